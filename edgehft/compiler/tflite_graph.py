"""Reading a TFLite graph through the schema's object API (``ModelT``), shared by the native-plan builders
(:mod:`edgehft.compiler.native`, :mod:`edgehft.compiler.native_moves`): the schema module, tensor names,
constant tensors as float32 arrays, the fused-activation codes the native kernels take."""
from __future__ import annotations

import numpy as np

from edgehft.errors import LoweringError

# ActivationFunctionType codes (tflite schema) the native kernels apply after their sum
FUSED_ACTIVATIONS = {0: "none", 1: "relu", 2: "relu_n1_to_1", 3: "relu6"}


def schema():
    """The tflite schema's generated Python module (from ai-edge-litert)."""
    from ai_edge_litert import schema_py_generated as s
    return s


def tensor_name(t) -> str:
    """A ``TensorT``'s name as str."""
    return t.name.decode() if isinstance(t.name, bytes) else t.name


def const_array(s, m, g, t: int) -> np.ndarray | None:
    """Tensor ``t`` of subgraph ``g`` of model ``m`` (``s``: the schema module) as a float32 array with its
    shape, int8 weights dequantized per tensor or per channel (``real = (q - zero_point) * scale``, the TFLite
    spec); None for an absent (-1) or non-constant tensor.

    Raises:
        LoweringError: a constant of another tensor type.
    """
    if t < 0:
        return None
    T = g.tensors[t]
    data = m.buffers[T.buffer].data if T.buffer > 0 else None
    if data is None or len(data) == 0:
        return None
    raw = np.asarray(data, np.uint8).tobytes()
    shape = [int(d) for d in T.shape]
    if T.type == s.TensorType.FLOAT32:
        return np.frombuffer(raw, np.float32).reshape(shape).copy()
    if T.type == s.TensorType.INT8 and T.quantization is not None and T.quantization.scale is not None:
        q = np.frombuffer(raw, np.int8).reshape(shape).astype(np.float32)
        sc = np.asarray(T.quantization.scale, np.float32)
        zp = np.asarray(T.quantization.zeroPoint if T.quantization.zeroPoint is not None else [0], np.float32)
        if sc.size > 1:
            shp = [1] * q.ndim
            shp[T.quantization.quantizedDimension] = -1
            sc, zp = sc.reshape(shp), zp.reshape(shp)
        return (q - zp) * sc
    raise LoweringError(f"LSTM weight {tensor_name(T)} has tensor type {T.type}; the native kernel takes float32 "
                        "or int8 (dynamic-range) weights")
