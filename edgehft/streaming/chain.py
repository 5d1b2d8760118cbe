"""The stream executor for native chains with a convolution front end (issue 21): DeepLOB's ``native-bf16`` plan.

A cpu bundle's ``native-bf16`` plan runs the float graph as a chain of edgehft's own kernels (``native.json``:
conv2d, maxpool, concat, reshape, the LSTM's input projection on the conv kernel, the LSTM recurrence, slice,
fc, softmax; :mod:`edgehft.runtime.native_chain`). :class:`ChainExecutor` runs the same kernels one tick at a
time, and per tensor only the rows the streaming analysis (:mod:`edgehft.streaming.analysis`) says are not
cached:

- every tensor along time (the model input, each conv, pool and concat output, the projections) lives in a
  buffer of :data:`CAPACITY` windows of rows; the window's row ``r`` is buffer row ``base + r``. A tick moves
  ``base`` one row on, so a cached row (row ``r + 1`` one tick earlier) is already in place: never recomputed,
  never copied. When the buffers are full, :meth:`ChainExecutor.prepare` moves the window to their start (off
  the critical path; one copy of every window per ``(CAPACITY - 1) * T`` ticks);
- ``prepare`` computes the rows of the next window that do not read its newest row (the top rows that padding
  changes, analysis status ``prepared`` or ``constant``) and the LSTM steps whose projections are final
  (from the zero state, as ``predict`` does);
- ``push`` writes the row, computes the ``critical`` rows of every tensor in graph order, the LSTM's last steps
  and the head (fc, softmax) on the last step.

A conv or pool computes a run of output rows ``[a, b)`` from the input rows they read, with the window's edges
as explicit padding (:func:`edgehft.kernels.cpu.conv.geometry`): the same kernel code, weights and per-output
sums as the whole-window call, so every row has the bits ``predict`` gives it (the bf16 conv kernel sums each
output over its taps in a fixed order whatever the other outputs are; pools take a max; copies are copies).
A critical run of a conv along H is split by kernel rows (:meth:`~edgehft.kernels.cpu.conv.NativeConv2D.split`,
not on AMX): its first rows' kernel rows that read only rows received before the tick (a (4,1) SAME conv's first
three critical rows: 3, 2 and 1 of its 4) are summed in cold / prepare into a buffer the push's call starts from,
in the order the whole conv sums them, so the bits stay predict's; no kernel row over the zero padding is summed
(a zero product leaves the sum's bits alone). DeepLOB: 2.5 M MACs on the tick instead of the analysis' 3.1 M
(:meth:`Plan.macs_run`). The LSTM runs :meth:`~edgehft.kernels.cpu.lstm.NativeLSTM.steps` on the projections in place. So ``push``
equals ``predict`` of the same plan on the same window bit for bit on every dispatch target, which the tests
check over a replayed day.

The calls (one kernel per run of rows, about 20 for DeepLOB's critical path: no allocation, no copy of a cached
row) run from one native program (:mod:`edgehft.kernels.cpu.chain_program`, ``cpu_chain.cpp``): a push is one
native call, a prepare another, and ``prepare="thread"`` runs prepare on a pinned helper thread. The time axis is
axis 1 of each tensor, or axis 2 after a dim of 1 (a Conv1D's ``(1, 1, T, C)``). What the executor refuses, with
the op: a LiteRT segment in the chain, a stride along time, time along W with H > 1, a concat along time, a
reshape that moves rows across the time axis, an LSTM that is not fed by projections, anything after the LSTM but
a slice of its last step and whole-tensor kernels (fc, softmax, reshape).
"""
from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass, field

import numpy as np

from edgehft.errors import InputError

CAPACITY = 4            # windows of rows per time tensor's buffer (a move every (CAPACITY - 1) * T ticks)
PER_ROW = ("conv2d", "maxpool", "concat", "fc", "softmax")


def _refuse(msg: str) -> InputError:
    return InputError(msg, hint="predict it window by window, or compile a plan whose chain streams "
                                "(python -m edgehft.streaming.analysis BUNDLE says per op what streams)")


def runs(rows) -> list:
    """Maximal runs ``[(a, b), ...]`` of consecutive row indices in ``rows`` (ascending)."""
    out = []
    for r in sorted(rows):
        if out and out[-1][1] == r:
            out[-1][1] = r + 1
        else:
            out.append([r, r + 1])
    return [tuple(x) for x in out]


@dataclass
class TimeTensor:
    """A tensor with a time axis (axis 1 of its shape, or axis 2 after a dim of 1): ``rows`` along time,
    ``row_shape`` per row (the dims after the time axis), the buffer
    ``buf`` (CAPACITY * T rows of ``row`` float32 values), and from the analysis the row indices that are
    ``prepared`` (incl. constant) and ``critical``."""

    name: str
    rows: int
    row_shape: tuple
    buf: np.ndarray
    prepared: tuple = ()
    critical: tuple = ()
    axis: int = 1                 # 1, or 2 with a dim 1 before it (a Conv1D's (1, 1, T, C) layout)

    @property
    def row(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64))

    @property
    def addr(self) -> int:
        return self.buf.ctypes.data

    @property
    def row_bytes(self) -> int:
        return 4 * self.row


