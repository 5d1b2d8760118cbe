"""compile --board jetson-*: ONNX in the bundle, golden vectors from onnxruntime, predicted TensorRT
placement (layers 1-2 of the Jetson backend; no GPU, no TensorRT here). ``--quant int8``: explicit Q/DQ ONNX
whose ranges come from the int8 TFLite IR of the same calibration (the cpu bundle's model.tflite)."""
import json

import numpy as np
import pytest

from conftest import DEEPLOB, FEED_DAY1
from edgehft import runtime
from edgehft.bundle import load_bundle
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.compiler.jetson import QDQ_GOLDEN_ATOL, QDQ_VS_TFLITE_ARGMAX, QDQ_VS_TFLITE_MAX_ABS
from edgehft.compiler.onnx_check import run_onnx
from edgehft.compiler.onnx_qdq import symmetric_scale
from edgehft.errors import BoardUnavailableError, InputError
from edgehft.ir import TFLiteModel


@pytest.fixture(scope="module")
def deeplob_jetson(tmp_path_factory):
    out = tmp_path_factory.mktemp("jetson") / "deeplob.orin-nx"
    res = compile_model(DEEPLOB / "deeplob.keras", [FEED_DAY1], out, CompileOptions(board="jetson-orin-nx"))
    return out, res


def test_deeplob_fp16_bundle(deeplob_jetson):
    out, res = deeplob_jetson
    b = load_bundle(out)
    m = b.manifest
    assert (m.model_file, m.quantization.mode, m.golden.compare) == ("model_fp16.onnx", "fp16", "allclose")
    assert 1e-3 <= m.golden.atol < 0.05
    assert m.accelerator["onnx"]["float16"]["op_types"]["LSTM"] == 1
    rep = res.report
    assert rep.verdict == "predicted" and rep.drift.passed and rep.drift.outputs[0].argmax_agreement >= 0.99
    lstm = next(o for o in rep.ops if o.op == "LSTM")
    assert (lstm.kernel, lstm.reason_code) == ("GPU", "DLA_NO_RNN")
    assert next(o for o in rep.ops if o.op == "Softmax").kernel == "DLA"          # Orin's DLA v2
    assert sum(o.op == "Conv" and o.kernel == "DLA" for o in rep.ops) == 14
    ins, outs = b.golden()
    assert ins["lob"].dtype == np.float32 and outs["signal"].shape == (16, 3)
    with pytest.raises(BoardUnavailableError, match="no NVIDIA GPU here"):
        runtime.open(out)
    assert json.loads((out / "report.json").read_text())["accelerator"]["dla_cores"] == 2


def test_jetson_refusals(tmp_path):
    tfl = tmp_path / "m.tflite"
    tfl.write_bytes(b"TFL3")
    with pytest.raises(InputError, match="takes a Keras model"):
        compile_model(tfl, [], tmp_path / "b", CompileOptions(board="jetson-agx-orin"))


@pytest.fixture(scope="module")
def deeplob_int8_jetson(tmp_path_factory):
    out = tmp_path_factory.mktemp("jetson") / "deeplob.agx-orin.int8"
    res = compile_model(DEEPLOB / "deeplob.keras", [FEED_DAY1], out,
                        CompileOptions(board="jetson-agx-orin", quant="int8"))
    return out, res


def _producers(g):
    return {o: n for n in g.node for o in n.output}


