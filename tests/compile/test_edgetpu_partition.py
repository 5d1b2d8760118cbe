"""The Edge TPU partition prediction against what the real compiler did, and the compiler's own log.

Ground truth: ../shared/data/edgetpu_pairs (CPU model X.tflite + the compiler's X_edgetpu.tflite).
"""
from collections import Counter
from pathlib import Path

import pytest

from conftest import ROOT, SHARED, run_maker
from edgehft.errors import InputError
from edgehft.ir import TFLiteModel
from edgehft.partition import coral_rules as R
from edgehft.partition.coral_predict import EdgeTPUOptions, predict
from edgehft.partition.coral_compiled import compare, read_compiled
from edgehft.partition.coral_report import edgetpu_report
from edgehft.toolchains.edgetpu_compiler import parse_output

PAIRS_DIR = SHARED / "edgetpu_pairs"
PAIRS = sorted(p for p in PAIRS_DIR.rglob("*.tflite") if not p.stem.endswith("_edgetpu")) \
    if PAIRS_DIR.is_dir() else []


@pytest.mark.needs("edgetpu-pairs")
@pytest.mark.parametrize("cpu_path", PAIRS, ids=[p.stem for p in PAIRS])
def test_prediction_matches_the_real_compiler(cpu_path):
    cpu = TFLiteModel.from_file(cpu_path)
    compiled = TFLiteModel.from_file(cpu_path.with_name(cpu_path.stem + "_edgetpu.tflite"))
    part = predict(cpu)
    actual = read_compiled(compiled, cpu)
    # The CPU ops as a multiset of op types ...
    predicted_cpu = Counter(v.op for v in part.ops if v.stage != "tpu")
    real_cpu = Counter(cpu.main.ops[k].name for k in actual.cpu_ops)
    assert predicted_cpu == real_cpu
    # ... and positionally: the compiled graph's op sequence.
    assert part.compiled_op_names() == compiled.op_names()
    ag = compare(part, actual)
    assert ag.disagreements == [] and ag.agree == len(cpu.main.ops)


@pytest.mark.needs("edgetpu-pairs")
def test_agreement_over_all_pairs():
    ops = agree = 0
    for cpu_path in PAIRS:
        cpu = TFLiteModel.from_file(cpu_path)
        compiled = TFLiteModel.from_file(cpu_path.with_name(cpu_path.stem + "_edgetpu.tflite"))
        ag = compare(predict(cpu), read_compiled(compiled, cpu))
        ops, agree = ops + ag.ops, agree + ag.agree
    assert (len(PAIRS), ops, agree) == (14, 669, 669)


@pytest.mark.needs("edgetpu-pairs")
def test_movenet_independent_branch_keeps_mapping_after_the_first_cpu_op():
    cpu = TFLiteModel.from_file(PAIRS_DIR / "google-coral__test_data" / "movenet_single_pose_lightning_ptq.tflite")
    part = predict(cpu)
    by = {v.index: v for v in part.ops}
    assert [by[0].stage, by[1].stage] == ["pre", "pre"]                    # CAST, float QUANTIZE
    assert (by[89].op, by[89].stage, by[89].status) == ("ARG_MAX", "post", R.UNSUPPORTED_DTYPE)
    assert (by[103].op, by[103].stage) == ("LOGISTIC", "tpu")              # later in graph order, independent
    assert by[115].code == "AFTER_CPU_OP" and by[115].status == R.MORE_THAN_ONE_SUBGRAPH


@pytest.mark.needs("edgetpu-pairs")
def test_deeplab_resize_factor_rule_with_concrete_values():
    cpu = TFLiteModel.from_file(PAIRS_DIR / "google-coral__test_data" / "deeplabv3_mnv2_pascal_quant.tflite")
    v = predict(cpu).ops[64]
    assert (v.op, v.status, v.code) == ("RESIZE_BILINEAR", R.UNSPECIFIED_LIMITATION, "RESIZE_FACTOR")
    assert "1x1 -> 33x33" in v.detail and "factor 33" in v.detail


