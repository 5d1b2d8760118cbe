"""Build and load edgehft's native CPU kernel libraries (``edgehft/kernels/cpu/cpu_*.cpp``), and the ctypes
kernel object they share.

Each source is built on first use with ``$CXX`` / ``g++`` (flags after
:data:`edgehft.kernels.cxx.CXXFLAGS`, via :func:`edgehft.kernels.cxx.build_library`) into
:func:`edgehft.kernels.cxx.default_cache_dir`, under a name keyed by the source's hash, the flags, the
compiler and the host CPU's feature flags, and loaded once per process. No g++, a failed build or load
raises :class:`~edgehft.errors.BoardUnavailableError`.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from edgehft.errors import BoardUnavailableError
from edgehft.kernels.cxx import CXXFLAGS, build_library, default_cache_dir

NATIVE_FLAGS = ("-O3", "-march=native", "-std=c++17")
_LIBS: dict[tuple, ctypes.CDLL] = {}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def library_path(flags, cache_dir: Path | str | None, source: Path) -> Path:
    """Where the library built from ``source`` with ``flags`` lives in the cache (built or not)."""
    cxx = shutil.which(os.environ.get("CXX", "g++")) or "g++"
    h = hashlib.sha256()
    for part in (source.read_bytes(), " ".join((*CXXFLAGS, *flags)).encode(), cxx.encode(), _cpu_flags().encode()):
        h.update(part)
        h.update(b"\0")
    return Path(cache_dir or default_cache_dir()) / f"libedgehft_{source.stem}-{h.hexdigest()[:16]}.so"


def cached_library(source: Path, flags, cache_dir: Path | str | None = None) -> ctypes.CDLL:
    """Build ``source`` (one .cpp) into the cache if it is not there yet, and load it (once per process).
    Raises :class:`~edgehft.errors.BoardUnavailableError` without the source, a compiler, or on a failed
    build or load."""
    path = library_path(flags, cache_dir, source)
    key = (str(path),)
    if key in _LIBS:
        return _LIBS[key]
    if not path.is_file():
        if not source.is_file():
            raise BoardUnavailableError(f"the native kernel's source is missing ({source})",
                                        hint=f"reinstall edgehft; the wheel ships edgehft/kernels/cpu/{source.name}")
        with tempfile.TemporaryDirectory(prefix="edgehft-native-src-") as d:
            shutil.copyfile(source, Path(d) / source.name)       # build_library compiles a directory
            build_library(path, Path(d), flags)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise BoardUnavailableError(f"cannot load {path}: {e}", hint=f"delete {path} to rebuild it") from e
    _LIBS[key] = lib
    return lib


class NativeKernel:
    """What every native kernel object shares: a handle from the library's ``*_create``, the run function
    ``_run(handle, x_ptr, out_ptr)``, a preallocated :attr:`out`, and the input shape(s) it was built for.
    Subclasses set ``_lib``, ``_h``, ``_run``, ``_outp``, ``out``, ``input_shape`` and ``_destroy`` (the
    library's destroy function's name)."""

    _destroy = ""

    @property
    def input_shapes(self) -> list:
        """The shape of each input, in order."""
        return [self.input_shape]

    def input_pointer(self, xs) -> int:
        """What :meth:`run_ptr` takes for the inputs ``xs`` (C-contiguous float32 arrays that stay put):
        the data address of a single input."""
        return xs[0].ctypes.data

    def run_ptr(self, x_ptr: int, out_ptr: int | None = None) -> None:
        """Hot path without checks: ``x_ptr`` from :meth:`input_pointer`, ``out_ptr`` (default
        :attr:`out`) room for the output."""
        self._run(self._h, x_ptr, self._outp if out_ptr is None else out_ptr)

    def close(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h:
            getattr(self._lib, self._destroy)(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