@dataclass
class Plan:
    """What :class:`ChainExecutor` runs: the input tensor's name, the time tensors, per phase the prepared calls
    (``cold``: every non-critical row, for the first window after open or reset; ``prepare``; ``critical``) and
    what each call is (``call_ops``: step kind, graph ops, output rows ``[a, b)``: what the profile shows), the
    LSTM (kernel, projection tensor, steps before the tick) and the head calls on whole tensors."""

    input: str
    window: int
    tensors: dict
    calls: dict = field(default_factory=lambda: {"cold": [], "prepare": [], "critical": []})
    call_ops: dict = field(default_factory=lambda: {"cold": [], "prepare": [], "critical": []})  # (kind, ops, a, b)
    lstm: object = None
    lstm_input: str = ""
    lstm_prepared: int = 0
    head: list = field(default_factory=list)
    head_ops: list = field(default_factory=list)                      # (kind, ops) per head call
    output: np.ndarray | None = None
    h_last: np.ndarray | None = None
    kernels: list = field(default_factory=list)
    buffers: list = field(default_factory=list)                       # arrays the calls write that no tensor owns
    layers: list = field(default_factory=list)                        # each LSTM's units, in order
    isa: dict = field(default_factory=dict)
    kernel_macs: dict = field(default_factory=lambda: {"prepare": 0, "critical": 0, "head": 0})   # per tick

    def macs_run(self) -> dict:
        """Multiply-accumulates the executor runs per tick, ``{"critical": push, "prepare": prepare}``: its row
        calls' kernels as they run (:meth:`NativeConv2D.macs_per_run`: no kernel row over the zero padding, a
        split conv's prefix in prepare), the LSTM's recurrent steps (4H x H each) and the head's fc. The streaming
        analysis' figures count every kernel row of a critical row on the tick instead."""
        from edgehft.kernels.cpu.chain_program import recurrent_steps
        H, S, P = self.lstm.hidden[0], self.lstm.timesteps, self.lstm_prepared
        ahead = 0 < P < S                              # step P's recurrent sum runs in prepare (cpu_chain.cpp)
        return {"critical": self.kernel_macs["critical"] + recurrent_steps(P, S - P, summed=ahead) * 4 * H * H
                + self.kernel_macs["head"],
                "prepare": self.kernel_macs["prepare"] + recurrent_steps(0, P, ahead=ahead) * 4 * H * H}


def _rows_of(analysis, name: str):
    for t in analysis.tensors:
        if t.name == name:
            return t
    return None


def _time_tensor(plan: Plan, name: str, shape, analysis, like: str | None = None) -> TimeTensor:
    """Register the time tensor ``name`` of ``shape`` ``(1, rows, ...)`` or ``(1, 1, rows, ...)`` with its analysis
    rows (those of ``like`` for a tensor the graph does not have: an LSTM's projections)."""
    info = _rows_of(analysis, like or name)
    shape = tuple(int(d) for d in shape)
    axis = info.time_axis if info is not None else None
    if like is not None and info is not None:
        axis = 1
    if info is None or axis not in (1, 2) or info.sub != 1 or not info.exact or (axis == 2 and shape[1] != 1):
        raise _refuse(f"tensor {name!r}: the streaming analysis has no exact rows along its axis 1 (or axis 2 "
                      "after a dim of 1) for it")
    if len(shape) <= axis or shape[0] != 1 or shape[axis] != info.rows:
        raise _refuse(f"tensor {name!r} of shape {list(shape)}: not {info.rows} rows along axis {axis}")
    row_shape = shape[axis + 1:]
    t = TimeTensor(name, shape[axis], row_shape,
                   np.zeros((CAPACITY * plan.window, int(np.prod(row_shape, dtype=np.int64))), np.float32),
                   tuple(sorted(info.prepared + info.constant)), tuple(info.critical), axis)
    plan.tensors[name] = t
    return t


def _slab(out_rows: tuple, pad_top: int, k: int, in_rows: int) -> tuple:
    """Input rows ``[lo, hi)`` and explicit time padding ``(top, bottom)`` for output rows ``[a, b)`` of a
    stride-1 conv or pool with kernel ``k`` along time and leading padding ``pad_top``."""
    a, b = out_rows
    want_lo, want_hi = a - pad_top, b - pad_top + k - 1
    lo, hi = max(0, want_lo), min(in_rows, want_hi)
    return lo, hi, lo - want_lo, want_hi - hi


