"""Shared fixtures. Models are built and compiled once per session (the converter is slow)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
DEEPLOB = ROOT / "examples" / "deeplob"
FEED_DAY1 = DEEPLOB / "data" / "btcusd_perp_20240808_depth.gz"
FEED_DAY2 = DEEPLOB / "data" / "btcusd_perp_20240809_depth.gz"


def run_maker(script: Path, out: Path, timeout: int = 600) -> Path:
    """Run a model-building script (it imports TensorFlow) in a subprocess: ``python SCRIPT OUT``."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1"}
    subprocess.run([sys.executable, str(script), str(out)], check=True, env=env, capture_output=True,
                   timeout=timeout)
    return out


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Path:
    """Directory of small Keras 3 and tf-keras models (see tests/make_models.py)."""
    return run_maker(ROOT / "tests" / "make_models.py", tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def mlp(tmp_path_factory) -> Path:
    """The example MLP (examples/mlp/model.py, 64 -> 512 -> 256 -> 128 -> 64 -> 1) as ``mlp.keras`` and 400
    random float32 windows ``x.npy`` (64,) in one directory."""
    work = tmp_path_factory.mktemp("mlp")
    run_maker(ROOT / "examples" / "mlp" / "model.py", work / "mlp.keras", timeout=300)
    np.save(work / "x.npy", np.random.default_rng(0).standard_normal((400, 64)).astype(np.float32))
    return work


@pytest.fixture(scope="session")
def deeplob_bundle(tmp_path_factory) -> Path:
    """The shipped DeepLOB compiled for the cpu board as full int8 (bit-exact golden vectors; the board's
    default plan is ``auto``), calibrated on the shipped real feed."""
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    out = tmp_path_factory.mktemp("bundles") / "deeplob.cpu"
    compile_model(DEEPLOB / "deeplob.keras", [FEED_DAY1], out, CompileOptions(board="cpu", quant="int8"))
    return out


@pytest.fixture(scope="session")
def deeplob_windows() -> dict:
    sys.path.insert(0, str(DEEPLOB))
    try:
        import features
    finally:
        sys.path.remove(str(DEEPLOB))
    return features.windows_from_feed([FEED_DAY1], labels=False)


@pytest.fixture
def rng():
    return np.random.default_rng(42)


@pytest.fixture(scope="session")
def ssh_box(tmp_path_factory):
    """A real sshd on 127.0.0.1 standing in for a box (tests/sshbox.py); its Python is .venv-board.

    Skipped with the reason where sshd or the board venv is missing, except under CI (CI=true), where
    scripts/test.sh installs both and a missing one is a failure.
    """
    from sshbox import BOX_PYTHON, SSHD, LoopbackBox
    missing = [what for what, ok in ((f"sshd ({SSHD}; apt-get install openssh-server)", os.path.exists(SSHD)),
                                     (f"the board venv ({BOX_PYTHON}; scripts/board-venv.sh)", BOX_PYTHON.exists()))
               if not ok]
    if missing:
        if os.environ.get("CI"):
            pytest.fail("deploy tests need " + " and ".join(missing))
        pytest.skip("deploy tests need " + " and ".join(missing))
    box = LoopbackBox(tmp_path_factory.mktemp("sshbox")).start()
    yield box
    box.stop()