def test_deeplob_int8_qdq_bundle(deeplob_int8_jetson, deeplob_bundle):
    import onnx
    from onnx import numpy_helper
    out, res = deeplob_int8_jetson
    b = load_bundle(out)
    m = b.manifest
    assert (m.model_file, m.quantization.mode, m.golden.compare, m.golden.atol) == \
        ("model_int8_qdq.onnx", "int8", "allclose", QDQ_GOLDEN_ATOL)
    # the cpu board's IR, converted from the same calibration windows (same feed, seed and counts)
    assert m.quantization.calibration_sha256 == load_bundle(deeplob_bundle).manifest.quantization.calibration_sha256
    # Q/DQ nodes are fused into their int8 layers: the DLA/GPU switches are those of the fp16 model
    rep = res.report
    assert rep.boundary_copies == 3 and all(o.reason_code == "QDQ_FUSED" for o in rep.ops
                                            if o.op in ("QuantizeLinear", "DequantizeLinear"))
    ir = TFLiteModel.from_file(deeplob_bundle / "model.tflite").main
    tfl = {t.name: t for t in ir.tensors}
    g = onnx.load(str(out / m.model_file)).graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    prod = _producers(g)
    weighted = [n for n in g.node if n.op_type in ("Conv", "Gemm")]
    assert [n.op_type for n in weighted].count("Conv") == 14 and [n.op_type for n in weighted].count("Gemm") == 1
    for n in weighted:                      # DQ(Q(x)) into every Conv/Gemm, per-channel int8 weights
        dq = prod[n.input[0]]
        assert dq.op_type == "DequantizeLinear" and prod[dq.input[0]].op_type == "QuantizeLinear", n.name
        wdq = prod[n.input[1]]
        assert wdq.op_type == "DequantizeLinear" and inits[wdq.input[0]].dtype == np.int8
        axis = next(a.i for a in wdq.attribute if a.name == "axis")
        assert inits[wdq.input[1]].shape == (inits[wdq.input[0]].shape[axis],)
        assert not inits[wdq.input[2]].any()                           # TensorRT: zero point 0
        nxt = [c for c in g.node if n.output[0] in c.input]             # Q after it (through its activation)
        if nxt[0].op_type == "LeakyRelu":
            nxt = [c for c in g.node if nxt[0].output[0] in c.input]
        assert any(c.op_type == "QuantizeLinear" for c in nxt), n.name
    # scales are the IR's: conv2d_3's per-channel weight scales exactly; its input leaky_re_lu_2's range exactly
    conv3 = next(n for n in weighted if n.name == "deeplob/conv2d_3/BiasAdd")
    assert np.array_equal(inits[prod[conv3.input[1]].input[1]], tfl["deeplob/conv2d_3/Conv2D"].quant.scale)
    act = tfl["deeplob/leaky_re_lu_2/LeakyRelu"].quant
    q = prod[prod[conv3.input[0]].input[0]]
    assert q.input[0] == "deeplob/leaky_re_lu_2/LeakyRelu:0"
    assert float(inits[q.input[1]]) == symmetric_scale(act.scale[0], act.zero_point[0])
    qdq = res.report.accelerator["qdq"]
    mt = qdq["matched_tensors"]["deeplob/leaky_re_lu_2/LeakyRelu:0"]
    assert (mt["tflite_scale"], mt["tflite_zero_point"]) == (float(act.scale[0]), int(act.zero_point[0]))
    assert qdq["weights_per_channel"] == 15 and qdq["weight_scales"] == {"tflite": 15, "computed": 0}
    assert qdq["matched"] >= 35 and set(qdq["unmatched_tensors"]) <= {"Transpose__82:0", "LSTM__28:1", "LSTM__28:2"}
    lstm = next(n for n in g.node if n.op_type == "LSTM")                  # float LSTM, Q/DQ around it
    assert all(inits.get(i) is None or inits[i].dtype == np.float32 for i in lstm.input if i)
    assert any(c.op_type == "QuantizeLinear" for c in g.node if lstm.output[0] in c.input)
    # against the int8 TFLite model and Keras, measured in compile on the held-out real windows
    v = res.report.golden["qdq_vs_tflite_int8"]
    assert v["windows"] >= 200 and v["max_abs_diff"] <= QDQ_VS_TFLITE_MAX_ABS
    assert v["argmax_agreement"] >= QDQ_VS_TFLITE_ARGMAX
    assert res.report.drift.passed and res.report.drift.outputs[0].argmax_agreement >= 0.98
    assert not res.warnings
    assert m.accelerator["onnx"]["int8_qdq"]["vs_tflite_int8"]["passed"]
    ins, outs = b.golden()                                                  # golden = onnxruntime on the Q/DQ
    np.testing.assert_allclose(run_onnx(out / m.model_file, ins["lob"])[0], outs["signal"], atol=1e-6)


def test_deeplob_int8_qdq_vs_cpu_bundle_on_real_windows(deeplob_int8_jetson, deeplob_bundle, deeplob_windows):
    """Independently: 300 real windows through onnxruntime (Q/DQ ONNX) and the cpu bundle (int8 TFLite)."""
    out, _ = deeplob_int8_jetson
    x = deeplob_windows["x"][::max(1, len(deeplob_windows["x"]) // 300)][:300]
    y = run_onnx(out / "model_int8_qdq.onnx", x)[0]
    with runtime.open(deeplob_bundle) as r:
        ref = np.stack([np.array(r.predict(w), copy=True).reshape(-1) for w in x])
    assert len(x) >= 200 and np.abs(y - ref).max() <= QDQ_VS_TFLITE_MAX_ABS
    assert (y.argmax(1) == ref.argmax(1)).mean() >= QDQ_VS_TFLITE_ARGMAX


@pytest.mark.parametrize("quant", ["fp16", "int8"])
def test_mlp_on_jetson(mlp, tmp_path, quant):
    out = tmp_path / f"mlp.{quant}"
    res = compile_model(mlp / "mlp.keras", [mlp / "x.npy"], out,
                        CompileOptions(board="jetson-xavier-nx", quant=quant))
    rep = res.report
    dense = [o for o in rep.ops if o.op in ("Gemm", "MatMul")]
    assert len(dense) == 5 and all(o.kernel == "GPU" and o.reason_code == "DLA_MATMUL" for o in dense)
    assert all(o.kernel == "DLA" for o in rep.ops if o.op == "Relu")
    assert rep.drift.passed
    if quant == "int8":
        qdq = rep.accelerator["qdq"]
        assert qdq["weights_per_channel"] == 5
        assert qdq["vs_tflite_int8"]["max_abs_diff"] <= 0.25
        assert all(o.reason_code == "QDQ_FUSED" for o in rep.ops if o.op in ("QuantizeLinear", "DequantizeLinear"))
