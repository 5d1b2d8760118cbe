"""The FPGA kernels' C++ (``bitstreams/kernels/*.cpp``), built with g++ and called through ctypes: what
the emulated PYNQ board executes on ap_start, and the third view (after :mod:`edgehft.kernels.fpga.reference`
and LiteRT) the kernel tests compare bit for bit.

:class:`KernelLibrary` builds ``libedgehft_kernels.so`` on first use into a cache directory
(``$EDGEHFT_CACHE``, else ``$XDG_CACHE_HOME/edgehft``, else ``~/.cache/edgehft``; rebuilt when missing
or older than the sources) and loads a private copy of it: the kernels' on-chip memory (weight slots)
is C++ static storage, so **one KernelLibrary is one board**. :class:`CSimDenseKernel` and
:class:`CSimLstmKernel` are :class:`edgehft.emulate.KernelModel` s over a library: ``run(args, mem)``
reads the blob, weights and x from the emulated device memory, calls the kernel and writes y back.

A kernel refuses a call (bad slot, sizes over its limits, a params blob of another layout, mode 1 on a
slot never loaded or loaded with other sizes): the hardware then returns without writing y; the
status codes below say why (:data:`STATUS`). ``delegates/build.py`` builds the same library by hand.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from edgehft.errors import BoardUnavailableError, EdgeHFTError
from edgehft.kernels import cxx
from edgehft.kernels.cxx import default_cache_dir
from edgehft.kernels.fpga import blob as B

LIBRARY_NAME = "libedgehft_kernels.so"
STATUS = {0: "ok", 1: "bad mode", 2: "bad slot", 3: "sizes over the kernel's limits", 4: "params blob does not "
          "match the layout or the arguments", 5: "slot was never loaded (mode 1 before mode 0)",
          6: "sizes differ from the ones loaded in the slot", 7: "unknown requantize mode"}
_ROOT = Path(__file__).resolve().parents[3]
_PKG = Path(__file__).resolve().parents[2]


class KernelStatusError(EdgeHFTError):
    """A kernel refused a call (``strict`` kernel models raise it; the hardware just leaves y alone)."""

    exit_code = 7


def kernel_sources() -> Path:
    """The directory with the kernels' C++: ``$EDGEHFT_KERNEL_SOURCES``, the checkout's
    ``bitstreams/kernels`` or a wheel's ``edgehft/_kernels``."""
    env = os.environ.get("EDGEHFT_KERNEL_SOURCES")
    for d in ([Path(env)] if env else []) + [_ROOT / "bitstreams" / "kernels", _PKG / "_kernels"]:
        if (d / "dense_int8.cpp").is_file():
            return d
    raise BoardUnavailableError("the FPGA kernels' C++ sources are not installed (no bitstreams/kernels)",
                                hint="run from a checkout of edgehft, or set EDGEHFT_KERNEL_SOURCES")


def build_library(out: Path | str, sources: Path | None = None, flags=()) -> Path:
    """Compile every non-testbench ``*.cpp`` of ``sources`` (default :func:`kernel_sources`) into the shared
    library ``out`` (atomically), see :func:`edgehft.kernels.cxx.build_library`. Raises
    :class:`BoardUnavailableError` without a compiler or on a failed build."""
    return cxx.build_library(out, Path(sources) if sources else kernel_sources(), flags,
                             no_compiler_hint="install g++ (apt-get install g++), or pass KernelLibrary(path=...) "
                                              "a libedgehft_kernels.so built elsewhere with delegates/build.py")


def _stale(lib: Path, src: Path) -> bool:
    newest = max(p.stat().st_mtime for p in [*src.glob("*.cpp"), *src.glob("*.h")])
    return not lib.is_file() or lib.stat().st_mtime < newest


def _ptr(a: np.ndarray | None):
    return None if a is None else ctypes.c_void_p(a.ctypes.data)


def _arr(a, dtype, what: str, n: int | None, writable: bool = False) -> np.ndarray | None:
    if a is None:
        if n:
            raise ValueError(f"{what} is needed ({n} elements)")
        return None
    if writable:
        if not (isinstance(a, np.ndarray) and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable):
            raise ValueError(f"{what} must be a writable C-contiguous {np.dtype(dtype).name} array")
    else:
        a = np.ascontiguousarray(a, dtype)
    if n is not None and a.size < n:
        raise ValueError(f"{what} has {a.size} elements, the kernel reads {n}")
    return a


