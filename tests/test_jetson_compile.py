"""compile --board jetson-*: ONNX in the bundle, golden vectors from onnxruntime, predicted TensorRT
placement (layers 1-2 of the Jetson backend; no GPU, no TensorRT here)."""
import json

import numpy as np
import pytest

from conftest import DEEPLOB, FEED_DAY1
from edgehft import runtime
from edgehft.bundle import load_bundle
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.errors import BoardUnavailableError, InputError


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
    with pytest.raises(InputError, match="Q/DQ export"):
        compile_model(DEEPLOB / "deeplob.keras", [FEED_DAY1], tmp_path / "a",
                      CompileOptions(board="jetson-agx-orin", quant="int8"))
    tfl = tmp_path / "m.tflite"
    tfl.write_bytes(b"TFL3")
    with pytest.raises(InputError, match="takes a Keras model"):
        compile_model(tfl, [], tmp_path / "b", CompileOptions(board="jetson-agx-orin"))
