"""edgehft's native MAX_POOL_2D, CONCATENATION, FULLY_CONNECTED and SOFTMAX (``edgehft/kernels/cpu/cpu_ops.cpp``)
through ctypes, for the native chain: after native convs and LSTMs they save a LiteRT segment (whose invoke,
cold after the kernels, costs ~10 µs on this project's test host, more than the ops, and has the chain's
longest tail: ~1.4 % of its invokes take over 100 µs there).

They follow the TFLite reference kernels: MAX_POOL_2D takes the max over the filter window clipped to the
input (SAME padding never wins), then the fused activation; CONCATENATION copies the inputs' slices along
the axis in order (both exact); FULLY_CONNECTED sums in fp32 over 16 lanes then a fixed tree (every
dispatch target gives the same bits; another order than XNNPACK's, so ~1 ulp from LiteRT);
SOFTMAX is exp(beta * (x - max)) / sum in fp32. Pool and dense run the SIMD target in force when they are
created (:func:`edgehft.kernels.cpu.build.force_target`; :attr:`isa` names it), with the same results on
every target.

    pool = NativeMaxPool2D((100, 1), 64, filter_hw=(3, 1), stride=(1, 1), padding="SAME")
    y = pool.run(x)                           # (1, 100, 1, 64) float32 (a reused buffer)
    cat = NativeConcat([(1, 100, 1, 64)] * 3, axis=3)
    y = cat.run([a, b, c])                    # (1, 100, 1, 192)
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from edgehft.errors import DTypeError, ShapeError
from edgehft.kernels.cpu.conv import geometry
from edgehft.kernels.cpu import build
from edgehft.kernels.cpu.build import NativeKernel

SOURCE = Path(__file__).resolve().parent / "cpu_ops.cpp"
POOL_ACTIVATIONS = {"none": 0, "relu": 1, "relu_n1_to_1": 2, "relu6": 3}


def load_library(cache_dir: Path | str | None = None) -> ctypes.CDLL:
    """Build (if not cached) and load the library; raises ``BoardUnavailableError`` like the LSTM's."""
    lib = build.load_library(cache_dir)
    if getattr(lib, "_edgehft_ops_typed", False):
        return lib
    vp, i32 = ctypes.c_void_p, ctypes.c_int
    lib.edgehft_pool_create.restype = vp
    lib.edgehft_pool_create.argtypes = [vp, i32]
    lib.edgehft_pool_run.restype = i32
    lib.edgehft_pool_run.argtypes = [vp, vp, vp]
    lib.edgehft_pool_destroy.argtypes = [vp]
    lib.edgehft_concat_create.restype = vp
    lib.edgehft_concat_create.argtypes = [i32, i32, vp]
    lib.edgehft_concat_run.restype = i32
    lib.edgehft_concat_run.argtypes = [vp, vp, vp]
    lib.edgehft_concat_destroy.argtypes = [vp]
    lib.edgehft_dense_create.restype = vp
    lib.edgehft_dense_create.argtypes = [i32, i32, i32, vp, vp, i32]
    lib.edgehft_dense_run.restype = i32
    lib.edgehft_dense_run.argtypes = [vp, vp, vp]
    lib.edgehft_dense_destroy.argtypes = [vp]
    lib.edgehft_softmax_create.restype = vp
    lib.edgehft_softmax_create.argtypes = [i32, i32, ctypes.c_float]
    lib.edgehft_softmax_run.restype = i32
    lib.edgehft_softmax_run.argtypes = [vp, vp, vp]
    lib.edgehft_softmax_destroy.argtypes = [vp]
    for name in ("edgehft_pool_slot", "edgehft_dense_slot"):
        getattr(lib, name).restype = i32
        getattr(lib, name).argtypes = [vp]
    lib.edgehft_act_create.restype = vp
    lib.edgehft_act_create.argtypes = [i32, i32]
    lib.edgehft_act_run.restype = i32
    lib.edgehft_act_run.argtypes = [vp, vp, vp]
    lib.edgehft_act_destroy.argtypes = [vp]
    lib.edgehft_pad_create.restype = vp
    lib.edgehft_pad_create.argtypes = [vp]
    lib.edgehft_pad_run.restype = i32
    lib.edgehft_pad_run.argtypes = [vp, vp, vp]
    lib.edgehft_pad_destroy.argtypes = [vp]
    lib._edgehft_ops_typed = True
    return lib