class KernelLibrary:
    """The kernels of one emulated board: a private copy of ``libedgehft_kernels.so``.

    Args:
        path: a prebuilt library; default: build (if missing or stale) into ``cache_dir``.
        cache_dir: default :func:`default_cache_dir`.
        sources: kernel source directory, default :func:`kernel_sources`.
    """

    def __init__(self, path: Path | str | None = None, *, cache_dir: Path | str | None = None,
                 sources: Path | str | None = None):
        if path is None:
            src = Path(sources) if sources else kernel_sources()
            path = Path(cache_dir or default_cache_dir()) / LIBRARY_NAME
            if _stale(path, src):
                build_library(path, src)
        self.path = Path(path)
        with tempfile.TemporaryDirectory(prefix="edgehft-board-") as d:   # dlopen once per copy
            private = Path(d) / LIBRARY_NAME
            shutil.copyfile(self.path, private)
            self._lib = ctypes.CDLL(str(private))
        L, u32, i32, vp = self._lib, ctypes.c_uint32, ctypes.c_int32, ctypes.c_void_p
        for name in ("edgehft_dense_int8", "edgehft_lstm_int8"):
            getattr(L, name).argtypes = [u32, u32, u32, u32, vp, vp, vp, vp, u32]
            getattr(L, name).restype = i32
        for name in ("edgehft_dense_slot", "edgehft_lstm_slot"):
            getattr(L, name).argtypes, getattr(L, name).restype = [u32, vp], i32
        L.edgehft_mbqm.argtypes = [vp, vp, vp, i32, vp, i32]
        L.edgehft_requantize.argtypes = [vp, i32, i32, ctypes.c_float, ctypes.c_double, i32, vp, i32]
        L.edgehft_sigmoid_int16.argtypes = [vp, vp, i32]
        L.edgehft_tanh_int16.argtypes = [vp, i32, vp, i32]
        lim = np.zeros(8, np.int32)
        L.edgehft_dense_limits(_ptr(lim))
        self.dense_limits = dict(zip(("max_in", "max_out", "slots", "lanes"), map(int, lim[:4])))
        L.edgehft_lstm_limits(_ptr(lim))
        self.lstm_limits = dict(zip(("max_in", "max_hidden", "max_steps", "slots", "lanes"), map(int, lim[:5])))

    def reset(self) -> None:
        """Forget every slot (what reprogramming the bitstream does)."""
        self._lib.edgehft_dense_reset()
        self._lib.edgehft_lstm_reset()

    def slot(self, kernel: str, slot: int) -> dict[str, int]:
        """What slot ``slot`` of ``kernel`` ("dense_int8" | "lstm_int8") holds: loaded, n_in, n_out, rounding."""
        out = np.zeros(4, np.int32)
        fn = self._lib.edgehft_dense_slot if kernel == "dense_int8" else self._lib.edgehft_lstm_slot
        if fn(slot, _ptr(out)) != 0:
            return {"loaded": 0, "n_in": 0, "n_out": 0, "rounding": 0}
        return dict(zip(("loaded", "n_in", "n_out", "rounding"), map(int, out)))

    def reads(self, kernel: str, mode: int, rows: int, n_in: int, n_out: int, slot: int,
              header: np.ndarray | None = None) -> dict[str, int]:
        """What the kernel will read for this call, in elements (weights, params words, x), and write
        (y): zeros where it refuses before touching that buffer. ``header``: the params header (mode 0)."""
        dense = kernel == "dense_int8"
        lim = self.dense_limits if dense else self.lstm_limits
        max_out = lim["max_out"] if dense else lim["max_hidden"]
        none = {"weights": 0, "params": 0, "x": 0, "y": 0}
        if not 0 <= slot < lim["slots"]:
            return none
        if mode == 0:
            if not (0 < n_in <= lim["max_in"] and 0 < n_out <= max_out):
                return none
            total = B.HEADER_WORDS + (7 * n_out if dense else 16 + 8 * n_out)
            want = (B.MAGIC, B.VERSION, B.KIND_DENSE if dense else B.KIND_LSTM, B.HEADER_WORDS, total, n_in, n_out)
            ok = header is not None and len(header) >= 7 and tuple(int(v) for v in header[:7]) == want
            rows_w = n_out if dense else 4 * n_out
            return {"weights": rows_w * (n_in if dense else n_in + n_out) if ok else 0,
                    "params": total if ok else B.HEADER_WORDS, "x": 0, "y": 0}
        s = self.slot(kernel, slot)
        if mode != 1 or not s["loaded"] or (s["n_in"], s["n_out"]) != (n_in, n_out):
            return none
        if not dense and rows > lim["max_steps"]:
            return none
        return {"weights": 0, "params": 0, "x": rows * n_in, "y": rows * n_out}

    def _call(self, kernel, mode, rows, n_in, n_out, weights, params, x, y, slot) -> int:
        hdr = None if params is None else np.asarray(params).reshape(-1)[:B.HEADER_WORDS]
        need = self.reads(kernel, mode, rows, n_in, n_out, slot, hdr)
        w = _arr(weights, np.int8, "weights", need["weights"])
        p = _arr(params, np.int32, "params", need["params"])
        xa = _arr(x, np.int8, "x", need["x"])
        ya = _arr(y, np.int8, "y", need["y"], writable=y is not None)
        fn = self._lib.edgehft_dense_int8 if kernel == "dense_int8" else self._lib.edgehft_lstm_int8
        return int(fn(mode, rows, n_in, n_out, _ptr(w), _ptr(p), _ptr(xa), _ptr(ya), slot))

    def dense(self, mode: int, rows: int, n_in: int, n_out: int, weights=None, params=None, x=None,
              y: np.ndarray | None = None, slot: int = 0) -> int:
        """``dense_int8_top`` with numpy buffers (int8 weights/x, int32 params, writable int8 ``y``);
        returns the status (0 ok, see :data:`STATUS`)."""
        return self._call("dense_int8", mode, rows, n_in, n_out, weights, params, x, y, slot)

    def lstm(self, mode: int, steps: int, n_in: int, n_hidden: int, weights=None, params=None, x=None,
             y: np.ndarray | None = None, slot: int = 0) -> int:
        """``lstm_int8_top`` with numpy buffers; returns the status (0 ok, see :data:`STATUS`)."""
        return self._call("lstm_int8", mode, steps, n_in, n_hidden, weights, params, x, y, slot)

    # ---- the fixed-point helpers of int8_ops.h, elementwise, for tests -----------------------------
    def mbqm(self, x, multiplier, shift, mode: str) -> np.ndarray:
        x, m, s = (np.ascontiguousarray(np.broadcast_to(v, np.shape(x)), np.int32).reshape(-1)
                   for v in (x, multiplier, shift))
        out = np.empty_like(x)
        self._lib.edgehft_mbqm(_ptr(x), _ptr(m), _ptr(s), B.REQUANTIZE[mode], _ptr(out), x.size)
        return out.astype(np.int64)

    def requantize(self, acc, multiplier: int, shift: int, scale32: float, scale64: float, mode: str) -> np.ndarray:
        acc = np.ascontiguousarray(acc, np.int32).reshape(-1)
        out = np.empty(acc.size, np.int64)
        self._lib.edgehft_requantize(_ptr(acc), int(multiplier), int(shift), float(np.float32(scale32)),
                                     float(scale64), B.REQUANTIZE[mode], _ptr(out), acc.size)
        return out

    def sigmoid_int16(self, x) -> np.ndarray:
        x = np.ascontiguousarray(x, np.int16).reshape(-1)
        out = np.empty_like(x)
        self._lib.edgehft_sigmoid_int16(_ptr(x), _ptr(out), x.size)
        return out

    def tanh_int16(self, x, integer_bits: int) -> np.ndarray:
        x = np.ascontiguousarray(x, np.int16).reshape(-1)
        out = np.empty_like(x)
        self._lib.edgehft_tanh_int16(_ptr(x), integer_bits, _ptr(out), x.size)
        return out


