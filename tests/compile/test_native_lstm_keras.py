"""The native CPU LSTM kernel (edgehft.kernels.cpu.lstm) against Keras itself and LiteRT's float
UNIDIRECTIONAL_SEQUENCE_LSTM, on tf-keras models built with TensorFlow (tests/make_native_lstm_models.py). The
bounds (BOUND, SAT_BOUND) are reasoned in tests/unit/test_native_lstm.py, where the kernel meets a float64
reference without TensorFlow."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import ROOT, run_maker
from edgehft.kernels.cpu.lstm import NativeLSTM
from native_reference import BOUND, SAT_BOUND


@pytest.fixture(scope="module")
def keras_lstms(tmp_path_factory):
    """tf-keras LSTM models with their float TFLite conversions (tests/make_native_lstm_models.py):
    ``stack`` (T 20, in 13, LSTM(7) -> LSTM(100), sequences), ``deeplob_lstm`` (DeepLOB's LSTM(64)
    over 100 x 192, last step) and ``saturating`` (LSTM(9) whose |c| passes 10)."""
    pytest.importorskip("ai_edge_litert")
    return run_maker(ROOT / "tests" / "make_native_lstm_models.py", tmp_path_factory.mktemp("native_lstm"))


def _cell_clips(tflite: bytes) -> list[float]:
    from ai_edge_litert import schema_py_generated as s
    m = s.ModelT.InitFromPackedBuf(tflite, 0)
    return [op.builtinOptions.cellClip for op in m.subgraphs[0].operators
            if isinstance(op.builtinOptions, s.UnidirectionalSequenceLSTMOptionsT)]


@pytest.mark.parametrize("name", ["stack", "deeplob_lstm", "saturating"])
def test_matches_keras_and_litert_float_lstm(keras_lstms, name):
    """The kernel against Keras itself (no cell clip) and, with the op's cell_clip, against LiteRT
    running the float conversion, where each LSTM is LiteRT's builtin UNIDIRECTIONAL_SEQUENCE_LSTM. On
    ``saturating`` Keras and LiteRT disagree (the converter's cell_clip 10 engages): the kernel follows
    each with the matching option."""
    from ai_edge_litert.interpreter import Interpreter
    d = np.load(keras_lstms / f"{name}.npz")
    nl = sum(1 for f in d.files if f.startswith("W"))
    X, Y = d["X"], d["Y"]
    rs = Y.ndim == 3
    layers = [(d[f"W{i}"], d[f"U{i}"], d[f"b{i}"]) for i in range(nl)]
    clips = _cell_clips((keras_lstms / f"{name}.tflite").read_bytes())
    assert len(set(clips)) == 1 and clips[0] == 10.0, clips
    k = NativeLSTM(layers, X.shape[1], rs)
    kc = NativeLSTM(layers, X.shape[1], rs, cell_clip=clips[0])
    bound = SAT_BOUND if name == "saturating" else BOUND
    it = Interpreter(model_path=str(keras_lstms / f"{name}.tflite"), num_threads=1)
    it.allocate_tensors()
    ops = [o["op_name"] for o in it._get_ops_details()]
    assert ops.count("UNIDIRECTIONAL_SEQUENCE_LSTM") == nl, ops
    i, o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    for w in range(len(X)):
        it.reset_all_variables()    # the op keeps h, c in variable tensors (edgehft's cpu runtime resets them too)
        it.set_tensor(i, X[w:w + 1])
        it.invoke()
        lite = it.get_tensor(o)[0]
        assert np.abs(k.run(X[w]) - Y[w]).max() < bound
        assert np.abs(kc.run(X[w]) - lite).max() < bound
        if name == "saturating":
            assert np.abs(lite - Y[w]).max() > 1e-3
