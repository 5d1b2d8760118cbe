"""Build and load edgehft's native CPU kernel library (``edgehft/kernels/cpu/cpu_*.cpp``), choose its SIMD
target, and the ctypes kernel object every kernel shares.

One library, ``libedgehft_cpu.so``, from every ``.cpp`` (and ``.h``) in this directory, compiled without
``-march``: Google Highway (Debian ``libhwy-dev``, headers only) compiles each kernel's SIMD code once per
target (x86-64: AVX3 = AVX-512, AVX2 + FMA, and a scalar fallback; aarch64: NEON and the fallback) and the
library picks the best one this CPU runs when a kernel is created (``cpu_dispatch.h``). The conv kernel has
two more levels of its own code (:data:`CONV_ONLY`; the other kernels run the best Highway target there):
``avx3_bf16`` (AVX512_BF16's VDPBF16PS) and ``amx`` (AMX-BF16 tiles, where the CPU and Linux allow them). The binary is the same on
every box of an architecture, so it is built once:

* :func:`build_all` builds it into a directory (the wheel/install step ships it in
  ``edgehft/kernels/cpu/prebuilt/``, see :data:`PREBUILT_DIR`), with a manifest of what it was built from;
* :func:`load_library` loads that prebuilt library when its manifest matches these sources, flags and
  machine; otherwise it builds (``$CXX`` / ``g++``) into :func:`edgehft.kernels.cxx.default_cache_dir`
  under a name keyed by the sources' hash, the flags and the compiler, once, and loads that.

Choosing the target: :func:`targets` (what this CPU runs, best first), :func:`dispatch_target` (what new
kernels get now), :func:`set_target` / :func:`force_target` (tests, benchmarks; kernels created before
keep theirs), and the environment variable ``EDGEHFT_CPU_TARGET`` (read when the library is first loaded).
Target names, best first: ``amx``, ``avx3_bf16``, ``avx3`` (alias ``avx512``), ``avx2``, ``neon``, ``scalar``.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from edgehft.errors import BoardUnavailableError, InputError
from edgehft.kernels.cxx import CXXFLAGS, build_library, default_cache_dir

HERE = Path(__file__).resolve().parent
NATIVE_FLAGS = ("-O3", "-std=c++17", "-Wl,-z,defs")
LIB_NAME = "libedgehft_cpu"
PREBUILT_DIR = HERE / "prebuilt"
TARGET_ENV = "EDGEHFT_CPU_TARGET"
ALIASES = {"avx512": "avx3", "best": ""}
CONV_ONLY = ("amx", "avx3_bf16")      # levels only the conv kernel has (the others run the best SIMD target)
_LIBS: dict[str, ctypes.CDLL] = {}
_FORCED: list = [None]            # the target set_target forced (None: the best), for force_target
_HWY_HINT = "install Google Highway's headers (Debian: apt-get install libhwy-dev), or edgehft's prebuilt kernels"
_NO_CXX_HINT = ("no prebuilt kernel library for this edgehft (edgehft/kernels/cpu/prebuilt/): reinstall edgehft "
                "from its platform wheel (built where g++ and libhwy-dev are), or install g++ and libhwy-dev here "
                "(apt-get install g++ libhwy-dev)")


def sources() -> list[Path]:
    """The kernel library's sources: every ``.cpp`` and ``.h`` of this directory, sorted by name."""
    return sorted(p for p in HERE.iterdir() if p.suffix in (".cpp", ".h") and p.is_file())


def source_digest() -> str:
    """sha256 (hex) over the sources' names and contents: what a built library must have been built from."""
    h = hashlib.sha256()
    for p in sources():
        for part in (p.name.encode(), p.read_bytes()):
            h.update(part)
            h.update(b"\0")
    return h.hexdigest()


def _cxx() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


def _manifest(cxx: str) -> dict:
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        version = ""
    return {"sources_sha256": source_digest(), "flags": [*CXXFLAGS, *NATIVE_FLAGS], "machine": platform.machine(),
            "compiler": cxx, "compiler_version": version}


