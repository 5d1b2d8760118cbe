"""``compile --board coral-*`` end to end: predicted without the compiler, confirmed with it (driven
through a replay of the real compiler's recorded outputs), and the CLI around it."""
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT, SHARED
from edgehft import runtime
from edgehft.bundle import load_bundle
from edgehft.cli import main
from edgehft.partition.coral_options import EdgeTPUFlags
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.errors import BoardUnavailableError, ConverterError
from edgehft.toolchains.edgetpu_compiler import run_compiler

TEST_DATA = SHARED / "edgetpu_pairs" / "google-coral__test_data"
LSTM = TEST_DATA / "keras_lstm_mnist_ptq.tflite"
DEEPLAB = TEST_DATA / "deeplabv3_mnv2_dm05_pascal_quant.tflite"
pytestmark = pytest.mark.needs("edgetpu-pairs")


@pytest.fixture
def replay_compiler(tmp_path, monkeypatch) -> Path:
    """``edgetpu_compiler`` on PATH = tests/tools/replay_edgetpu_compiler.py (recorded real outputs)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "edgetpu_compiler").symlink_to(ROOT / "tests" / "tools" / "replay_edgetpu_compiler.py")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir / "edgetpu_compiler"


def test_without_compiler_the_verdict_is_predicted(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    res = compile_model(LSTM, [], tmp_path / "b", CompileOptions(board="coral-usb"))
    m = res.bundle.manifest
    assert res.report.verdict == "predicted" and m.artifacts == {} and m.accelerator["compiled"] is False
    assert m.quantization.calibration_sha256 is None and m.golden.count == 16
    assert "random raw inputs" in res.report.golden["inputs"]
    with pytest.raises(BoardUnavailableError, match="no Edge TPU compiled model"):
        runtime.open(res.bundle.path)
    with runtime.open(res.bundle.path, emulate=True) as r:
        assert r.describe()["emulated"] is True


def test_with_the_compiler_the_verdict_is_confirmed(tmp_path, replay_compiler):
    res = compile_model(DEEPLAB, [], tmp_path / "b", CompileOptions(board="coral-usb"))
    rep, m = res.report, res.bundle.manifest
    assert rep.verdict == "confirmed" and rep.verdict_source.startswith("edgetpu_compiler 16.0.384591198")
    assert rep.disagreements == [] and rep.accelerator["agreement"] == "72/72" and res.warnings == []
    assert m.artifacts == {"edgetpu_model": "model_edgetpu.tflite"}
    assert m.accelerator["min_runtime_version"] == 12 and m.toolchain["edgetpu_compiler"].startswith("16.0")
    assert (res.bundle.path / "model_edgetpu.tflite").read_bytes() == \
        (TEST_DATA / "deeplabv3_mnv2_dm05_pascal_quant_edgetpu.tflite").read_bytes()
    assert rep.counts == {"accelerator": 64, "cpu": 8}
    argv = rep.accelerator["compiler"]["argv"]
    assert argv[:4] == ["-s", "-o", argv[2], "-m"] and argv[4] == "14" and argv[-1].endswith(".tflite")
    load_bundle(res.bundle.path)                                   # hashes cover the compiled model
    with pytest.raises(BoardUnavailableError, match="libedgetpu"):  # compiled model present; no runtime here
        runtime.open(res.bundle.path)


def test_disagreements_with_the_compiler_are_listed(tmp_path, replay_compiler):
    # Predict with a cut (-i) that the replayed compiler output does not have: every op after the cut
    # is predicted on the CPU, but the compiled model has it inside the custom op.
    from edgehft.ir import TFLiteModel
    m = TFLiteModel.from_file(LSTM)
    cut = m.main.tensors[m.main.ops[2].outputs[0]].name          # RESHAPE's output
    res = compile_model(LSTM, [], tmp_path / "b",
                        CompileOptions(board="coral-usb", board_options={"edgetpu": EdgeTPUFlags(intermediate_tensors=(cut,))}))
    dis = res.report.disagreements
    assert [(d["index"], d["op"], d["predicted"], d["actual"]) for d in dis] == [
        (3, "FULLY_CONNECTED", "cpu", "tpu"), (4, "SOFTMAX", "cpu", "tpu"), (5, "QUANTIZE", "cpu", "tpu")]
    assert "disagree on 3 op(s)" in res.warnings[0]
    fc = res.report.ops[3]
    assert fc.placement == "accelerator" and fc.reason_code == "COMPILER_MAPPED"


@pytest.mark.parametrize("mode,match", [("fail", "Didn't find op for builtin opcode"), ("crash", "SIGSEGV"),
                                        ("hang", "did not finish in 2 s")])
def test_compiler_failures_are_reported(tmp_path, replay_compiler, monkeypatch, mode, match):
    monkeypatch.setenv("REPLAY_MODE", mode)
    with pytest.raises(ConverterError, match=match):
        run_compiler(LSTM, tmp_path / "out", ["-m", "14"], timeout_s=2)
    assert not (tmp_path / "out" / "keras_lstm_mnist_ptq_edgetpu.tflite").exists()


def test_cli_report_on_a_compiled_model_and_a_prediction():
    cli = CliRunner()
    res = cli.invoke(main, ["report", str(TEST_DATA / "movenet_single_pose_lightning_ptq_edgetpu.tflite"), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["min_runtime_version"] == 12 and len(d["custom_ops"]) == 1
    assert len(d["custom_ops"][0]["ops"]) == 98 and len(d["cpu_ops"]) == 59
    assert d["agreement"]["agree"] == 157 and d["agreement"]["layout_equal"] is True
    res = cli.invoke(main, ["report", str(TEST_DATA / "movenet_single_pose_lightning_ptq_edgetpu.tflite")])
    text = " ".join(res.output.split())
    assert res.exit_code == 0 and "edgetpu-custom-op" in text and "157/157 ops placed as the compiler did" in text
    res = cli.invoke(main, ["report", str(DEEPLAB), "--board", "coral-m2", "-a", "--json"])
    rep = json.loads(res.output)["report"]
    assert rep["verdict"] == "predicted" and rep["accelerator"]["flags"] == ["-m", "14", "-a"]
    res = cli.invoke(main, ["report", str(DEEPLAB), "--board", "cpu"])
    assert res.exit_code == 3 and "Coral boards" in res.output


def test_cli_refuses_without_a_tpu_and_runs_emulated(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    cli = CliRunner()
    out = tmp_path / "b"
    res = cli.invoke(main, ["compile", str(LSTM), "--board", "coral-usb", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    res = cli.invoke(main, ["run", str(out), "--golden"])
    assert res.exit_code == 7 and "no Edge TPU compiled model" in " ".join(res.output.split())
    res = cli.invoke(main, ["run", str(out), "--golden", "--emulate"])
    assert res.exit_code == 0 and "EMULATED" in res.output and "16/16 reproduced" in " ".join(res.output.split())
    res = cli.invoke(main, ["compile", str(LSTM), "--board", "coral-usb", "--out", str(tmp_path / "c"),
                            "-i", "nope"])
    assert res.exit_code == 3 and "-i tensor(s) not in the model: nope" in " ".join(res.output.split())


def _text(res) -> str:
    return " ".join(res.output.split())


def test_cli_option_checks(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    cli = CliRunner()
    out = tmp_path / "b"
    assert cli.invoke(main, ["compile", str(LSTM), "--board", "coral-usb", "--out", str(out)]).exit_code == 0
    import numpy as np
    np.save(tmp_path / "x.npy", np.zeros((4, 28, 28), np.uint8))
    for args in (["bench", str(out), "--emulate", "--ticks", str(tmp_path / "x.npy"), "--samples", "-5"],
                 ["run", str(out), "--golden", "--emulate", "--threads", "0"],
                 ["run", str(out), "--golden", "--device", "gpu"],
                 ["report", str(LSTM), "-m", "5"],
                 ["report", str(out), "-a"]):
        res = cli.invoke(main, args)
        assert res.exit_code == 2, (args, res.output)
    res = cli.invoke(main, ["run", str(out), "--golden", "--emulate", "--json"])
    d = json.loads(res.output)
    assert (d["ok"], d["emulated"], d["board"]) == (True, True, "coral-usb")
    res = cli.invoke(main, ["compile", str(LSTM), "--board", "coral-usb", "--quant", "fp16", "--out", str(tmp_path / "q")])
    assert res.exit_code == 3 and "--quant does not apply" in _text(res)
    res = cli.invoke(main, ["compile", str(LSTM), "--board", "cpu", "-a", "--out", str(tmp_path / "c")])
    assert res.exit_code == 3 and "apply to Coral boards" in _text(res)


def test_cli_lists_tensors_for_cuts():
    res = CliRunner().invoke(main, ["report", str(LSTM), "--tensors", "--json"])
    rows = json.loads(res.output)
    assert [r["op"] for r in rows] == ["QUANTIZE", "UNIDIRECTIONAL_SEQUENCE_LSTM", "RESHAPE", "FULLY_CONNECTED",
                                       "SOFTMAX", "QUANTIZE"]
    assert rows[1]["shape"] == [1, 28, 20] and rows[1]["dtype"] == "int8"


def test_compiled_elsewhere_is_checked_and_bundled(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    compiled = TEST_DATA / "deeplabv3_mnv2_dm05_pascal_quant_edgetpu.tflite"
    res = compile_model(DEEPLAB, [], tmp_path / "b", CompileOptions(board="coral-pcie", board_options={"edgetpu_model": compiled}))
    assert res.report.verdict == "confirmed" and res.report.disagreements == []
    assert res.bundle.manifest.accelerator["compiled_elsewhere"] == compiled.name
    from edgehft.errors import InputError
    with pytest.raises(InputError, match="does not look like the source"):
        compile_model(LSTM, [], tmp_path / "c", CompileOptions(board="coral-pcie", board_options={"edgetpu_model": compiled}))
    whole = TEST_DATA / "mobilenet_v1_0.25_128_quant_edgetpu.tflite"         # no CPU ops left to compare
    with pytest.raises(InputError, match="are not tensors of it"):
        compile_model(LSTM, [], tmp_path / "d", CompileOptions(board="coral-pcie", board_options={"edgetpu_model": whole}))


def test_uint8_windows_for_a_uint8_model_are_raw_inputs(tmp_path, monkeypatch):
    import numpy as np
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    x = np.random.default_rng(0).integers(0, 256, (20, 28, 28), dtype=np.uint8)
    np.save(tmp_path / "u8.npy", x)
    res = compile_model(LSTM, [tmp_path / "u8.npy"], tmp_path / "b", CompileOptions(board="coral-usb"))
    ins, _ = res.bundle.golden()
    assert np.array_equal(next(iter(ins.values())), x[:16])
    np.save(tmp_path / "i8.npy", x.astype(np.int8))
    from edgehft.errors import InputError
    with pytest.raises(InputError, match="windows are int8"):
        compile_model(LSTM, [tmp_path / "i8.npy"], tmp_path / "c", CompileOptions(board="coral-usb"))


@pytest.mark.parametrize("board", ["cpu", "coral-usb"])
def test_a_model_already_compiled_for_the_edge_tpu_is_refused(tmp_path, board):
    """compile takes a .tflite as is, but not one an edgetpu_compiler already compiled: the coral backend
    recognises it (its ``compiled_model``) and the message says what it was compiled for (exit 3)."""
    from edgehft.errors import InputError
    compiled = TEST_DATA / "deeplabv3_mnv2_dm05_pascal_quant_edgetpu.tflite"
    with pytest.raises(InputError, match=r"is already compiled for the Edge TPU") as e:
        compile_model(compiled, [], tmp_path / "b", CompileOptions(board=board))
    assert e.value.exit_code == 3 and "edgehft report" in e.value.hint and not (tmp_path / "b").exists()


def test_compile_onto_a_bundle_of_another_board_or_model_needs_force(tmp_path, monkeypatch):
    """``compile --out DIR`` where DIR holds a bundle of another board, of another model, or one whose manifest
    cannot be read: exit 3 naming what is there, nothing touched; ``--force`` replaces it; a bundle of the same
    board and model is replaced without it (a new compile of the same thing)."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    cli, out = CliRunner(), tmp_path / "b"
    out.mkdir()
    for manifest, said in [({"board": "cpu", "source": {"file": LSTM.name, "sha256": "0" * 64}},
                            "holds a bundle for board cpu, not coral-usb"),
                           ({"board": "coral-usb", "source": {"file": "other.keras", "sha256": "ab" * 32}},
                            "holds a bundle of another model (other.keras, sha256 abababababab…) than " + LSTM.name),
                           ("{not json", "holds a bundle whose manifest cannot be read (JSONDecodeError)")]:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        (out / "manifest.json").write_text(text)
        res = cli.invoke(main, ["compile", str(LSTM), "--board", "coral-usb", "--out", str(out)])
        assert res.exit_code == 3 and said in _text(res) and "--force" in _text(res), res.output
        assert (out / "manifest.json").read_text() == text and sorted(p.name for p in out.iterdir()) == ["manifest.json"]
    res = cli.invoke(main, ["compile", str(LSTM), "--board", "coral-usb", "--out", str(out), "--force"])
    assert res.exit_code == 0, res.output
    assert load_bundle(out).manifest.board == "coral-usb"
    res = cli.invoke(main, ["compile", str(LSTM), "--board", "coral-usb", "--out", str(out)])
    assert res.exit_code == 0, res.output