class _CSimKernel:
    kernel = ""
    _dims = ("rows", "n_in", "n_out")

    def __init__(self, lib: KernelLibrary | None = None, strict: bool = False):
        self.lib = lib if lib is not None else KernelLibrary()
        self.strict = strict
        self.last_status = 0
        self.refused = 0

    def run(self, args: dict[str, int], mem) -> None:
        """One ap_start: read what the kernel reads from ``mem``, run it, write y back (unless refused)."""
        mode, slot = int(args["mode"]), int(args["slot"])
        rows, n_in, n_out = (int(args[k]) for k in self._dims)
        need = self.lib.reads(self.kernel, mode, rows, n_in, n_out, slot)
        header = None
        if need["params"]:          # mode 0 within the limits: the kernel reads the header first
            header = np.frombuffer(mem.read(args["params"], 4 * B.HEADER_WORDS), "<i4")
            need = self.lib.reads(self.kernel, mode, rows, n_in, n_out, slot, header)
        get = lambda k, dt, n: np.frombuffer(mem.read(args[k], n * np.dtype(dt).itemsize), dt).copy()  # noqa: E731
        params = get("params", "<i4", need["params"]) if need["params"] > B.HEADER_WORDS else header
        weights = get("weights", np.int8, need["weights"]) if need["weights"] else None
        x = get("x", np.int8, need["x"]) if need["x"] else None
        y = np.zeros(need["y"], np.int8) if need["y"] else None
        st = self.lib._call(self.kernel, mode, rows, n_in, n_out, weights, params, x, y, slot)
        self.last_status = st
        if st != 0:
            self.refused += 1
            if self.strict:
                raise KernelStatusError(f"{self.kernel} refused mode {mode} on slot {slot}: {STATUS.get(st, st)}",
                                        hint="load the slot with mode 0 (same n_in / sizes) before mode 1")
            return
        if y is not None and y.size:
            mem.write(args["y"], y.tobytes())


