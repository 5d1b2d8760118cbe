"""Streaming inference on the cpu board (issue 21 items 1 and 3): one tick in, one signal out.

``stream = runner.stream(prepare="inline" | "thread", core=None)`` on a cpu runner whose plan is native and of
the form LSTM (-> LSTM ...) -> last step -> head, every LSTM from the zero state, fed by the model's input (the
``--quant native`` plan of the STAC-ML LSTM_A: two LSTM(100) over 50 x 100 rows and a Dense(1)):

- ``stream.push(row)`` takes the window's newest row (the input without its batch and time axes: ``(100,)``
  for LSTM_A, or ``(1, 100)``), checked as ``predict`` checks a window (the same ShapeError / DTypeError /
  NonFiniteInputError, exit 3; a float64 row is cast like a float64 window), and returns the output of the
  window of the last T rows, in ``predict``'s output shape, from a buffer reused by the next push (copy what
  you keep). Until T rows were pushed it returns None: ``stream.warming_up`` is True and ``stream.status``
  says ``"warming up, k of T rows"`` (no output for a window that is not full: never zeros or a partial
  window's value).
- ``stream.prepare()`` runs the ahead-of-tick work for the window the next push completes: every LSTM step
  that does not read that row (LSTM_A: 49 of each layer's 50 steps); the push then runs one step of each
  layer and the head (:mod:`edgehft.kernels.cpu.stream`, one native call). A push whose window was not
  prepared prepares it first; ``stream.counters`` says how often (``prepared_late``) and what it cost.
  With ``prepare="thread"`` a native helper thread, pinned to ``core`` when given, prepares right after each
  push (the push takes no lock; it waits only when the helper is still on its window).
- ``stream.reset()`` forgets every row; ``stream.window()`` copies the current window (oldest row first), what
  ``predict`` would take; ``stream.close()`` (or ``with``) stops the helper and frees the executor. A stream has
  its own executor (a copy of the weights) and head interpreter: the runner's ``predict`` keeps working beside
  it, and closing the runner does not close the stream.
- ``stream.native_entry()`` gives a C or C++ caller the push and prepare entry points, the handle and the row and
  output buffers' addresses, to push without Python (the contract is in its docstring).
- ``stream.time_pushes(rows)`` pushes rows in turn, each push timed inside the native library (what a C or C++
  caller of the executor sees, without Python's row check, copy and call): the benchmarks' second push row.

Exactness: the executor runs the native LSTM kernel's own step code, so every push equals ``predict`` of the
same plan on the same window bit for bit, on every dispatch target. The head: when the plan's head is a
STRIDED_SLICE of the last step and a float FULLY_CONNECTED without activation, the executor computes it
natively in XNNPACK's order and the stream checks it at open on seeded probe sequences against the plan's own
LiteRT head segment (``describe()["head"] == "native"``); a head that is anything else, or that differs on a
probe, runs on that LiteRT segment after the native call (``"litert"``: exact by construction, slower).

A convolution front end (DeepLOB: Conv2D, MaxPool along time, concat, reshape, then the LSTM and its head) streams
on the ``native-bf16`` plan (``compile --quant native-bf16``): its chain of edgehft kernels runs on
:mod:`edgehft.streaming.chain`'s executor (``describe()["executor"] == "chain"``; each tensor's rows in buffers that
slide, the rows the analysis calls prepared computed by ``prepare()``, the critical ones by ``push``; bit for bit
``predict`` of that plan; a push and a prepare are one native call each, ``prepare="thread"`` as above).

A model or plan that does not stream is refused at ``runner.stream()`` with InputError (exit 3) naming why: the
streaming analysis' blocking op (:mod:`edgehft.streaming.analysis`; e.g. DeepLOB's int8-weight convolutions in
the ``native`` and ``dynamic`` plans), a plan that is not native, or the first op of the plan the executors do
not run (a LiteRT segment, a Conv1D's time-on-width layout, a stride along time).

    with runtime.open("lstm_a.native") as r, r.stream(prepare="thread", core=3) as s:
        for row in ticks:
            y = s.push(row)            # (1, 1) float32, or None while warming up
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgehft.errors import DTypeError, InputError, NonFiniteInputError, RunnerStateError, ShapeError

MODES = ("inline", "thread")
CHAIN_FRONT = ("conv2d", "maxpool", "pad", "reshape", "concat", "fc", "softmax", "act")   # the chain executor
HEAD_PROBES = 64                  # seeded probe sequences the native head must match the plan's head on
HINT_NATIVE = ("compile the model with --quant native (LSTM models; --quant auto ships it when it passes the "
               "gate, then open it with plan='native'), or predict window by window")


@dataclass
class StreamPlan:
    """What the stream executor runs, read from a native bundle: the LSTM layers in order (Keras layout
    ``(kernel, recurrent_kernel, bias, cell_clip)``), the window ``T`` and row shape, the head segment's model
    file and tensor names, and when its ops allow the native head ``head_weights`` (M, H) / ``head_bias``."""

    layers: list
    timesteps: int
    row_shape: tuple
    head_model: Path
    head_input: str
    head_output: str
    head_weights: np.ndarray | None = None
    head_bias: np.ndarray | None = None
    why_not_native_head: str = ""
    analysis: object = field(default=None, repr=False)
    chain: object = field(default=None, repr=False)      # a conv front end's chain (edgehft.streaming.chain.Plan)


def _refuse(msg: str, hint: str = HINT_NATIVE) -> InputError:
    return InputError(msg, hint=hint)


def _analysis(bundle):
    """The streaming analysis of the bundle's model, or InputError with its blocking op."""
    from edgehft.ir import TFLiteModel
    from edgehft.report import printable
    from edgehft.streaming.analysis import analyze
    a = analyze(TFLiteModel.from_file(bundle.model_path))
    if not a.streamable:
        b = a.blocking
        where = "its input" if b["index"] is None else f"op #{b['index']} {b['op']}"
        raise _refuse(f"{bundle.path.name} cannot stream: {where}: {printable(b['reason'])}",
                      hint="predict recomputes the whole window each tick; a model streams when no op mixes the "
                           "whole window before the last step (python -m edgehft.streaming.analysis BUNDLE)")
    return a


