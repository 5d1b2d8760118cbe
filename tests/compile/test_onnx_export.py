"""ONNX export for the Jetson backend, checked against Keras (no TensorRT): the converter worker exports the
lowered (tf-keras) model with tf2onnx when asked (``"onnx"`` / ``"onnx_fp16"``), an LSTM stays one ONNX
``LSTM`` node, and onnxruntime agrees with the Keras float outputs on held-out windows.

Measured here (tensorflow-cpu 2.21, tf2onnx 1.17, onnxruntime 1.32, CPUExecutionProvider, 1 thread), max
|ONNX - Keras| (max relative) on the held-out windows of these tests:
  DeepLOB, 256 real windows:         float32 6.6e-7 (3.5e-6)   float16 1.4e-3 (4.3e-3), argmax 100 %
  MLP 64-512-256-128-64-1, 256:      float32 8.9e-8            float16 4.7e-4 (rel 6e-2 on near-zero outputs)
  Keras 3 Sequential LSTM(12), 80:   float32 6.0e-8 (2.3e-7)   float16 9.6e-5 (3.7e-4), argmax 100 %
The float16 figures on the CPU measure float16 *rounding* of weights and activations: ONNX Runtime's CPU
provider has no float16 kernel for several of these ops and casts around them, so float16 *arithmetic*
(TensorRT) can differ somewhat more. The tolerances below sit a little above the measured figures.

The worker runs in its own process (edgehft.compiler.isolate.run_worker): TensorFlow never enters pytest.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from edgehft.compiler.isolate import run_worker
from edgehft.compiler.onnx_check import compare_onnx, run_onnx, softmax_outputs
from edgehft.errors import DriftError

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

FLOAT32_ATOL = 1e-5
FP16_ATOL = {"deeplob": 2e-3, "mlp": 1e-3, "seq_lstm": 2e-4}


def _worker(model: Path, calib: np.ndarray, held: np.ndarray, work: Path, **flags) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    np.savez(work / "calib.npz", x=calib)
    np.savez(work / "eval.npz", x=held)
    req = {"model": str(model), "quant": "float", "lowering": "auto",
           "calib_npz": str(work / "calib.npz"), "eval_npz": str(work / "eval.npz"), **flags}
    return run_worker(req, work / "worker", timeout_s=600)


def _keras_outputs(work: Path) -> list[np.ndarray]:
    with np.load(work / "worker" / "float_outputs.npz") as z:
        return [z[f"out{k}"] for k in range(len(z.files))]


@pytest.fixture(scope="module")
def deeplob_run(tmp_path_factory, deeplob_windows):
    x = deeplob_windows["x"]
    idx = np.linspace(0, len(x) - 1, 272).astype(int)            # spread over the whole capture day
    held = x[idx[16:]]
    work = tmp_path_factory.mktemp("onnx_deeplob")
    info = _worker(ROOT / "examples" / "deeplob" / "deeplob.keras", x[idx[:16]], held, work,
                   onnx=True, onnx_fp16=True)
    return info, work, held


@pytest.fixture(scope="module")
def mlp_run(mlp, tmp_path_factory):
    work = tmp_path_factory.mktemp("onnx_mlp")
    x = np.load(mlp / "x.npy")[:272]
    info = _worker(mlp / "mlp.keras", x[:16], x[16:], work, onnx=True, onnx_fp16=True)
    return info, work, x[16:]


@pytest.fixture(scope="module")
def seq_lstm_run(tmp_path_factory, models):
    work = tmp_path_factory.mktemp("onnx_seq_lstm")
    x = np.load(models / "calib.npy")
    info = _worker(models / "k3_seq_lstm.keras", x[:16], x[16:], work, onnx=True, onnx_fp16=True)
    return info, work, x[16:]



@pytest.mark.slow
def test_deeplob_lstm_stays_one_onnx_lstm_node(deeplob_run):
    info, work, _ = deeplob_run
    assert info["flavour"] == "keras3" and "tf-keras rebuild" in info["lowering"]
    ops = info["onnx"]["float32"]["op_types"]
    assert ops == {"Concat": 1, "Conv": 14, "Gemm": 1, "LSTM": 1, "LeakyRelu": 14, "MaxPool": 1, "Reshape": 2,
                   "Slice": 1, "Softmax": 1, "Squeeze": 2, "Transpose": 1}
    assert info["onnx"]["float32"]["opset"] == 17
    assert info["onnx"]["float32"]["input_names"] == ["lob"]
    assert info["onnx"]["float32"]["output_names"] == ["signal"]
    m = onnx.load(str(work / "worker" / "model.onnx"))
    dims = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 100, 40, 1]                               # static batch 1, as the other boards
    lstm = next(n for n in m.graph.node if n.op_type == "LSTM")
    assert next(a.i for a in lstm.attribute if a.name == "hidden_size") == 64


@pytest.mark.slow
def test_deeplob_float32_matches_keras(deeplob_run):
    info, work, held = deeplob_run
    vs = info["onnx"]["float32"]["vs_keras"]
    assert vs["windows"] == len(held) == 256
    assert vs["max_abs_diff"] <= FLOAT32_ATOL                    # measured 6.6e-7
    assert vs["argmax_agreement"] == 1.0
    with np.load(work / "worker" / "onnx_outputs.npz") as z:
        assert z["out0"].shape == (256, 3)
    # the main-process check (no TensorFlow here) reproduces the worker's figure
    fig = compare_onnx(work / "worker" / "model.onnx", held, _keras_outputs(work), atol=FLOAT32_ATOL)
    assert fig["passed"] and fig["max_abs_diff"] == pytest.approx(vs["max_abs_diff"], abs=1e-7)


@pytest.mark.slow
def test_deeplob_fp16(deeplob_run):
    info, work, held = deeplob_run
    f16 = info["onnx"]["float16"]
    path = work / "worker" / "model_fp16.onnx"
    assert f16["op_types"]["LSTM"] == 1 and f16["op_types"]["Cast"] == 2 and "Loop" not in f16["op_types"]
    m = onnx.load(str(path))
    f32 = onnx.TensorProto.FLOAT
    assert [i.type.tensor_type.elem_type for i in m.graph.input] == [f32]          # I/O stay float32
    assert [o.type.tensor_type.elem_type for o in m.graph.output] == [f32]
    assert {t.data_type for t in m.graph.initializer if t.data_type in (f32, onnx.TensorProto.FLOAT16)} \
        == {onnx.TensorProto.FLOAT16}
    assert path.stat().st_size < 0.6 * (work / "worker" / "model.onnx").stat().st_size
    vs = f16["vs_keras"]
    assert vs["max_abs_diff"] <= FP16_ATOL["deeplob"]            # measured 1.4e-3
    assert vs["argmax_agreement"] >= 0.99                        # measured 1.0
    fig = compare_onnx(path, held, _keras_outputs(work), atol=FP16_ATOL["deeplob"])
    assert fig["passed"] and softmax_outputs(path) == [True]
    with pytest.raises(DriftError, match="differs from the reference"):
        compare_onnx(path, held, _keras_outputs(work), atol=FLOAT32_ATOL)


@pytest.mark.slow
def test_mlp(mlp_run):
    info, work, held = mlp_run
    f32, f16 = info["onnx"]["float32"], info["onnx"]["float16"]
    assert "LSTM" not in f32["op_types"] and "Relu" in f32["op_types"]
    assert f32["input_names"] == ["features"] and f32["output_names"] == ["signal"]
    assert f32["vs_keras"]["max_abs_diff"] <= FLOAT32_ATOL
    assert f32["vs_keras"]["argmax_agreement"] is None           # a regression output, not softmax
    assert f16["vs_keras"]["max_abs_diff"] <= FP16_ATOL["mlp"]
    ys = run_onnx(work / "worker" / "model_fp16.onnx", held)
    assert ys[0].dtype == np.float32 and ys[0].shape == (len(held), 1)


@pytest.mark.slow
def test_keras3_sequential_lstm_exports_as_lstm_node(seq_lstm_run):
    info, work, held = seq_lstm_run
    f32, f16 = info["onnx"]["float32"], info["onnx"]["float16"]
    assert f32["op_types"].get("LSTM") == 1 and "Loop" not in f32["op_types"]
    assert f16["op_types"].get("LSTM") == 1
    assert f32["vs_keras"]["max_abs_diff"] <= FLOAT32_ATOL
    assert f16["vs_keras"]["max_abs_diff"] <= FP16_ATOL["seq_lstm"]
    assert f32["vs_keras"]["argmax_agreement"] == 1.0


@pytest.mark.slow
def test_worker_without_flag_writes_no_onnx(models, tmp_path):
    x = np.load(models / "calib.npy")
    info = _worker(models / "k3_seq_lstm.keras", x[:16], x[16:32], tmp_path)
    assert "onnx" not in info
    assert sorted(p.name for p in (tmp_path / "worker").iterdir() if "onnx" in p.name) == []
    assert (tmp_path / "worker" / "model.tflite").exists()
    json.dumps(info)


def test_to_fp16_keeps_a_hand_built_lstm_correct(tmp_path):
    """No TensorFlow: an ONNX LSTM graph with float32 I/O, converted by to_fp16, runs in onnxruntime."""
    from onnx import TensorProto, helper, numpy_helper

    from edgehft.compiler.onnx_export import to_fp16
    rng = np.random.default_rng(0)
    T, I, H = 7, 5, 4
    w = {"W": rng.normal(0, 0.5, (1, 4 * H, I)), "R": rng.normal(0, 0.5, (1, 4 * H, H)),
         "B": rng.normal(0, 0.1, (1, 8 * H)), "perm_shape": np.array([1, H])}
    inits = [numpy_helper.from_array(v.astype(np.int64 if k == "perm_shape" else np.float32), k)
             for k, v in w.items()]
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node("LSTM", ["xt", "W", "R", "B"], ["", "yh"], hidden_size=H),
             helper.make_node("Reshape", ["yh", "perm_shape"], ["h"]),
             helper.make_node("Softmax", ["h"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, I])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, H])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(tmp_path / "f32.onnx"))
    info = to_fp16(tmp_path / "f32.onnx", tmp_path / "f16.onnx")
    assert info["initializers"] == 3 and info["casts_inserted"] == 2 and info["op_types"]["LSTM"] == 1
    x = rng.standard_normal((32, T, I)).astype(np.float32)
    ref = run_onnx(tmp_path / "f32.onnx", x)
    fig = compare_onnx(tmp_path / "f16.onnx", x, ref, atol=2e-3)
    assert fig["passed"] and fig["argmax_agreement"] >= 0.9 and fig["max_abs_diff"] > 0
    m16 = onnx.load(str(tmp_path / "f16.onnx"))
    lstm = next(n for n in m16.graph.node if n.op_type == "LSTM")
    types = {t.name: t.data_type for t in m16.graph.initializer}
    assert [types[n] for n in lstm.input[1:4]] == [TensorProto.FLOAT16] * 3
    assert types["perm_shape"] == TensorProto.INT64
