"""A box without a compiler (issue 15 item 2).

edgehft's platform wheel is built here, the build host with g++ and libhwy-dev (``pip wheel .``, through
hatch_build.py), and carries the native kernel library. Installed with pip into a directory the board venv's
Python imports first, and run on a PATH that has no C++ compiler, with an empty kernel cache, it opens a
native bundle and reproduces its golden vectors without building anything. The same install without the
prebuilt library is a clear exit 7 that says what to do, and its probe facts make deploy refuse the box.
"""
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import BOARD_PY, ROOT
from edgehft.deploy.probe import kernels_missing
from edgehft.kernels.cpu import build
from nocompiler_box import COMPILERS, PREBUILT, box_env, install, native_lstm, platform_wheel  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.needs("g++", "board-venv")]

# On the box: which edgehft it imports, and its native_kernels probe fact.
PROBE = ("import json, edgehft; from edgehft.deploy.probe import native_kernels; "
         "print(json.dumps({'edgehft': edgehft.__file__, **native_kernels()}))")


def _box(site: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    """The board venv's Python as a box without a compiler (nocompiler_box.box_env)."""
    return subprocess.run([str(BOARD_PY), *args], capture_output=True, text=True, env=box_env(site, cache),
                          cwd=cache.parent, timeout=300)


def test_the_platform_wheel_carries_the_kernel_library(platform_wheel):
    wheel = platform_wheel
    tag = "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert wheel.name == f"edgehft-0.3.0-{tag}.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert {f"{PREBUILT}/libedgehft_cpu.so", f"{PREBUILT}/libedgehft_cpu.json"} <= names
        assert {f"edgehft/kernels/cpu/{p.name}" for p in build.sources()} <= names   # what it was built from
        meta = z.read("edgehft-0.3.0.dist-info/WHEEL").decode()
        manifest = json.loads(z.read(f"{PREBUILT}/libedgehft_cpu.json"))
        assert z.read(f"{PREBUILT}/libedgehft_cpu.so")[:4] == b"\x7fELF"
    assert "Root-Is-Purelib: false" in meta and f"Tag: {tag}" in meta
    assert manifest["sources_sha256"] == build.source_digest() and manifest["machine"] == platform.machine()
    assert "-march=native" not in manifest["flags"]


def test_a_box_without_a_compiler_runs_a_native_bundle(platform_wheel, native_lstm, tmp_path):
    site, cache = install(platform_wheel, tmp_path / "site"), tmp_path / "cache"
    probe = _box(site, cache, "-c", PROBE)
    assert probe.returncode == 0, probe.stderr[-3000:]
    facts = json.loads(probe.stdout)
    assert Path(facts["edgehft"]).resolve() == (site / "edgehft" / "__init__.py").resolve()
    assert Path(facts["prebuilt"]).resolve() == (site / PREBUILT / "libedgehft_cpu.so").resolve()
    assert facts["compiler"] is None and facts["targets"] == build.targets()
    assert kernels_missing({"native_kernels": facts}) is None            # deploy accepts this box
    res = _box(site, cache, "-m", "edgehft", "run", str(native_lstm), "--golden", "--json")
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    got = json.loads(res.stdout)
    assert got["ok"] and got["count"] == got["matched"] == 16 and got["max_diff"] == 0.0
    assert got["plan"] == "native" and "edgehft native LSTM" in got["path"]
    assert sorted(str(p.relative_to(cache)) for p in cache.rglob("*.so")) == []     # nothing was built


def test_without_the_prebuilt_library_the_box_says_what_to_do(platform_wheel, native_lstm, tmp_path):
    site, cache = install(platform_wheel, tmp_path / "site", prebuilt=False), tmp_path / "cache"
    res = _box(site, cache, "-m", "edgehft", "run", str(native_lstm), "--golden")
    assert res.returncode == 7, res.stdout + res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith(("error:", "  hint:"))]
    assert len(lines) == 2 and "no C++ compiler" in lines[0] and "g++ not on PATH" in lines[0]
    assert "reinstall edgehft from its platform wheel" in lines[1] and "g++ and libhwy-dev" in lines[1]
    probe = _box(site, cache, "-c", PROBE)
    facts = json.loads(probe.stdout)
    assert (facts["prebuilt"], facts["targets"], facts["compiler"]) == (None, None, None)
    why = kernels_missing({"native_kernels": facts})
    assert why.startswith("the box's edgehft has no prebuilt kernel library matching its sources and cannot "
                          "build one: no C++ compiler (g++)")


def test_without_a_compiler_the_wheel_build_stops_unless_told(tmp_path):
    """hatch_build.py on a build host without g++: the wheel build fails with the reason and the ways on;
    EDGEHFT_SKIP_NATIVE_KERNELS=1 builds a pure wheel without the library, saying so."""
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "PIP_NO_BUILD_ISOLATION")}
    env["PATH"] = str(Path(sys.executable).parent)
    assert [c for c in COMPILERS if shutil.which(c, path=env["PATH"])] == []
    cmd = [sys.executable, "-m", "pip", "wheel", str(ROOT), "-w", str(tmp_path), "--no-deps", "-v"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and list(tmp_path.glob("*.whl")) == []
    assert "the native CPU kernel library (libedgehft_cpu.so) cannot be built here: no C++ compiler" in out
    assert "apt-get install g++ libhwy-dev" in out and "EDGEHFT_SKIP_NATIVE_KERNELS=1" in out
    res = subprocess.run(cmd, capture_output=True, text=True, env={**env, "EDGEHFT_SKIP_NATIVE_KERNELS": "1"},
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "building without the native CPU kernel library" in res.stdout + res.stderr
    (pure,) = tmp_path.glob("*.whl")
    assert pure.name == "edgehft-0.3.0-py3-none-any.whl"
    with zipfile.ZipFile(pure) as z:
        assert not [n for n in z.namelist() if n.startswith(PREBUILT)]