@pytest.mark.needs("edgetpu-pairs")
def test_compiled_model_alone_and_with_its_cpu_model():
    d = PAIRS_DIR / "google-coral__test_data"
    compiled = TFLiteModel.from_file(d / "deeplabv3_mnv2_pascal_quant_edgetpu.tflite")
    alone = read_compiled(compiled)
    assert alone.cpu_ops is None and alone.min_runtime_version == 12
    assert alone.cpu_op_names == ["RESIZE_BILINEAR", "QUANTIZE", "CONCATENATION", "CONV_2D", "CONV_2D",
                                  "RESIZE_BILINEAR", "RESIZE_BILINEAR", "ARG_MAX"]
    placed = read_compiled(compiled, TFLiteModel.from_file(d / "deeplabv3_mnv2_pascal_quant.tflite"))
    assert placed.custom_ops[0].ops == list(range(64)) and placed.cpu_ops == list(range(64, 72))
    with pytest.raises(InputError, match="not compiled for the Edge TPU"):
        read_compiled(TFLiteModel.from_file(d / "deeplabv3_mnv2_pascal_quant.tflite"))
    with pytest.raises(InputError, match="does not look like the source"):
        read_compiled(compiled, TFLiteModel.from_file(d / "mobilenet_v1_0.25_128_quant.tflite"))


@pytest.mark.needs("edgetpu-pairs")
def test_real_compiler_log_rows():
    log = PAIRS_DIR / "logs_only" / "guichristmann__edge-tpu-tiny-yolo" / "quant_coco-tiny-v3-relu_edgetpu.log"
    parsed = parse_output(log.read_text())
    assert parsed.version == "2.0.267685300"
    assert (parsed.input_model, parsed.output_model) == ("quant_coco-tiny-v3-relu.tflite",
                                                         "quant_coco-tiny-v3-relu_edgetpu.tflite")
    assert parsed.rows == [("RESIZE_NEAREST_NEIGHBOR", 1, R.MAPPED), ("MAX_POOL_2D", 6, R.MAPPED),
                           ("CONCATENATION", 1, R.MAPPED), ("QUANTIZE", 4, R.MAPPED), ("CONV_2D", 13, R.MAPPED)]
    assert parsed.mapped == 25 and parsed.errors == []


def test_compiler_error_lines_are_parsed():
    text = "Edge TPU Compiler version 2.0.267685300\nERROR: Didn't find op for builtin opcode 'RELU' version '2'\n" \
           "\nERROR: Registration failed.\n\nInvalid model: m.tflite\nModel could not be parsed\n"
    parsed = parse_output(text)
    assert parsed.version == "2.0.267685300" and parsed.rows == []
    assert parsed.errors[0] == "ERROR: Didn't find op for builtin opcode 'RELU' version '2'"
    assert "Invalid model: m.tflite" in parsed.errors and "Model could not be parsed" in parsed.errors


@pytest.fixture(scope="session")
def rule_models(tmp_path_factory) -> Path:
    return run_maker(ROOT / "tests" / "make_edgetpu_models.py", tmp_path_factory.mktemp("edgetpu_models"))


def _ops(path, **kw):
    return {v.index: v for v in predict(TFLiteModel.from_file(path), EdgeTPUOptions(**kw)).ops}


def test_prelu_alpha_rule_and_fix(rule_models):
    bad = _ops(rule_models / "prelu_unshared.tflite")
    assert (bad[1].op, bad[1].code, bad[1].stage) == ("PRELU", "PRELU_ALPHA_SHAPE", "post")
    assert "(8, 8, 4)" in bad[1].detail and "shared_axes=[1, 2]" in bad[1].fix
    assert (bad[2].code, bad[2].detail) == ("AFTER_CPU_OP", "depends on CPU op #1 PRELU")
    good = _ops(rule_models / "prelu_shared.tflite")
    assert all(v.stage == "tpu" for v in good.values())


