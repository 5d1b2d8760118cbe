"""The TFLite reader on real files: the Coral test-data models and their compiled twins."""
import pytest

from conftest import SHARED
from edgehft.errors import InputError
from edgehft.ir import TFLiteModel

PAIRS = SHARED / "edgetpu_pairs" / "google-coral__test_data"


@pytest.mark.needs("edgetpu-pairs")
def test_reads_quantized_lstm_model():
    m = TFLiteModel.from_file(PAIRS / "keras_lstm_mnist_ptq.tflite")
    assert m.op_names() == ["QUANTIZE", "UNIDIRECTIONAL_SEQUENCE_LSTM", "RESHAPE", "FULLY_CONNECTED",
                            "SOFTMAX", "QUANTIZE"]
    t = m.main.tensors[m.main.inputs[0]]
    assert (t.shape, t.dtype) == ((1, 28, 28), "uint8")
    assert t.quant.zero_point.tolist() == [0] and abs(float(t.quant.scale[0]) - 1 / 255) < 1e-7
    fc = next(op for op in m.main.ops if op.name == "FULLY_CONNECTED")
    w = m.main.tensors[fc.inputs[1]]
    assert w.is_constant and m.buffer(w).shape == w.shape


@pytest.mark.needs("edgetpu-pairs")
def test_reads_compiled_edgetpu_model():
    m = TFLiteModel.from_file(PAIRS / "keras_lstm_mnist_ptq_edgetpu.tflite")
    assert m.op_names() == ["CUSTOM:edgetpu-custom-op"]
    assert m.main.ops[0].custom_options[:0] == b"" and len(m.main.ops[0].custom_options) > 0


def test_rejects_non_tflite(tmp_path):
    p = tmp_path / "x.tflite"
    p.write_bytes(b"not a model at all")
    with pytest.raises(InputError, match="not a TFLite model"):
        TFLiteModel.from_file(p)


@pytest.mark.needs("edgetpu-pairs")
def test_rejects_truncated_model(tmp_path):
    data = (PAIRS / "keras_lstm_mnist_ptq.tflite").read_bytes()
    p = tmp_path / "cut.tflite"
    p.write_bytes(data[:200])
    with pytest.raises(InputError, match="malformed|truncated"):
        TFLiteModel.from_file(p)