def _op_words(a, ops) -> str:
    """``ops #0-3 (RESHAPE, CONV_2D, TANH; CONV_2D #1: on the critical path, row 7 reads the newest row)``: the
    plan step's graph ops and the analysis' verdict on the one with the most MACs."""
    from edgehft.report import printable
    rows = [a.op(int(i)) for i in ops]
    names = ", ".join(dict.fromkeys(o.op for o in rows))
    span = f"op #{rows[0].index}" if len(rows) == 1 else f"ops #{rows[0].index}-{rows[-1].index}"
    big = max(rows, key=lambda o: o.macs_full)
    return f"{span} ({names}; {big.op} #{big.index}: {big.verdict}, {printable(big.reason)})"


def read_plan(runner) -> StreamPlan:
    """The :class:`StreamPlan` of ``runner``'s bundle (a cpu runner on a native plan).

    Raises:
        InputError: the model cannot stream (the analysis' blocking op), the plan is not native, or it is not
            [LSTM from the model's input] (-> LSTM ...) -> one LiteRT head step; the message names why."""
    bundle = runner.bundle
    plan = getattr(runner, "plan", None) or bundle.manifest.quantization.mode
    a = _analysis(bundle)
    rel = bundle.manifest.artifacts.get("native")
    if not rel:
        raise _refuse(f"the model streams, but the stream executor runs the cpu board's native plans; "
                      f"{bundle.path.name} runs plan {plan!r} whole on "
                      + ("ONNX Runtime" if plan.startswith("ort") else "LiteRT"))
    graph = json.loads((bundle.path / rel).read_text())
    ins, steps = bundle.manifest.inputs, graph["steps"]
    if len(ins) != 1 or len(bundle.manifest.outputs) != 1 or len(graph["inputs"]) != 1:
        raise _refuse(f"the stream takes one input and one output; {bundle.path.name} has {len(ins)} and "
                      f"{len(bundle.manifest.outputs)}")
    from edgehft.kernels.cpu.lstm import recurrent_bf16_of
    layers, src = [], graph["inputs"][0]
    k = 0
    while k < len(steps) and steps[k]["kind"] == "lstm" and steps[k]["inputs"] == [src] and not steps[k].get("projected"):
        st = steps[k]
        if recurrent_bf16_of(st):
            raise _refuse(f"op #{st.get('op')} LSTM: bf16 recurrent weights on an unprojected LSTM (the stack "
                          "stream executor keeps them fp32; the compiler writes bf16 only on projected LSTMs)")
        with np.load(bundle.path / st["weights"]) as w:
            layers.append((w["kernel"], w["recurrent_kernel"], w["bias"], float(w["cell_clip"])))
        src = st["outputs"][0]
        k += 1
    rest = steps[k:]
    if not layers and steps and steps[0]["kind"] in CHAIN_FRONT:
        return _chain_plan(runner, a)
    if not layers or len(rest) != 1 or rest[0]["kind"] != "litert" or rest[0]["inputs"] != [src] \
            or rest[0]["outputs"] != graph["outputs"]:
        first = steps[k] if k < len(steps) else None
        if first is None:
            what = "nothing after the last LSTM"
        elif first.get("projected") or first.get("what") == "LSTM input projection":
            what = (f"{_op_words(a, [first['op']])} with its input projection on the bf16 conv kernel (the stream "
                    "executor computes fp32 projections: plan 'native')")
        else:
            what = f"{_op_words(a, first.get('ops') or [first['op']])} on " + (
                "LiteRT" if first["kind"] == "litert" else f"a native {first['kind']} kernel")
        where = "before the first LSTM" if not layers else "after the LSTMs"
        raise _refuse(f"the stream executor runs native plans of LSTM (-> LSTM ...) -> last step -> head; plan "
                      f"{plan!r} of {bundle.path.name} has {what} {where}",
                      hint="predict it window by window; a convolution front end streams on the native-bf16 plan "
                           "(compile --quant native-bf16; python -m edgehft.streaming.analysis BUNDLE gives its rows)")
    spec = ins[0]
    if spec.quantized or spec.dtype != "float32" or len(spec.shape) != 3 or spec.shape[0] != 1:
        raise _refuse(f"the stream takes a float32 (1, T, features) input; {spec.name!r} is {spec.dtype} "
                      f"{list(spec.shape)}")
    p = StreamPlan(layers, int(spec.shape[1]), (int(spec.shape[2]),), bundle.path / rest[0]["model"], src,
                   graph["outputs"][0], analysis=a)
    _native_head(p)
    return p