def test_float_io_quantize_and_dequantize_stay_at_the_edges(rule_models):
    ops = _ops(rule_models / "prelu_shared_float_io.tflite")
    assert (ops[0].op, ops[0].stage, ops[0].status) == ("QUANTIZE", "pre", R.UNSPECIFIED_LIMITATION)
    assert (ops[4].op, ops[4].stage, ops[4].status) == ("DEQUANTIZE", "post", R.UNSUPPORTED_DTYPE)
    assert [ops[k].stage for k in (1, 2, 3)] == ["tpu"] * 3


def test_softmax_rank_and_runtime_rules(rule_models):
    sm = _ops(rule_models / "softmax_2d.tflite")
    assert (sm[3].op, sm[3].code, sm[3].detail) == ("SOFTMAX", "SOFTMAX_NOT_1D", "input shape (1, 4, 8) is not 1-D")
    r5 = _ops(rule_models / "rank5.tflite")
    assert (r5[0].status, r5[0].code) == (R.UNSUPPORTED_RANK, "RANK")
    tr14 = _ops(rule_models / "transpose.tflite", min_runtime_version=14)
    tr13 = _ops(rule_models / "transpose.tflite", min_runtime_version=13)
    assert tr14[3].op == "TRANSPOSE" and tr14[3].stage == "tpu"
    assert (tr13[3].code, tr13[3].stage, tr13[5].code) == ("NEEDS_NEWER_RUNTIME", "post", "AFTER_CPU_OP")


def test_independent_branch_maps_and_flags_a_and_i(rule_models):
    path = rule_models / "branches.tflite"
    ops = _ops(path)
    assert [(ops[k].op, ops[k].stage) for k in range(5)] == [
        ("CONV_2D", "tpu"), ("LEAKY_RELU", "post"), ("CONV_2D", "post"), ("CONV_2D", "tpu"), ("CONV_2D", "tpu")]
    model = TFLiteModel.from_file(path)
    multi = predict(model, EdgeTPUOptions(allow_multiple_subgraphs=True))
    assert [len(s) for s in multi.subgraphs] == [1, 3]
    assert multi.compiled_op_names() == ["CUSTOM:edgetpu-custom-op", "LEAKY_RELU", "CUSTOM:edgetpu-custom-op"]
    cut_name = model.main.tensors[model.main.ops[3].outputs[0]].name
    cut = predict(model, EdgeTPUOptions(intermediate_tensors=(cut_name,)))
    assert (cut.ops[4].stage, cut.ops[4].code) == ("post", "AFTER_INTERMEDIATE_TENSOR")
    assert cut.ops[3].stage == "tpu"
    with pytest.raises(InputError, match="not in the model"):
        predict(model, EdgeTPUOptions(intermediate_tensors=("no_such_tensor",)))


def test_deeplob_report_says_what_to_change(deeplob_bundle):
    model = TFLiteModel.from_file(deeplob_bundle / "model.tflite")
    rep = edgetpu_report(model, "coral-usb", EdgeTPUOptions())
    assert rep.verdict == "predicted" and rep.counts == {"accelerator": 1, "cpu": 34}
    leaky = [o for o in rep.ops if o.op == "LEAKY_RELU"]
    assert len(leaky) == 14 and all(o.status == R.NOT_SUPPORTED for o in leaky)
    assert "shared_axes=[1, 2]" in leaky[0].fix
    lstm = next(o for o in rep.ops if o.op == "UNIDIRECTIONAL_SEQUENCE_LSTM")
    assert (lstm.status, lstm.reason) == (R.MORE_THAN_ONE_SUBGRAPH, "depends on CPU op #25 LEAKY_RELU")
    text = "\n".join(rep.summary)
    assert "1 of 35 ops map" in text
    assert "with LEAKY_RELU replaced by supported ops, 35 of 35 ops would map" in text
    assert "with -a: 21 of 35 ops would map in 15 subgraphs" in text
    assert rep.accelerator["boundary"][0]["bytes_in"] == 100 * 40   # the int8 window