def _geometry(st: dict, src: TimeTensor, kernel_hw, in_hw):
    """A conv / pool / pad step along its input's time axis: ``(k, lead, fixed, out_hw)`` with ``k`` the kernel
    along time, ``lead`` its leading padding there, ``fixed`` the (before, after) padding of the other spatial axis
    and ``out_hw`` the output's (H, W). InputError for a stride along time or time on W with H > 1."""
    from edgehft.kernels.cpu.conv import geometry
    H, W = in_hw
    (kh, kw), (sh, sw) = kernel_hw, st.get("stride", (1, 1))
    padding = st.get("padding") or [*st["pads"]]
    Ho, Wo, ph, pw = geometry((H, W), (kh, kw), (sh, sw), padding)
    if isinstance(padding, str):
        pads = (ph, max((Ho - 1) * sh + kh - H - ph, 0), pw, max((Wo - 1) * sw + kw - W - pw, 0))
    else:
        pads = tuple(int(v) for v in padding)
    t = 0 if src.axis == 1 else 1                       # which of (H, W) is time
    if (sh, sw)[t] != 1:
        raise _refuse(f"op #{st['op']} {st['kind']}: stride {(sh, sw)[t]} along time (each tick would shift its "
                      f"rows by a fraction of a row)")
    if t == 1 and (H != 1 or Ho != 1):
        raise _refuse(f"op #{st['op']} {st['kind']}: time along W with H = {H} (rows of a tick are not contiguous)")
    fixed = pads[2:] if t == 0 else pads[:2]
    return (kh, kw)[t], pads[2 * t], fixed, (Ho, Wo), t


def _slab_kernel(t: int, n_in: int, other: int, time_pads, fixed):
    """``(in_hw, pads)`` of a kernel over ``n_in`` rows along time (axis ``t`` of (H, W)), the other axis
    ``other`` wide with its ``fixed`` padding, the window's edges as ``time_pads``."""
    if t == 0:
        return (n_in, other), (*time_pads, *fixed)
    return (other, n_in), (*fixed, *time_pads)


class _Calls:
    """Builds the three phases' calls of one row-wise step (one kernel per run of rows, kernels shared between
    runs of the same geometry)."""

    def __init__(self, plan: Plan, out: TimeTensor, make, st: dict):
        self.plan, self.out, self.make, self.cache = plan, out, make, {}
        self.what = (st["kind"], tuple(st.get("ops") or [st["op"]]))

    def kernel(self, key, fresh: bool = False):
        """The kernel of geometry ``key`` (``make(key)``; shared between runs unless ``fresh``)."""
        k = None if fresh else self.cache.get(key)
        if k is None:
            k = self.make(key)
            self.plan.kernels.append(k)
            if not fresh:
                self.cache[key] = k
        return k

    def add(self, ins, slab_of, split_of=None) -> None:
        """``ins``: the step's input TimeTensors; ``slab_of((a, b))`` -> ``(lo, hi, key)``: the input rows a run
        reads and the kernel's geometry key, ``make(key)`` the kernel. ``split_of((a, b))`` (convs) -> ``j0``: the
        kernel rows of the run's first output row that read only rows received before the tick (0: none); a
        critical run with ``0 < j0 <= b - a`` is split (:meth:`_split`)."""
        every = tuple(r for r in range(self.out.rows) if r not in set(self.out.critical))
        for phase, rows in (("cold", every), ("prepare", self.out.prepared), ("critical", self.out.critical)):
            for a, b in runs(rows):
                lo, hi, key = slab_of((a, b))
                j0 = split_of((a, b)) if split_of is not None and phase == "critical" else 0
                if 0 < j0 <= b - a and self._split(ins, slab_of, (a, b), (lo, hi, key), j0):
                    continue
                self._append(phase, self.kernel(key), ins, lo, hi, (self.out.addr, self.out.row_bytes, a),
                             (*self.what, a, b))

    def _split(self, ins, slab_of, run, slab, j0: int) -> bool:
        """A critical run of a conv whose first rows' sums begin with kernel rows that read only rows received
        before the tick: those parts (the prefix, :meth:`NativeConv2D.split`) move to cold and prepare, the
        critical call (the suffix) starts from them: the same sums in the same order, fewer products on the tick.
        False (nothing added) for a kernel that cannot split (AMX): the run's plain kernel is then the one made."""
        a, b = run
        lo, hi, key = slab
        suffix = self.kernel(key, fresh=True)
        if not getattr(suffix, "splittable", False):
            self.cache.setdefault(key, suffix)
            return False
        plo, phi, pkey = slab_of((a, a + j0))
        prefix = self.kernel(pkey, fresh=True)
        part = prefix.split("prefix", j0)
        self.plan.buffers.append(part)
        for phase in ("cold", "prepare"):
            self._append(phase, prefix, ins, plo, phi, (part.ctypes.data, 0, 0),
                         (f"{self.what[0]} prefix", self.what[1], a, a + j0))
        suffix.split("suffix", j0, part)
        self._append("critical", suffix, ins, lo, hi, (self.out.addr, self.out.row_bytes, a), (*self.what, a, b))
        return True

    def _append(self, phase: str, k, ins, lo: int, hi: int, out: tuple, what: tuple) -> None:
        """One call of kernel ``k`` reading rows ``[lo, hi)`` of ``ins``, writing ``out`` = (address, row bytes,
        first row) (row bytes 0: a fixed buffer, a prefix's sums)."""
        a, b = what[2:]
        if int(np.prod(k.out.shape)) != (b - a) * self.out.row and out[1]:
            raise _refuse(f"tensor {self.out.name!r}: rows {a}-{b - 1} do not fit the kernel's output "
                          f"{list(k.out.shape)}")
        # the kernel reads (hi - lo) whole rows of each input: native.json's shapes must say so (a bundle is
        # untrusted: a kernel built for wider rows than the tensor's would read past its buffer)
        for t, shape in zip(ins, k.input_shapes):
            if int(np.prod(shape)) != (hi - lo) * t.row:
                raise _refuse(f"tensor {t.name!r}: {hi - lo} rows of {t.row} values do not fit the kernel "
                              f"input {list(shape)} of {self.out.name!r} (an inconsistent native.json)")
        ptrs = getattr(k, "_ptrs", None) if len(ins) > 1 else None
        srcs = tuple((t.addr, t.row_bytes, lo) for t in ins)
        self.plan.calls[phase].append((k._run, k._h, srcs, *out, ptrs,
                                       None if ptrs is None else ctypes.addressof(ptrs)))
        self.plan.call_ops[phase].append(what)
        if phase in self.plan.kernel_macs and hasattr(k, "macs_per_run"):
            self.plan.kernel_macs[phase] += k.macs_per_run()


