"""A box without a compiler (issue 15 item 2), shared by tests/emulated/test_no_compiler_box.py and
tests/deploy/test_deploy_no_compiler.py: edgehft's platform wheel built from this tree (the build host, with
g++ and libhwy-dev), a ``--quant native`` bundle, and the board venv's Python run with that wheel installed
first on its path, on a PATH with no C++ compiler and an empty kernel cache. Import the fixtures by name in
a test module (``from nocompiler_box import platform_wheel, native_lstm``)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BOARD_PY, ROOT

PREBUILT = "edgehft/kernels/cpu/prebuilt"
COMPILERS = ("g++", "c++", "cc", "gcc", "clang++")


_BUILT: dict = {}        # one wheel and one bundle per session, whichever test module asks first


@pytest.fixture(scope="session")
def platform_wheel(tmp_path_factory) -> Path:
    """edgehft's wheel, built from this tree by pip (build isolation, the hatch_build.py hook)."""
    if "wheel" not in _BUILT:
        _BUILT["wheel"] = _build_wheel(tmp_path_factory.mktemp("wheel"))
    return _BUILT["wheel"]


def _build_wheel(out: Path) -> Path:
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "-w", str(out), "--no-deps", "-q"],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    wheels = sorted(out.glob("edgehft-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="session")
def native_lstm(models, tmp_path_factory) -> Path:
    """k3_lstm.keras (Conv1D -> LSTM(16) -> Dense softmax) compiled with --quant native: its LSTM runs on
    the native kernel library."""
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    if "native" not in _BUILT:
        out = tmp_path_factory.mktemp("native") / "lstm.native"
        compile_model(models / "k3_lstm.keras", [models / "calib.npy"], out,
                      CompileOptions(board="cpu", quant="native"))
        _BUILT["native"] = out
    return _BUILT["native"]


def install(wheel: Path, site: Path, prebuilt: bool = True) -> Path:
    """``pip install --no-deps --target site wheel`` with the board venv's pip (then without the prebuilt
    library unless ``prebuilt``); returns ``site``."""
    res = subprocess.run([str(BOARD_PY), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                          str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    if not prebuilt:
        shutil.rmtree(site / PREBUILT)
    return site


def box_env(site: Path, cache: Path) -> dict:
    """The environment of a box without a compiler: ``site`` first on sys.path, PATH only the board venv's
    bin (asserted to hold no C++ compiler), CXX unset, ``cache`` (created empty) the kernel cache."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CXX", "CC", "PYTHONPATH", "EDGEHFT_CPU_TARGET", "XDG_CACHE_HOME")}
    env.update(PATH=str(BOARD_PY.parent), PYTHONPATH=str(site), EDGEHFT_CACHE=str(cache))
    assert [c for c in COMPILERS if shutil.which(c, path=env["PATH"])] == []
    cache.mkdir(parents=True, exist_ok=True)
    return env


def box_python(site: Path, cache: Path, path: Path) -> Path:
    """A script at ``path`` that runs the board venv's Python in :func:`box_env` (for ``--remote-python``)."""
    env = box_env(site, cache)
    path.write_text("#!/bin/sh\nunset CXX CC EDGEHFT_CPU_TARGET XDG_CACHE_HOME\n"
                    + "".join(f"export {k}='{env[k]}'\n" for k in ("PATH", "PYTHONPATH", "EDGEHFT_CACHE"))
                    + f'exec {BOARD_PY} "$@"\n')
    path.chmod(0o755)
    return path
