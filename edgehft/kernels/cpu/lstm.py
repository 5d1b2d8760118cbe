"""edgehft's native CPU LSTM kernel (``edgehft/kernels/cpu/cpu_lstm.cpp``) through ctypes: Keras LSTM
forward in fp32 (optionally with the recurrent weights rounded to bf16: ``recurrent_bf16``), batch 1, one
sequence, one or more stacked layers.

Semantics are Keras / tf-keras ``LSTM`` with its defaults (activation ``tanh``, recurrent activation
``sigmoid``, gate order i, f, c, o, zero initial state, no masking): per step
``z = x_t @ kernel + h @ recurrent_kernel + bias``, ``c = f*c + i*g``, ``h = o*tanh(c)``; optionally with
TFLite's ``cell_clip`` (c clamped after its update; the TF converter sets 10 for Keras LSTMs, which on
DeepLOB's real windows is reached: |c| up to ~15). tanh is Eigen's
rational approximation (max |error| 3.1e-7 against float64 on [-20, 20]), sigmoid(x) = 0.5 + 0.5*tanh(x/2)
(max |error| 1.8e-7); sums are fp32. Against a float64 LSTM the outputs differ by ~2e-7 on the shapes the
tests cover (bound asserted: 2e-6, ``tests/test_native_lstm.py``).

The schedule: one register-blocked GEMM for the input projection of all timesteps, then per step the
recurrent product with its accumulator vectors held in registers over the whole k loop (AVX-512: up to 28,
the 4 gates of up to 112 hidden units; wider layers: several column chunks), then the gates a vector at a
time. The code is Google Highway's, compiled for every target (AVX-512, AVX2, NEON, scalar) in one library
that runs the best this CPU has (:mod:`edgehft.kernels.cpu.build`; ``portable=True`` or
:func:`~edgehft.kernels.cpu.build.force_target` picks another). Every target gives the same bits: the
same fused multiply-adds in the same order on every lane.

The library is prebuilt or built on first use and cached (:mod:`edgehft.kernels.cpu.build`); neither
(no g++ or a failed build) raises :class:`~edgehft.errors.BoardUnavailableError`.

    k = NativeLSTM([(kernel, recurrent_kernel, bias)], timesteps=100, return_sequences=False)
    y = k.run(x)          # x (100, in) or (1, 100, in) float32 -> y (H,) float32 (a reused buffer)
"""
from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path

import numpy as np

from edgehft.errors import DTypeError, ShapeError
from edgehft.kernels.cpu import build
from edgehft.kernels.cpu.build import NativeKernel

SOURCE = Path(__file__).resolve().parent / "cpu_lstm.cpp"
PORTABLE_TARGET = "scalar"


def load_library(portable: bool = False, cache_dir: Path | str | None = None) -> ctypes.CDLL:
    """The kernel library (:func:`edgehft.kernels.cpu.build.load_library`) with the LSTM functions typed.
    ``portable`` is accepted for compatibility: one library holds every target now."""
    lib = build.load_library(cache_dir)
    if getattr(lib, "_edgehft_lstm_typed", False):
        return lib
    vp, i32 = ctypes.c_void_p, ctypes.c_int
    lib.edgehft_lstm_create.restype = vp
    lib.edgehft_lstm_create.argtypes = [i32, i32, i32, vp, vp, vp, vp, i32, ctypes.c_float, i32]
    lib.edgehft_lstm_run.restype = i32
    lib.edgehft_lstm_run.argtypes = [vp, vp, vp]
    lib.edgehft_lstm_run_projected.restype = i32
    lib.edgehft_lstm_run_projected.argtypes = [vp, vp, vp]
    lib.edgehft_lstm_steps.restype = i32
    lib.edgehft_lstm_steps.argtypes = [vp, vp, i32, i32, i32, vp]
    lib.edgehft_lstm_recur_ahead.restype = i32
    lib.edgehft_lstm_recur_ahead.argtypes = [vp]
    lib.edgehft_lstm_destroy.restype = None
    lib.edgehft_lstm_destroy.argtypes = [vp]
    lib.edgehft_lstm_slot.restype = i32
    lib.edgehft_lstm_slot.argtypes = [vp]
    lib.edgehft_lstm_act_probe.restype = None
    lib.edgehft_lstm_act_probe.argtypes = [vp, vp, vp, i32]
    lib._edgehft_lstm_typed = True
    return lib


def _target(portable: bool):
    """The target a kernel is created under: the scalar fallback for ``portable``, else the one in force."""
    return build.force_target(PORTABLE_TARGET) if portable else contextlib.nullcontext()