def _conv_like(plan: Plan, st: dict, root, analysis, portable: bool) -> None:
    """A conv2d, maxpool or pad step: stride 1 along time; runs of output rows from slabs of input rows."""
    from edgehft.kernels.cpu.conv import NativeConv2D
    from edgehft.kernels.cpu.ops import NativeMaxPool2D, NativePad
    kind, src = st["kind"], plan.tensors.get(st["inputs"][0])
    if src is None:
        raise _refuse(f"op #{st['op']} {kind}: its input {st['inputs'][0]!r} has no rows along time here")
    in_hw, C = tuple(st["in_hw"]), int(st["channels"])
    if kind == "conv2d":
        with np.load(root / st["weights"]) as z:
            w, bias = z["weights"], (z["bias"] if "bias" in z.files else None)
        Co, kh, kw, _ = w.shape
    else:
        (kh, kw), Co = (st["filter"] if kind == "maxpool" else (1, 1)), C
    k, lead, fixed, (Ho, Wo), t = _geometry(st, src, (kh, kw), in_hw)
    like = st["inputs"][0] if st.get("what") == "LSTM input projection" else None
    out = _time_tensor(plan, st["outputs"][0], (1, Ho, Wo, Co), analysis, like=like)   # (1, T, C): same rows
    other = in_hw[1 - t]
    sh, sw = st.get("stride", (1, 1))
    stride = (1, sw) if t == 0 else (sh, 1)

    def slab_of(run):
        lo, hi, top, bottom = _slab(run, lead, k, in_hw[t])
        return lo, hi, (hi - lo, top, bottom)

    def split_of(run):
        # kernel rows of output row a reading only input rows before the first critical one (final before the tick)
        # (time along H only: the kernel splits by kernel rows; a Conv1D's taps along W share one row)
        if kind != "conv2d" or k < 2 or not src.critical or t != 0:
            return 0
        return max(0, min(k, min(src.critical) - (run[0] - lead)))

    def make(key):
        n, top, bottom = key
        hw, pads = _slab_kernel(t, n, other, (top, bottom), fixed)
        if kind == "conv2d":
            kern = NativeConv2D(w, bias, hw, C, stride, pads,
                                activation=st["activation"], alpha=st.get("alpha", 0.0), portable=portable)
            plan.isa["CONV_2D"] = kern.isa
            return kern
        if kind == "pad":
            return NativePad(hw, C, pads)
        return NativeMaxPool2D(hw, C, (kh, kw), stride, pads, st["activation"])
    _Calls(plan, out, make, st).add([src], slab_of, split_of)


