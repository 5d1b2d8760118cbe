"""The ``native`` plan of the cpu board: a TFLite graph whose UNIDIRECTIONAL_SEQUENCE_LSTM ops run on
edgehft's native LSTM kernel (:mod:`edgehft.kernels.native_lstm`) and every other op on LiteRT.

The graph is cut (:func:`edgehft.compiler.split.split`) into LiteRT segment models between the LSTM ops;
``native.json`` describes the chain (segments and kernel calls, tensors handed over by name) the cpu
runtime executes. Each LSTM's weights are read from the op's inputs (TFLite order: 0 input, 1-4
input_to_{input,forget,cell,output}_weights (H, in), 5-8 recurrent_to_* (H, H), 9-11 peepholes, 12-15 gate
biases, 16-17 projection, 18-19 state variables) and stored in Keras layout (kernel (in, 4H),
recurrent_kernel (H, 4H), bias (4H,)); float32 weights are taken as they are, int8 (dynamic-range) ones
dequantized. ``weights_from`` takes them from another conversion of the same model instead (the auto
plan uses the dynamic-range graph for the other ops and the float conversion's exact LSTM weights).

Refused (:class:`~edgehft.errors.LoweringError`): no LSTM op, peepholes, projection, CIFG (no input
gate), layer norm, activation other than tanh, a projection clip, time-major input, batch other than 1.
The op's ``cell_clip`` (the TF converter writes 10 for a Keras LSTM) is applied by the kernel.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgehft.errors import LoweringError

NATIVE_JSON = "native.json"


def _schema():
    from ai_edge_litert import schema_py_generated as s
    return s


@dataclass
class LstmOp:
    op: int                     # op index in the graph
    kernel: np.ndarray          # (in, 4H) float32, Keras layout
    recurrent: np.ndarray       # (H, 4H)
    bias: np.ndarray            # (4H,)
    cell_clip: float
    input: str                  # tensor names
    output: str
    timesteps: int


def _name(t) -> str:
    return t.name.decode() if isinstance(t.name, bytes) else t.name


def _const(s, m, g, t: int) -> np.ndarray | None:
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
    raise LoweringError(f"LSTM weight {_name(T)} has tensor type {T.type}; the native kernel takes float32 "
                        "or int8 (dynamic-range) weights")


def lstm_ops(model_bytes: bytes) -> list[LstmOp]:
    """Every UNIDIRECTIONAL_SEQUENCE_LSTM of the main subgraph, checked and with Keras-layout weights."""
    s = _schema()
    m = s.ModelT.InitFromPackedBuf(model_bytes, 0)
    g = m.subgraphs[0]
    codes = [max(oc.builtinCode, oc.deprecatedBuiltinCode) for oc in m.operatorCodes]
    found = []
    for k, op in enumerate(g.operators):
        if codes[op.opcodeIndex] != s.BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM:
            continue
        where = f"op #{k} (UNIDIRECTIONAL_SEQUENCE_LSTM)"
        o = op.builtinOptions
        ins = [int(t) for t in op.inputs]
        if o.fusedActivationFunction != s.ActivationFunctionType.TANH:
            raise LoweringError(f"{where}: activation {o.fusedActivationFunction}, the native kernel uses tanh")
        if o.projClip:
            raise LoweringError(f"{where}: proj_clip {o.projClip}; the native kernel has no projection")
        if o.timeMajor:
            raise LoweringError(f"{where}: time-major input; the native kernel takes batch-major (1, T, in)")
        for i, what in ((9, "peephole"), (10, "peephole"), (11, "peephole"), (16, "projection"),
                        (17, "projection"), (20, "layer norm"), (21, "layer norm"), (22, "layer norm"),
                        (23, "layer norm")):
            if i < len(ins) and ins[i] >= 0:
                raise LoweringError(f"{where}: has {what} weights (input {i}); the native kernel has none")
        w = [_const(s, m, g, ins[i]) for i in range(1, 9)]
        b = [_const(s, m, g, ins[i]) for i in range(12, 16)]
        if any(a is None for a in w + b):
            raise LoweringError(f"{where}: a gate's weights or bias are missing or not constant (CIFG?)")
        x = g.tensors[ins[0]]
        if len(x.shape) != 3 or int(x.shape[0]) != 1:
            raise LoweringError(f"{where}: input shape {list(x.shape)}; the native kernel takes (1, T, in)")
        found.append(LstmOp(k, np.concatenate([a.T for a in w[:4]], 1).astype(np.float32),
                            np.concatenate([a.T for a in w[4:]], 1).astype(np.float32),
                            np.concatenate(b).astype(np.float32), float(o.cellClip or 0.0), _name(x),
                            _name(g.tensors[int(op.outputs[0])]), int(x.shape[1])))
    return found


def native_files(model_file: str | Path, weights_from: str | Path | None = None) -> dict[str, bytes]:
    """The native plan's files for the graph ``model_file``: ``native.json``, ``native/seg<i>.tflite``,
    ``native/op<k>.npz`` (kernel, recurrent_kernel, bias, cell_clip). Raises :class:`LoweringError`."""
    from edgehft.compiler.split import split
    data = Path(model_file).read_bytes()
    ops = lstm_ops(data)
    if not ops:
        raise LoweringError(f"{Path(model_file).name} has no UNIDIRECTIONAL_SEQUENCE_LSTM op: nothing for the "
                            "native kernel")
    if weights_from is not None:
        other = lstm_ops(Path(weights_from).read_bytes())
        if [(a.kernel.shape, a.recurrent.shape) for a in other] != [(a.kernel.shape, a.recurrent.shape)
                                                                     for a in ops]:
            raise LoweringError(f"{Path(weights_from).name}'s LSTM ops do not match {Path(model_file).name}'s")
        for a, b in zip(ops, other):
            a.kernel, a.recurrent, a.bias = b.kernel, b.recurrent, b.bias
    s = _schema()
    g = s.ModelT.InitFromPackedBuf(data, 0).subgraphs[0]
    at = {o.op: o for o in ops}
    plan, cur = [], []
    for k in range(len(g.operators)):
        if k in at:
            if cur:
                plan.append(cur)
                cur = []
            plan.append(k)
        else:
            cur.append(k)
    if cur:
        plan.append(cur)
    segs = iter(split(data, [p for p in plan if isinstance(p, list)]))
    files: dict[str, bytes] = {}
    steps = []
    for i, p in enumerate(plan):
        if isinstance(p, list):
            seg = next(segs)
            rel = f"native/seg{i}.tflite"
            files[rel] = seg.data
            steps.append({"kind": "litert", "ops": p, "model": rel, "inputs": seg.inputs, "outputs": seg.outputs})
        else:
            o = at[p]
            rel = f"native/op{p}.npz"
            buf = io.BytesIO()
            np.savez(buf, kernel=o.kernel, recurrent_kernel=o.recurrent, bias=o.bias,
                     cell_clip=np.float32(o.cell_clip))
            files[rel] = buf.getvalue()
            steps.append({"kind": "lstm", "op": p, "weights": rel, "inputs": [o.input], "outputs": [o.output],
                          "timesteps": o.timesteps, "input_size": int(o.kernel.shape[0]),
                          "hidden": int(o.recurrent.shape[0]), "cell_clip": o.cell_clip})
    graph = {"inputs": [_name(g.tensors[int(t)]) for t in g.inputs],
             "outputs": [_name(g.tensors[int(t)]) for t in g.outputs], "steps": steps}
    files[NATIVE_JSON] = (json.dumps(graph, indent=1) + "\n").encode()
    return files