def _chain_plan(runner, a) -> StreamPlan:
    """The :class:`StreamPlan` of a native chain with a convolution front end (:mod:`edgehft.streaming.chain`);
    InputError naming the op the chain executor cannot run one tick at a time."""
    from edgehft.streaming.chain import build_plan
    spec = runner.bundle.manifest.inputs[0]
    if spec.quantized or spec.dtype != "float32" or len(spec.shape) < 3 or spec.shape[0] != 1:
        raise _refuse(f"the stream takes a float32 (1, T, ...) input; {spec.name!r} is {spec.dtype} "
                      f"{list(spec.shape)}")
    chain = build_plan(runner.bundle, a, portable=bool(getattr(runner, "native_portable", False)))
    return StreamPlan([], int(spec.shape[1]), tuple(int(d) for d in spec.shape[2:]), None, "", "", analysis=a,
                      chain=chain)


def _native_head(p: StreamPlan) -> None:
    """Fill ``p.head_weights``/``head_bias`` when the head segment is STRIDED_SLICE(last step) + float
    FULLY_CONNECTED (no fused activation) writing the output; else say why in ``why_not_native_head``."""
    from edgehft.ir import TFLiteModel
    m = TFLiteModel.from_file(p.head_model)
    g = m.main
    names = [op.name for op in g.ops]
    if names != ["STRIDED_SLICE", "FULLY_CONNECTED"]:
        p.why_not_native_head = f"the head is {' + '.join(names)} (native: STRIDED_SLICE + FULLY_CONNECTED)"
        return
    fc = g.ops[1]
    w_t = g.tensors[fc.inputs[1]]
    b_t = g.tensors[fc.inputs[2]] if len(fc.inputs) > 2 and fc.inputs[2] >= 0 else None
    H = p.layers[-1][1].shape[0]
    if fc.options.get("FusedActivationFunction", 0) != 0 or fc.options.get("WeightsFormat", 0) != 0 \
            or w_t.dtype != "float32" or not w_t.is_constant or len(w_t.shape) != 2 or w_t.shape[1] != H \
            or (b_t is not None and (b_t.dtype != "float32" or not b_t.is_constant)) \
            or fc.inputs[0] != g.ops[0].outputs[0] or g.outputs != (fc.outputs[0],):
        p.why_not_native_head = "the FULLY_CONNECTED is not a float Dense of the last step without activation"
        return
    p.head_weights = np.ascontiguousarray(m.buffer(w_t), np.float32)
    p.head_bias = None if b_t is None else np.ascontiguousarray(m.buffer(b_t), np.float32).reshape(-1)