def _concat(plan: Plan, st: dict, analysis) -> None:
    """A concat of time tensors along an axis after time (channels): each run of rows from the same rows."""
    from edgehft.kernels.cpu.ops import NativeConcat
    srcs = [plan.tensors.get(n) for n in st["inputs"]]
    shapes = [tuple(s) for s in st["input_shapes"]]
    axis = st["axis"] + len(shapes[0]) if st["axis"] < 0 else st["axis"]
    if None in srcs or axis <= 1:
        raise _refuse(f"op #{st['op']} CONCATENATION: " + ("along time (the window's rows would not slide)"
                      if axis <= 1 else "an input without rows along time"))
    out_shape = list(shapes[0])
    out_shape[axis] = sum(s[axis] for s in shapes)
    out = _time_tensor(plan, st["outputs"][0], out_shape, analysis)
    make = lambda n: NativeConcat([(1, n, *s[2:]) for s in shapes], axis)   # noqa: E731
    _Calls(plan, out, make, st).add(srcs, lambda run: (run[0], run[1], run[1] - run[0]))


def _per_row(plan: Plan, st: dict, root, analysis) -> None:
    """A per-timestep fc (Dense on every row), a softmax over a time tensor's last axis, or an elementwise
    activation (tanh, logistic)."""
    from edgehft.kernels.cpu.ops import NativeActivation, NativeDense, NativeSoftmax
    src = plan.tensors.get(st["inputs"][0])
    shape = [int(d) for d in st["shape"]]
    if src is None or len(shape) <= src.axis + 1 - (st["kind"] == "act") or shape[src.axis] != src.rows:
        raise _refuse(f"op #{st['op']} {st['kind']}: not applied row by row to a tensor along time")
    out = _time_tensor(plan, st["outputs"][0], shape, analysis)
    if st["kind"] == "act":
        make = lambda n: NativeActivation((n, *shape[src.axis + 1:]), st["act"])   # noqa: E731
    elif st["kind"] == "fc":
        with np.load(root / st["weights"]) as z:
            w, bias = z["weights"], (z["bias"] if "bias" in z.files else None)
        make = lambda n: NativeDense(w, bias, n * src.row // w.shape[1], (n, out.row), st["activation"])  # noqa: E731
    else:
        make = lambda n: NativeSoftmax((n, *shape[src.axis + 1:]), st["beta"])   # noqa: E731
    _Calls(plan, out, make, st).add([src], lambda run: (run[0], run[1], run[1] - run[0]))


def _reshape(plan: Plan, st: dict, analysis) -> None:
    """A reshape that keeps the time axis' rows (along axis 1, or axis 2 after a dim of 1: a Conv1D's expand and
    squeeze): the same buffer seen with another row shape."""
    src = plan.tensors[st["inputs"][0]]
    shape = [int(d) for d in st["shape"]]
    axis = 2 if len(shape) > 2 and shape[1] == 1 and shape[2] == src.rows else 1
    if st.get("index") is not None or len(shape) <= axis or shape[axis] != src.rows or \
            int(np.prod(shape[axis + 1:], dtype=np.int64)) != src.row:
        raise _refuse(f"op #{st['op']} RESHAPE to {shape}: it moves rows across the time axis")
    t = _time_tensor(plan, st["outputs"][0], shape, analysis)
    t.buf = src.buf


def _projected_lstm(plan: Plan, st: dict, root, portable: bool):
    """``(kernel, projections tensor)`` of a native.json ``lstm`` step fed by its input projections along time
    (the kernel registered in ``plan.kernels``, so it is closed with the plan).

    Raises:
        InputError: an LSTM not fed by projections, or projections that do not fit its weights."""
    from edgehft.kernels.cpu.lstm import NativeLSTM, recurrent_bf16_of
    proj = plan.tensors.get(st["inputs"][0])
    if not st.get("projected") or proj is None:
        raise _refuse(f"op #{st['op']} LSTM: the chain executor runs an LSTM fed by its input projections along "
                      "time (plan native-bf16)")
    with np.load(root / st["weights"]) as z:
        k = NativeLSTM([(z["kernel"], z["recurrent_kernel"], z["bias"])], st["timesteps"], True,
                       cell_clip=float(z["cell_clip"]), portable=portable,
                       recurrent_bf16=recurrent_bf16_of(st)).projected()
    plan.kernels.append(k)
    plan.layers.append(int(k.hidden[0]))
    plan.isa["LSTM"] = k.isa
    if k.timesteps != proj.rows or proj.row != 4 * k.hidden[0]:
        raise _refuse(f"op #{st['op']} LSTM: {k.timesteps} steps of {4 * k.hidden[0]} projections, its input has "
                      f"{proj.rows} rows of {proj.row} (an inconsistent native.json)")
    return k, proj


def _lstm(plan: Plan, st: dict, root, analysis, portable: bool) -> str:
    """The LSTM on its projections: the kernel, the steps before the tick; returns its output's name."""
    k, proj = _projected_lstm(plan, st, root, portable)
    row = analysis.op(int(st["op"]))
    if row.steps_prepared is None or row.steps_prepared + (row.steps_critical or 0) != proj.rows:
        raise _refuse(f"op #{st['op']} LSTM: the analysis gives no steps before and after the tick")
    plan.lstm, plan.lstm_input, plan.lstm_prepared = k, proj.name, int(row.steps_prepared)
    return st["outputs"][0]


def _stacked_lstm(plan: Plan, st: dict, root, analysis, portable: bool) -> None:
    """An LSTM whose h sequence feeds another layer (LSTM_A's first of two): its steps as row calls (cold /
    prepare: the steps before the tick from the zero state, critical: the rest), every step's h into a time
    tensor the next layer's input projection reads row by row."""
    from edgehft.kernels.cpu.chain_program import LstmSteps
    k, proj = _projected_lstm(plan, st, root, portable)
    H, S = k.hidden[0], proj.rows
    out = _time_tensor(plan, st["outputs"][0], (1, S, H), analysis)
    P = len(out.prepared)
    if out.prepared != tuple(range(P)) or out.critical != tuple(range(P, S)):
        raise _refuse(f"op #{st['op']} LSTM: the analysis does not give its first steps before the tick and the "
                      "rest after it")
    calls = _Calls(plan, out, None, st)
    ahead = 0 < P < S                                  # step P's recurrent sum before the tick
    for phase, s0, n in (("cold", 0, P), ("prepare", 0, P), ("critical", P, S - P)):
        if n:
            steps = LstmSteps(k, s0, n, ahead=ahead and phase != "critical", summed=ahead and phase == "critical")
            plan.kernels.append(steps)
            calls._append(phase, steps, [proj], s0, s0 + n, (out.addr, out.row_bytes, s0), ("lstm", (st["op"],),
                                                                                             s0, s0 + n))


def _head(plan: Plan, st: dict, root, whole: dict, lstm_out: str) -> None:
    """A step after the LSTM: a slice of its last step, or fc / softmax / reshape on whole tensors."""
    from edgehft.kernels.cpu.ops import NativeDense, NativeSoftmax
    kind, src, dst = st["kind"], st["inputs"][0], st["outputs"][0]
    if kind == "slice" and src == lstm_out:
        idx = st.get("index") or []
        if len(idx) != 3 or idx[1].get("index") not in (-1, plan.window - 1) or \
                any(d.get("index") is not None or d.get("start") or d.get("stop") for d in (idx[0], idx[2])):
            raise _refuse(f"op #{st['op']} STRIDED_SLICE: the head takes the LSTM's last step only")
        whole[dst] = whole[lstm_out].reshape(st["shape"])
        return
    if src not in whole:
        raise _refuse(f"op #{st['op']} {kind}: reads {src!r}, which is neither the LSTM's last step nor computed "
                      "from it (the stream keeps only the last step of the sequence)")
    if kind in ("reshape", "slice") and st.get("index") is None:
        whole[dst] = whole[src].reshape(st["shape"])
        return
    if kind == "fc":
        with np.load(root / st["weights"]) as z:
            k = NativeDense(z["weights"], z["bias"] if "bias" in z.files else None, st["rows"], st["shape"],
                            st["activation"])
    elif kind == "softmax":
        k = NativeSoftmax(st["shape"], st["beta"])
    else:
        raise _refuse(f"op #{st['op']} {kind}: not a head step the chain executor runs (fc, softmax, reshape)")
    if whole[src].size != int(np.prod(k.input_shape)):
        raise _refuse(f"op #{st['op']} {kind}: its input holds {whole[src].size} values, the kernel takes "
                      f"{list(k.input_shape)}")
    plan.kernels.append(k)
    plan.kernel_macs["head"] += k.macs_per_run() if hasattr(k, "macs_per_run") else 0
    plan.head.append((k._run, k._h, whole[src].ctypes.data, k.out.ctypes.data))
    plan.head_ops.append((kind, tuple(st.get("ops") or [st["op"]])))
    whole[dst] = k.out


def build_plan(bundle, analysis, portable: bool = False) -> Plan:
    """The :class:`Plan` of ``bundle``'s native chain (``native.json``) for one input along axis 1, rows as
    ``analysis`` says (a :class:`~edgehft.streaming.analysis.StreamingAnalysis` of the bundle's graph).

    Raises:
        InputError: a step the executor cannot run one tick at a time (the message names the op and why)."""
    root = bundle.path
    graph = json.loads((root / bundle.manifest.artifacts["native"]).read_text())
    spec = bundle.manifest.inputs[0]
    plan = Plan(graph["inputs"][0], int(spec.shape[1]), {})
    try:
        _time_tensor(plan, plan.input, spec.shape, analysis)
        whole, lstm_out = {}, None
        for i, st in enumerate(graph["steps"]):
            kind = st["kind"]
            if kind == "litert":
                raise _refuse(f"ops #{st['ops'][0]}-{st['ops'][-1]} run on a LiteRT segment, which computes whole "
                              "tensors (the chain executor runs edgehft's own kernels row by row)")
            if lstm_out is not None:
                _head(plan, st, root, whole, lstm_out)
            elif kind in ("conv2d", "maxpool", "pad"):
                _conv_like(plan, st, root, analysis, portable)
            elif kind == "concat":
                _concat(plan, st, analysis)
            elif kind in ("fc", "softmax", "act"):
                _per_row(plan, st, root, analysis)
            elif kind == "reshape":
                _reshape(plan, st, analysis)
            elif kind == "lstm" and any(s["kind"] == "lstm" for s in graph["steps"][i + 1:]):
                _stacked_lstm(plan, st, root, analysis, portable)
            elif kind == "lstm":
                lstm_out = _lstm(plan, st, root, analysis, portable)
                H = plan.lstm.hidden[0]
                whole[lstm_out] = np.zeros(H, np.float32)
            else:
                raise _refuse(f"op #{st['op']} {kind}: the chain executor does not run it along time")
        out = whole.get(graph["outputs"][0])
        if out is None:
            raise _refuse("the chain's output is not computed from an LSTM's last step (the chain executor streams "
                          "conv front ends into an LSTM and its head)")
        plan.output = out
        plan.h_last = whole[lstm_out]
        return plan
    except BaseException:
        for k in plan.kernels:
            k.close()
        raise


def _program(plan: Plan, row: np.ndarray):
    """The native program of ``plan`` (:class:`~edgehft.kernels.cpu.chain_program.ChainProgram`) reading the
    staging ``row``."""
    from edgehft.kernels.cpu.chain_program import ChainProgram
    proj = plan.tensors[plan.lstm_input]
    if proj.row != 4 * plan.lstm.hidden[0]:
        raise _refuse(f"tensor {proj.name!r}: rows of {proj.row} values, the LSTM takes {4 * plan.lstm.hidden[0]}")
    src = plan.tensors[plan.input]
    bufs = list({id(t.buf): t.buf for t in plan.tensors.values()}.values())
    calls = {ph: [(fn, h, srcs, out, out_rb, a, ptrs is not None) for fn, h, srcs, out, out_rb, a, ptrs, _ in cs]
             for ph, cs in plan.calls.items()}
    return ChainProgram(window=plan.window, capacity=CAPACITY, lstm_prepared=plan.lstm_prepared,
                        lstm_steps=plan.lstm.timesteps, row=row,
                        input_buf=(src.addr, src.row_bytes), lstm=plan.lstm._h, proj=(proj.addr, proj.row),
                        h_last=plan.h_last, calls=calls, buffers=[(b.ctypes.data, b.strides[0]) for b in bufs],
                        head=plan.head, warm=_warm_calls(plan))


def _warm_calls(plan: Plan) -> list:
    """``[(edgehft_conv_warm, handle), ...]``: each conv the critical calls run, once: the program reads its
    weights back into the caches at the end of every inline prepare (not on a helper thread, whose core's caches
    are not the pushing core's). On LSTM_A's native-bf16 plan (the first layer's
    projection weights are never read by prepare) this took the native push's p99 from 6.3-6.7 to 4.2-5.1 µs on
    an AMD Zen 4 core (p50 3.0 -> 2.8 µs)."""
    from edgehft.kernels.cpu.chain_program import address
    from edgehft.kernels.cpu.conv import NativeConv2D, load_library
    convs = {address(k._h) for k in plan.kernels if isinstance(k, NativeConv2D)}
    warm, seen = [], set()
    fn = load_library().edgehft_conv_warm
    for call in plan.calls["critical"]:
        h = address(call[1])
        if h in convs and h not in seen:
            seen.add(h)
            warm.append((fn, h))
    return warm


class ChainExecutor:
    """One stream on a :class:`Plan` (the interface of :class:`edgehft.kernels.cpu.stream.NativeStream`, which
    :class:`edgehft.streaming.stream.Stream` drives), run by a native program
    (:class:`~edgehft.kernels.cpu.chain_program.ChainProgram`: the executor's state and the plan's calls in C):
    :attr:`row` is the staging row (``(row,)`` float32), :meth:`push_staged` pushes it in one native call (0:
    :attr:`out` holds the window's output; 1: warming up; -1: the row holds a NaN or an infinity and was not
    kept), :meth:`prepare` runs the ahead-of-tick rows and steps (one native call), :meth:`start_helper` starts
    the native thread that prepares after each push.

    Raises:
        InputError: the plan's projections do not fit its LSTM; MemoryError / BoardUnavailableError: the
            program cannot be made (the plan's kernels are closed then)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.T = plan.window
        self.row = np.zeros(plan.tensors[plan.input].row, np.float32)
        self.out = plan.output
        self.isa = ", ".join(f"{op} {isa}" for op, isa in plan.isa.items())
        self.helper_core = None
        try:
            self._prog = _program(plan, self.row)
        except BaseException:
            self.close()
            raise
        self.push_raw = call = self._prog.push_staged       # the native call alone: any rc, raises nothing

        def push_staged() -> int:
            rc = call()
            if rc < -1:
                self.raise_failed(rc)
            return rc
        self.push_staged = push_staged

    @staticmethod
    def raise_failed(rc: int):
        """Raise what a push that returned ``rc`` < -1 means: BoardUnavailableError (a kernel failed)."""
        from edgehft.errors import BoardUnavailableError
        raise BoardUnavailableError(f"a kernel of the chain failed on this push or its prepare (code {rc}: out of "
                                    "memory for its scratch): no output", hint="free memory, then reset() the stream "
                                    "or open another")

    @property
    def rows(self) -> int:
        """Rows pushed since construction or :meth:`reset`."""
        return self._prog.rows

    def reset(self) -> None:
        """Forget every row (warming up again; a prepare running on the helper finishes first)."""
        self._prog.reset()

    def prepare(self) -> bool:
        """The next window's rows and LSTM steps that do not need its newest row (waits for the helper if it is
        on them). False while fewer than T - 1 rows were pushed (nothing to prepare), else True (also when it
        was already prepared)."""
        return self._prog.prepare()

    def native_entry(self) -> dict:
        """The C entry points a native caller pushes with (see :meth:`edgehft.streaming.stream.Stream.native_entry`)."""
        from edgehft.kernels.cpu.stream import entry
        lib = self._prog._lib
        return entry(self._prog._h, lib.edgehft_chain_push, lib.edgehft_chain_prepare, self.row, self.out)

    def time_pushes(self, rows: np.ndarray, ns: np.ndarray, prepare: bool = True) -> int:
        """:meth:`ChainProgram.time_pushes <edgehft.kernels.cpu.chain_program.ChainProgram.time_pushes>`; raises
        BoardUnavailableError when a kernel failed, RunnerStateError when closed."""
        if self._prog is None:
            from edgehft.errors import RunnerStateError
            raise RunnerStateError("the executor is closed", hint="open another stream")
        n = self._prog.time_pushes(rows, ns, prepare)
        if n < -1:
            self.raise_failed(n)
        return n

    def profile(self, on: bool = True) -> None:
        """Op-by-op timing of prepare and push on (zeroed) or off (off by default: no clock on the hot path)."""
        self._prog.profile(on)

    def profile_ops(self) -> list[dict]:
        """Per call of the prepare and critical phases (step kind, graph ops, output rows), the LSTM's steps in
        each, and the head calls: :func:`~edgehft.kernels.cpu.stream.profile_rows`, µs per prepare or push since
        :meth:`profile` turned on (the cold calls after a reset are not timed; empty while it is off)."""
        from edgehft.kernels.cpu.stream import profile_rows
        p = self.plan
        S, P = p.lstm.timesteps, p.lstm_prepared

        def call(kind, ops, a, b):
            return f"{kind} (op {', '.join(str(o) for o in ops)}) rows {a}-{b - 1}"
        labels = [("prepare", call(*c)) for c in p.call_ops["prepare"]]
        labels.append(("prepare", f"LSTM steps 0-{P - 1}" if P else "LSTM (no step before the tick)"))
        labels += [("critical", call(*c)) for c in p.call_ops["critical"]]
        labels.append(("critical", f"LSTM steps {P}-{S - 1}"))
        labels += [("critical", f"{kind} (op {', '.join(str(o) for o in ops)})") for kind, ops in p.head_ops]
        return profile_rows(labels, *self._prog.profile_counts(len(labels)))

    def counters(self) -> dict:
        """The counters :class:`~edgehft.kernels.cpu.stream.NativeStream` keeps (``helper``: 1 while the helper
        thread runs), plus ``moves`` (times the window was moved to the buffers' start) and ``kernel_errors``
        (pushes or prepares whose kernels failed)."""
        return self._prog.counters()

    def window(self) -> np.ndarray:
        """A copy of the current window's rows, oldest first: ``(min(rows, T), row)`` float32."""
        return self._prog.window()

    def start_helper(self, core=None, spin_us: int = 1000) -> int:
        """Start the native thread that prepares right after each push, pinned to CPU ``core`` (None: not pinned);
        it spins ``spin_us`` µs after its last prepare, then sleeps until the next push. Returns 0, or -1 already
        running, -2 no thread could be started, -3 the core was refused, -4 profiling is on (:meth:`profile`)."""
        rc = self._prog.start_helper(core, spin_us)
        if rc == 0:
            self.helper_core = core
        return rc

    def close(self) -> None:
        """Stop the helper thread and free the program, then the kernels."""
        prog, self._prog = getattr(self, "_prog", None), None
        if prog is not None:
            prog.close()
        for k in self.plan.kernels:
            k.close()
        self.plan.kernels = []
