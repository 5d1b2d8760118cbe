"""edgehft's native chain program (``edgehft/kernels/cpu/cpu_chain.cpp``) through ctypes: a native chain's stream
executor (issue 21) as data, built once, so that a push is one native call and a prepare another.

:class:`edgehft.streaming.chain.ChainExecutor` hands the program its plan: per phase (``cold``, ``prepare``,
``critical``) the kernel calls, each a run of rows of one tensor (the kernel's run function and handle, the
output buffer's address, row bytes and first row, per input the buffer's address, row bytes and first row), the
LSTM (a projected :class:`~edgehft.kernels.cpu.lstm.NativeLSTM`'s handle, its projections' buffer, the steps
before the tick), the head's calls on whole tensors, the input buffer, the staging row and every buffer along
time (for the window's move). The program keeps the executor's state (rows, ``base``, whether the next window
is prepared, the moves) and the counters; the kernels are called in the plan's order with the plan's pointers,
so its outputs are the Python executor's bit for bit. :meth:`ChainProgram.start_helper` starts a native thread
(pinned to a core) that prepares right after each push (the same handover as
:class:`~edgehft.kernels.cpu.stream.NativeStream`'s).

The program does not own the kernels or buffers it names: they must outlive it (the caller keeps the plan).

    prog = ChainProgram(window=100, capacity=4, lstm_prepared=86, lstm_steps=100, row=staging, ...)
    rc = prog.push_staged()     # 0 output in the head's buffer, 1 warming up, -1 not finite, -2 a kernel failed
    prog.prepare()              # when idle: the next window's rows and steps that do not need its newest row

Raises :class:`~edgehft.errors.BoardUnavailableError` when the kernel library cannot be built or loaded.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from edgehft.errors import InputError
from edgehft.kernels.cpu import build

PHASES = ("cold", "prepare", "critical")
COUNTERS = ("pushes", "outputs", "prepared_ahead", "prepared_late", "late_waited", "late_prepare_ns",
            "prepares", "prepare_ns_total", "prepare_ns_last", "rows", "bad_rows", "helper", "moves",
            "kernel_errors")
PUSHED, WARMING, NOT_FINITE, KERNEL_FAILED = 0, 1, -1, -2     # edgehft_chain_push's return codes
_I64 = ctypes.c_int64


def _struct(name: str, fields: str):
    return type(name, (ctypes.Structure,), {"_fields_": [(f, _I64) for f in fields.split()]})


# cpu_chain.cpp's Spec* structs: every field a 64-bit integer (addresses too)
SpecSrc = _struct("SpecSrc", "addr row_bytes lo")
SpecCall = _struct("SpecCall", "fn handle out out_row_bytes a nsrc src0 use_ptrs")
SpecBuf = _struct("SpecBuf", "addr row_bytes")
SpecHead = _struct("SpecHead", "fn handle x y")
SpecWarm = _struct("SpecWarm", "fn handle")


class Spec(ctypes.Structure):
    _fields_ = [(f, _I64) for f in "T capacity P S row_floats row in_ in_row_bytes lstm proj proj_ld h_last".split()] \
        + [("calls", _I64 * 3), ("ncalls", _I64 * 3)] + \
        [(f, _I64) for f in "srcs nsrcs bufs nbufs head nhead warm nwarm".split()]


def _typed(lib: ctypes.CDLL) -> ctypes.CDLL:
    if getattr(lib, "_edgehft_chain_typed", False):
        return lib
    vp, i32, u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64
    for name, res, args in (("edgehft_chain_create", vp, [vp]), ("edgehft_chain_destroy", None, [vp]),
                            ("edgehft_chain_push", i32, [vp]), ("edgehft_chain_prepare", i32, [vp]),
                            ("edgehft_chain_reset", None, [vp]), ("edgehft_chain_rows", u64, [vp]),
                            ("edgehft_chain_start_helper", i32, [vp, i32, i32]),
                            ("edgehft_chain_counters", None, [vp, vp]), ("edgehft_chain_window", i32, [vp, vp]),
                            ("edgehft_chain_profile", i32, [vp, i32]),
                            ("edgehft_chain_profile_read", i32, [vp, vp, i32]),
                            ("edgehft_chain_lstm_call_create", vp, [vp, i32, i32, i32, i32, i32]),
                            ("edgehft_chain_lstm_call", i32, [vp, vp, vp]),
                            ("edgehft_chain_lstm_call_destroy", None, [vp]),
                            ("edgehft_chain_time_pushes", ctypes.c_int64, [vp, vp, ctypes.c_int64, vp, i32])):
        getattr(lib, name).restype = res
        getattr(lib, name).argtypes = args
    lib._edgehft_chain_typed = True
    return lib


def load_library(cache_dir=None) -> ctypes.CDLL:
    """The kernel library (:func:`edgehft.kernels.cpu.build.load_library`) with the chain functions typed."""
    return _typed(build.load_library(cache_dir))


class LstmSteps(build.NativeKernel):
    """A stacked LSTM layer's steps ``s0 .. s0+n-1`` as one row call of a phase (the layer's h sequence feeds the
    next layer's input projection): reads ``n`` projection rows ``(n, 4H)`` float32, writes each step's h to a row
    of ``(n, H)`` float32 (``edgehft_lstm_steps_seq``: the bits of the layer's whole-window run, the steps run in
    order from the zero state across calls). ``ahead``: the call also sums step ``s0 + n``'s recurrent part
    ``h @ U`` (``edgehft_lstm_recur_ahead``; a prepare call), so the next call's first step, starting there, adds it
    instead of summing it (``summed``: this call's first step is such a step; only the MAC count uses it).
    ``lstm``: a projected single-layer :class:`~edgehft.kernels.cpu.lstm.NativeLSTM` that must outlive this call.
    :attr:`out` only gives the output's shape (the program writes the chain's buffer). Raises MemoryError when the
    call cannot be made."""

    _destroy = "edgehft_chain_lstm_call_destroy"

    def __init__(self, lstm, s0: int, n: int, ahead: bool = False, summed: bool = False):
        H = int(lstm.hidden[0])
        self._lib = lib = load_library()
        h = lib.edgehft_chain_lstm_call_create(lstm._h, int(s0), int(n), 4 * H, H, int(bool(ahead)))
        if not h:
            raise MemoryError("edgehft_chain_lstm_call_create failed")
        self._h, self._run = ctypes.c_void_p(h), lib.edgehft_chain_lstm_call
        self.input_shape, self.out, self.isa = (int(n), 4 * H), np.zeros((int(n), H), np.float32), lstm.isa
        self._outp = ctypes.c_void_p(self.out.ctypes.data)
        self._macs = recurrent_steps(int(s0), int(n), ahead, summed) * 4 * H * H

    def macs_per_run(self) -> int:
        """The recurrent multiply-accumulates the call runs (4H x H a step; the projections are the conv's)."""
        return self._macs


def recurrent_steps(s0: int, n: int, ahead: bool = False, summed: bool = False) -> int:
    """How many recurrent sums ``h @ U`` a call running steps ``s0 .. s0+n-1`` computes: one per step after step 0
    (step 0 starts from the zero state), less its first when that sum ``summed`` ahead, plus the next step's when it
    sums it ``ahead``."""
    own = n - (1 if s0 == 0 and n > 0 else 0) - (1 if summed and s0 > 0 and n > 0 else 0)
    return own + (1 if ahead else 0)


def address(x) -> int:
    """The address of a ctypes function, a ``c_void_p`` handle, a numpy array's data or an int (0 for None)."""
    if x is None:
        return 0
    if isinstance(x, int):
        return x
    if isinstance(x, np.ndarray):
        return x.ctypes.data
    if isinstance(x, ctypes.c_void_p):
        return x.value or 0
    return ctypes.cast(x, ctypes.c_void_p).value or 0


def _calls(calls: dict) -> tuple:
    """Per phase a SpecCall array, and the SpecSrc array they index, from ``calls[phase]`` =
    ``[(fn, handle, srcs, out_addr, out_row_bytes, a, use_ptrs), ...]``, ``srcs`` = ``((addr, row_bytes, lo), ...)``."""
    srcs, arrays = [], []
    for phase in PHASES:
        rows = []
        for fn, h, ins, out, out_rb, a, use_ptrs in calls.get(phase, ()):
            rows.append(SpecCall(address(fn), address(h), int(out), int(out_rb), int(a), len(ins), len(srcs),
                                 int(bool(use_ptrs))))
            srcs.extend(SpecSrc(int(addr), int(rb), int(lo)) for addr, rb, lo in ins)
        arrays.append(((SpecCall * max(len(rows), 1))(*rows), len(rows)))
    return arrays, (SpecSrc * max(len(srcs), 1))(*srcs), len(srcs)


class ChainProgram:
    """A native chain program (see the module docstring).

    Args:
        window: T, the window's rows.
        capacity: windows of rows per buffer along time (>= 2; a move every ``(capacity - 1) * T`` ticks).
        lstm_prepared: P, the LSTM steps run in prepare (0 .. S).
        lstm_steps: S, the LSTM's timesteps (<= T; the push runs steps P .. S - 1).
        row: the staging row, a C-contiguous float32 array (its size is the input's row) the push reads.
        input_buf: ``(address, row_bytes)`` of the input tensor's buffer (``capacity * T`` rows).
        lstm: the projected single-layer LSTM's handle (``NativeLSTM._h``).
        proj: ``(address, row_floats)`` of its projections' buffer (rows of ``4H`` float32 values at that stride).
        h_last: ``(H,)`` float32, the LSTM's last h (the head's input).
        calls: per phase name of :data:`PHASES` the calls ``(fn, handle, srcs, out_addr, out_row_bytes, a,
            use_ptrs)`` (``fn`` a ctypes function ``int run(void*, const void*, float*)`` of the kernel library,
            ``srcs`` ``((addr, row_bytes, lo), ...)``, ``use_ptrs``: the kernel takes an array of input pointers).
        buffers: ``[(address, row_bytes), ...]`` of every distinct buffer along time.
        head: ``[(fn, handle, x_addr, y_addr), ...]`` on whole tensors, after the LSTM.
        warm: ``[(fn, handle), ...]``, ``int fn(void*)`` run at the end of every prepare (``edgehft_conv_warm`` on
            the convs the push runs: their weights back in the caches before the tick).

    Raises:
        InputError: the program refuses the spec (a size out of range, an empty buffer list);
        MemoryError: it cannot be allocated; BoardUnavailableError: no kernel library."""

    def __init__(self, *, window: int, capacity: int, lstm_prepared: int, lstm_steps: int, row: np.ndarray,
                 input_buf, lstm, proj, h_last: np.ndarray, calls: dict, buffers, head, warm=(),
                 lib: ctypes.CDLL | None = None):
        if row.dtype != np.float32 or row.ndim != 1 or not row.flags.c_contiguous:
            raise InputError(f"the staging row must be a contiguous (n,) float32 array, got {row.dtype} {row.shape}",
                             hint="np.zeros(n, np.float32)")
        self._lib = lib = _typed(lib) if lib is not None else load_library()
        phase_arrays, srcs, nsrcs = _calls(calls)
        bufs = (SpecBuf * max(len(buffers), 1))(*[SpecBuf(int(a), int(rb)) for a, rb in buffers])
        heads = (SpecHead * max(len(head), 1))(*[SpecHead(address(f), address(h), int(x), int(y))
                                                 for f, h, x, y in head])
        warms = (SpecWarm * max(len(warm), 1))(*[SpecWarm(address(f), address(h)) for f, h in warm])
        spec = Spec(T=int(window), capacity=int(capacity), P=int(lstm_prepared), S=int(lstm_steps),
                    row_floats=row.size, row=row.ctypes.data, in_=int(input_buf[0]), in_row_bytes=int(input_buf[1]),
                    lstm=address(lstm), proj=int(proj[0]), proj_ld=int(proj[1]), h_last=address(h_last),
                    srcs=ctypes.addressof(srcs), nsrcs=nsrcs, bufs=ctypes.addressof(bufs), nbufs=len(buffers),
                    head=ctypes.addressof(heads), nhead=len(head), warm=ctypes.addressof(warms), nwarm=len(warm))
        for i, (arr, n) in enumerate(phase_arrays):
            spec.calls[i], spec.ncalls[i] = ctypes.addressof(arr), n
        h = lib.edgehft_chain_create(ctypes.byref(spec))
        if not h:
            raise InputError("the native chain program refused the plan (a size out of range or no buffers)",
                             hint="rebuild the plan (edgehft.streaming.chain.build_plan)")
        self._h = ctypes.c_void_p(h)
        self.window_rows, self.row_size, self.warm_calls = int(window), row.size, len(warm)
        self._counts = (ctypes.c_uint64 * len(COUNTERS))()
        # the hot path's call, bound once: the staging row is the program's
        self.push_staged = functools.partial(lib.edgehft_chain_push, self._h)

    def prepare(self) -> bool:
        """The next window's rows and LSTM steps that do not need its newest row (waits for the helper if it is
        on them). False while fewer than T - 1 rows were pushed (nothing to prepare), else True."""
        return self._lib.edgehft_chain_prepare(self._h) == 0

    def time_pushes(self, rows: np.ndarray, ns: np.ndarray, prepare: bool = True) -> int:
        """Push ``rows`` (``(n, row)`` float32, C-contiguous) in turn, each timed inside the library into ``ns``
        (``(n,)`` uint64: ns, 0 for a push without an output), ``prepare`` after each (untimed). Returns the
        number of outputs, or -2 when a kernel failed (``edgehft_chain_time_pushes``).

        Raises:
            RunnerStateError: closed; ShapeError: rows or ns of another shape, dtype or layout."""
        from edgehft.kernels.cpu.stream import time_args
        time_args(self._h, rows, ns, self.row_size)
        return int(self._lib.edgehft_chain_time_pushes(self._h, rows.ctypes.data, rows.shape[0], ns.ctypes.data,
                                                       int(bool(prepare))))

    def reset(self) -> None:
        """Forget every row (warming up again; a prepare running on the helper finishes first); counters stay."""
        self._lib.edgehft_chain_reset(self._h)

    @property
    def rows(self) -> int:
        """Rows pushed since construction or :meth:`reset`."""
        return int(self._lib.edgehft_chain_rows(self._h))

    def start_helper(self, core: int | None = None, spin_us: int = 1000) -> int:
        """Start the thread that prepares after each push, pinned to CPU ``core`` (None: not pinned); it spins
        ``spin_us`` µs after its last prepare, then sleeps until the next push. Returns 0, or -1 already running,
        -2 no thread could be started, -3 the core was refused, -4 profiling is on (:meth:`profile`)."""
        return int(self._lib.edgehft_chain_start_helper(self._h, -1 if core is None else int(core), int(spin_us)))

    def profile(self, on: bool = True) -> None:
        """Op-by-op timing on (zeroed) or off (:func:`edgehft.kernels.cpu.stream.profile_switch`)."""
        from edgehft.kernels.cpu.stream import profile_switch
        profile_switch(self._lib.edgehft_chain_profile, self._h, on)

    def profile_counts(self, nslots: int) -> tuple[int, int, list[int]]:
        """``(prepares timed, pushes timed, ns per slot)``: one slot per prepare call, the LSTM's prepared steps,
        one per critical call, the LSTM's steps on the tick, one per head call."""
        from edgehft.kernels.cpu.stream import profile_counts
        return profile_counts(self._lib.edgehft_chain_profile_read, self._h, nslots)

    def counters(self) -> dict:
        """The program's counters (:data:`COUNTERS`), ints: ns for the ``*_ns*`` ones."""
        self._lib.edgehft_chain_counters(self._h, self._counts)
        return dict(zip(COUNTERS, (int(v) for v in self._counts)))

    def window(self) -> np.ndarray:
        """A copy of the current window's rows, oldest first: ``(min(rows, T), row)`` float32."""
        buf = np.empty((self.window_rows, self.row_size), np.float32)
        n = self._lib.edgehft_chain_window(self._h, buf.ctypes.data)
        return buf[:n].copy()

    def close(self) -> None:
        """Stop the helper thread (after a prepare in progress) and free the program (not the kernels)."""
        h, self._h = getattr(self, "_h", None), None
        if h:
            self._lib.edgehft_chain_destroy(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
