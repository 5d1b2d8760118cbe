"""The small ops of the native-bf16 plan (:mod:`edgehft.compiler.native`): MAX_POOL_2D, CONCATENATION,
RESHAPE, STRIDED_SLICE, FULLY_CONNECTED, SOFTMAX, TANH, LOGISTIC and zero PAD along H/W run natively (:mod:`edgehft.kernels.cpu.ops`; reshapes
and contiguous slices as views) when every input they read comes from a native step or the graph's input,
so a chain of native kernels is not cut by a LiteRT segment for them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgehft.compiler.tflite_graph import FUSED_ACTIVATIONS, const_array, schema, tensor_name


@dataclass
class MoveOp:
    """A MAX_POOL_2D, CONCATENATION, RESHAPE, STRIDED_SLICE (a view), FULLY_CONNECTED or SOFTMAX that runs
    natively because its inputs come from native steps (a LiteRT segment would cost more than the op)."""
    op: int
    kind: str                   # maxpool | concat | reshape | slice | fc | softmax | act | pad
    inputs: list
    output: str
    params: dict
    arrays: dict | None = None  # fc: weights (M, N), bias (M,)

    @property
    def ops(self):
        return [self.op]


def _slice_index(s, m, g, op) -> list | None:
    """A STRIDED_SLICE's constant begin/end/strides and masks as per-dim numpy slices (``{"start", "stop",
    "step"}`` or ``{"index"}`` for a shrunk axis); None when it needs ellipsis/new-axis masks or offsets."""
    o = op.builtinOptions
    if o.ellipsisMask or o.newAxisMask or getattr(o, "offset", False):
        return None
    consts = [_const_int(s, m, g, int(t)) for t in op.inputs[1:4]]
    if any(c is None for c in consts):
        return None
    begin, end, strides = consts
    idx = []
    for i, (b, e, st) in enumerate(zip(begin, end, strides)):
        if o.shrinkAxisMask >> i & 1:
            idx.append({"index": int(b)})
        else:
            idx.append({"start": None if o.beginMask >> i & 1 else int(b),
                        "stop": None if o.endMask >> i & 1 else int(e), "step": int(st)})
    return idx


def _const_int(s, m, g, t: int):
    T = g.tensors[t]
    data = m.buffers[T.buffer].data if T.buffer > 0 else None
    if data is None or len(data) == 0 or T.type not in (s.TensorType.INT32, s.TensorType.INT64):
        return None
    return np.frombuffer(np.asarray(data, np.uint8).tobytes(),
                         np.int32 if T.type == s.TensorType.INT32 else np.int64).tolist()


def _pad_params(s, m, g, op, x) -> dict | None:
    """A PAD with constant zero padding of a (1, H, C) or (1, H, W, C) float32 tensor along H / W only:
    ``{"in_hw", "channels", "pads": [top, bottom, left, right]}``; None for anything else (LiteRT pads it)."""
    pads = _const_int(s, m, g, int(op.inputs[1]))
    shape = [int(d) for d in x.shape]
    if pads is None or len(pads) != 2 * len(shape) or len(shape) not in (3, 4) or shape[0] != 1 or \
            pads[0] or pads[1] or pads[-2] or pads[-1] or min(pads) < 0:
        return None
    if len(shape) == 3:
        return {"in_hw": [shape[1], 1], "channels": shape[2], "pads": [pads[2], pads[3], 0, 0]}
    return {"in_hw": shape[1:3], "channels": shape[3], "pads": pads[2:6]}


def _elementwise(s, m, g, B, op, code, shape, x) -> tuple:
    """``(kind, params)`` of a SOFTMAX, TANH, LOGISTIC or PAD (params None: it stays on LiteRT)."""
    if code == B.SOFTMAX:
        return "softmax", {"shape": shape, "beta": float(op.builtinOptions.beta)}
    if code in (B.TANH, B.LOGISTIC):
        return "act", {"shape": shape, "act": "tanh" if code == B.TANH else "logistic"}
    return "pad", _pad_params(s, m, g, op, x)


def move_ops(model_bytes: bytes, native_outputs: dict[int, str], fused: set[int]) -> list[MoveOp]:
    """Walk the graph in order; a float32 MAX_POOL_2D (batch 1, 4-D), CONCATENATION (no fused activation),
    RESHAPE, STRIDED_SLICE (constant, no ellipsis/new-axis: a view), FULLY_CONNECTED (constant float32
    weights) or SOFTMAX whose non-constant inputs are all the graph's inputs or outputs of native steps
    (``native_outputs``: op index -> output name, the native kernels' and the ones found so far) runs
    natively. ``fused``: op indices already inside a native step."""
    s = schema()
    m = s.ModelT.InitFromPackedBuf(model_bytes, 0)
    g = m.subgraphs[0]
    B = s.BuiltinOperator
    codes = [max(oc.builtinCode, oc.deprecatedBuiltinCode) for oc in m.operatorCodes]
    avail = {tensor_name(g.tensors[int(t)]) for t in g.inputs}
    found = []
    for k, op in enumerate(g.operators):
        if k in native_outputs:
            avail.add(native_outputs[k])
            continue
        if k in fused:
            continue
        code = codes[op.opcodeIndex]
        if code not in (B.MAX_POOL_2D, B.CONCATENATION, B.RESHAPE, B.STRIDED_SLICE, B.FULLY_CONNECTED, B.SOFTMAX,
                        B.TANH, B.LOGISTIC, B.PAD):
            continue
        ins = [int(t) for t in op.inputs if int(t) >= 0]
        data = ins[:1] if code in (B.RESHAPE, B.STRIDED_SLICE, B.FULLY_CONNECTED, B.SOFTMAX, B.TANH, B.LOGISTIC,
                                   B.PAD) else \
            [t for t in ins if const_array(s, m, g, t) is None]
        names = [tensor_name(g.tensors[t]) for t in data]
        out_t = g.tensors[int(op.outputs[0])]
        if not names or any(n not in avail for n in names) or out_t.type != s.TensorType.FLOAT32 or any(
                g.tensors[t].type != s.TensorType.FLOAT32 for t in data):
            continue
        o = op.builtinOptions
        shape = [int(d) for d in out_t.shape]
        arrays = None
        if -1 in shape:
            continue
        if code == B.STRIDED_SLICE:
            idx = _slice_index(s, m, g, op)
            if idx is None:
                continue
            params, kind = {"index": idx, "shape": shape}, "slice"
        elif code == B.FULLY_CONNECTED:
            w = const_array(s, m, g, int(op.inputs[1])) if g.tensors[int(op.inputs[1])].type == s.TensorType.FLOAT32 \
                else None
            b = const_array(s, m, g, int(op.inputs[2])) if len(op.inputs) > 2 and int(op.inputs[2]) >= 0 else None
            x = g.tensors[data[0]]
            if (w is None or w.ndim != 2 or o.fusedActivationFunction not in FUSED_ACTIVATIONS or getattr(o, "weightsFormat", 0)
                    or int(np.prod([int(d) for d in x.shape])) % w.shape[1]):
                continue
            rows = int(np.prod([int(d) for d in x.shape])) // w.shape[1]
            params = {"rows": rows, "shape": shape, "activation": FUSED_ACTIVATIONS[o.fusedActivationFunction]}
            arrays = {"weights": w.astype(np.float32), **({} if b is None else {"bias": b.astype(np.float32)})}
            kind = "fc"
        elif code in (B.SOFTMAX, B.TANH, B.LOGISTIC, B.PAD):
            kind, params = _elementwise(s, m, g, B, op, code, shape, g.tensors[data[0]])
            if params is None:
                continue
        elif code == B.MAX_POOL_2D:
            x = g.tensors[data[0]]
            if len(x.shape) != 4 or int(x.shape[0]) != 1 or o.fusedActivationFunction not in FUSED_ACTIVATIONS:
                continue
            params = {"in_hw": [int(x.shape[1]), int(x.shape[2])], "channels": int(x.shape[3]),
                      "filter": [int(o.filterHeight), int(o.filterWidth)], "stride": [int(o.strideH), int(o.strideW)],
                      "padding": "SAME" if o.padding == 0 else "VALID", "activation": FUSED_ACTIVATIONS[o.fusedActivationFunction]}
            kind = "maxpool"
        elif code == B.CONCATENATION:
            if o.fusedActivationFunction != 0 or len(data) != len(ins):      # a constant operand: LiteRT
                continue
            params = {"input_shapes": [[int(d) for d in g.tensors[t].shape] for t in data], "axis": int(o.axis)}
            kind = "concat"
        else:
            params = {"shape": shape}
            kind = "reshape"
        found.append(MoveOp(k, kind, names, tensor_name(out_t), params, arrays))
        native_outputs[k] = tensor_name(out_t)
        avail.add(tensor_name(out_t))
    return found