def _check(x, shape):
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise DTypeError(f"expected a float32 numpy array, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.size != int(np.prod(shape)):
        raise ShapeError(f"input shape {x.shape}, expected {tuple(shape)}")
    return np.ascontiguousarray(x)


class NativeMaxPool2D(NativeKernel):
    """TFLite MAX_POOL_2D on ``(1, H, W, C)`` float32: ``filter_hw``, ``stride`` (h, w), "SAME"/"VALID" or
    explicit ``(top, bottom, left, right)`` (:func:`~edgehft.kernels.cpu.conv.geometry`; padded taps never
    win, as TFLite's), fused ``activation`` (a key of :data:`POOL_ACTIVATIONS`). :meth:`run` returns :attr:`out`
    ``(1, Ho, Wo, C)``. Raises ``ShapeError`` on an empty output or bad sizes."""

    _destroy = "edgehft_pool_destroy"

    def __init__(self, in_hw, channels: int, filter_hw, stride=(1, 1), padding="VALID",
                 activation: str = "none"):
        if activation not in POOL_ACTIVATIONS:
            raise ShapeError(f"activation {activation!r}: one of {sorted(POOL_ACTIVATIONS)}")
        (H, W), (fh, fw), (sh, sw), C = in_hw, filter_hw, stride, int(channels)
        if min(H, W, fh, fw, sh, sw, C) < 1:
            raise ShapeError(f"sizes must be >= 1: input {(H, W, C)}, filter {(fh, fw)}, stride {(sh, sw)}")
        Ho, Wo, ph, pw = geometry((H, W), (fh, fw), (sh, sw), padding)
        if Ho < 1 or Wo < 1:
            raise ShapeError(f"empty output ({Ho}x{Wo}): the filter is larger than the input")
        self.input_shape = (1, H, W, C)
        self.out = np.zeros((1, Ho, Wo, C), np.float32)
        self._lib = lib = load_library()
        h = lib.edgehft_pool_create((ctypes.c_int * 11)(H, W, C, Ho, Wo, fh, fw, sh, sw, ph, pw),
                                    POOL_ACTIVATIONS[activation])
        if not h:
            raise MemoryError("edgehft_pool_create failed")
        self._h, self._outp, self._run = ctypes.c_void_p(h), ctypes.c_void_p(self.out.ctypes.data), lib.edgehft_pool_run
        self.isa = build.slot_name(lib.edgehft_pool_slot(self._h))

    def run(self, x: np.ndarray) -> np.ndarray:
        x = _check(x, self.input_shape)
        self._run(self._h, x.ctypes.data, self._outp)
        return self.out


class NativeConcat(NativeKernel):
    """TFLite CONCATENATION of float32 tensors of ``input_shapes`` along ``axis`` (negative counts from the
    end). :meth:`run` takes the inputs in order and returns :attr:`out`. ``ShapeError`` when the shapes
    differ off the axis."""

    _destroy = "edgehft_concat_destroy"

    def __init__(self, input_shapes, axis: int):
        shapes = [tuple(int(d) for d in s) for s in input_shapes]
        if not shapes or any(len(s) != len(shapes[0]) for s in shapes):
            raise ShapeError(f"inputs must have the same rank, got {shapes}")
        rank = len(shapes[0])
        ax = axis + rank if axis < 0 else axis
        if not 0 <= ax < rank:
            raise ShapeError(f"axis {axis} out of range for rank {rank}")
        if any(s[:ax] + s[ax + 1:] != shapes[0][:ax] + shapes[0][ax + 1:] for s in shapes):
            raise ShapeError(f"inputs differ off axis {ax}: {shapes}")
        self._input_shapes = shapes
        outer = int(np.prod(shapes[0][:ax], dtype=np.int64))
        inner = [int(np.prod(s[ax:], dtype=np.int64)) for s in shapes]
        self.out = np.zeros(shapes[0][:ax] + (sum(s[ax] for s in shapes),) + shapes[0][ax + 1:], np.float32)
        self._lib = lib = load_library()
        h = lib.edgehft_concat_create(len(shapes), outer, (ctypes.c_int * len(shapes))(*inner))
        if not h:
            raise ShapeError(f"edgehft_concat_create refused shapes {shapes}")
        self._h, self._outp, self._run = ctypes.c_void_p(h), ctypes.c_void_p(self.out.ctypes.data), lib.edgehft_concat_run
        self._ptrs = (ctypes.c_void_p * len(shapes))()

    @property
    def input_shapes(self) -> list:
        return list(self._input_shapes)

    def input_pointer(self, xs) -> int:
        """Address of a pointer array holding the inputs' data pointers (kept by this object), for
        :meth:`run_ptr`. The arrays must stay alive and in place."""
        for i, a in enumerate(xs):
            self._ptrs[i] = a.ctypes.data
        return ctypes.addressof(self._ptrs)

    def run(self, xs) -> np.ndarray:
        if len(xs) != len(self.input_shapes):
            raise ShapeError(f"{len(xs)} inputs, the concat takes {len(self.input_shapes)}")
        xs = [_check(x, s) for x, s in zip(xs, self.input_shapes)]
        self._run(self._h, self.input_pointer(xs), self._outp)
        return self.out


class NativeDense(NativeKernel):
    """TFLite FULLY_CONNECTED in fp32: ``weights`` (M, N) (TFLite's layout), ``bias`` (M,) or None, fused
    ``activation`` (a key of :data:`POOL_ACTIVATIONS`). The input is any float32 array of ``rows * N``
    values; :attr:`out` has ``out_shape`` (default ``(rows, M)``). ``ShapeError`` on inconsistent sizes."""

    _destroy = "edgehft_dense_destroy"

    def __init__(self, weights, bias, rows: int, out_shape=None, activation: str = "none"):
        w = np.ascontiguousarray(weights, np.float32)
        if w.ndim != 2:
            raise ShapeError(f"weights must be (M, N), got {w.shape}")
        M, N = w.shape
        b = None if bias is None else np.ascontiguousarray(bias, np.float32)
        if b is not None and b.shape != (M,):
            raise ShapeError(f"bias must be ({M},), got {b.shape}")
        if activation not in POOL_ACTIVATIONS:
            raise ShapeError(f"activation {activation!r}: one of {sorted(POOL_ACTIVATIONS)}")
        out_shape = tuple(out_shape) if out_shape is not None else (int(rows), M)
        if int(rows) < 1 or int(np.prod(out_shape)) != int(rows) * M:
            raise ShapeError(f"output shape {out_shape} does not hold {rows} rows of {M}")
        self.input_shape = (int(rows), N)
        self.out = np.zeros(out_shape, np.float32)
        self._lib = lib = load_library()
        h = lib.edgehft_dense_create(int(rows), N, M, w.ctypes.data, None if b is None else b.ctypes.data,
                                     POOL_ACTIVATIONS[activation])
        if not h:
            raise MemoryError("edgehft_dense_create failed")
        self._h, self._outp, self._run = ctypes.c_void_p(h), ctypes.c_void_p(self.out.ctypes.data), lib.edgehft_dense_run
        self.isa = build.slot_name(lib.edgehft_dense_slot(self._h))
        self._macs = int(rows) * N * M

    def macs_per_run(self) -> int:
        """Multiply-accumulates one :meth:`run` performs: rows x N x M."""
        return self._macs

    def run(self, x: np.ndarray) -> np.ndarray:
        x = _check(x, self.input_shape)
        self._run(self._h, x.ctypes.data, self._outp)
        return self.out


class NativeSoftmax(NativeKernel):
    """TFLite SOFTMAX in fp32 over the last axis of a float32 tensor of ``shape`` with ``beta``."""

    _destroy = "edgehft_softmax_destroy"

    def __init__(self, shape, beta: float = 1.0):
        shape = tuple(int(d) for d in shape)
        if not shape or min(shape) < 1:
            raise ShapeError(f"softmax input shape {shape}: every dim must be >= 1")
        self.input_shape = shape
        self.out = np.zeros(shape, np.float32)
        self._lib = lib = load_library()
        h = lib.edgehft_softmax_create(int(np.prod(shape[:-1], dtype=np.int64)), shape[-1], float(beta))
        if not h:
            raise MemoryError("edgehft_softmax_create failed")
        self._h, self._outp, self._run = ctypes.c_void_p(h), ctypes.c_void_p(self.out.ctypes.data), lib.edgehft_softmax_run

    def run(self, x: np.ndarray) -> np.ndarray:
        x = _check(x, self.input_shape)
        self._run(self._h, x.ctypes.data, self._outp)
        return self.out


ACTS = {"tanh": 0, "logistic": 1}


class NativeActivation(NativeKernel):
    """TANH or LOGISTIC (``kind``, a key of :data:`ACTS`) elementwise on a float32 tensor of ``shape``, as the
    native LSTM kernel computes its gates (the same bits on every target; within a few fp32 ulps of
    ``np.tanh`` / the logistic function). :meth:`run` returns :attr:`out`. ``ShapeError`` on a bad shape or kind."""

    _destroy = "edgehft_act_destroy"

    def __init__(self, shape, kind: str):
        shape = tuple(int(d) for d in shape)
        if not shape or min(shape) < 1 or kind not in ACTS:
            raise ShapeError(f"activation {kind!r} on {shape}: a shape of dims >= 1 and one of {sorted(ACTS)}")
        self.input_shape, self.kind = shape, kind
        self.out = np.zeros(shape, np.float32)
        self._lib = lib = load_library()
        h = lib.edgehft_act_create(int(np.prod(shape, dtype=np.int64)), ACTS[kind])
        if not h:
            raise MemoryError("edgehft_act_create failed")
        self._h, self._outp, self._run = ctypes.c_void_p(h), ctypes.c_void_p(self.out.ctypes.data), lib.edgehft_act_run

    def run(self, x: np.ndarray) -> np.ndarray:
        x = _check(x, self.input_shape)
        self._run(self._h, x.ctypes.data, self._outp)
        return self.out


class NativePad(NativeKernel):
    """TFLite PAD with zeros of a ``(H, W, C)`` float32 tensor (batch 1): ``pads`` ``(top, bottom, left, right)``;
    ``H`` may be 0 (an output made of padding only). :meth:`run` returns :attr:`out` ``(1, H + top + bottom,
    W + left + right, C)``. ``ShapeError`` on negative sizes."""

    _destroy = "edgehft_pad_destroy"

    def __init__(self, in_hw, channels: int, pads):
        (H, W), C = (int(v) for v in in_hw), int(channels)
        t, b, left, right = (int(v) for v in pads)
        if H < 0 or W < 1 or C < 1 or min(t, b, left, right) < 0:
            raise ShapeError(f"pad of {(H, W, C)} by {(t, b, left, right)}: sizes must be >= 0 (W, C >= 1)")
        self.input_shape = (1, H, W, C)
        self.out = np.zeros((1, H + t + b, W + left + right, C), np.float32)
        self._lib = lib = load_library()
        h = lib.edgehft_pad_create((ctypes.c_int * 7)(H, W, C, t, b, left, right))
        if not h:
            raise MemoryError("edgehft_pad_create failed")
        self._h, self._outp, self._run = ctypes.c_void_p(h), ctypes.c_void_p(self.out.ctypes.data), lib.edgehft_pad_run

    def run(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32) if self.input_shape[1] else np.zeros(1, np.float32)
        self._run(self._h, x.ctypes.data, self._outp)
        return self.out