def test_host_tpu_copies_get_an_estimate_at_the_board_link_rate():
    """Issue 19: the host<->Edge TPU copies of an inference cost, per tensor, the board file's
    transfer_overhead_us plus its bytes at link_bytes_per_s (an estimate); USB 3.0 (coral-usb) costs more than the
    PCIe boards; a board file without the rate says "not estimated"."""
    from edgehft.partition.coral_report import copy_estimate
    boundary = [{"inputs": [{"bytes": 700_000}], "outputs": [{"bytes": 1_000}, {"bytes": 24}]}]
    est = copy_estimate(boundary, {"link_bytes_per_s": 350e6, "transfer_overhead_us": 50.0})
    assert est == {"bytes": 701_024, "transfers": 3, "us": round(3 * 50 + 701_024 / 350.0, 1)}
    assert copy_estimate(boundary, {"link": "USB"}) is None and copy_estimate(boundary, None) is None
    from edgehft.boards import load_board
    from edgehft.partition.coral import PARTITIONER
    model = SHARED / "edgetpu_pairs" / "google-coral__test_data" / "keras_lstm_mnist_ptq.tflite"
    usb, m2 = (PARTITIONER.predict(model, load_board(b)) for b in ("coral-usb", "coral-m2"))
    assert usb.accelerator["copy_us_estimate"] > m2.accelerator["copy_us_estimate"] > 0
    assert any("copy time: ~" in line and "estimate" in line for line in usb.summary)
