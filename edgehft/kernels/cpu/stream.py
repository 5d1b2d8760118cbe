"""edgehft's native stream executor (``edgehft/kernels/cpu/cpu_stream.cpp``) through ctypes: stacked Keras LSTMs
from the zero state every window and a Dense head on the last step, fed one row (tick) at a time (issue 21).

The window is the ``timesteps`` newest rows. :meth:`NativeStream.prepare` runs, ahead of the next row, every step
that row does not feed (per layer, steps 0 .. T-2 of the next window, from the zero state); :meth:`push` then
runs only step T-1 of each layer and the head. Layer 0's input projection ``x_t @ kernel + bias`` is computed
once per row, when it arrives, and kept for the later windows that hold it. The steps are the native LSTM
kernel's own functions (``cpu_lstm.h``), so a push gives the bits :class:`~edgehft.kernels.cpu.lstm.NativeLSTM`
gives on the same window, on every dispatch target. The head sums, per output, bias then ``h[k] * w[m][k]`` for
``k`` ascending with fused multiply-adds (the order of XNNPACK's f32 GEMM micro-kernels for one row).

A push before its window was prepared prepares it first ("late", counted). :meth:`start_helper` starts a native
thread (pinned to a core) that prepares right after each push; the push path takes no lock (one atomic word
hands the buffers over, ``cpu_stream.cpp`` says which memory ordering it relies on).

    s = NativeStream([(kernel, recurrent_kernel, bias, cell_clip), ...], timesteps=50, head=(w, b))
    y = s.push(row)      # row (in,) float32 -> (M,) float32 (a reused buffer), or None while warming up
    s.prepare()          # when idle: the next window's steps that do not need its newest row

Raises :class:`~edgehft.errors.BoardUnavailableError` when the kernel library cannot be built or loaded.
"""
from __future__ import annotations

import contextlib
import ctypes

import numpy as np

from edgehft.errors import NonFiniteInputError, ShapeError
from edgehft.kernels.cpu import build

OUTPUTS = {"head": 0, "last": 1, "sequence": 2}
COUNTERS = ("pushes", "outputs", "prepared_ahead", "prepared_late", "late_waited", "late_prepare_ns",
            "prepares", "prepare_ns_total", "prepare_ns_last", "rows", "bad_rows", "helper")
PUSHED, WARMING, NOT_FINITE = 0, 1, -1         # edgehft_stream_push's return codes


def load_library(cache_dir=None) -> ctypes.CDLL:
    """The kernel library (:func:`edgehft.kernels.cpu.build.load_library`) with the stream functions typed."""
    lib = build.load_library(cache_dir)
    if getattr(lib, "_edgehft_stream_typed", False):
        return lib
    vp, i32, u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64
    lib.edgehft_stream_create.restype = vp
    lib.edgehft_stream_create.argtypes = [i32, i32, i32, vp, vp, vp, vp, vp, i32, vp, vp, i32]
    for name, res, args in (("edgehft_stream_push", i32, [vp, vp, vp]), ("edgehft_stream_prepare", i32, [vp]),
                            ("edgehft_stream_reset", None, [vp]), ("edgehft_stream_rows", u64, [vp]),
                            ("edgehft_stream_start_helper", i32, [vp, i32, i32]),
                            ("edgehft_stream_counters", None, [vp, vp]), ("edgehft_stream_window", i32, [vp, vp]),
                            ("edgehft_stream_head", i32, [vp, vp, vp]), ("edgehft_stream_slot", i32, [vp]),
                            ("edgehft_stream_destroy", None, [vp])):
        getattr(lib, name).restype = res
        getattr(lib, name).argtypes = args
    lib.edgehft_stream_stage.restype = None
    lib.edgehft_stream_stage.argtypes = [vp, vp, vp]
    lib.edgehft_stream_push_staged.restype = i32
    lib.edgehft_stream_push_staged.argtypes = [vp]
    lib.edgehft_stream_time_pushes.restype = ctypes.c_int64
    lib.edgehft_stream_time_pushes.argtypes = [vp, vp, ctypes.c_int64, vp, vp, i32]
    lib.edgehft_stream_profile.restype = i32
    lib.edgehft_stream_profile.argtypes = [vp, i32]
    lib.edgehft_stream_profile_read.restype = i32
    lib.edgehft_stream_profile_read.argtypes = [vp, vp, i32]
    lib._edgehft_stream_typed = True
    return lib


