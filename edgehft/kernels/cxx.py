"""Build C++ kernels into a shared library with the host's compiler (``$CXX`` or ``g++``): the flags every
edgehft kernel library is built with and the cache directory they land in. Used by the PYNQ overlay's
host emulation (:mod:`edgehft.kernels.fpga.csim`) and the cpu board's native kernels
(:mod:`edgehft.kernels.cpu.build`).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from edgehft.errors import BoardUnavailableError

CXXFLAGS = ("-O2", "-std=c++14", "-fPIC", "-shared", "-ffp-contract=off", "-Wall", "-Wno-unknown-pragmas",
            "-Wno-unused-label")


def default_cache_dir() -> Path:
    """Where built kernel libraries are cached: ``$EDGEHFT_CACHE/kernels``, else
    ``$XDG_CACHE_HOME/edgehft/kernels`` (default ``~/.cache/edgehft/kernels``)."""
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    base = os.environ.get("EDGEHFT_CACHE") or xdg / "edgehft"
    return Path(base) / "kernels"


def build_library(out: Path | str, sources: Path, flags=(),
                  no_compiler_hint: str = "install g++ (apt-get install g++)") -> Path:
    """Compile every non-testbench (``tb_*``) ``*.cpp`` of the directory ``sources`` into the shared library
    ``out`` (written atomically) with ``$CXX`` or ``g++`` from PATH, flags :data:`CXXFLAGS` then ``flags``.

    Raises:
        BoardUnavailableError: no compiler (hint ``no_compiler_hint``), or the build failed (its stderr).
    """
    src, out = Path(sources), Path(out)
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        raise BoardUnavailableError(f"no C++ compiler to build {out.name} (g++ not on PATH)", hint=no_compiler_hint)
    out.parent.mkdir(parents=True, exist_ok=True)
    cpps = sorted(p for p in src.glob("*.cpp") if not p.name.startswith("tb_"))
    fd, tmp = tempfile.mkstemp(prefix=out.name, dir=out.parent)
    os.close(fd)
    cmd = [cxx, *CXXFLAGS, *flags, f"-I{src}", *map(str, cpps), "-o", tmp]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        os.unlink(tmp)
        raise BoardUnavailableError(f"building {out.name} failed: {' '.join(cmd)}\n{res.stderr[-3000:]}",
                                    hint="the kernel sources must compile with g++ -std=c++14")
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)
    return out


