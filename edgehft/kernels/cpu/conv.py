"""edgehft's native CPU CONV_2D kernel (``edgehft/kernels/cpu/cpu_conv.cpp``) through ctypes: TFLite CONV_2D
(NHWC, batch 1, dilation 1, SAME/VALID) with bfloat16 operands and fp32 sums, on AMX tiles where the CPU
and the OS allow them (Intel Sapphire Rapids and later), else on Google Highway SIMD code (AVX-512, AVX2,
NEON or scalar: the best this CPU runs, or the one forced with
:func:`edgehft.kernels.cpu.build.force_target`) with the same rounded operands.

Numerics: the input and the weights are rounded to bfloat16 (round to nearest even; 8 significant bits, a
relative error of at most 2^-9 each), every product and sum is fp32, then the bias and the activation
(none, relu, relu6, relu_n1_to_1, or a fused following LEAKY_RELU with its alpha) in fp32. Against a
float64 conv of the unrounded operands the error is that of the rounding (tests bound it at 2^-8 of the
sum of |products|). A product of two bf16 values is exact in fp32, so every SIMD target gives the same
bits (the same order of sums); the AMX path differs from them only in summation order.

Every kernel size, stride and SAME/VALID padding is taken (the input is copied into a zero-padded bf16
buffer; tiles read it without an im2col copy, over all output pixels at once when they are evenly spaced
in that buffer, e.g. kx1 SAME or 1xk VALID convs that tile the width, else row by row). Dilation is not
(the compiler leaves such convs on LiteRT).

    k = NativeConv2D(weights_ohwi, bias, in_hw=(100, 20), channels=32, stride=(1, 1), padding="SAME",
                     activation="leaky_relu", alpha=0.01)
    y = k.run(x)       # x (100, 20, 32) or (1, 100, 20, 32) float32 -> y (1, Ho, Wo, Co) (a reused buffer)
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from edgehft.errors import DTypeError, ShapeError
from edgehft.kernels.cpu import build
from edgehft.kernels.cpu.build import NativeKernel

SOURCE = Path(__file__).resolve().parent / "cpu_conv.cpp"
ACTIVATIONS = {"none": 0, "relu": 1, "relu6": 2, "relu_n1_to_1": 3, "leaky_relu": 4}


def load_library(cache_dir: Path | str | None = None) -> ctypes.CDLL:
    """Build (if not cached) and load the conv library; raises ``BoardUnavailableError`` like the LSTM's."""
    lib = build.load_library(cache_dir)
    if getattr(lib, "_edgehft_conv_typed", False):
        return lib
    vp, i32 = ctypes.c_void_p, ctypes.c_int
    lib.edgehft_conv_create.restype = vp
    lib.edgehft_conv_create.argtypes = [vp, vp, vp, i32, ctypes.c_float, i32]
    lib.edgehft_conv_run.restype = i32
    lib.edgehft_conv_run.argtypes = [vp, vp, vp]
    lib.edgehft_conv_isa.restype = i32
    lib.edgehft_conv_isa.argtypes = [vp]
    lib.edgehft_conv_amx.restype = i32
    lib.edgehft_conv_slot.restype = i32
    lib.edgehft_conv_slot.argtypes = [vp]
    lib.edgehft_conv_run_link.restype = i32
    lib.edgehft_conv_run_link.argtypes = [vp, vp, vp, vp]
    lib.edgehft_conv_own_buffer.restype = i32
    lib.edgehft_conv_own_buffer.argtypes = [vp]
    lib.edgehft_conv_split.restype = i32
    lib.edgehft_conv_split.argtypes = [vp, i32, i32, vp]
    lib.edgehft_conv_warm.restype = i32
    lib.edgehft_conv_warm.argtypes = [vp]
    lib.edgehft_conv_destroy.restype = None
    lib.edgehft_conv_destroy.argtypes = [vp]
    lib._edgehft_conv_typed = True
    return lib