def activations(x: np.ndarray, portable: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(tanh(x), sigmoid(x)) as the kernels created now compute them (``portable``: the scalar target's),
    float32 of ``x``'s size (for accuracy checks)."""
    lib = load_library()
    x = np.ascontiguousarray(x, np.float32).ravel()
    th, sg = np.empty_like(x), np.empty_like(x)
    with _target(portable):
        lib.edgehft_lstm_act_probe(x.ctypes.data, th.ctypes.data, sg.ctypes.data, x.size)
    return th, sg


def recurrent_bf16_of(step: dict) -> bool:
    """Whether a ``native.json`` LSTM step keeps its recurrent kernel in bf16 (``"recurrent": "bf16"``, the
    native-bf16 plan since bundle format 4; absent: fp32). Raises :class:`~edgehft.errors.BundleError` for
    another value (a bundle from a newer edgehft, or a damaged one)."""
    value = step.get("recurrent", "fp32")
    if value not in ("fp32", "bf16"):
        from edgehft.errors import BundleError
        raise BundleError(f"native.json: an LSTM step's recurrent weights are {value!r}; this edgehft runs fp32 "
                          "or bf16", hint="recompile the bundle, or upgrade edgehft on this box")
    return value == "bf16"


class NativeLSTM(NativeKernel):
    """Stacked Keras LSTM layers on the native kernel, weights copied at construction.

    Args:
        layers: per layer ``(kernel, recurrent_kernel, bias)`` as Keras stores them: kernel
            ``(in, 4H)``, recurrent_kernel ``(H, 4H)``, bias ``(4H,)``, gate order i, f, c, o; any float
            dtype (converted to float32). Layer l's ``in`` must be layer l-1's H.
        timesteps: T, the sequence length every call uses.
        return_sequences: the last layer's output is the whole sequence ``(T, H)``, else its last step
            ``(H,)`` (earlier layers always pass their sequence on, as stacked Keras LSTMs must).
        cell_clip: when > 0, every cell state c_t is clamped to [-cell_clip, cell_clip] after its update,
            as TFLite's ``UNIDIRECTIONAL_SEQUENCE_LSTM`` does with its ``cell_clip`` option (the TF
            converter writes 10.0 for a Keras LSTM; Keras itself never clips: the default 0 is Keras).
        portable: run the scalar fallback target (what any CPU runs; the same bits as every other target),
            else the target in force (:func:`edgehft.kernels.cpu.build.dispatch_target`). :attr:`isa`
            names the target the kernel runs.
        recurrent_bf16: keep the recurrent kernels rounded to bf16 (round to nearest even, as the conv
            kernel rounds its weights; the native-bf16 plan): every output is bit for bit the fp32 kernel's
            on those rounded weights (h, c and every sum stay fp32), from half the weight bytes per step
            (the recurrence reads U from L2 every step: LSTM_A's window 270 -> 211 µs on an AMD Zen 4 core).

    :meth:`run` writes into one preallocated float32 buffer (:attr:`out`) and returns it: copy it if you
    keep it past the next call. Raises :class:`~edgehft.errors.ShapeError` (an ``InputError``) for
    weights or inputs of the wrong shape, :class:`~edgehft.errors.BoardUnavailableError` when the kernel
    cannot be built or loaded.
    """

    _destroy = "edgehft_lstm_destroy"

    def __init__(self, layers, timesteps: int, return_sequences: bool = False, *, cell_clip: float = 0.0,
                 portable: bool = False, recurrent_bf16: bool = False):
        if not layers:
            raise ShapeError("NativeLSTM needs at least one layer")
        if int(timesteps) < 1:
            raise ShapeError(f"timesteps must be >= 1, got {timesteps}")
        self.timesteps = T = int(timesteps)
        Ws, Us, bs, Hs = [], [], [], []
        in_l = None
        for li, lw in enumerate(layers):
            if len(lw) != 3:
                raise ShapeError(f"layer {li}: expected (kernel, recurrent_kernel, bias), got {len(lw)} arrays")
            W, U, b = (np.ascontiguousarray(a, np.float32) for a in lw)
            if U.ndim != 2 or U.shape[1] != 4 * U.shape[0] or U.shape[0] < 1:
                raise ShapeError(f"layer {li}: recurrent_kernel must be (H, 4H), got {U.shape}")
            H = U.shape[0]
            if W.ndim != 2 or W.shape[1] != 4 * H or W.shape[0] < 1:
                raise ShapeError(f"layer {li}: kernel must be (in, {4 * H}), got {W.shape}")
            if b.shape != (4 * H,):
                raise ShapeError(f"layer {li}: bias must be ({4 * H},), got {b.shape}")
            if in_l is not None and W.shape[0] != in_l:
                raise ShapeError(f"layer {li}: kernel has {W.shape[0]} input rows, the previous layer gives {in_l}")
            in_l = H
            Ws.append(W), Us.append(U), bs.append(b), Hs.append(H)
        self.input_size = Ws[0].shape[0]
        self.hidden = tuple(Hs)
        self.return_sequences = bool(return_sequences)
        self.input_shape = (T, self.input_size)
        self.cell_clip = float(cell_clip)
        if not np.isfinite(self.cell_clip) or self.cell_clip < 0:
            raise ShapeError(f"cell_clip must be a finite value >= 0 (0: no clipping), got {cell_clip}")
        self._lib = load_library()
        n = len(layers)
        P = ctypes.c_void_p * n
        with _target(portable):
            handle = self._lib.edgehft_lstm_create(
                n, T, self.input_size, (ctypes.c_int * n)(*Hs), P(*[a.ctypes.data for a in Ws]),
                P(*[a.ctypes.data for a in Us]), P(*[a.ctypes.data for a in bs]), int(self.return_sequences),
                self.cell_clip, int(bool(recurrent_bf16)))
        if not handle:
            raise MemoryError("edgehft_lstm_create failed (out of memory)")
        self._h = ctypes.c_void_p(handle)
        self.isa = build.slot_name(self._lib.edgehft_lstm_slot(self._h))
        self.out = np.zeros((T, Hs[-1]) if self.return_sequences else (Hs[-1],), np.float32)
        self._outp = ctypes.c_void_p(self.out.ctypes.data)
        self._run = self._lib.edgehft_lstm_run

    def run(self, x: np.ndarray) -> np.ndarray:
        """``x``: ``(T, in)`` or ``(1, T, in)`` float32 (C-contiguous avoids a copy) -> :attr:`out`."""
        if not isinstance(x, np.ndarray):
            raise DTypeError(f"expected a numpy float32 array, got {type(x).__name__}")
        shape = x.shape[1:] if x.ndim == 3 and x.shape[0] == 1 else x.shape
        if shape != self.input_shape:
            raise ShapeError(f"input shape {x.shape}, the kernel takes {self.input_shape} (or (1, ...) of it)")
        if x.dtype != np.float32:
            raise DTypeError(f"input dtype {x.dtype}, the kernel takes float32")
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        self._run(self._h, x.ctypes.data, self._outp)
        return self.out

    def projected(self) -> "NativeLSTM":
        """From now on :meth:`run_ptr` takes the input projection ``x_t @ kernel + bias`` for every step,
        ``(T, 4H)`` float32, computed elsewhere, and runs only the recurrence. Single-layer nets only
        (``ShapeError`` otherwise)."""
        if len(self.hidden) != 1:
            raise ShapeError("a projected input needs a single-layer LSTM")
        self._run = self._lib.edgehft_lstm_run_projected
        self.input_shape = (self.timesteps, 4 * self.hidden[0])
        return self

    def steps(self, g: np.ndarray, s0: int, h_out: np.ndarray | None = None, ahead: bool = False) -> None:
        """Steps ``s0 .. s0 + len(g) - 1`` of a single-layer net's recurrence on their input projections ``g``
        ``(n, 4H)`` float32 (row-major rows, any row stride), continuing the state the previous call left
        (``s0 == 0``: from the zero state). ``h_out`` ``(H,)`` float32 gets the last step's h. Steps 0 .. T-1 in
        any number of calls give :meth:`run`'s bits on the projected net (the same step code and state).
        ``ahead``: then also sum the next step's recurrent part ``h @ U`` (``edgehft_lstm_recur_ahead``, what the
        stream executor runs before a tick), which the next call adds to its first projection: the same bits.

        Raises:
            ShapeError: a multi-layer net, ``g`` not (n, 4H) float32 with unit column stride, ``s0 + n > T``,
                ``s0 > 0`` not continuing the previous call, or ``ahead`` with no step left (all T ran)."""
        H = self.hidden[0]
        if len(self.hidden) != 1:
            raise ShapeError("steps() runs a single-layer LSTM")
        if g.dtype != np.float32 or g.ndim != 2 or g.shape[1] != 4 * H or g.strides[1] != 4:
            raise ShapeError(f"g must be (n, {4 * H}) float32 rows, got {g.dtype} {g.shape}")
        if h_out is not None and (h_out.dtype != np.float32 or h_out.size != H or not h_out.flags.c_contiguous):
            raise ShapeError(f"h_out must be ({H},) float32, contiguous")
        if ahead and int(s0) + g.shape[0] >= self.timesteps:
            raise ShapeError(f"ahead: steps {s0} .. {int(s0) + g.shape[0] - 1} leave no step of 0 .. "
                             f"{self.timesteps - 1} to sum ahead", hint="ahead=True on a call that ends before "
                             "the last step")
        rc = self._lib.edgehft_lstm_steps(self._h, g.ctypes.data, g.strides[0] // 4, int(s0), g.shape[0],
                                          None if h_out is None else h_out.ctypes.data)
        if rc:
            raise ShapeError(f"steps {s0} .. {s0 + g.shape[0] - 1}: outside 0 .. {self.timesteps - 1} or not "
                             "continuing the previous call", hint="start a window at s0=0, then continue in order")
        if ahead and self._lib.edgehft_lstm_recur_ahead(self._h):
            raise ShapeError(f"ahead: no step after step {int(s0) + g.shape[0] - 1} to sum ahead")