class CSimDenseKernel(_CSimKernel):
    """KernelModel of ``dense_int8`` (interface.toml args: mode, rows, n_in, n_out, weights, params, x,
    y, slot). ``strict``: raise :class:`KernelStatusError` when the kernel refuses a call instead of
    leaving y untouched as the hardware does; ``last_status`` / ``refused`` say what happened."""

    kernel = "dense_int8"
    _dims = ("rows", "n_in", "n_out")


class CSimLstmKernel(_CSimKernel):
    """KernelModel of ``lstm_int8`` (args: mode, steps, n_in, n_hidden, weights, params, x, y, slot)."""

    kernel = "lstm_int8"
    _dims = ("steps", "n_in", "n_hidden")


def write_testbench_vectors(path: Path | str, cases) -> Path:
    """Vectors for ``tb_dense_int8.cpp`` / ``tb_lstm_int8.cpp``: ``cases`` is a list of ``(blob, x, y,
    slot)`` (one kernel kind), ``x`` int8 ``(rows, n_in)`` and expected ``y`` int8 ``(rows, n_out)``.
    Little-endian: u32 magic "EHTV", kind, count; per case u32 slot, rows, n_in, n_out, weight bytes,
    params words, then weights, params, x, y."""
    parts = []
    kinds = set()
    for blob, x, y, slot in cases:
        h = B.read_header(blob.params)
        kinds.add(h["kind"])
        x, y = np.ascontiguousarray(x, np.int8), np.ascontiguousarray(y, np.int8)
        rows = x.size // h["n_in"]
        meta = np.array([slot, rows, h["n_in"], h["n_out"], blob.weights.size, blob.params.size], "<u4")
        parts += [meta.tobytes(), blob.weights.astype(np.int8).tobytes(), blob.params.astype("<i4").tobytes(),
                  x.tobytes(), y.tobytes()]
    if len(kinds) != 1:
        raise ValueError("testbench vectors hold one kernel kind")
    head = np.array([0x56544845, kinds.pop(), len(cases)], "<u4").tobytes()
    Path(path).write_bytes(head + b"".join(parts))
    return Path(path)