def amx_available() -> bool:
    """True when this process can run the AMX-BF16 path (CPU flags and the Linux permission request)."""
    return bool(load_library().edgehft_conv_amx())


def geometry(in_hw, kernel_hw, stride, padding) -> tuple[int, int, int, int]:
    """TFLite's output size and leading padding: ``(Ho, Wo, pad_top, pad_left)``.

    ``padding``: "SAME" or "VALID" (TFLite's rules), or explicit zero rows and columns ``(top, bottom, left,
    right)`` (what a PAD before a VALID conv adds, or a slab of a window's rows: the streaming executor computes
    some output rows of a conv from the input rows they read, with the window's edges as padding). Raises
    ShapeError for another string or a negative pad."""
    (H, W), (kh, kw), (sh, sw) = in_hw, kernel_hw, stride
    if not isinstance(padding, str):
        top, bottom, left, right = (int(v) for v in padding)
        if min(top, bottom, left, right) < 0:
            raise ShapeError(f"padding {tuple(padding)}: pads must be >= 0")
        return (H + top + bottom - kh) // sh + 1, (W + left + right - kw) // sw + 1, top, left
    if padding.upper() == "SAME":
        Ho, Wo = -(-H // sh), -(-W // sw)
        ph = max((Ho - 1) * sh + kh - H, 0) // 2
        pw = max((Wo - 1) * sw + kw - W, 0) // 2
    elif padding.upper() == "VALID":
        Ho, Wo, ph, pw = (H - kh) // sh + 1, (W - kw) // sw + 1, 0, 0
    else:
        raise ShapeError(f"padding {padding!r}: SAME, VALID or (top, bottom, left, right)")
    return Ho, Wo, ph, pw


def supported(in_hw, kernel_hw, stride, padding) -> str | None:
    """None when the native kernel takes this conv geometry (``padding`` as :func:`geometry` takes it), else the
    reason it does not."""
    if min(*in_hw, *kernel_hw, *stride) < 1:
        return f"sizes must be >= 1 (input {tuple(in_hw)}, kernel {tuple(kernel_hw)}, stride {tuple(stride)})"
    Ho, Wo, ph, pw = geometry(in_hw, kernel_hw, stride, padding)
    if Ho < 1 or Wo < 1:
        return f"empty output ({Ho}x{Wo}): the kernel is larger than the input"
    if ph >= kernel_hw[0] or pw >= kernel_hw[1]:
        return f"leading padding {(ph, pw)} must be smaller than the kernel {tuple(kernel_hw)}"
    return None


class NativeConv2D(NativeKernel):
    """One CONV_2D (+ activation) on the native kernel, weights rounded to bf16 at construction.

    Args:
        weights: ``(Co, kh, kw, C)`` (TFLite's OHWI filter layout), any float dtype.
        bias: ``(Co,)`` or None.
        in_hw: input ``(H, W)``; ``channels`` must equal the filter's C.
        stride: ``(stride_h, stride_w)``; ``padding``: "SAME" or "VALID" (TFLite's rules), or explicit zero
            rows and columns ``(top, bottom, left, right)`` (:func:`geometry`; top < kh, left < kw).
        activation: one of :data:`ACTIVATIONS`; ``alpha`` is the LEAKY_RELU slope.
        portable: never AMX, the SIMD path of the target in force (what a box without AMX runs; the same
            bits on every SIMD target). :attr:`isa` names the target the conv runs (``amx``, ``avx3``, ...).

    :meth:`run` writes into :attr:`out` ``(1, Ho, Wo, Co)`` float32 and returns it. Raises
    :class:`~edgehft.errors.ShapeError` for a geometry :func:`supported` refuses or inputs of the wrong
    shape, ``DTypeError`` for a non-float32 input, ``BoardUnavailableError`` when the kernel cannot be built.
    """

    _destroy = "edgehft_conv_destroy"

    def __init__(self, weights, bias, in_hw, channels: int, stride=(1, 1), padding="VALID", *,
                 activation: str = "none", alpha: float = 0.0, portable: bool = False):
        w = np.ascontiguousarray(weights, np.float32)
        if w.ndim != 4 or w.shape[3] != int(channels):
            raise ShapeError(f"weights must be (Co, kh, kw, {channels}), got {w.shape}")
        Co, kh, kw, C = w.shape
        b = None if bias is None else np.ascontiguousarray(bias, np.float32)
        if b is not None and b.shape != (Co,):
            raise ShapeError(f"bias must be ({Co},), got {b.shape}")
        if activation not in ACTIVATIONS:
            raise ShapeError(f"activation {activation!r}: one of {sorted(ACTIVATIONS)}")
        H, W = (int(v) for v in in_hw)
        sh, sw = (int(v) for v in stride)
        why = supported((H, W), (kh, kw), (sh, sw), padding)
        if why:
            raise ShapeError(f"conv {kh}x{kw} stride {(sh, sw)} {padding} on {H}x{W}: {why}")
        Ho, Wo, ph, pw = geometry((H, W), (kh, kw), (sh, sw), padding)
        self.input_shape = (H, W, C)
        self._taps = (H, kh, kw, sh, ph, Ho, Wo, Co)
        self._split = (None, 0)
        self.out = np.zeros((1, Ho, Wo, Co), np.float32)
        self._lib = lib = load_library()
        dims = (ctypes.c_int * 12)(H, W, C, Co, kh, kw, sh, sw, ph, pw, Ho, Wo)
        h = lib.edgehft_conv_create(dims, w.ctypes.data, None if b is None else b.ctypes.data,
                                    ACTIVATIONS[activation], float(alpha), int(portable))
        if not h:
            raise MemoryError("edgehft_conv_create failed (out of memory)")
        self._h = ctypes.c_void_p(h)
        self.isa = build.slot_name(lib.edgehft_conv_slot(self._h))
        self._outp = ctypes.c_void_p(self.out.ctypes.data)
        self._run = lib.edgehft_conv_run

    @property
    def linkable(self) -> bool:
        """Whether this conv keeps its input as bf16 (AMX or VDPBF16PS), so :meth:`linked_call` can hand its
        output to the next conv without an fp32 tensor between them."""
        return self.isa in ("amx", "avx3_bf16")

    def linked_call(self, x_ptr: int | None, out_ptr: int, next_conv: "NativeConv2D | None"):
        """A bound call (no arguments; as the hot path's other calls, its return code is the run's: 0, -1 when
        this thread's scratch could not grow, -2 when the conv linked before it has not filled its buffer yet
        (calls out of order)) for a run of convs each reading only the previous one:
        reads ``x_ptr`` (a ``(H, W, C)`` float32 input that stays put) or, with None, the bf16 buffer the conv
        linked before this one fills; writes ``out_ptr`` (fp32, :attr:`out`'s shape), or with ``next_conv``
        straight into that conv's bf16 input buffer (allocated now). Outputs are bit for bit those of
        :meth:`run` on each conv in turn. Raises ShapeError when the link cannot be made (a conv not
        :attr:`linkable`, ``next_conv`` reading another shape), MemoryError without memory for the buffer."""
        nxt = next_conv
        if not self.linkable or (nxt is not None and (not nxt.linkable or nxt.input_shape != self.out.shape[1:])):
            raise ShapeError(f"conv {self.input_shape} -> {self.out.shape[1:]} ({self.isa}) cannot be linked to "
                             f"{None if nxt is None else (nxt.input_shape, nxt.isa)}")
        if nxt is not None and self._lib.edgehft_conv_own_buffer(nxt._h):
            raise MemoryError("edgehft_conv_own_buffer: no memory for the next conv's bf16 input buffer")
        return functools.partial(self._lib.edgehft_conv_run_link, self._h, ctypes.c_void_p(x_ptr),
                                 ctypes.c_void_p(out_ptr), None if nxt is None else nxt._h)

    @property
    def splittable(self) -> bool:
        """Whether :meth:`split` may split this conv's sums (every path but AMX, whose tiles sum in their own
        order)."""
        return self.isa != "amx"

    def split(self, role: str, j0: int, part: np.ndarray | None = None) -> np.ndarray | None:
        """Split each output's sum by kernel rows (the stream executor, issue 21): output row ``oy`` takes kernel
        rows below ``j0 - oy`` in the ``"prefix"`` and the rest in the ``"suffix"``. A prefix conv (``Ho <= j0``)
        then writes its raw sums (no bias, no activation) to the array it returns, ``(Ho * Wo, Cop)`` float32
        (``Cop``: Co rounded up to 16), which replaces :attr:`out`; a suffix conv (``j0 <= Ho``) starts the sums of
        its rows ``oy < j0`` from ``part`` (a prefix's output, read at each run and kept alive by the caller).
        Prefix then suffix give each output the bits of the unsplit conv (the same kernel rows in the same order
        from the same start), on every path but AMX. Raises ShapeError for a bad role, ``j0`` or ``part``, or on
        an AMX conv (:attr:`splittable`)."""
        Ho, Wo, Co = self._taps[5:]
        Cop = -(-Co // 16) * 16
        if not self.splittable:
            raise ShapeError("an AMX conv's sums cannot be split (its tiles sum in their own order)")
        if role == "prefix":
            buf = np.zeros((Ho * Wo, Cop), np.float32)
            rc = self._lib.edgehft_conv_split(self._h, 1, int(j0), None)
        elif role == "suffix":
            if not isinstance(part, np.ndarray) or part.dtype != np.float32 or part.shape != (int(j0) * Wo, Cop) \
                    or not part.flags.c_contiguous:
                raise ShapeError(f"part must be a C-contiguous ({int(j0) * Wo}, {Cop}) float32 array")
            buf = None
            rc = self._lib.edgehft_conv_split(self._h, 2, int(j0), part.ctypes.data)
        else:
            raise ShapeError(f"role {role!r}: prefix or suffix")
        if rc:
            raise ShapeError(f"cannot split the {Ho}-row conv at j0={j0} as {role} (edgehft_conv_split: {rc})")
        self._split = (role, int(j0))
        if buf is not None:
            self.out = buf
            self._outp = ctypes.c_void_p(buf.ctypes.data)
        return buf

    def macs_per_run(self) -> int:
        """Multiply-accumulates one :meth:`run` performs: per output row the kernel rows it sums (cpu_conv.cpp's
        ``tap_range``: not those over the zero padding, and of a :meth:`split` conv only its part; AMX sums every
        kernel row) x Wo x kw x C x Co."""
        H, kh, kw, sh, ph, Ho, Wo, Co = self._taps
        role, j0 = self._split
        rows = 0
        for oy in range(Ho):
            lo, hi = (0, kh) if self.isa == "amx" else (max(0, ph - oy * sh), min(kh, H + ph - oy * sh))
            if role == "prefix":
                hi = min(hi, j0 - oy)
            elif role == "suffix":
                lo = max(lo, j0 - oy)
            rows += max(0, hi - lo)
        return rows * Wo * kw * self.input_shape[2] * Co

    def run(self, x: np.ndarray) -> np.ndarray:
        """``x``: ``(H, W, C)`` or ``(1, H, W, C)`` float32 -> :attr:`out`."""
        if not isinstance(x, np.ndarray):
            raise DTypeError(f"expected a numpy float32 array, got {type(x).__name__}")
        shape = x.shape[1:] if x.ndim == 4 and x.shape[0] == 1 else x.shape
        if shape != self.input_shape:
            raise ShapeError(f"input shape {x.shape}, the conv takes {self.input_shape} (or (1, ...) of it)")
        if x.dtype != np.float32:
            raise DTypeError(f"input dtype {x.dtype}, the conv takes float32")
        x = np.ascontiguousarray(x)
        if self._run(self._h, x.ctypes.data, self._outp):
            raise MemoryError("edgehft_conv_run: no memory for this thread's bf16 input buffer")
        return self.out