def time_args(handle, rows: np.ndarray, ns: np.ndarray, row_size: int) -> None:
    """Check ``time_pushes``' arguments before the native loop reads or writes them: an open executor, ``rows``
    ``(n, row_size)`` float32 C-contiguous, ``ns`` ``(n,)`` uint64 C-contiguous.

    Raises:
        RunnerStateError: the executor was closed; ShapeError: any other argument."""
    from edgehft.errors import RunnerStateError
    if not handle:
        raise RunnerStateError("the executor is closed", hint="open another stream")
    if not (isinstance(rows, np.ndarray) and rows.dtype == np.float32 and rows.ndim == 2
            and rows.shape[1] == row_size and rows.flags.c_contiguous):
        raise ShapeError(f"rows must be (n, {row_size}) float32, C-contiguous; got "
                         f"{getattr(rows, 'dtype', type(rows).__name__)} {getattr(rows, 'shape', '')}")
    if not (isinstance(ns, np.ndarray) and ns.dtype == np.uint64 and ns.shape == (rows.shape[0],)
            and ns.flags.c_contiguous):
        raise ShapeError(f"ns must be ({rows.shape[0]},) uint64, C-contiguous; got "
                         f"{getattr(ns, 'dtype', type(ns).__name__)} {getattr(ns, 'shape', '')}")


def entry(handle, push, prepare, row: np.ndarray, out: np.ndarray) -> dict:
    """An executor's native entry points as integers (:meth:`edgehft.streaming.stream.Stream.native_entry`): the
    handle, ``int push(void*)`` and ``int prepare(void*)`` (ctypes functions of the library), the staging row and
    the output buffer."""
    vp = ctypes.c_void_p
    return {"handle": handle.value, "push": ctypes.cast(push, vp).value, "prepare": ctypes.cast(prepare, vp).value,
            "row": row.ctypes.data, "row_floats": row.size, "out": out.ctypes.data, "out_floats": out.size}


def profile_switch(fn, handle, on: bool) -> None:
    """Turn an executor's op-by-op timing on (zeroed) or off: ``fn`` is ``edgehft_stream_profile`` or
    ``edgehft_chain_profile``. Raises ``InputError`` while its helper thread runs (the timing needs the prepare on
    the pushing thread), ``MemoryError`` when the slots cannot be allocated."""
    from edgehft.errors import InputError
    rc = int(fn(handle, int(bool(on))))
    if rc == -1:
        raise InputError("op-by-op timing needs the prepare on the pushing thread, and this stream's helper thread "
                         "runs", hint="open the stream with prepare='inline' to profile it")
    if rc:
        raise MemoryError("no memory for the stream's profile slots")


def profile_counts(fn, handle, nslots: int) -> tuple[int, int, list[int]]:
    """``(prepares timed, pushes timed, ns per slot)`` from ``edgehft_stream_profile_read`` or
    ``edgehft_chain_profile_read`` (``nslots`` the executor's slot count)."""
    buf = (ctypes.c_uint64 * (nslots + 2))()
    n = int(fn(handle, buf, nslots + 2))
    return int(buf[0]), int(buf[1]), [int(v) for v in buf[2:2 + min(n, nslots)]]


def profile_rows(labels: list, prepares: int, pushes: int, ns: list[int]) -> list[dict]:
    """One dict per slot: ``phase`` ("prepare" | "critical"), ``op`` (its label), ``us_per_tick`` (mean µs per
    prepare or push timed), ``share`` (of its phase's total)."""
    rows, total = [], {"prepare": 0.0, "critical": 0.0}
    for (phase, op), v in zip(labels, ns):
        n = prepares if phase == "prepare" else pushes
        us = v / 1e3 / n if n else 0.0
        rows.append({"phase": phase, "op": op, "us_per_tick": us})
        total[phase] += us
    for r in rows:
        t = total[r["phase"]]
        r["share"] = r["us_per_tick"] / t if t else 0.0
    return rows