def library_path(cache_dir: Path | str | None = None) -> Path:
    """Where the library built from these sources with these flags and this compiler lives in the cache
    (built or not)."""
    h = hashlib.sha256()
    for part in (source_digest(), " ".join((*CXXFLAGS, *NATIVE_FLAGS)), _cxx() or "g++"):
        h.update(part.encode())
        h.update(b"\0")
    return Path(cache_dir or default_cache_dir()) / f"{LIB_NAME}-{h.hexdigest()[:16]}.so"


def _compile(out: Path) -> None:
    missing = [p for p in (HERE / "cpu_dispatch.cpp", HERE / "cpu_dispatch.h") if not p.is_file()]
    if missing:
        raise BoardUnavailableError(f"the native kernels' source is missing ({missing[0]})",
                                    hint="reinstall edgehft; the wheel ships edgehft/kernels/cpu/*.cpp")
    with tempfile.TemporaryDirectory(prefix="edgehft-native-src-") as d:
        for p in sources():
            shutil.copyfile(p, Path(d) / p.name)          # build_library compiles a directory
        try:
            build_library(out, Path(d), NATIVE_FLAGS, no_compiler_hint=_NO_CXX_HINT)
        except BoardUnavailableError as exc:
            if "hwy/" in str(exc) and "No such file" in str(exc):
                raise BoardUnavailableError(f"building {out.name}: Google Highway's headers are missing",
                                            hint=_HWY_HINT) from None
            raise


def build_all(dest_dir: Path | str) -> Path:
    """Build the kernel library into ``dest_dir`` as ``libedgehft_cpu.so`` with its manifest
    ``libedgehft_cpu.json`` (sources' sha256, flags, machine, compiler), for shipping prebuilt (the wheel or
    install step puts them in :data:`PREBUILT_DIR`). Returns the library's path. Raises
    :class:`~edgehft.errors.BoardUnavailableError` without a compiler or Highway's headers, or when the
    build fails."""
    dest = Path(dest_dir)
    cxx = _cxx()
    if cxx is None:
        raise BoardUnavailableError("no C++ compiler to build the native kernels (g++ not on PATH)",
                                    hint="install g++ (apt-get install g++)")
    out = dest / f"{LIB_NAME}.so"
    _compile(out)
    (dest / f"{LIB_NAME}.json").write_text(json.dumps(_manifest(cxx), indent=1) + "\n")
    return out


def prebuilt_library(prebuilt_dir: Path | str | None = None) -> Path | None:
    """The prebuilt library in ``prebuilt_dir`` (default :data:`PREBUILT_DIR`) when its manifest says it
    was built from these sources with these flags for this machine, else None."""
    d = Path(prebuilt_dir or PREBUILT_DIR)
    lib, man = d / f"{LIB_NAME}.so", d / f"{LIB_NAME}.json"
    try:
        m = json.loads(man.read_text())
    except (OSError, ValueError):
        return None
    ok = (isinstance(m, dict) and m.get("sources_sha256") == source_digest()
          and m.get("flags") == [*CXXFLAGS, *NATIVE_FLAGS] and m.get("machine") == platform.machine())
    return lib if ok and lib.is_file() else None


def _typed(lib: ctypes.CDLL) -> ctypes.CDLL:
    cp, i32 = ctypes.c_char_p, ctypes.c_int
    for name in ("edgehft_cpu_targets", "edgehft_cpu_target", "edgehft_cpu_compiled"):
        getattr(lib, name).restype = cp
        getattr(lib, name).argtypes = []
    lib.edgehft_cpu_set_target.restype = i32
    lib.edgehft_cpu_set_target.argtypes = [cp]
    lib.edgehft_cpu_slot_name.restype = cp
    lib.edgehft_cpu_slot_name.argtypes = [i32]
    return lib


