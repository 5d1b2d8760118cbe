"""Compile small real models through the isolated TensorFlow converter: LSTM lowering in both Keras
flavours, clear errors for layers that cannot be lowered, crash and hang isolation, quant modes."""
import numpy as np
import pytest

from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.errors import ConverterError, InputError, LoweringError
from edgehft.ir import TFLiteModel

pytestmark = pytest.mark.slow


def _compile(models, name, tmp_path, calib="calib.npy", **kw):
    opts = CompileOptions(board="cpu", calib_windows=48, drift_windows=48, **{"quant": "int8", **kw})
    return compile_model(models / name, [models / calib], tmp_path / name.replace(".", "_"), opts)


@pytest.mark.parametrize("name,flavour", [("k3_lstm.keras", "keras3"), ("tfk_lstm.h5", "tf-keras"),
                                          ("k3_seq_lstm.keras", "keras3")])
def test_lstm_becomes_fused_op_in_both_flavours(models, tmp_path, name, flavour):
    res = _compile(models, name, tmp_path)
    ops = TFLiteModel.from_file(res.bundle.model_path).op_names()
    assert "UNIDIRECTIONAL_SEQUENCE_LSTM" in ops and "WHILE" not in ops
    m = res.bundle.manifest
    assert m.source.flavour == flavour
    assert m.inputs[0].dtype == "int8" and m.outputs[0].dtype == "int8"
    lstm = next(o for o in res.report.ops if o.op == "UNIDIRECTIONAL_SEQUENCE_LSTM")
    assert lstm.layer == "lstm" and lstm.dtype == "int8" and lstm.placement == "cpu"
    assert res.report.drift.outputs[0].argmax_agreement is not None   # softmax output: classifier


@pytest.mark.parametrize("name,calib,flavour,op", [
    ("tfk_lstm_savedmodel", "calib.npy", "tf-keras", "UNIDIRECTIONAL_SEQUENCE_LSTM"),
    ("k3_mlp_savedmodel", "calib_mlp.npy", "saved-model", "FULLY_CONNECTED")])
def test_savedmodel_directories(models, tmp_path, name, calib, flavour, op):
    res = _compile(models, name, tmp_path, calib=calib)
    assert res.bundle.manifest.source.flavour == flavour
    ops = TFLiteModel.from_file(res.bundle.model_path).op_names()
    assert op in ops and "WHILE" not in ops
    assert res.report.drift.passed


def test_gru_is_refused_with_the_layer_named(models, tmp_path):
    with pytest.raises(LoweringError, match=r"'gru' \(GRU\) cannot be lowered.*WHILE") as exc:
        _compile(models, "k3_gru.keras", tmp_path)
    assert "unroll=True" in exc.value.hint
    assert "it works on cpu" in exc.value.hint and "Edge TPU" not in exc.value.hint      # the cpu board's line
    assert not (tmp_path / "k3_gru_keras").exists()


def test_the_gru_hint_says_what_works_on_each_board(models, tmp_path):
    """Issue 19: a GRU refused for Coral says to use LSTM there (an unrolled GRU's UNPACK / SPLIT_V do not map;
    the numbers are edgehft's own prediction for tests/make_models.py's k3_gru_unrolled); without a board the
    hint names every family."""
    from edgehft.compiler.lowering import GRU_ON_BOARD, recurrent_hint
    with pytest.raises(LoweringError, match=r"'gru' \(GRU\) cannot be lowered") as exc:
        compile_model(models / "k3_gru.keras", [models / "calib.npy"], tmp_path / "gru.coral",
                      CompileOptions(board="coral-usb", calib_windows=48, drift_windows=48))
    assert exc.value.hint.startswith("TFLite has no fused GRU: use LSTM: its UNIDIRECTIONAL_SEQUENCE_LSTM op maps")
    assert "294 of 297 ops" in exc.value.hint and "unroll=True" not in exc.value.hint
    every = recurrent_hint("GRU")
    assert all(line in every for line in GRU_ON_BOARD.values()) and recurrent_hint("SimpleRNN", "cpu") == \
        "pass unroll=True to the layer (static sequence length)"


def test_raw_keras_op_is_refused(models, tmp_path):
    with pytest.raises(LoweringError, match="raw keras.ops call") as exc:
        _compile(models, "k3_rawop.keras", tmp_path)
    assert "keras.layers" in exc.value.hint