def open_stream(runner, prepare: str = "inline", core: int | None = None, spin_us: int = 1000) -> "Stream":
    """``runner.stream()``: a :class:`Stream` on ``runner``'s native plan (see the module docstring).

    Args:
        prepare: ``"inline"`` (the caller runs :meth:`Stream.prepare` between ticks; a push whose window is not
            prepared prepares it) or ``"thread"`` (a native helper thread prepares after each push).
        core: the CPU the helper thread is pinned to (``"thread"`` only; None: not pinned).
        spin_us: µs the helper spins after its last prepare before it sleeps until the next push.

    Raises:
        InputError: a bad ``prepare``/``core``, or a model or plan that does not stream here (why, see
            :func:`read_plan`); BoardUnavailableError: the kernel library cannot be loaded."""
    if prepare not in MODES:
        raise InputError(f"prepare={prepare!r}: one of {', '.join(MODES)}",
                         hint="inline: call stream.prepare() when idle; thread: a helper thread does it")
    if core is not None:
        if prepare != "thread":
            raise InputError("core= names the prepare thread's CPU: it applies to prepare='thread'",
                             hint="stream(prepare='thread', core=N), or drop core")
        if isinstance(core, bool) or not isinstance(core, (int, np.integer)) or not 0 <= int(core) < (os.cpu_count() or 1):
            raise InputError(f"core {core!r}: this machine's CPUs are 0 to {(os.cpu_count() or 1) - 1}",
                             hint=f"CPUs this process may use: {sorted(os.sched_getaffinity(0))}")
    if isinstance(spin_us, bool) or not isinstance(spin_us, (int, np.integer)) or spin_us < 0:
        raise InputError(f"spin_us {spin_us!r}: a whole number of µs >= 0")
    try:
        plan = read_plan(runner)
    except InputError as exc:
        raise _with_other_plans(exc, runner) from None
    return Stream(runner, plan, prepare, None if core is None else int(core), int(spin_us))


def _with_other_plans(exc: InputError, runner) -> InputError:
    """``exc`` with, in its hint, the bundle's other native plans (the stream executor's), when it carries some:
    a bundle compiled with ``--quant auto`` whose chosen plan does not stream may hold one that does."""
    bundle = runner.bundle
    top = bundle.path.parent.parent if bundle.path.parent.name == "plans" else bundle.path
    try:
        from edgehft.bundle import load_bundle
        names = load_bundle(top).plan_names() if top != bundle.path else bundle.plan_names()
    except Exception:  # noqa: BLE001 - only a hint: a bundle whose plans cannot be listed gets none
        return exc
    current = getattr(runner, "plan", None)
    others = [n for n in names if n.startswith("native") and n != current]
    if not others:
        return exc
    tries = "; ".join(f"runtime.open({str(top)!r}, plan={n!r}).stream()" for n in others)
    return InputError(str(exc).split("\n")[0], hint=f"this bundle also carries plan(s) {', '.join(others)}, which "
                      f"may stream: {tries} (or edgehft bench {top} --plan NAME --streaming); {exc.hint}")