def load_library(cache_dir: Path | str | None = None) -> ctypes.CDLL:
    """The kernel library, loaded once per process: the prebuilt one when it matches
    (:func:`prebuilt_library`), else the cached build (built now if missing). The first load applies
    ``$EDGEHFT_CPU_TARGET`` (:func:`set_target`). Raises :class:`~edgehft.errors.BoardUnavailableError`
    without a matching prebuilt library and no compiler or Highway headers, on a failed build or load, or
    when ``$EDGEHFT_CPU_TARGET`` names a target this CPU does not run; ``InputError`` when it names none."""
    path = prebuilt_library() or library_path(cache_dir)
    key = str(path)
    if key in _LIBS:
        return _LIBS[key]
    if not path.is_file():
        _compile(path)
    try:
        lib = _typed(ctypes.CDLL(str(path)))
    except (OSError, AttributeError) as e:
        raise BoardUnavailableError(f"cannot load {path}: {e}", hint=f"delete {path} to rebuild it") from e
    first = not _LIBS
    _LIBS[key] = lib
    if first and os.environ.get(TARGET_ENV):
        try:
            set_target(os.environ[TARGET_ENV])
        except (InputError, BoardUnavailableError) as exc:
            del _LIBS[key]
            raise type(exc)(f"${TARGET_ENV}: {exc.args[0]}", hint=exc.hint) from None
    elif _FORCED[0]:
        lib.edgehft_cpu_set_target(_FORCED[0].encode())     # a second library (prebuilt and cached) follows
    return lib


def _all_libs() -> list[ctypes.CDLL]:
    if not _LIBS:
        load_library()
    return list(_LIBS.values())


def targets() -> list[str]:
    """The targets this CPU (and this build) runs, best first, e.g. ``["avx3_bf16", "avx3", "avx2", "scalar"]``."""
    return _all_libs()[0].edgehft_cpu_targets().decode().split(",")


def bf16_in_hardware(runs: list[str] | None = None) -> bool:
    """Whether the targets ``runs`` (default: what this CPU runs, :func:`targets`) include a level with bf16
    products in hardware (:data:`CONV_ONLY`: AMX-BF16 tiles or AVX512_BF16's VDPBF16PS): where the native-bf16
    plan is worth timing and running."""
    return bool(set(CONV_ONLY) & set(targets() if runs is None else runs))


def compiled_targets() -> list[str]:
    """The Highway targets compiled into the library (Highway's names, e.g. ``["AVX3", "AVX2", "SCALAR"]``)."""
    return _all_libs()[0].edgehft_cpu_compiled().decode().split(",")


def dispatch_target() -> str:
    """The target kernels created now get (the best in :func:`targets` unless one was set)."""
    return _all_libs()[0].edgehft_cpu_target().decode()


def slot_name(slot: int) -> str:
    """A target slot number (what the kernels' ``*_slot`` functions return) as its target name."""
    return _all_libs()[0].edgehft_cpu_slot_name(int(slot)).decode()


def set_target(name: str | None) -> None:
    """Kernels created from now on run ``name`` (one of :func:`targets`, or an alias: ``avx512`` is
    ``avx3``); None, "" or "best": the best again. Kernels created before keep their target. Raises
    :class:`~edgehft.errors.InputError` for an unknown name, ``BoardUnavailableError`` for a target this
    CPU does not run."""
    want = ALIASES.get((name or "").strip().lower(), (name or "").strip().lower())
    libs = _all_libs()
    for lib in libs:
        rc = lib.edgehft_cpu_set_target(want.encode())
        if rc == -1:
            raise InputError(f"unknown CPU kernel target {name!r}",
                             hint="one of amx, avx3_bf16, avx3 (avx512), avx2, neon, scalar, or best")
        if rc == -2:
            raise BoardUnavailableError(f"this CPU does not run the {want} kernels",
                                        hint=f"it runs: {', '.join(targets())}")
    _FORCED[0] = want or None


@contextlib.contextmanager
def force_target(name: str | None):
    """Context manager: kernels created inside run ``name`` (as :func:`set_target`); the target in force
    before is restored on exit. Not for concurrent use from several threads."""
    _all_libs()
    before = _FORCED[0]
    set_target(name)
    try:
        yield dispatch_target()
    finally:
        set_target(before)


class NativeKernel:
    """What every native kernel object shares: a handle from the library's ``*_create``, the run function
    ``_run(handle, x_ptr, out_ptr)``, a preallocated :attr:`out`, the input shape(s) it was built for, and
    :attr:`isa`, the target it runs (a name from :func:`targets`). Subclasses set ``_lib``, ``_h``,
    ``_run``, ``_outp``, ``out``, ``input_shape``, ``isa`` and ``_destroy`` (the library's destroy
    function's name)."""

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