def test_gru_in_tf_keras_is_refused_before_conversion(models, tmp_path):
    with pytest.raises(LoweringError, match=r"'gru' \(GRU\) cannot be lowered"):
        _compile(models, "tfk_gru.h5", tmp_path)


def test_converter_crash_is_reported_not_inherited(models, tmp_path):
    # A tf-keras GRU sent to the full-int8 converter as is segfaults TensorFlow (a real crash).
    with pytest.raises(ConverterError, match=r"crashed \(SIG[A-Z]+\) during step 'convert \(int8\)'") as exc:
        _compile(models, "tfk_gru.h5", tmp_path, lowering="native")
    assert "--lowering native" in exc.value.hint


def test_converter_hang_is_stopped(models, tmp_path):
    with pytest.raises(ConverterError, match="did not finish within 1 s"):
        _compile(models, "k3_lstm.keras", tmp_path, timeout_s=1.0)


@pytest.mark.parametrize("quant,io_dtype,weights", [("dynamic", "float32", "int8"),
                                                    ("fp16", "float32", "float16"),
                                                    ("float", "float32", "float32")])
def test_quantization_modes(models, tmp_path, quant, io_dtype, weights):
    res = _compile(models, "k3_mlp.keras", tmp_path, calib="calib_mlp.npy", quant=quant)
    m = res.bundle.manifest
    assert m.quantization.mode == quant and m.inputs[0].dtype == io_dtype
    ir = TFLiteModel.from_file(res.bundle.model_path)
    const_dtypes = {t.dtype for t in ir.main.tensors if t.is_constant and len(t.shape) == 2}
    assert weights in const_dtypes
    assert m.golden.compare == "allclose"
    assert res.report.drift.passed and res.report.drift.outputs[0].argmax_agreement is None


def test_int8_mlp_drift_and_io(models, tmp_path):
    res = _compile(models, "k3_mlp.keras", tmp_path, calib="calib_mlp.npy")
    out = res.bundle.manifest.outputs[0]
    assert out.name == "signal" and out.dtype == "int8" and out.shape == [1, 1]
    d = res.report.drift.outputs[0]
    assert 0 < d.mae_rel < 0.01 and d.max_abs >= d.mae


def test_nan_calibration_is_refused(models, tmp_path):
    x = np.load(models / "calib.npy")
    x[5, 3, 2] = np.nan
    np.save(tmp_path / "bad.npy", x)
    with pytest.raises(InputError, match=r"window 5 \(of \d+\) holds NaN.* first at \(5, 3, 2\)"):
        compile_model(models / "k3_lstm.keras", [tmp_path / "bad.npy"], tmp_path / "out", CompileOptions())


def test_wrong_window_shape_is_refused(models, tmp_path):
    with pytest.raises(InputError, match=r"shape \(16,\), the model takes \(20, 8\)"):
        _compile(models, "k3_lstm.keras", tmp_path, calib="calib_mlp.npy")


def test_malformed_model_file(tmp_path, models):
    bad = tmp_path / "broken.keras"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(InputError, match="not a valid .keras archive"):
        compile_model(bad, [models / "calib.npy"], tmp_path / "out", CompileOptions())


@pytest.mark.parametrize("quant", ["float", "int8"])
@pytest.mark.parametrize("name, outputs", [("k3_two_heads.keras", ["a", "b"]),
                                           ("k3_three_heads.keras", ["z_first", "a_second", "m_third"])])
def test_a_multi_output_model_keeps_its_outputs_order(models, tmp_path, quant, name, outputs):
    """Two heads ``a`` and ``b`` of one value each: the converter lists the graph's outputs as (b, a); the bundle's
    output k is still the Keras model's output k (worker.outputs_in_order), so its names are right and each
    output's drift against Keras is its own (it was 46 % with the outputs swapped). Three heads of three shapes:
    the tf-keras rebuild check compares them one by one (np.asarray of the list failed: exit 4)."""
    res = _compile(models, name, tmp_path, calib="calib_mlp.npy", quant=quant)
    assert [o.name for o in res.bundle.manifest.outputs] == outputs
    d = res.report.drift
    assert [o.name for o in d.outputs] == outputs, d
    assert all(o.mae_rel < (1e-5 if quant == "float" else 0.03) for o in d.outputs), d
