"""Odd but valid Edge TPU compiler inputs are not lost (issue 13, section 4): a model XNNPACK refuses to
prepare, a custom op that no LiteRT kernel runs (the real PoseNet), a batch-4 model, dilation along an
axis where the kernel is 1, and a compiled model whose package records no compiler version."""
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT, SHARED, run_maker
from edgehft.cli import main
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.ir import TFLiteModel
from edgehft.partition.coral_predict import predict

TEST_DATA = SHARED / "edgetpu_pairs" / "google-coral__test_data"
POSENET = TEST_DATA / "posenet_mobilenet_v1_075_353_481_16_quant_decoder.tflite"
MOVENET_COMPILED = TEST_DATA / "movenet_single_pose_lightning_ptq_edgetpu.tflite"
DEEPLAB = TEST_DATA / "deeplabv3_mnv2_dm05_pascal_quant.tflite"


@pytest.fixture(scope="module")
def odd(tmp_path_factory) -> Path:
    """tests/make_odd_edgetpu_models.py's models (one TensorFlow subprocess, ~10 s)."""
    return run_maker(ROOT / "tests" / "make_odd_edgetpu_models.py", tmp_path_factory.mktemp("odd_edgetpu"))


@pytest.fixture
def replay_compiler(tmp_path, monkeypatch) -> Path:
    """``edgetpu_compiler`` on PATH = tests/tools/replay_edgetpu_compiler.py (recorded real outputs)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "edgetpu_compiler").symlink_to(ROOT / "tests" / "tools" / "replay_edgetpu_compiler.py")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    return bin_dir / "edgetpu_compiler"


def _text(res) -> str:
    return " ".join(res.output.split())


def _refused_cleanly(res, code: int, *words: str) -> str:
    """The CLI result exited ``code`` with a message holding ``words`` and no traceback."""
    text = _text(res)
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output and not isinstance(res.exception, (AttributeError, RuntimeError)), text
    for w in words:
        assert w in text, text
    return text


@pytest.mark.needs("edgetpu-pairs")
def test_posenet_custom_op_keeps_the_confirmed_partition_without_golden_vectors(tmp_path, replay_compiler):
    # PosenetDecoderOp has no LiteRT kernel on any path (auto, builtin, reference): compile used to raise
    # RuntimeError and lose the partition. Now the bundle keeps it, confirmed by the real compiler's output.
    out = tmp_path / "posenet"
    res = compile_model(POSENET, [], out, CompileOptions(board="coral-usb", golden_count=2))
    rep, m = res.report, res.bundle.manifest
    assert rep.verdict == "confirmed" and rep.disagreements == [] and rep.accelerator["agreement"] == "38/38"
    assert rep.counts == {"accelerator": 37, "cpu": 1}
    assert (rep.ops[37].op, rep.ops[37].placement, rep.ops[37].reason_code) == \
        ("CUSTOM:PosenetDecoderOp", "cpu", "CUSTOM_OP")
    assert m.artifacts == {"edgetpu_model": "model_edgetpu.tflite"}
    assert m.golden is None and "golden.npz" not in m.files and not (out / "golden.npz").exists()
    assert rep.golden["count"] == 0
    assert "auto, builtin, reference: Encountered unresolved custom op: PosenetDecoderOp" in rep.golden["missing"]
    assert any(n.startswith("no golden vectors: no LiteRT kernel path runs it") for n in rep.notes)
    assert len(res.warnings) == 1 and "the bundle has no golden vectors" in res.warnings[0]
    # its four outputs are poses, poses:1, poses:2, poses:3: the names stay distinct
    assert [o.name for o in m.outputs] == ["poses", "poses:1", "poses:2", "poses:3"]

    cli = CliRunner()
    for extra in (["--emulate"], []):          # before any runtime opens it (the custom op would not open)
        r = cli.invoke(main, ["run", str(out), "--golden", *extra])
        _refused_cleanly(r, 6, "has no golden vectors", "PosenetDecoderOp", "hint: `edgehft report")
    # deploy refuses it before the box is touched: nothing listens on port 1, which would be exit 10
    r = cli.invoke(main, ["deploy", str(out), "--host", "127.0.0.1:1"])
    _refused_cleanly(r, 6, "has no golden vectors", "PosenetDecoderOp")
    r = cli.invoke(main, ["report", str(out), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["manifest"]["golden"] is None


@pytest.mark.needs("edgetpu-pairs")
def test_a_model_no_litert_path_runs_is_refused_for_the_cpu_board(tmp_path):
    res = CliRunner().invoke(main, ["compile", str(POSENET), "--board", "cpu", "--out", str(tmp_path / "b")])
    _refused_cleanly(res, 3, "no golden vectors can be made", "unresolved custom op: PosenetDecoderOp",
                     "hint: board cpu runs the whole model on LiteRT")
    assert not (tmp_path / "b").exists()


def test_xnnpack_refusal_falls_back_to_builtin_kernels(tmp_path, odd, monkeypatch):
    # A 1x1 conv, then a bilinear resize to a width of 2**24: XNNPACK's delegate fails to prepare it
    # (compile used to raise RuntimeError); LiteRT's builtin kernels make the golden vectors, and the cpu
    # runtime falls back the same way, so --emulate reproduces them.
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    model = odd / "resize_xnnpack_refuses.tflite"
    out = tmp_path / "resize"
    res = compile_model(model, [], out, CompileOptions(board="coral-usb", golden_count=2))
    rep, m = res.report, res.bundle.manifest
    assert [(o.op, o.placement, o.reason_code) for o in rep.ops] == [
        ("CONV_2D", "accelerator", "MAPPED"), ("RESIZE_BILINEAR", "cpu", "RESIZE_FACTOR")]
    assert m.golden.count == 2 and m.golden.compare == "exact"
    assert m.golden.reference_path.endswith("BUILTIN_WITHOUT_DEFAULT_DELEGATES (XNNPACK refused to prepare "
                                            "the model)")
    assert rep.golden["reference_kernels_path"].endswith("BUILTIN_REF")
    why = [n for n in rep.golden["notes"] if n.startswith("XNNPACK refused to prepare the model")]
    assert len(why) == 1 and "RESIZE_BILINEAR" in why[0] and "TfLiteXNNPackDelegate" in why[0]
    assert any(n.startswith("golden vectors: XNNPACK refused") for n in rep.notes) and res.warnings == []
    ins, outs = res.bundle.golden()
    assert next(iter(outs.values())).shape == (2, 1, 1 << 24, 1)
    r = CliRunner().invoke(main, ["run", str(out), "--golden", "--emulate"])
    assert r.exit_code == 0, r.output
    assert "2/2 reproduced (bit-exact)" in _text(r) and "XNNPACK refused to prepare the model" in _text(r)


def test_batch4_model_is_cpu_for_the_edge_tpu_with_its_reason(tmp_path, odd, monkeypatch):
    # Compile used to fail with "input shape (1, 16, 16, 3), expected (4, 16, 16, 3)" about golden inputs
    # the user never gave. The Edge TPU takes batch-1 models only: the op report says so for every op.
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    model = odd / "batch4.tflite"
    out = tmp_path / "b4"
    res = compile_model(model, [], out, CompileOptions(board="coral-usb"))
    rep, m = res.report, res.bundle.manifest
    assert [(o.op, o.placement, o.reason_code, o.status) for o in rep.ops] == [
        ("CONV_2D", "cpu", "BATCH_NOT_1", "Tensor has unsupported rank (up to 3 innermost dimensions mapped)")] * 2
    assert rep.ops[0].reason == ("tensor 'serving_default_x:0' shape (4, 16, 16, 3): batch 4; the Edge TPU "
                                 "compiler takes batch-1 models only")
    assert "keras.Input(batch_shape=(1, ...))" in rep.ops[0].fix
    assert rep.accelerator["mapped"] == 0 and any("input has batch 4" in n for n in rep.notes)
    assert m.golden is None and m.inputs[0].shape == [4, 16, 16, 3]
    assert rep.golden["missing"] == ("input 'serving_default_x' has shape (4, 16, 16, 3), batch 4: golden vectors "
                                     "are one window per call at batch 1")
    cli = CliRunner()
    _refused_cleanly(cli.invoke(main, ["run", str(out), "--golden", "--emulate"]), 6, "has no golden vectors",
                     "batch 4")
    r = cli.invoke(main, ["compile", str(model), "--board", "cpu", "--out", str(tmp_path / "cpu")])
    _refused_cleanly(r, 3, "no golden vectors can be made", "batch 4", "hint: convert the model with a batch of 1")


def test_dilation_along_a_unit_kernel_axis_is_ignored(odd):
    # A TCN over (1, T, 1, C): 3x1 kernels with dilation (2, 1) and (4, 1). Compiler 16.0 mapped such a
    # model whole (the kernel is 1 wide, so the width dilation does nothing); it was predicted
    # "UNEQUAL_DILATION, CPU". A 3x3 kernel with dilation (2, 1) is still refused.
    tcn = predict(TFLiteModel.from_file(odd / "tcn_dilated.tflite"))
    convs = TFLiteModel.from_file(odd / "tcn_dilated.tflite").main.ops
    assert [(op.options["DilationHFactor"], op.options["DilationWFactor"]) for op in convs] == [(2, 1), (4, 1), (1, 1)]
    assert [(v.op, v.stage, v.code) for v in tcn.ops] == [("CONV_2D", "tpu", "MAPPED")] * 3
    assert tcn.subgraphs == [[0, 1, 2]] and tcn.compiled_op_names() == ["CUSTOM:edgetpu-custom-op"]
    sq = predict(TFLiteModel.from_file(odd / "dilated_3x3_unequal.tflite"))
    assert (sq.ops[0].code, sq.ops[0].detail) == ("UNEQUAL_DILATION", "dilation (h, w) = (2, 1) with a 3x3 kernel")
    assert sq.ops[0].stage == "pre" and sq.ops[1].stage == "tpu"


@pytest.mark.needs("edgetpu-pairs")
def test_report_json_says_compiler_version_not_recorded(tmp_path, monkeypatch):
    # The real compiled models' DWN1 package records compiler_version "cl/" (an empty changelist).
    r = CliRunner().invoke(main, ["report", str(MOVENET_COMPILED), "--json"])
    assert r.exit_code == 0, r.output
    assert [c["compiler_version"] for c in json.loads(r.output)["custom_ops"]] == ["not recorded"]
    text = _text(CliRunner().invoke(main, ["report", str(MOVENET_COMPILED)]))
    assert "compiler version not recorded" in text
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    compiled = TEST_DATA / "deeplabv3_mnv2_dm05_pascal_quant_edgetpu.tflite"
    res = compile_model(DEEPLAB, [], tmp_path / "b", CompileOptions(board="coral-pcie", board_options={"edgetpu_model": compiled},
                                                                    golden_count=1))
    assert res.bundle.manifest.accelerator["compiler_version"] == "not recorded"
    r = CliRunner().invoke(main, ["report", str(tmp_path / "b"), "--json"])
    assert json.loads(r.output)["manifest"]["accelerator"]["compiler_version"] == "not recorded"
