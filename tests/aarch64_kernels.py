"""The native kernel library cross-compiled for aarch64 (Debian's g++-aarch64-linux-gnu, Highway's NEON and
scalar targets) and C++ drivers run on it under QEMU user mode (qemu-user-static) and on this machine's build,
for the tests that compare their bits (tests/unit/test_native_aarch64.py, test_native_stream_aarch64.py). The
library is built once per session. QEMU says nothing about speed on ARM."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from edgehft.kernels.cpu import build

CROSS, QEMU = "aarch64-linux-gnu-g++", "qemu-aarch64-static"
SYSROOT = Path("/usr/aarch64-linux-gnu")
NEEDS = [pytest.mark.needs("g++"),
         pytest.mark.skipif(not (shutil.which(CROSS) and shutil.which(QEMU) and SYSROOT.is_dir()),
                            reason=f"no {CROSS} / {QEMU} (apt-get install g++-aarch64-linux-gnu qemu-user-static)")]


def results(stdout: str) -> tuple[list[str], dict[str, str]]:
    """A driver's output: the ``targets a,b,...`` line, then one ``<target> <results>`` line per target."""
    lines = stdout.strip().splitlines()
    assert lines[0].startswith("targets "), stdout
    return lines[0].split()[1].split(","), {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in lines[1:]}


_BUILT: dict = {}          # one build per process: each test module that imports the fixture registers its own


@pytest.fixture(scope="session")
def aarch64_library(tmp_path_factory) -> Path:
    """libedgehft_cpu.so for aarch64, from the same sources and flags as this machine's build."""
    if "lib" not in _BUILT:
        _BUILT["lib"] = _cross_build(tmp_path_factory.mktemp("aarch64"))
    return _BUILT["lib"]


def _cross_build(d: Path) -> Path:
    inc = d / "include"
    inc.mkdir()
    (inc / "hwy").symlink_to(Path("/usr/include/hwy"))          # Highway's headers are the same on every arch
    lib = d / "libedgehft_cpu.so"
    srcs = [str(p) for p in build.sources() if p.suffix == ".cpp"]
    subprocess.run([CROSS, *build.CXXFLAGS, *build.NATIVE_FLAGS, f"-I{build.HERE}", f"-I{inc}", *srcs, "-o", str(lib)],
                   check=True, capture_output=True, text=True, timeout=900)
    return lib


def run_here(driver: str, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """``driver`` (C++ source) linked against this machine's library and run: its :func:`results`."""
    (tmp_path / "driver.cpp").write_text(driver)
    lib = build.load_library()._name
    subprocess.run(["g++", "-O1", str(tmp_path / "driver.cpp"), lib, f"-Wl,-rpath,{Path(lib).parent}",
                    "-o", str(tmp_path / "x86")], check=True)
    return results(subprocess.run([str(tmp_path / "x86")], capture_output=True, text=True, check=True).stdout)


def run_on_arm(driver: str, lib: Path, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """``driver`` cross-compiled against the aarch64 ``lib`` and run under QEMU: its :func:`results`."""
    (tmp_path / "driver.cpp").write_text(driver)
    subprocess.run([CROSS, "-O1", str(tmp_path / "driver.cpp"), str(lib), "-o", str(tmp_path / "arm")], check=True)
    res = subprocess.run([QEMU, "-L", str(SYSROOT), "-E", f"LD_LIBRARY_PATH={lib.parent}", str(tmp_path / "arm")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return results(res.stdout)
