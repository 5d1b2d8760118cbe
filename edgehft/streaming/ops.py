"""Per-op rules of the streaming analysis: how each TFLite op carries the time axis and which input rows each
output row reads (:mod:`edgehft.streaming.rows` turns those taps into cached / constant / prepared /
critical rows).

The op semantics followed are TFLite's builtin kernels (tensorflow/lite/kernels: conv.cc,
depthwise_conv.cc, pooling.cc, fully_connected.cc, batch_matmul.cc, strided_slice.cc, pad.cc,
mirror_pad.cc, reduce.cc, concatenation.cc, gather.cc, split.cc, unidirectional_sequence_lstm.cc) and the
schema's options (tensorflow/lite/schema/schema.fbs): NHWC activations, OHWI conv filters, (1, kh, kw, C)
depthwise filters, FULLY_CONNECTED weights (out, in) applied to the input viewed as (-1, in), SAME padding
with ``pad_before = pad_total // 2`` (a (4,1) kernel pads 1 row above and 2 below), LSTM inputs in the
order 0 input, 1-4 input-to-gate weights, 5-8 recurrent weights, 9-11 peepholes, 12-15 biases, 16-17
projection, 18-19 hidden and cell state.

:func:`analyze_op` returns an :class:`Outcome` per op: the state of each output tensor, the MACs, and for
an op that makes a streaming plan impossible the reason (``refused``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgehft.streaming.rows import CONSTANT, CRITICAL, POOL_PAD, PREPARED, ZERO, Rows, Whole

_SAME, _VALID = 0, 1           # tflite.Padding


@dataclass
class Outcome:
    """What one op does to the rows: ``outputs`` (tensor -> Rows | Whole), ``macs_full`` (its MACs over the
    whole window), ``macs_row`` (per row of its first output, for time-local ops), ``recurrence`` (for
    LSTM/RNN: ``proj_row`` MACs per input row, ``step`` MACs per step, the input rows' and the steps'
    statuses), ``refused`` (why no streaming plan can have it, or None) and a ``note`` for the reason."""

    outputs: dict
    macs_full: int = 0
    macs_row: int | None = None
    recurrence: dict | None = None
    refused: str | None = None
    note: str = ""


def _prod(xs) -> int:
    return int(np.prod(xs)) if len(xs) else 1


def _fixed(env, t: int) -> bool:
    """Tensor ``t`` is the same in every window: omitted, a constant, or computed from constants only."""
    s = env.state.get(t)
    return t < 0 or env.is_const(t) or (isinstance(s, Whole) and s.status == CONSTANT)


def _hybrid(env, op) -> bool:
    """A dynamic-range op: float activations, int8 / uint8 weights (input 1). TFLite quantizes the input of a
    hybrid CONV_2D / DEPTHWISE_CONV_2D per batch (the whole window: conv.cc, depthwise_conv.cc EvalHybrid),
    of a FULLY_CONNECTED per row of its (-1, in) view and of a sequence LSTM per step (time-local)."""
    return (env.graph.tensors[op.inputs[0]].dtype == "float32"
            and env.graph.tensors[op.inputs[1]].dtype in ("int8", "uint8"))


def refuse(env, op, reason: str) -> Outcome:
    """Every output of ``op`` becomes new each tick, as a whole (no time axis is tracked past it)."""
    return Outcome({t: Whole(CRITICAL) for t in op.outputs}, macs_full=op_macs(env, op), refused=reason)


def op_macs(env, op) -> int:
    """Multiply-accumulates of ``op`` over the whole window: conv out elements x kh x kw x C_in/groups,
    depthwise out elements x kh x kw, FULLY_CONNECTED out elements x in, BATCH_MATMUL out elements x K, a
    sequence LSTM/RNN T x (input weights + recurrent weights + projection) ; 0 for every other op."""
    name = op.name
    if name in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL"):
        out = _prod(env.shape(op.outputs[0]))
        w = env.shape(op.inputs[1])
        if name == "CONV_2D":
            return out * w[1] * w[2] * w[3]
        if name == "DEPTHWISE_CONV_2D":
            return out * w[1] * w[2]
        if name == "FULLY_CONNECTED":
            return out * w[1]
        x = env.shape(op.inputs[0])
        return out * (x[-2] if op.options.get("AdjX") else x[-1])
    if name in _RECURRENT:
        proj, step = _recurrent_macs(env, op)
        x = env.shape(op.inputs[0])
        return (x[0] if op.options.get("TimeMajor") else x[1]) * (proj + step)
    return 0


def analyze_op(env, op) -> Outcome:
    """The :class:`Outcome` of ``op`` given ``env.state`` (its inputs' rows)."""
    timed = [t for t in op.inputs if t >= 0 and isinstance(env.state.get(t), Rows)]
    if not timed:
        return _after_time(env, op)
    if op.name in _BIDIRECTIONAL:
        return refuse(env, op, "a bidirectional recurrence: its backward direction starts at the newest row, so "
                               "every step runs each tick")
    handler = HANDLERS.get(op.name)
    if handler is None:
        return refuse(env, op, f"unknown op {op.name}: whole window each tick")
    return handler(env, op)


def _after_time(env, op) -> Outcome:
    """An op reading no time-indexed tensor (the head, once the time axis is gone): whole, each output
    critical, prepared or constant as its inputs are."""
    taps = [x for t in op.inputs if t >= 0 for x in env.all_taps(t)]
    whole = env.derive_whole(("op", op.index), taps)
    return Outcome({t: whole for t in op.outputs}, macs_full=op_macs(env, op))


def _rows_out(env, op, x: int, axis: int, taps: list, copy: bool = False, t_out: int | None = None,
              reversed_: bool | None = None) -> Rows:
    """Output rows along ``axis`` from ``taps`` (one list per row), the layout (``sub``) of input ``x``."""
    src = env.state[x]
    status, keys = env.derive_rows(("op", op.index, t_out), taps, copy=copy)
    return Rows(axis, src.sub, status, keys, src.reversed if reversed_ is None else reversed_)


def _side_taps(env, op, skip: tuple, axis_of, i: int, sub: int) -> list:
    """Taps of row ``i`` from ``op``'s other inputs: rows of time-indexed ones, the rows of constants that vary
    along the time axis (``axis_of(t)``: that axis in constant ``t``, or None where it broadcasts), whole
    tensors."""
    taps = []
    for t in op.inputs:
        if t < 0 or t in skip:
            continue
        s = env.state.get(t)
        if isinstance(s, Rows):
            taps.append(("r", t, i))
        elif isinstance(s, Whole):
            a = axis_of(t)
            taps.append(env.whole_row_tap(t, i) if a is not None else ("w", t))
        elif env.is_const(t):
            a = axis_of(t)
            if a is not None:
                taps.append(env.const_row_tap(t, a, i, sub))
    return taps


def _elementwise(env, op) -> Outcome:
    """Unary and broadcasting n-ary elementwise ops: row i of the output reads row i of each input."""
    out = op.outputs[0]
    rank = len(env.shape(out))
    timed = [(t, env.state[t]) for t in op.inputs if t >= 0 and isinstance(env.state.get(t), Rows)]
    axes = {r.axis + rank - len(env.shape(t)) for t, r in timed}
    lengths = {(r.length, r.sub) for _, r in timed}
    if len(axes) != 1 or len(lengths) != 1:
        return refuse(env, op, f"{op.name} combines tensors whose time axes do not line up")
    axis = axes.pop()
    length, sub = lengths.pop()
    if env.shape(out)[axis] != length * sub:
        return refuse(env, op, f"{op.name} broadcasts along the time axis")

    def axis_of(t):
        shape = env.shape(t)
        a = axis - (rank - len(shape))
        return a if 0 <= a < len(shape) and shape[a] > 1 else None
    taps = [_side_taps(env, op, (), axis_of, i, sub) for i in range(length)]
    return Outcome({out: _rows_out(env, op, timed[0][0], axis, taps,
                                   reversed_=any(r.reversed for _, r in timed))})


def _last_axis(env, op) -> Outcome:
    """SOFTMAX and other ops that normalize along the last axis: per row unless time is that axis."""
    x = op.inputs[0]
    if env.state[x].axis == len(env.shape(x)) - 1:
        return refuse(env, op, f"{op.name} normalizes along the time axis: every row reads every other row")
    return _elementwise(env, op)


def locate(in_shape: tuple, rows: Rows, new_shape: tuple) -> tuple | None:
    """``(axis, sub)`` of the time rows of a tensor of ``in_shape`` laid out again (same bytes, C order) as
    ``new_shape``, or None where no axis of it holds whole time rows (time mixed with another axis)."""
    outer = _prod(in_shape[:rows.axis])
    for b, n in enumerate(new_shape):
        if _prod(new_shape[:b]) == outer and n >= rows.length and n % rows.length == 0:
            return b, n // rows.length
        if _prod(new_shape[:b + 1]) > outer:
            break
    return None


def _layout(env, op) -> Outcome:
    """RESHAPE / SQUEEZE / EXPAND_DIMS: the same bytes in another shape; each row keeps its status."""
    x, out = op.inputs[0], op.outputs[0]
    src = env.state[x]
    found = locate(env.shape(x), src, env.shape(out))
    if found is None:
        return refuse(env, op, f"{op.name} to {list(env.shape(out))} mixes the time axis with another axis")
    return Outcome({out: Rows(found[0], found[1], list(src.status), list(src.keys), src.reversed)})


def _transpose(env, op) -> Outcome:
    x, out = op.inputs[0], op.outputs[0]
    perm = env.const(op.inputs[1])
    if perm is None:
        return refuse(env, op, "TRANSPOSE with a computed permutation")
    src = env.state[x]
    axis = [int(p) % len(env.shape(x)) for p in perm.reshape(-1)].index(src.axis)
    return Outcome({out: Rows(axis, src.sub, list(src.status), list(src.keys), src.reversed)})


def _fully_connected(env, op) -> Outcome:
    """FULLY_CONNECTED on the input viewed as (-1, in): per timestep when each row of that view lies inside
    one time row; otherwise every output reads several rows (a Flatten / Reshape folded time into the
    features) and the whole window is recomputed each tick."""
    x, w, out = op.inputs[0], op.inputs[1], op.outputs[0]
    if not isinstance(env.state.get(x), Rows) or isinstance(env.state.get(w), Rows):
        return refuse(env, op, "FULLY_CONNECTED whose weights depend on the window")
    src, shape = env.state[x], env.shape(x)
    n_in, n_out = env.shape(w)[1], env.shape(w)[0]
    row_elems = src.sub * _prod(shape[src.axis + 1:])
    if row_elems % n_in:
        k = n_in // row_elems if n_in % row_elems == 0 else "several"
        k = f"all {k}" if k == src.length else k
        return refuse(env, op, f"every output reads {k} rows of the window (in = {n_in}: the time axis is inside "
                               "its features, folded there by a Flatten or Reshape or moved there by a Permute)")
    outer = _prod(shape[:src.axis])
    virtual = (outer, src.length, row_elems // n_in * n_out)
    found = locate(virtual, Rows(1, 1, src.status, src.keys), env.shape(out))
    if found is None:
        return refuse(env, op, "FULLY_CONNECTED output mixes the time axis with another axis")
    taps = [[("r", x, i)] + _side_taps(env, op, (x,), lambda t: None, i, 1) for i in range(src.length)]
    rows = _rows_out(env, op, x, found[0], taps)
    rows.sub = found[1]
    full = op_macs(env, op)
    return Outcome({out: rows}, macs_full=full, macs_row=full // src.length)


def _batch_matmul(env, op) -> Outcome:
    """BATCH_MATMUL x @ y: per row when only x depends on the window and time is one of its row or batch axes;
    attention (both operands from the window) or a contraction over time is whole window each tick."""
    x, y, out = op.inputs[0], op.inputs[1], op.outputs[0]
    if isinstance(env.state.get(y), Rows) or not isinstance(env.state.get(x), Rows):
        return refuse(env, op, "BATCH_MATMUL of two tensors from the window (attention over time): every "
                               "output row reads every row")
    if _hybrid(env, op):
        return refuse(env, op, "a dynamic-range BATCH_MATMUL (int8 weights, float input): its input quantization "
                               "is not known to be per row")
    src, rx, ro = env.state[x], len(env.shape(x)), len(env.shape(out))
    m_axis, k_axis = (rx - 1, rx - 2) if op.options.get("AdjX") else (rx - 2, rx - 1)
    if src.axis == k_axis:
        return refuse(env, op, "BATCH_MATMUL contracts over the time axis: every output reads every row")
    axis = ro - 2 if src.axis == m_axis else src.axis + ro - rx
    taps = [[("r", x, i)] + _side_taps(env, op, (x,), lambda t: None, i, 1) for i in range(src.length)]
    full = op_macs(env, op)
    return Outcome({out: _rows_out(env, op, x, axis, taps)}, macs_full=full, macs_row=full // src.length)


def _window_rows(env, op, x: int, k: int, stride: int, dil: int, same: bool, pad_key, what: str):
    """Rows of a kernel sliding along time (CONV_2D, DEPTHWISE_CONV_2D, pools): row i reads rows
    ``i - pad_before + j * dil``, ``j < k``. Returns the output :class:`Rows` or the refusal (str)."""
    src = env.state[x]
    n, extent = src.length, (k - 1) * dil + 1
    if stride > 1:
        return (f"stride {stride} along the time axis: an output row per {stride} ticks, so rows do not shift by "
                f"one (refused)")
    if extent >= n > 1:
        return f"a {what} of {extent} rows, as long as the {n}-row window: every output reads the whole window"
    if src.sub != 1:
        return "a Reshape put several time rows on one axis of this op"
    n_out, before = (n, (extent - 1) // 2) if same else (n - extent + 1, 0)
    if env.shape(op.outputs[0])[src.axis] != n_out:
        return f"output has {env.shape(op.outputs[0])[src.axis]} rows where {n_out} were expected"
    taps = [[env.row_tap(x, i - before + j * dil, pad_key) for j in range(k)] for i in range(n_out)]
    return _rows_out(env, op, x, src.axis, taps)


def _conv(env, op) -> Outcome:
    """CONV_2D / DEPTHWISE_CONV_2D (NHWC): along H or W a sliding kernel, along the batch axis per row; a
    computed filter or time on the channel axis is whole window each tick."""
    x, out = op.inputs[0], op.outputs[0]
    src, o = env.state[x], op.options
    if not all(_fixed(env, t) for t in op.inputs[1:3]):
        return refuse(env, op, f"{op.name} whose filter or bias depends on the window")
    if _hybrid(env, op):
        return refuse(env, op, f"a dynamic-range {op.name} (int8 filter, float input) quantizes its input with "
                               "one scale for the whole window, so every row depends on the newest row: on the cpu "
                               "board stream the native-bf16 plan (compile --quant native-bf16)")
    full = op_macs(env, op)
    if src.axis == 0:
        taps = [[("r", x, i)] for i in range(src.length)]
        rows = _rows_out(env, op, x, 0, taps)
    elif src.axis in (1, 2):
        hw = "H" if src.axis == 1 else "W"
        k = env.shape(op.inputs[1])[src.axis]
        rows = _window_rows(env, op, x, k, o.get(f"Stride{hw}", 1), o.get(f"Dilation{hw}Factor", 1) or 1,
                            o.get("Padding") == _SAME, ZERO, "kernel")
        if isinstance(rows, str):
            return refuse(env, op, rows)
    else:
        return refuse(env, op, f"{op.name} over the time axis as channels: every output reads every row")
    return Outcome({out: rows}, macs_full=full, macs_row=full // rows.length)


def _pool(env, op) -> Outcome:
    """MAX_POOL_2D / AVERAGE_POOL_2D / L2_POOL_2D: along H or W a sliding window whose padded taps are left
    out; along the batch or channel axis per row."""
    x, out = op.inputs[0], op.outputs[0]
    src, o = env.state[x], op.options
    if src.axis in (1, 2):
        hw = "H" if src.axis == 1 else "W"
        k = o.get("FilterHeight" if hw == "H" else "FilterWidth", 1)
        rows = _window_rows(env, op, x, k, o.get(f"Stride{hw}", 1), 1, o.get("Padding") == _SAME, POOL_PAD,
                            "pooling window")
        if isinstance(rows, str):
            return refuse(env, op, rows)
    else:
        rows = _rows_out(env, op, x, src.axis, [[("r", x, i)] for i in range(src.length)])
    return Outcome({out: rows})


def _axes(env, op, t: int) -> list | None:
    data = env.const(t)
    if data is None:
        return None
    rank = len(env.shape(op.inputs[0]))
    return sorted({int(a) % rank for a in data.reshape(-1)})


def _reduce(env, op) -> Outcome:
    """MEAN / SUM / REDUCE_* / ARG_MAX / ARG_MIN: over the time axis the output has none (and reads every row
    each tick); over other axes per row."""
    x, out = op.inputs[0], op.outputs[0]
    src = env.state[x]
    axes = _axes(env, op, op.inputs[1])
    if axes is None:
        return refuse(env, op, f"{op.name} over computed axes")
    if src.axis in axes:
        whole = env.derive_whole(("op", op.index), env.all_taps(x))
        return Outcome({out: whole}, note=f"reduces the time axis: reads all {src.length} rows each tick")
    keep = bool(op.options.get("KeepDims")) and not op.name.startswith("ARG_")
    axis = src.axis if keep else src.axis - sum(a < src.axis for a in axes)
    return Outcome({out: _rows_out(env, op, x, axis, [[("r", x, i)] for i in range(src.length)])})


def _concatenation(env, op) -> Outcome:
    """CONCATENATION: along another axis row i joins row i of every input; along time the rows of the inputs
    follow each other (each output row a copy of one input row or constant row)."""
    out = op.outputs[0]
    rank = len(env.shape(out))
    axis = op.options.get("Axis", 0) % rank
    timed = [(t, env.state[t]) for t in op.inputs if isinstance(env.state.get(t), Rows)]
    if len({(r.axis, r.sub) for _, r in timed}) != 1:
        return refuse(env, op, "CONCATENATION of tensors whose time axes do not line up")
    t_axis, sub = timed[0][1].axis, timed[0][1].sub
    if axis != t_axis:
        if len({r.length for _, r in timed}) != 1:
            return refuse(env, op, "CONCATENATION of tensors whose time axes do not line up")
        taps = [_side_taps(env, op, (), lambda t: t_axis, i, sub) for i in range(timed[0][1].length)]
        return Outcome({out: _rows_out(env, op, timed[0][0], t_axis, taps)})
    if sub != 1:
        return refuse(env, op, "CONCATENATION along a time axis that a Reshape folded")
    taps = []
    for t in op.inputs:
        s = env.state.get(t)
        n = env.shape(t)[axis]
        for j in range(n):
            taps.append([("r", t, j)] if isinstance(s, Rows) else
                        [env.whole_row_tap(t, j)] if isinstance(s, Whole) else [env.const_row_tap(t, axis, j)])
    return Outcome({out: _rows_out(env, op, timed[0][0], axis, taps, copy=True)})


def _pad(env, op) -> Outcome:
    """PAD / PADV2 / MIRROR_PAD: along time the padded rows are constant (PAD: real zero, as a SAME
    convolution pads) or mirror rows of the input; along other axes per row."""
    x, out = op.inputs[0], op.outputs[0]
    src = env.state[x]
    pads = env.const(op.inputs[1])
    if pads is None:
        return refuse(env, op, f"{op.name} with computed paddings")
    before, after = (int(v) for v in pads.reshape(-1, 2)[src.axis])
    n = src.length
    if before == after == 0:
        return Outcome({out: _rows_out(env, op, x, src.axis, [[("r", x, i)] for i in range(n)])})
    if src.sub != 1:
        return refuse(env, op, f"{op.name} along a time axis that a Reshape folded")
    pad_tap = ("k", env.key(_pad_value(env, op)))
    taps = []
    for o in range(before + n + after):
        j = o - before
        if 0 <= j < n:
            taps.append([("r", x, j)])
        elif op.name == "MIRROR_PAD":
            symmetric = op.options.get("Mode", 0) == 1
            taps.append([("r", x, (-j - 1 if symmetric else -j) if j < 0 else
                          (2 * n - 1 - j if symmetric else 2 * n - 2 - j))])
        else:
            taps.append([pad_tap])
    return Outcome({out: _rows_out(env, op, x, src.axis, taps, copy=True)})


def _pad_value(env, op):
    """The key of the value PAD / PADV2 fills with: ZERO for real zero (PAD; PADV2 with a zero constant)."""
    if op.name != "PADV2" or len(op.inputs) < 3 or op.inputs[2] < 0:
        return ZERO
    v = env.const(op.inputs[2])
    q = env.graph.tensors[op.inputs[2]].quant
    real = v.astype(np.float64) if q is None else (v.astype(np.float64) - q.zero_point[0]) * q.scale[0]
    return ZERO if not np.any(real) else ("padv2", v.dtype.str, v.tobytes())


def _slice_indices(env, op, shape: tuple):
    """Per input axis ``(indices, shrunk)`` of STRIDED_SLICE / SLICE (TFLite's masks and negative indices), or
    a refusal (str)."""
    o = op.options
    begin = env.const(op.inputs[1])
    end = env.const(op.inputs[2]) if len(op.inputs) > 2 else None
    strides = env.const(op.inputs[3]) if op.name == "STRIDED_SLICE" and len(op.inputs) > 3 else None
    if begin is None or end is None or (op.name == "STRIDED_SLICE" and strides is None):
        return "a slice with computed bounds"
    if o.get("EllipsisMask") or o.get("NewAxisMask"):
        return "a strided slice with an ellipsis or new axes"
    out = []
    for k, d in enumerate(shape):
        b = int(begin[k])
        if op.name == "SLICE":
            size = int(end[k])
            out.append((list(range(b, d if size < 0 else b + size)), False))
            continue
        s, e = int(strides[k]), int(end[k])
        if (o.get("ShrinkAxisMask", 0) >> k) & 1:
            out.append(([b % d], True))
            continue
        b = (0 if s > 0 else d - 1) if (o.get("BeginMask", 0) >> k) & 1 else b
        if (o.get("EndMask", 0) >> k) & 1:
            e = d if s > 0 else -d - 1
        elif o.get("Offset"):
            e = b + e
        out.append((list(range(d))[slice(b, e, s)], False))
    return out


def _slice(env, op) -> Outcome:
    """STRIDED_SLICE / SLICE: along other axes per row; along time each output row copies one input row, and a
    shrunk time axis (the last step, ``x[:, -1]``) leaves a tensor without one."""
    x, out = op.inputs[0], op.outputs[0]
    src = env.state[x]
    idx = _slice_indices(env, op, env.shape(x))
    if isinstance(idx, str):
        return refuse(env, op, idx)
    rows, shrunk = idx[src.axis]
    full = rows == list(range(env.shape(x)[src.axis]))
    if src.sub != 1 and not full:
        return refuse(env, op, f"{op.name} along a time axis that a Reshape folded")
    if shrunk:
        return Outcome({out: env.derive_whole(("op", op.index), [("r", x, rows[0])])},
                       note=f"takes row {rows[0]} of {src.length}" + (" (the last step)" if rows[0] == src.length - 1
                                                                      else ""))
    axis = src.axis - sum(s for _, s in idx[:src.axis])
    taps = [[("r", x, i)] for i in (range(src.length) if src.sub != 1 else rows)]
    return Outcome({out: _rows_out(env, op, x, axis, taps, copy=True)})


def _gather(env, op) -> Outcome:
    """GATHER with constant indices: along time each output row copies one input row (a scalar index leaves no
    time axis); along other axes per row. An embedding lookup (time-indexed indices into a constant table)
    is per row."""
    params, indices, out = op.inputs[0], op.inputs[1], op.outputs[0]
    rank = len(env.shape(params))
    axis = op.options.get("Axis", 0) % rank
    if op.options.get("BatchDims"):
        return refuse(env, op, "GATHER with batch dimensions")
    if isinstance(env.state.get(indices), Rows):
        src = env.state[indices]
        if not env.is_const(params) or src.sub != 1:
            return refuse(env, op, "GATHER by indices from the window into a tensor that is not constant")
        taps = [[("r", indices, i)] for i in range(src.length)]
        return Outcome({out: _rows_out(env, op, indices, axis + src.axis, taps)})
    idx = env.const(indices)
    src = env.state[params]
    if idx is None:
        return refuse(env, op, "GATHER along time by computed indices")
    if axis != src.axis:
        shift = idx.ndim - 1 if src.axis > axis else 0
        taps = [[("r", params, i)] for i in range(src.length)]
        return Outcome({out: _rows_out(env, op, params, src.axis + shift, taps)})
    if src.sub != 1 or idx.ndim > 1:
        return refuse(env, op, "GATHER along time with a multi-dimensional index or a folded time axis")
    if idx.ndim == 0:
        return Outcome({out: env.derive_whole(("op", op.index), [("r", params, int(idx) % src.length)])},
                       note=f"takes row {int(idx) % src.length} of {src.length}")
    taps = [[("r", params, int(j) % src.length)] for j in idx]
    return Outcome({out: _rows_out(env, op, params, axis, taps, copy=True)})


def _split(env, op) -> Outcome:
    """SPLIT / SPLIT_V: along other axes each output per row; along time each output copies a run of rows."""
    x = op.inputs[1] if op.name == "SPLIT" else op.inputs[0]
    a_t = op.inputs[0] if op.name == "SPLIT" else op.inputs[2]
    src = env.state.get(x)
    axis_v = env.const(a_t)
    if not isinstance(src, Rows) or axis_v is None:
        return refuse(env, op, f"{op.name} of a tensor from the window along a computed axis")
    axis = int(axis_v.reshape(-1)[0]) % len(env.shape(x))
    outs, start = {}, 0
    for t in op.outputs:
        if axis != src.axis:
            outs[t] = _rows_out(env, op, x, src.axis, [[("r", x, i)] for i in range(src.length)], t_out=t)
            continue
        n = env.shape(t)[axis]
        if src.sub != 1:
            return refuse(env, op, f"{op.name} along a time axis that a Reshape folded")
        outs[t] = _rows_out(env, op, x, axis, [[("r", x, start + i)] for i in range(n)], copy=True, t_out=t)
        start += n
    return Outcome(outs)


def _unpack(env, op) -> Outcome:
    """UNPACK: along time output k is row k (no time axis left); along other axes per row."""
    x = op.inputs[0]
    src = env.state[x]
    axis = op.options.get("Axis", 0) % len(env.shape(x))
    if axis == src.axis:
        if src.sub != 1:
            return refuse(env, op, "UNPACK along a time axis that a Reshape folded")
        return Outcome({t: env.derive_whole(("op", op.index, t), [("r", x, k)]) for k, t in enumerate(op.outputs)})
    new = src.axis - (axis < src.axis)
    return Outcome({t: _rows_out(env, op, x, new, [[("r", x, i)] for i in range(src.length)], t_out=t)
                    for t in op.outputs})


def _pack(env, op) -> Outcome:
    """PACK: a new axis; row i stacks row i of every input."""
    timed = [(t, env.state[t]) for t in op.inputs if isinstance(env.state.get(t), Rows)]
    if len({(r.axis, r.sub, r.length) for _, r in timed}) != 1:
        return refuse(env, op, "PACK of tensors whose time axes do not line up")
    x, src = timed[0]
    axis = op.options.get("Axis", 0) % len(env.shape(op.outputs[0]))
    t_axis = src.axis + (axis <= src.axis)
    taps = [_side_taps(env, op, (), lambda t: src.axis, i, src.sub) for i in range(src.length)]
    return Outcome({op.outputs[0]: _rows_out(env, op, x, t_axis, taps)})


def _reverse(env, op) -> Outcome:
    """REVERSE_V2: along time row i copies row T-1-i (the rows then run newest first)."""
    x, out = op.inputs[0], op.outputs[0]
    src = env.state[x]
    axes = _axes(env, op, op.inputs[1])
    if axes is None:
        return refuse(env, op, "REVERSE_V2 over computed axes")
    if src.axis not in axes:
        return Outcome({out: _rows_out(env, op, x, src.axis, [[("r", x, i)] for i in range(src.length)])})
    if src.sub != 1:
        return refuse(env, op, "REVERSE_V2 along a time axis that a Reshape folded")
    n = src.length
    return Outcome({out: _rows_out(env, op, x, src.axis, [[("r", x, n - 1 - i)] for i in range(n)], copy=True,
                                   reversed_=not src.reversed)})


_RECURRENT = {"UNIDIRECTIONAL_SEQUENCE_LSTM": {"input": (1, 2, 3, 4), "step": (5, 6, 7, 8, 16), "state": (18, 19)},
              "UNIDIRECTIONAL_SEQUENCE_RNN": {"input": (1,), "step": (2,), "state": (4,)}}
_BIDIRECTIONAL = ("BIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_RNN")


def _recurrent_macs(env, op) -> tuple:
    """``(MACs per input row of the input projection, MACs per step of the recurrence)``: the sizes of the
    input-to-gate weights, and of the recurrent weights plus the projection."""
    spec = _RECURRENT[op.name]

    def size(ks):
        return sum(_prod(env.shape(op.inputs[k])) for k in ks if k < len(op.inputs) and op.inputs[k] >= 0)
    return size(spec["input"]), size(spec["step"])


def _state_problem(env, op) -> str | None:
    """Why the recurrence does not start from the zero state each window, or None: a state input that is a
    constant with non-zero values, or that another op or a graph input computes."""
    g = env.graph
    for k in _RECURRENT[op.name]["state"]:
        t = op.inputs[k] if k < len(op.inputs) else -1
        if t < 0:
            continue
        info = g.tensors[t]
        if info.is_constant:
            v = env.const(t).astype(np.float64)
            if info.quant is not None:
                v = (v - info.quant.zero_point.reshape(-1)[0]) * info.quant.scale.reshape(-1)[0]
            if np.any(v):
                return f"initial state {info.name!r} holds non-zero values (a learned initial state)"
        elif not info.is_variable:
            src = g.producer(t)
            where = f"op #{src.index} {src.name}" if src is not None else "a graph input"
            return f"initial state {info.name!r} comes from {where}, not the zero state"
    return None


def _recurrence(env, op) -> Outcome:
    """UNIDIRECTIONAL_SEQUENCE_LSTM / _RNN from the zero state each window: step s reads input rows 0..s, so
    the steps before the first critical input row can run before the tick (from the zero state) and the
    rest after it; every step's output is new each window (never cached)."""
    x, out = op.inputs[0], op.outputs[0]
    src = env.state[x]
    seq_axis = 0 if op.options.get("TimeMajor") else 1
    if src.axis != seq_axis or src.sub != 1:
        return refuse(env, op, f"{op.name} runs its recurrence along axis {seq_axis}, not the time axis")
    weights = [k for k in _RECURRENT[op.name]["input"] + _RECURRENT[op.name]["step"]
               if k < len(op.inputs) and op.inputs[k] >= 0]
    if not all(_fixed(env, op.inputs[k]) for k in weights):
        return refuse(env, op, f"{op.name} whose weights depend on the window")
    problem = _state_problem(env, op)
    if problem:
        return refuse(env, op, problem + ": each window's recurrence starts elsewhere (refused)")
    if src.reversed:
        return refuse(env, op, "a reverse-direction recurrence (the backward half of a Bidirectional layer, or "
                               "go_backwards=True): its first step reads the newest row, so every step runs each tick")
    status, keys = [], []
    crit, const_key = False, env.key(("zero state", op.index))
    for s in range(src.length):
        st, k = env.tap_status(("r", x, s))
        crit = crit or st == CRITICAL
        const_key = env.key((op.index, const_key, k)) if const_key is not None and st == CONSTANT else None
        status.append(CRITICAL if crit else CONSTANT if const_key is not None else PREPARED)
        keys.append(const_key if not crit else None)
    proj, step = _recurrent_macs(env, op)
    rec = {"proj_row": proj, "step": step, "inputs": list(src.status), "steps": status}
    rows = Rows(src.axis, 1, status, keys)
    if len(status) > 1 and all(s == CRITICAL for s in status):
        return Outcome({out: rows}, macs_full=op_macs(env, op), recurrence=rec,
                       refused="every step reads the newest row: the whole recurrence runs each tick")
    return Outcome({out: rows}, macs_full=op_macs(env, op), recurrence=rec)


_UNARY = ("QUANTIZE", "DEQUANTIZE", "CAST", "LOGISTIC", "TANH", "RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1",
          "LEAKY_RELU", "ELU", "HARD_SWISH", "GELU", "ABS", "NEG", "EXP", "LOG", "SQRT", "RSQRT", "SQUARE", "SIN",
          "COS", "FLOOR", "CEIL", "ROUND", "SIGN", "LOGICAL_NOT", "ZEROS_LIKE", "ONES_LIKE")
_NARY = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "POW", "FLOOR_DIV", "FLOOR_MOD",
         "PRELU", "ADD_N", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL", "LOGICAL_AND",
         "LOGICAL_OR", "SELECT", "SELECT_V2", "ATAN2")
HANDLERS = {
    **{n: _elementwise for n in _UNARY + _NARY},
    **{n: _last_axis for n in ("SOFTMAX", "LOG_SOFTMAX", "L2_NORMALIZATION", "LOCAL_RESPONSE_NORMALIZATION")},
    **{n: _layout for n in ("RESHAPE", "SQUEEZE", "EXPAND_DIMS")},
    **{n: _reduce for n in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "REDUCE_ANY", "REDUCE_ALL",
                            "ARG_MAX", "ARG_MIN")},
    **{n: _conv for n in ("CONV_2D", "DEPTHWISE_CONV_2D")},
    **{n: _pool for n in ("MAX_POOL_2D", "AVERAGE_POOL_2D", "L2_POOL_2D")},
    **{n: _pad for n in ("PAD", "PADV2", "MIRROR_PAD")},
    **{n: _slice for n in ("STRIDED_SLICE", "SLICE")},
    **{n: _split for n in ("SPLIT", "SPLIT_V")},
    **{n: _recurrence for n in _RECURRENT},
    "TRANSPOSE": _transpose, "FULLY_CONNECTED": _fully_connected, "BATCH_MATMUL": _batch_matmul,
    "CONCATENATION": _concatenation, "GATHER": _gather, "UNPACK": _unpack, "PACK": _pack, "REVERSE_V2": _reverse,
}
"""TFLite op name -> its rule; an op not here that reads a time-indexed tensor is refused (unknown op)."""