class Stream:
    """A stream on a cpu runner's native plan (made by :func:`open_stream` / ``runner.stream()``; the module
    docstring says what each method does). One thread at a time: a call that enters while another thread's
    call is in progress, or any call after :meth:`close`, raises RunnerStateError."""

    def __init__(self, runner, plan: StreamPlan, mode: str, core: int | None, spin_us: int):
        from edgehft.runtime.base import InputSlot
        self.plan, self.mode, self.core, self.bundle = plan, mode, core, runner.bundle
        self.window_rows = plan.timesteps
        spec = runner.bundle.manifest.inputs[0]
        self._native = None
        if plan.chain is not None:
            self._open_chain(plan, mode, core, spin_us)
        else:
            self._open_lstm_stack(runner, plan, mode, core, spin_us)
        self.isa = self._native.isa
        row_spec = spec.model_copy(update={"shape": [1, *plan.row_shape]})
        self._slot = InputSlot(row_spec, self._native.row.reshape(1, *plan.row_shape))
        self._out_shape = tuple(runner.bundle.manifest.outputs[0].shape)
        self.closed = False
        self._entry = threading.Lock()
        self._bind()

    def _open_chain(self, plan: StreamPlan, mode: str, core=None, spin_us: int = 1000) -> None:
        """The conv-front-end executor (:mod:`edgehft.streaming.chain`, a native program): its head is the chain's
        own kernels; ``prepare="thread"`` starts its native helper thread (pinned to ``core`` when given)."""
        from edgehft.streaming.chain import ChainExecutor
        self._head_seg = None
        self.head, self.head_check = "native", "the chain's own kernels (those predict runs)"
        self._native = ChainExecutor(plan.chain)           # closes the plan's kernels when it cannot be made
        if mode == "thread":
            rc = self._native.start_helper(core, spin_us)
            if rc != 0:
                self.close()
                raise InputError("cannot start the prepare thread" + (f" on core {core}" if core is not None else "")
                                 + f" (code {rc})", hint=f"CPUs this process may use: {sorted(os.sched_getaffinity(0))}")

    def _open_lstm_stack(self, runner, plan: StreamPlan, mode: str, core, spin_us: int) -> None:
        """The LSTM-stack executor (:mod:`edgehft.kernels.cpu.stream`) with a native or LiteRT head."""
        from edgehft.kernels.cpu.stream import NativeStream
        self._head_seg = _HeadSegment(plan, runner.threads, runner.op_resolver)
        portable = bool(getattr(runner, "native_portable", False))
        T = plan.timesteps
        try:
            self.head = "litert"
            if plan.head_weights is not None:
                self._native = NativeStream(plan.layers, T, (plan.head_weights, plan.head_bias), portable=portable)
                self.head_check = self._head_seg.check(self._native, plan)
                if self.head_check.startswith("equal"):
                    self.head = "native"
                else:
                    self._native.close()
                    self._native = None
            else:
                self.head_check = plan.why_not_native_head
            if self._native is None:
                self._native = NativeStream(plan.layers, T, output="sequence", portable=portable)
            if mode == "thread":
                rc = self._native.start_helper(core, spin_us)
                if rc != 0:
                    raise InputError("cannot start the prepare thread" + (f" on core {core}" if core is not None else "")
                                     + f" (code {rc})", hint=f"CPUs this process may use: {sorted(os.sched_getaffinity(0))}")
        except BaseException:
            self.close()
            raise

    # --- the hot path ------------------------------------------------------------------------------------
    def _bind(self) -> None:
        """``push``: for a float32 row of the right shape, the entry guard, one copy into the executor's staging
        row, one native call (it checks finiteness), and for the LiteRT head one segment run; anything else
        (another dtype, shape, or a non-finite row: the executor refuses it untouched) takes :meth:`_push_checked`,
        which raises predict's errors."""
        nat = self._native
        call = getattr(nat, "push_raw", nat.push_staged)      # the chain's bare native call (no Python frame)
        failed = getattr(nat, "raise_failed", None)
        shapes, dests = self._slot.shapes, {s: self._native.row.reshape(s) for s in self._slot.shapes}
        f32, ndarray, copyto = np.dtype(np.float32), np.ndarray, np.copyto
        enter, leave, busy, checked = self._entry.acquire, self._entry.release, self._busy, self._push_checked
        out = nat.out.reshape(self._out_shape) if self.head == "native" else None
        seg = self._head_seg.run if self.head == "litert" else None

        def push(row):
            if row.__class__ is ndarray and row.dtype is f32 and row.shape in shapes:
                if not enter(False):
                    busy()
                try:
                    copyto(dests[row.shape], row)
                    rc = call()
                    if rc == 0:
                        return out if seg is None else seg(nat.out)
                    if rc == 1:
                        return None
                finally:
                    leave()
                if rc < -1 and failed is not None:
                    failed(rc)
            return checked(row)
        self.push = push

    def push(self, row):
        """The window's newest row (the input without batch and time axes, or with a leading 1). Returns the
        output of the window of the last T rows (a reused float32 buffer of predict's output shape), or None
        while warming up. (An open stream's ``push`` is :meth:`_bind`'s closure; this is the checked path.)

        Raises:
            ShapeError, DTypeError, NonFiniteInputError: a bad row (nothing is kept); RunnerStateError: closed,
                or another thread's call in progress."""
        return self._push_checked(row)

    def _push_checked(self, row):
        """The general path: predict's checks and casts (:class:`~edgehft.runtime.base.InputSlot` on a one-row
        input) into the staging row, then the native call."""
        if not self._entry.acquire(False):
            self._busy()
        try:
            if isinstance(row, np.ndarray) and row.shape not in self._slot.shapes:
                raise ShapeError(f"input {self._slot.spec.name!r}: row shape {row.shape}, expected "
                                 f"{self.plan.row_shape} or (1, {', '.join(map(str, self.plan.row_shape))})",
                                 hint="one row per push: the window's newest row")
            self._slot.write(row)
            rc = self._native.push_staged()
            if rc == -1:            # a float64 row whose cast is fine but whose values the check let through
                raise NonFiniteInputError(f"input {self._slot.spec.name!r}: the row holds a NaN or an infinity",
                                          hint="drop or repair the tick before it reaches the model")
            if rc == 1:
                return None
            if self.head == "litert":
                return self._head_seg.run(self._native.out)
            return self._native.out.reshape(self._out_shape)
        finally:
            self._entry.release()

    def _busy(self):
        if self.closed:
            raise RunnerStateError(f"the stream on {self.bundle.path} is closed",
                                   hint="open another: runner.stream()")
        raise RunnerStateError(f"the stream on {self.bundle.path} is already running a call in another thread",
                               hint="a stream serves one thread: push, prepare and reset from the same one")

    def _guarded(self, method: str, *args):
        """The executor's ``method(*args)`` under the entry guard (RunnerStateError when closed or busy)."""
        if not self._entry.acquire(False):
            self._busy()
        try:
            return getattr(self._native, method)(*args)
        finally:
            self._entry.release()

    # --- the rest ------------------------------------------------------------------------------------------
    def prepare(self) -> bool:
        """Run the ahead-of-tick work for the window the next push completes (waits if the helper thread is on
        it). Returns False while warming up (fewer than T-1 rows: nothing to prepare), else True."""
        return self._guarded("prepare")

    def native_entry(self) -> "NativeEntry":
        """What a C or C++ caller needs to push this stream without Python (the lowest tick-to-signal this library
        gives: Python's push adds its row check, copy and call), as a dict of integers (addresses):

        * ``push``: ``int push(void* handle)``: pushes the row at ``row`` (``row_floats`` float32, written by the
          caller first); returns 0 (the output is at ``out``, ``out_floats`` float32, valid until the next push),
          1 warming up, -1 a NaN or infinity in the row (nothing kept), < -1 a kernel failed (no output);
        * ``prepare``: ``int prepare(void* handle)``: the ahead-of-tick work (call it when idle; a push prepares
          what is missing itself), 0 prepared, 1 warming up;
        * ``handle``, ``row``, ``row_floats``, ``out``, ``out_floats``; ``library``: the kernel library's path.

        The contract: the addresses are valid while the stream is open. The returned dict holds a reference to the
        stream, so the stream is not collected while the dict lives; keep it (or the stream) for as long as the
        caller pushes, and close the stream only after the caller's last call. One thread at a time pushes and
        prepares, and this object's own methods are not called meanwhile (the native calls take no lock). Every
        push gives the bits :meth:`push` gives.

        Raises:
            RunnerStateError: closed or busy; InputError: the stream's head runs in LiteRT from Python (no native
                output)."""
        entry = self._guarded("native_entry")
        if self.head == "litert":
            raise InputError("this stream's head runs in LiteRT from Python after the native push: no native entry "
                             "gives its output", hint="use stream.push")
        from edgehft.kernels.cpu.build import load_library
        return NativeEntry(self, {**entry, "library": str(getattr(load_library(), "_name", ""))})

    def time_pushes(self, rows, prepare: bool = True) -> np.ndarray:
        """Push ``rows`` in turn, each push timed inside the native library: what a C or C++ caller of the executor
        sees (no Python call, no row check or copy in Python; the clock read just before and just after the native
        push). For benchmarks (``benchmarks/streaming.py``'s "timed in the library" row) beside :meth:`push` timed
        from Python. ``prepare``: :meth:`prepare` after each push (untimed), else the helper thread or the push
        itself prepares. The stream then holds the last rows, as after as many pushes.

        Args:
            rows: ``(n, *row_shape)`` or ``(n, 1, *row_shape)`` float32 (copied to a C-contiguous array when it is
                not one); n may be 0.
            prepare: a bool.

        Returns:
            ``(n,)`` uint64 ns per push, 0 for a push without an output (warming up, a non-finite row refused).

        Raises:
            RunnerStateError: closed or busy; ShapeError / DTypeError: rows of another shape or dtype; InputError:
                a non-bool ``prepare``, or a stream whose head runs in LiteRT (the library's push ends before it:
                time :meth:`push`); BoardUnavailableError: a kernel failed."""
        if self.closed:
            self._busy()                                     # RunnerStateError: closed, before any argument check
        shape = tuple(self.plan.row_shape)
        if not isinstance(prepare, (bool, np.bool_)):
            raise InputError(f"prepare={prepare!r}: True or False", hint="True: prepare inline after each push")
        if not isinstance(rows, np.ndarray):
            raise DTypeError(f"rows must be a numpy array, got {type(rows).__name__}", hint="np.asarray(rows, np.float32)")
        if rows.dtype != np.float32:
            raise DTypeError(f"rows must be float32, got {rows.dtype}", hint="rows.astype(np.float32)")
        if rows.ndim < 1 or tuple(rows.shape[1:]) not in (shape, (1, *shape)):
            raise ShapeError(f"rows of shape {rows.shape}, expected (n, {', '.join(map(str, shape))})",
                             hint="one row per tick, stacked along axis 0")
        if self.head == "litert":
            raise InputError("this stream's head runs in LiteRT from Python after the native push: the library "
                             "cannot time the whole tick", hint="time stream.push instead")
        flat = np.ascontiguousarray(rows.reshape(rows.shape[0], int(np.prod(shape, dtype=np.int64))))
        ns = np.zeros(flat.shape[0], np.uint64)
        if len(flat):
            self._guarded("time_pushes", flat, ns, bool(prepare))
        return ns

    def reset(self) -> None:
        """Forget every row: warming up again (a prepare running on the helper finishes first). Counters stay."""
        self._guarded("reset")

    def window(self) -> np.ndarray:
        """A copy of the current window, oldest row first: ``(rows, *row_shape)`` float32 with rows = min(rows
        pushed, T) (at T rows: what ``predict`` takes for the last output)."""
        return self._guarded("window").reshape(-1, *self.plan.row_shape)

    @property
    def rows(self) -> int:
        """Rows pushed since the stream opened or was reset."""
        nat = self._native
        return nat.rows if nat is not None else 0

    @property
    def warming_up(self) -> bool:
        """Fewer than T rows pushed since open or reset: push returns None."""
        return self.rows < self.window_rows

    @property
    def status(self) -> str:
        """``"warming up, k of T rows"`` or ``"ready: window of T rows"``."""
        k = self.rows
        return f"warming up, {k} of {self.window_rows} rows" if k < self.window_rows else \
            f"ready: window of {self.window_rows} rows"

    @property
    def counters(self) -> dict:
        """``pushes``, ``outputs``, ``prepared_ahead`` (outputs whose window was prepared before the push),
        ``prepared_late`` (prepared by the push itself or waited for on the helper; ``late_waited`` of them
        waited), ``late_prepare_us_total`` (µs those pushes spent on it), ``prepares`` (windows prepared by
        anyone), ``prepare_us_mean`` / ``prepare_us_last``, ``bad_rows`` (refused rows)."""
        nat = self._native
        if nat is None:
            self._busy()
        c = nat.counters()
        n = c["prepares"]
        return {"pushes": c["pushes"], "outputs": c["outputs"], "prepared_ahead": c["prepared_ahead"],
                "prepared_late": c["prepared_late"], "late_waited": c["late_waited"],
                "late_prepare_us_total": c["late_prepare_ns"] / 1e3, "prepares": n,
                "prepare_us_mean": c["prepare_ns_total"] / 1e3 / n if n else 0.0,
                "prepare_us_last": c["prepare_ns_last"] / 1e3, "bad_rows": c["bad_rows"]}

    def profile(self, on: bool = True) -> None:
        """Op-by-op timing of prepare and push on (zeroed) or off; off by default (no clock read on the hot path).
        Raises InputError for a stream whose prepare runs on its helper thread (``prepare="thread"``)."""
        self._guarded("profile", on)

    def profile_ops(self) -> list[dict]:
        """Since :meth:`profile` turned on: per op of the prepare and the critical path (``phase``, ``op``,
        ``us_per_tick``: mean µs per prepare or push, ``share`` of its phase), as the executor runs them. A LiteRT
        head runs after the native push and is not in it. Empty while profiling is off."""
        return self._guarded("profile_ops")

    def describe(self) -> dict:
        """What the stream runs: mode, core, isa, window, head (native | litert) and its check, the analysis'
        MACs per tick (critical / prepare / whole window) and the MACs its kernels run per tick (``macs_run``:
        critical / prepare, with the last steps' recurrent sums in prepare and, for a chain, after the kernel-row
        split; :meth:`edgehft.streaming.chain.Plan.macs_run`)."""
        a = self.plan.analysis
        return {"prepare": self.mode, "core": self.core, "isa": self.isa, "window": self.window_rows,
                "row_shape": list(self.plan.row_shape), "executor": "lstm-stack" if self.plan.chain is None else "chain",
                "layers": [int(l[1].shape[0]) for l in self.plan.layers] if self.plan.chain is None
                else list(self.plan.chain.layers),
                "head": self.head, "head_check": self.head_check,
                "macs": None if a is None else {"critical": a.macs_critical, "prepare": a.macs_prepare,
                                                "window": a.macs_full},
                "macs_run": self._stack_macs_run() if self.plan.chain is None else self.plan.chain.macs_run()}

    def _stack_macs_run(self) -> dict:
        """The LSTM-stack executor's MACs per tick (cpu_stream.cpp): on the tick each layer's input projection of
        its last step and the native head; in prepare, per layer, the T - 1 recurrent sums (steps 1 .. T-2 and the
        last step's, ahead) and, for layers after the first, the projections of steps 0 .. T-2."""
        T, crit, prep = self.window_rows, 0, 0
        for i, (W, U, *_rest) in enumerate(self.plan.layers):
            n_in, n_out = int(W.shape[0]), int(W.shape[1])
            crit += n_in * n_out
            prep += (T - 1) * int(U.shape[0]) * n_out + (0 if i == 0 else (T - 1) * n_in * n_out)
        if self.head == "native" and self.plan.head_weights is not None:
            crit += int(self.plan.head_weights.size)
        return {"critical": crit, "prepare": prep}

    def close(self) -> None:
        """Stop the helper thread and free the executor; later calls raise RunnerStateError."""
        entry = getattr(self, "_entry", None)
        if entry is not None and not getattr(self, "closed", True):
            entry.acquire()                       # never released: later calls cannot enter
        self.closed = True
        nat, self._native = getattr(self, "_native", None), None
        if nat is not None:
            nat.close()
        self.__dict__.pop("push", None)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NativeEntry(dict):
    """:meth:`Stream.native_entry`'s dict of integers; it keeps its stream alive (``stream``) while it lives."""

    def __init__(self, stream: "Stream", values: dict):
        super().__init__(values)
        self.stream = stream


