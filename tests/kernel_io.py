"""LiteRT per-op capture and the FPGA int8 kernels' test inputs, shared by tests/compile/test_kernel_reference.py
(the numpy golden model, edgehft.kernels.fpga.reference, against LiteRT) and tests/emulated/test_kernel_csim.py
(the kernels' C++ against both): the interpreter paths and each path's FULLY_CONNECTED requantization, op
capture, DeepLOB's inputs, the stress models (tests/make_kernel_models.py) and their inputs, a scale patcher."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from edgehft.bundle import load_bundle
from edgehft.ir.tflite_model import TFLiteModel

MAKER = Path(__file__).resolve().parent / "make_kernel_models.py"
PATHS = ("AUTO", "BUILTIN_WITHOUT_DEFAULT_DELEGATES", "BUILTIN_REF")
FC_MODE = {"AUTO": "fp32", "BUILTIN_WITHOUT_DEFAULT_DELEGATES": "ruy-x86", "BUILTIN_REF": "float64"}


def capture(model: str | Path | bytes, inputs: np.ndarray, kind: str, tensors) -> dict[int, np.ndarray]:
    """Run ``inputs`` (raw, one window per row, no batch axis) through LiteRT on path ``kind`` and
    return ``{tensor index: stacked values}`` for ``tensors`` (each window from reset variables)."""
    from ai_edge_litert import interpreter as lit
    src = {"model_content": bytes(model)} if isinstance(model, (bytes, bytearray)) else {"model_path": str(model)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)       # "preserve_all_tensors is for debugging"
        it = lit.Interpreter(**src, experimental_op_resolver_type=getattr(lit.OpResolverType, kind),
                             experimental_preserve_all_tensors=True, num_threads=1)
    it.allocate_tensors()
    index = it.get_input_details()[0]["index"]
    out = {t: [] for t in tensors}
    for x in inputs:
        it.set_tensor(index, x[None])
        it.reset_all_variables()          # the LSTM state lives in variable tensors Invoke updates
        it.invoke()
        for t in tensors:
            out[t].append(it.get_tensor(t)[0].copy())
    return {t: np.stack(v) for t, v in out.items()}


def op_io(model: TFLiteModel, names=("FULLY_CONNECTED", "UNIDIRECTIONAL_SEQUENCE_LSTM")):
    """The ops to check and every tensor to capture: op input and output, LSTM state variables."""
    ops = [op for op in model.main.ops if op.name in names]
    states = [t for op in ops if op.name != "FULLY_CONNECTED" for t in op.inputs[18:20]]
    return ops, sorted({t for op in ops for t in (op.inputs[0], op.outputs[0])} | set(states))


def deeplob_inputs(deeplob_bundle, deeplob_windows):
    """``(bundle, model, inputs, lstm op, last FC op)``: the 16 golden windows plus 200 real windows spread
    over the feed, quantized with the input's scale (round half away from zero, as TFLite's QUANTIZE)."""
    bundle = load_bundle(deeplob_bundle)
    model = TFLiteModel.from_file(bundle.model_path)
    golden = bundle.golden()[0]["lob"]
    spec = bundle.manifest.inputs[0]
    x = deeplob_windows["x"][np.linspace(0, len(deeplob_windows["x"]) - 1, 200).astype(int)]
    v = x.astype(np.float32) / np.float32(spec.scale[0])
    q = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5) + spec.zero_point[0], -128, 127).astype(np.int8)
    inputs = np.concatenate([golden, q.reshape(len(q), *golden.shape[1:])])
    (lstm,) = [op for op in model.main.ops if op.name == "UNIDIRECTIONAL_SEQUENCE_LSTM"]   # op 31
    fc = [op for op in model.main.ops if op.name == "FULLY_CONNECTED"][-1]                 # op 33
    return bundle, model, inputs, lstm, fc


@pytest.fixture(scope="module")
def kernel_models(tmp_path_factory) -> Path:
    """The stress models of tests/make_kernel_models.py (one TensorFlow subprocess), in one directory."""
    out = tmp_path_factory.mktemp("kernel_models")
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1"}
    res = subprocess.run([sys.executable, str(MAKER), str(out)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def stress_inputs(shape, n: int, seed: int) -> np.ndarray:
    """Random int8 windows, plus all -128, all 127, alternating extremes and a step from -128 to 127."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (n, *shape)).astype(np.int8)
    x[0], x[1] = -128, 127
    x[2] = np.where(np.indices(shape).sum(axis=0) % 2 == 0, 127, -128)
    x[3] = 127
    x[3][: shape[0] // 2] = -128
    return x


def patch_scales(data: bytes, scales: dict[int, float]) -> bytes:
    """A copy of a .tflite with the quantization scales of some tensors overwritten in place."""
    import tflite
    buf = bytearray(data)
    g = tflite.Model.GetRootAsModel(buf, 0).Subgraphs(0)
    for t, s in scales.items():
        if t < 0:                                           # an omitted optional input (no bias)
            continue
        q = g.Tensors(t).Quantization()
        pos, n = q._tab.Vector(q._tab.Offset(8)), q.ScaleLength()       # field 2: scale
        buf[pos:pos + 4 * n] = np.full(n, s, np.float32).tobytes()
    return bytes(buf)