def _layers(layers) -> tuple[list, list, list, list, list]:
    """Checked float32 copies ``(Ws, Us, bs, Hs, clips)`` of ``[(kernel, recurrent_kernel, bias, cell_clip)]``."""
    Ws, Us, bs, Hs, clips = [], [], [], [], []
    for li, lw in enumerate(layers):
        if len(lw) != 4:
            raise ShapeError(f"layer {li}: expected (kernel, recurrent_kernel, bias, cell_clip), got {len(lw)} items")
        W, U, b = (np.ascontiguousarray(a, np.float32) for a in lw[:3])
        clip = float(lw[3])
        if U.ndim != 2 or U.shape[0] < 1 or U.shape[1] != 4 * U.shape[0]:
            raise ShapeError(f"layer {li}: recurrent_kernel must be (H, 4H), got {U.shape}")
        H = U.shape[0]
        if W.ndim != 2 or W.shape[0] < 1 or W.shape[1] != 4 * H:
            raise ShapeError(f"layer {li}: kernel must be (in, {4 * H}), got {W.shape}")
        if b.shape != (4 * H,):
            raise ShapeError(f"layer {li}: bias must be ({4 * H},), got {b.shape}")
        if Hs and W.shape[0] != Hs[-1]:
            raise ShapeError(f"layer {li}: kernel has {W.shape[0]} input rows, the previous layer gives {Hs[-1]}")
        if not np.isfinite(clip) or clip < 0:
            raise ShapeError(f"layer {li}: cell_clip must be a finite value >= 0 (0: no clipping), got {clip}")
        Ws.append(W), Us.append(U), bs.append(b), Hs.append(H), clips.append(clip)
    return Ws, Us, bs, Hs, clips


def _head(head, H: int) -> tuple:
    """``(weights (M, H) float32, bias (M,) float32 or None)`` checked."""
    w, b = head
    w = np.ascontiguousarray(w, np.float32)
    if w.ndim != 2 or w.shape[1] != H or w.shape[0] < 1:
        raise ShapeError(f"head weights must be (M, {H}) (TFLite FULLY_CONNECTED layout), got {w.shape}")
    if b is not None:
        b = np.ascontiguousarray(b, np.float32)
        if b.shape != (w.shape[0],):
            raise ShapeError(f"head bias must be ({w.shape[0]},), got {b.shape}")
    return w, b