class _HeadSegment:
    """The plan's own head segment on LiteRT (the interpreter ``predict`` uses for it, opened the same way): the
    native head's check, and the head of a stream whose head is not native."""

    def __init__(self, plan: StreamPlan, threads: int, op_resolver: str):
        from edgehft.runtime import litert
        self.it = litert.make_interpreter(plan.head_model, threads, op_resolver)
        d = {x["name"]: x for x in self.it.get_input_details() + self.it.get_output_details()}
        self.i_in, self.i_out = d[plan.head_input]["index"], d[plan.head_output]["index"]
        self.in_shape = tuple(d[plan.head_input]["shape"])
        self.out = np.empty(tuple(d[plan.head_output]["shape"]), np.float32)

    def run(self, seq: np.ndarray) -> np.ndarray:
        """The head on the last LSTM's whole output ``seq`` ``(T, H)``: the reused output buffer."""
        self.it.set_tensor(self.i_in, seq.reshape(self.in_shape))
        self.it.invoke()
        np.copyto(self.out, self.it.get_tensor(self.i_out))
        return self.out

    def check(self, native, plan: StreamPlan) -> str:
        """Compare the native head with this segment on :data:`HEAD_PROBES` seeded sequences (h in (-1, 1), as
        an LSTM's h is; every row differs, so a slice of another step differs too). ``"equal on N probes"`` or
        why not."""
        rng = np.random.default_rng(20240808)
        for i in range(HEAD_PROBES):
            seq = rng.uniform(-1, 1, self.in_shape).astype(np.float32)
            want = self.run(seq.reshape(self.in_shape[-2:])).reshape(-1)
            got = native.head(seq.reshape(self.in_shape[-2:])[-1])
            if not np.array_equal(want, got):
                return (f"the native head differs from the plan's LiteRT head on probe {i} "
                        f"(max |diff| {float(np.abs(want - got).max()):.3g}): the head runs on LiteRT")
        return f"equal on {HEAD_PROBES} probes"
