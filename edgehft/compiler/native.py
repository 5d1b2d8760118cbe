"""The native plans of the cpu board: a TFLite graph whose UNIDIRECTIONAL_SEQUENCE_LSTM ops run on
edgehft's native LSTM kernel (:mod:`edgehft.kernels.cpu.lstm`), with ``convs=True`` also its CONV_2D ops
on the native bf16 conv kernel (:mod:`edgehft.kernels.cpu.conv`, a following LEAKY_RELU fused) and the
MAX_POOL_2D / CONCATENATION / RESHAPE / STRIDED_SLICE / FULLY_CONNECTED / SOFTMAX ops fed by native steps
on :mod:`edgehft.kernels.cpu.ops` (reshapes and contiguous slices as views), and
every other op on LiteRT.

The graph is cut (:func:`edgehft.compiler.split.split`) into LiteRT segment models between the native ops;
``native.json`` describes the chain (segments and kernel calls, tensors handed over by name) the cpu
runtime executes. Each LSTM's weights are read from the op's inputs (TFLite order: 0 input, 1-4
input_to_{input,forget,cell,output}_weights (H, in), 5-8 recurrent_to_* (H, H), 9-11 peepholes, 12-15 gate
biases, 16-17 projection, 18-19 state variables) and stored in Keras layout (kernel (in, 4H),
recurrent_kernel (H, 4H), bias (4H,)); float32 weights are taken as they are, int8 (dynamic-range) ones
dequantized. ``weights_from`` takes them from another conversion of the same model instead (the auto
plan uses the dynamic-range graph for the other ops and the float conversion's exact LSTM weights).

Refused (:class:`~edgehft.errors.LoweringError`): no op for a native kernel; an LSTM with peepholes,
projection, CIFG (no input gate), layer norm, activation other than tanh, a projection clip, time-major
input, batch other than 1. The op's ``cell_clip`` (the TF converter writes 10 for a Keras LSTM) is applied
by the kernel. A CONV_2D the conv kernel does not take (dilation, a non-float input, a fused activation
other than relu/relu6/relu_n1_to_1) stays on LiteRT; ``native.json`` says why under ``conv_left_on_litert``.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgehft.compiler.tflite_graph import FUSED_ACTIVATIONS, const_array, schema, tensor_name
from edgehft.errors import LoweringError

NATIVE_JSON = "native.json"


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


@dataclass
class ConvOp:
    op: int                     # the CONV_2D's op index; ``ops`` also holds a fused LEAKY_RELU's
    ops: list
    weights: np.ndarray         # (Co, kh, kw, C) float32, TFLite OHWI
    bias: np.ndarray | None
    in_hw: tuple
    stride: tuple               # (h, w)
    padding: str                # SAME | VALID
    activation: str             # a key of native_conv.ACTIVATIONS
    alpha: float
    input: str
    output: str


def conv_ops(model_bytes: bytes) -> tuple[list[ConvOp], dict[int, str]]:
    """The CONV_2D ops of the main subgraph the native conv kernel takes (float32 activations, batch 1,
    dilation 1, a geometry :func:`edgehft.kernels.cpu.conv.supported` accepts, constant weights), each
    with a directly following LEAKY_RELU fused when the conv's output feeds nothing else; and, per CONV_2D
    left on LiteRT, why."""
    from edgehft.kernels.cpu.conv import supported
    s = schema()
    m = s.ModelT.InitFromPackedBuf(model_bytes, 0)
    g = m.subgraphs[0]
    codes = [max(oc.builtinCode, oc.deprecatedBuiltinCode) for oc in m.operatorCodes]
    B = s.BuiltinOperator
    readers: dict[int, int] = {}
    for op in g.operators:
        for t in op.inputs:
            readers[int(t)] = readers.get(int(t), 0) + 1
    graph_out = {int(t) for t in g.outputs}
    found, skipped = [], {}
    for k, op in enumerate(g.operators):
        if codes[op.opcodeIndex] != B.CONV_2D:
            continue
        o = op.builtinOptions
        ins = [int(t) for t in op.inputs]
        x = g.tensors[ins[0]]
        why = None
        if x.type != s.TensorType.FLOAT32 or len(x.shape) != 4 or int(x.shape[0]) != 1:
            why = "input is not a float32 (1, H, W, C) tensor"
        elif (o.dilationHFactor or 1) != 1 or (o.dilationWFactor or 1) != 1:
            why = "dilation other than 1"
        elif o.fusedActivationFunction not in FUSED_ACTIVATIONS:
            why = f"fused activation {o.fusedActivationFunction}"
        if why is None:
            try:
                w = const_array(s, m, g, ins[1])
                b = const_array(s, m, g, ins[2]) if len(ins) > 2 else None
            except LoweringError as exc:
                w, why = None, str(exc)
            if why is None and (w is None or w.ndim != 4 or int(w.shape[3]) != int(x.shape[3])):
                why = "filter is not a constant (Co, kh, kw, C) tensor"
        if why is None:
            stride, pad = (int(o.strideH), int(o.strideW)), ("SAME" if o.padding == 0 else "VALID")
            in_hw = (int(x.shape[1]), int(x.shape[2]))
            why = supported(in_hw, (int(w.shape[1]), int(w.shape[2])), stride, pad)
        if why:
            skipped[k] = why
            continue
        out = int(op.outputs[0])
        act, alpha, ops = FUSED_ACTIVATIONS[o.fusedActivationFunction], 0.0, [k]
        if (act == "none" and k + 1 < len(g.operators) and codes[g.operators[k + 1].opcodeIndex] == B.LEAKY_RELU
                and [int(t) for t in g.operators[k + 1].inputs] == [out] and readers.get(out) == 1
                and out not in graph_out):
            nxt = g.operators[k + 1]
            act, alpha, ops = "leaky_relu", float(nxt.builtinOptions.alpha), [k, k + 1]
            out = int(nxt.outputs[0])
        found.append(ConvOp(k, ops, w.astype(np.float32), None if b is None else b.astype(np.float32), in_hw,
                            stride, pad, act, alpha, tensor_name(x), tensor_name(g.tensors[out])))
    return found, skipped


def lstm_ops(model_bytes: bytes) -> list[LstmOp]:
    """Every UNIDIRECTIONAL_SEQUENCE_LSTM of the main subgraph, checked and with Keras-layout weights."""
    s = schema()
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
        w = [const_array(s, m, g, ins[i]) for i in range(1, 9)]
        b = [const_array(s, m, g, ins[i]) for i in range(12, 16)]
        if any(a is None for a in w + b):
            raise LoweringError(f"{where}: a gate's weights or bias are missing or not constant (CIFG?)")
        x = g.tensors[ins[0]]
        if len(x.shape) != 3 or int(x.shape[0]) != 1:
            raise LoweringError(f"{where}: input shape {list(x.shape)}; the native kernel takes (1, T, in)")
        found.append(LstmOp(k, np.concatenate([a.T for a in w[:4]], 1).astype(np.float32),
                            np.concatenate([a.T for a in w[4:]], 1).astype(np.float32),
                            np.concatenate(b).astype(np.float32), float(o.cellClip or 0.0), tensor_name(x),
                            tensor_name(g.tensors[int(op.outputs[0])]), int(x.shape[1])))
    return found


def native_files(model_file: str | Path, weights_from: str | Path | None = None, *,
                 convs: bool = False) -> dict[str, bytes]:
    """The native plan's files for the graph ``model_file``: ``native.json``, ``native/seg<i>.tflite``,
    ``native/op<k>.npz`` (LSTM: kernel, recurrent_kernel, bias, cell_clip; conv: weights, bias). With
    ``convs`` the CONV_2D ops the native conv kernel takes run there too, and so does each single LSTM's
    input projection (x_t @ kernel + bias for all T steps, a 1x1 conv over (T, 1, in); the LSTM kernel then
    runs only the recurrence). Raises :class:`LoweringError` when no op goes to a native kernel."""
    from edgehft.compiler.split import split
    data = Path(model_file).read_bytes()
    ops, cops, skipped = _native_ops(data, model_file, weights_from, convs)
    s = schema()
    g = s.ModelT.InitFromPackedBuf(data, 0).subgraphs[0]
    at: dict = {o.op: o for o in ops}
    at.update({c.op: c for c in cops})
    if convs:           # pools, concats, reshapes, ... fed by native steps: no LiteRT segment for them
        from edgehft.compiler.native_moves import MoveOp, move_ops
        outs = {k: o.output for k, o in at.items()}
        at.update({o.op: o for o in move_ops(data, outs, {i for c in cops for i in c.ops[1:]})})
    plan = _step_order(len(g.operators), at)
    segs = iter(split(data, [p for p in plan if isinstance(p, list)]))
    files: dict[str, bytes] = {}
    steps = []
    for i, p in enumerate(plan):
        if isinstance(p, list):
            seg = next(segs)
            rel = f"native/seg{i}.tflite"
            files[rel] = seg.data
            steps.append({"kind": "litert", "ops": p, "model": rel, "inputs": seg.inputs, "outputs": seg.outputs})
        elif convs and isinstance(at[p], MoveOp):
            steps.append(_move_step(at[p], p, files))
        elif isinstance(at[p], ConvOp):
            steps.append(_conv_step(at[p], p, files))
        else:
            steps += _lstm_steps(at[p], p, convs, files)
    graph = {"inputs": [tensor_name(g.tensors[int(t)]) for t in g.inputs],
             "outputs": [tensor_name(g.tensors[int(t)]) for t in g.outputs], "steps": steps,
             "conv_left_on_litert": {str(k): v for k, v in skipped.items()}}
    files[NATIVE_JSON] = (json.dumps(graph, indent=1) + "\n").encode()
    return files


def _native_ops(data: bytes, model_file: str | Path, weights_from: str | Path | None,
                convs: bool) -> tuple[list, list, dict]:
    """``(lstm ops, conv ops, convs left on LiteRT)`` of the graph ``data``, the LSTM weights taken from
    ``weights_from`` when given; :class:`LoweringError` when there is nothing for the native kernels or
    ``weights_from``'s LSTMs do not match."""
    ops = lstm_ops(data)
    cops, skipped = conv_ops(data) if convs else ([], {})
    if not ops and not cops:
        raise LoweringError(f"{Path(model_file).name} has no UNIDIRECTIONAL_SEQUENCE_LSTM op"
                            + (" and no CONV_2D op the native conv kernel takes" if convs else "")
                            + ": nothing for the native kernels")
    if weights_from is not None:
        other = lstm_ops(Path(weights_from).read_bytes())
        if [(a.kernel.shape, a.recurrent.shape) for a in other] != [(a.kernel.shape, a.recurrent.shape)
                                                                     for a in ops]:
            raise LoweringError(f"{Path(weights_from).name}'s LSTM ops do not match {Path(model_file).name}'s")
        for a, b in zip(ops, other):
            a.kernel, a.recurrent, a.bias = b.kernel, b.recurrent, b.bias
    return ops, cops, skipped