class NativeStream:
    """Stacked LSTM layers and a head on the native stream executor, weights copied at construction.

    Args:
        layers: per layer ``(kernel (in, 4H), recurrent_kernel (H, 4H), bias (4H,), cell_clip)`` in Keras layout
            (gate order i, f, c, o), any float dtype (converted to float32); ``cell_clip`` > 0 clamps the cell
            state as TFLite's option does (0: Keras, no clipping). Layer l's ``in`` is layer l-1's H.
        timesteps: T, the window's rows.
        head: ``(weights (M, H_last), bias (M,) or None)`` of a Dense on the last step (TFLite
            FULLY_CONNECTED layout), for ``output="head"``.
        output: ``"head"`` (the head's ``(M,)``), ``"last"`` (the last layer's last h, ``(H,)``) or
            ``"sequence"`` (the last layer's whole h sequence, ``(T, H)``).
        portable: run the scalar fallback target, else the one in force
            (:func:`edgehft.kernels.cpu.build.force_target`); :attr:`isa` names it.

    :attr:`out` is the preallocated float32 output; :meth:`push` returns it (copy what you keep). One thread
    at a time may call push, prepare, reset (the helper thread is the executor's own). Raises ``ShapeError``
    on inconsistent weights, ``MemoryError`` when the executor cannot be allocated.
    """

    def __init__(self, layers, timesteps: int, head=None, *, output: str = "head", portable: bool = False):
        if not layers:
            raise ShapeError("NativeStream needs at least one layer")
        if output not in OUTPUTS:
            raise ShapeError(f"output {output!r}: one of {', '.join(OUTPUTS)}")
        if (output == "head") != (head is not None):
            raise ShapeError("a head is given exactly when output='head'")
        self.timesteps = T = int(timesteps)
        if T < 1:
            raise ShapeError(f"timesteps must be >= 1, got {timesteps}")
        Ws, Us, bs, Hs, clips = _layers(layers)
        self.input_size, self.hidden = Ws[0].shape[0], tuple(Hs)
        hw, hb = _head(head, Hs[-1]) if head is not None else (None, None)
        self._lib = lib = load_library()
        n = len(Hs)
        P = ctypes.c_void_p * n
        target = build.force_target("scalar") if portable else contextlib.nullcontext()
        with target:
            h = lib.edgehft_stream_create(n, T, self.input_size, (ctypes.c_int * n)(*Hs), P(*[a.ctypes.data for a in Ws]),
                                          P(*[a.ctypes.data for a in Us]), P(*[a.ctypes.data for a in bs]),
                                          (ctypes.c_float * n)(*clips), 0 if hw is None else hw.shape[0],
                                          None if hw is None else hw.ctypes.data,
                                          None if hb is None else hb.ctypes.data, OUTPUTS[output])
        if not h:
            raise MemoryError("edgehft_stream_create failed (out of memory)")
        self._h = ctypes.c_void_p(h)
        self.isa = build.slot_name(lib.edgehft_stream_slot(self._h))
        shape = {"head": (0 if hw is None else hw.shape[0],), "last": (Hs[-1],), "sequence": (T, Hs[-1])}[output]
        self.out = np.zeros(shape, np.float32)
        self._m = None if hw is None else hw.shape[0]
        self.row = np.zeros(self.input_size, np.float32)       # the staging row push_staged reads
        self._counts = (ctypes.c_uint64 * len(COUNTERS))()
        self.helper_core: int | None = None
        # the hot path's call, bound once: push the staging row, write out
        self.push_staged = _bound(lib.edgehft_stream_push, self._h, self.row, self.out)
        lib.edgehft_stream_stage(self._h, self.row.ctypes.data, self.out.ctypes.data)   # for native_entry's callers

    def push(self, row: np.ndarray):
        """One row: ``(in,)`` float32. Returns :attr:`out` for the window ending at this row, or None while
        fewer than T rows were pushed since construction or :meth:`reset`.

        Raises:
            ShapeError: a row of another size; NonFiniteInputError: a NaN or infinity (nothing is kept)."""
        x = np.asarray(row, np.float32).reshape(-1)
        if x.size != self.input_size:
            raise ShapeError(f"row of {x.size} values, the stream takes {self.input_size}")
        np.copyto(self.row, x)
        rc = self.push_staged()
        if rc == NOT_FINITE:
            raise NonFiniteInputError("the row holds a NaN or an infinity")
        return self.out if rc == PUSHED else None

    def prepare(self) -> bool:
        """The next window's steps that do not need its newest row (waits for the helper if it is on them).
        Returns False while warming up (too few rows for anything to prepare), else True."""
        return self._lib.edgehft_stream_prepare(self._h) == 0

    def native_entry(self) -> dict:
        """The C entry points a native caller pushes with (see :meth:`edgehft.streaming.stream.Stream.native_entry`)."""
        return entry(self._h, self._lib.edgehft_stream_push_staged, self._lib.edgehft_stream_prepare, self.row,
                     self.out)

    def time_pushes(self, rows: np.ndarray, ns: np.ndarray, prepare: bool = True) -> int:
        """Push ``rows`` (``(n, in)`` float32, C-contiguous) in turn, each timed inside the library into ``ns``
        (``(n,)`` uint64: ns, 0 for a push without an output), outputs to :attr:`out`, ``prepare`` after each
        (untimed). Returns the number of outputs (``edgehft_stream_time_pushes``).

        Raises:
            RunnerStateError: closed; ShapeError: rows or ns of another shape, dtype or layout (:func:`time_args`)."""
        time_args(self._h, rows, ns, self.input_size)
        return int(self._lib.edgehft_stream_time_pushes(self._h, rows.ctypes.data, rows.shape[0], self.out.ctypes.data,
                                                        ns.ctypes.data, int(bool(prepare))))

    def reset(self) -> None:
        """Forget every row (warming up again); counters are kept."""
        self._lib.edgehft_stream_reset(self._h)

    @property
    def rows(self) -> int:
        """Rows pushed since construction or :meth:`reset`."""
        return int(self._lib.edgehft_stream_rows(self._h))

    def start_helper(self, core: int | None = None, spin_us: int = 1000) -> int:
        """Start the thread that prepares after each push, pinned to CPU ``core`` (None: not pinned); it spins
        ``spin_us`` µs after its last prepare, then sleeps until the next push. Returns 0, or the executor's
        code: -1 already running, -2 no thread could be started, -3 the core was refused, -4 profiling is on
        (:meth:`profile`)."""
        rc = int(self._lib.edgehft_stream_start_helper(self._h, -1 if core is None else int(core), int(spin_us)))
        if rc == 0:
            self.helper_core = core
        return rc

    def profile(self, on: bool = True) -> None:
        """Op-by-op timing of prepare and push on (zeroed) or off (:func:`profile_switch`; off by default: no
        clock is read on the hot path then)."""
        profile_switch(self._lib.edgehft_stream_profile, self._h, on)

    def profile_ops(self) -> list[dict]:
        """Per layer its prepare (steps 0..T-2 and step T-1's recurrent sum) and its last step on the tick, then
        the head (or the copy out): :func:`profile_rows`, µs per prepare or push since :meth:`profile` turned on
        (empty while it is off)."""
        nl, T = len(self.hidden), self.timesteps
        labels = [("prepare", f"LSTM layer {l} ({h}): steps 0-{T - 2} + step {T - 1}'s h @ U")
                  for l, h in enumerate(self.hidden)]
        labels += [("critical", f"LSTM layer {l} ({h}): step {T - 1}'s projection + gates")
                   for l, h in enumerate(self.hidden)]
        labels.append(("critical", "head (FULLY_CONNECTED)" if self._m is not None else "output copy"))
        return profile_rows(labels, *profile_counts(self._lib.edgehft_stream_profile_read, self._h, 2 * nl + 1))

    def counters(self) -> dict:
        """The executor's counters (:data:`COUNTERS`), ints: ns for the ``*_ns*`` ones."""
        self._lib.edgehft_stream_counters(self._h, self._counts)
        return dict(zip(COUNTERS, (int(v) for v in self._counts)))

    def head(self, h: np.ndarray) -> np.ndarray:
        """The head alone on ``h`` (``(H_last,)`` float32), exactly as :meth:`push` computes it: a new ``(M,)``
        float32 array. Raises ``ShapeError`` for a stream without a head or an ``h`` of another size."""
        h = np.ascontiguousarray(h, np.float32).reshape(-1)
        if self._m is None or h.size != self.hidden[-1]:
            raise ShapeError(f"head(): a ({self.hidden[-1]},) h for a stream with a head, got {h.shape}")
        y = np.empty(self._m, np.float32)
        self._lib.edgehft_stream_head(self._h, h.ctypes.data, y.ctypes.data)
        return y

    def window(self) -> np.ndarray:
        """A copy of the current window's rows, oldest first: ``(min(rows, T), in)`` float32."""
        buf = np.empty((self.timesteps, self.input_size), np.float32)
        n = self._lib.edgehft_stream_window(self._h, buf.ctypes.data)
        return buf[:n].copy()

    def close(self) -> None:
        """Stop the helper thread (after a prepare in progress) and free the executor."""
        h, self._h = getattr(self, "_h", None), None
        if h:
            self._lib.edgehft_stream_destroy(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _bound(fn, handle, row: np.ndarray, out: np.ndarray):
    """``fn(handle, row, out)`` with its arguments resolved once (the staging buffers stay put)."""
    import functools
    return functools.partial(fn, handle, ctypes.c_void_p(row.ctypes.data), ctypes.c_void_p(out.ctypes.data))