def _step_order(n_ops: int, at: dict) -> list:
    """The plan in graph order: an op index for each native step (a conv step spans its fused ops), a list
    of op indices for each run of ops left on LiteRT."""
    plan, cur, k = [], [], 0
    while k < n_ops:
        if k in at:
            if cur:
                plan.append(cur)
                cur = []
            plan.append(k)
            k += len(at[k].ops) if isinstance(at[k], ConvOp) else 1
        else:
            cur.append(k)
            k += 1
    if cur:
        plan.append(cur)
    return plan


def _npz(**arrays) -> bytes:
    """``arrays`` as the bytes of an uncompressed .npz."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _move_step(o, p: int, files: dict) -> dict:
    """The step of data-movement op ``o`` at op ``p``; its arrays (if any) go to ``files``."""
    step = {"kind": o.kind, "op": p, "ops": [p], "inputs": o.inputs, "outputs": [o.output], **o.params}
    if o.arrays:
        rel = f"native/op{p}.npz"
        files[rel] = _npz(**o.arrays)
        step["weights"] = rel
    return step


def _conv_step(o: ConvOp, p: int, files: dict) -> dict:
    """The native conv step of ``o`` at op ``p``; its weights (and bias) go to ``files``."""
    rel = f"native/op{p}.npz"
    files[rel] = _npz(weights=o.weights, **({} if o.bias is None else {"bias": o.bias}))
    return {"kind": "conv2d", "op": p, "ops": o.ops, "weights": rel, "inputs": [o.input],
            "outputs": [o.output], "in_hw": list(o.in_hw), "channels": int(o.weights.shape[3]),
            "stride": list(o.stride), "padding": o.padding, "activation": o.activation,
            "alpha": o.alpha}


def _lstm_steps(o: LstmOp, p: int, convs: bool, files: dict) -> list[dict]:
    """The native LSTM step of ``o`` at op ``p``, after its input projection as a conv step when
    ``convs`` (the native-bf16 plan, whose LSTM also keeps its recurrent kernel in bf16: ``"recurrent":
    "bf16"``); the weights go to ``files``."""
    steps = []
    src = o.input
    if convs:                   # the input projection on the conv kernel: (T, 1, in) -> (T, 1, 4H)
        src = f"{o.input}@projection(op{p})"
        prel = f"native/op{p}_projection.npz"
        files[prel] = _npz(weights=np.ascontiguousarray(o.kernel.T[:, None, None, :]), bias=o.bias)
        steps.append({"kind": "conv2d", "op": p, "ops": [p], "weights": prel, "inputs": [o.input],
                      "outputs": [src], "in_hw": [o.timesteps, 1], "channels": int(o.kernel.shape[0]),
                      "stride": [1, 1], "padding": "VALID", "activation": "none", "alpha": 0.0,
                      "what": "LSTM input projection"})
    steps.append({"kind": "lstm", "op": p, "weights": f"native/op{p}.npz", "inputs": [src],
                  "outputs": [o.output], "timesteps": o.timesteps, "input_size": int(o.kernel.shape[0]),
                  "hidden": int(o.recurrent.shape[0]), "cell_clip": o.cell_clip, "projected": bool(convs),
                  **({"recurrent": "bf16"} if convs else {})})
    files[f"native/op{p}.npz"] = _npz(kernel=o.kernel, recurrent_kernel=o.recurrent, bias=o.bias,
                                      cell_clip=np.float32(o.cell_clip))
    return steps
