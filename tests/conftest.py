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


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Path:
    """Directory of small Keras 3 and tf-keras models (see tests/make_models.py)."""
    out = tmp_path_factory.mktemp("models")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1"}
    subprocess.run([sys.executable, str(ROOT / "tests" / "make_models.py"), str(out)], check=True,
                   env=env, capture_output=True, timeout=600)
    return out


@pytest.fixture(scope="session")
def deeplob_bundle(tmp_path_factory) -> Path:
    """The shipped DeepLOB compiled for the cpu board (int8), calibrated on the shipped real feed."""
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    out = tmp_path_factory.mktemp("bundles") / "deeplob.cpu"
    compile_model(DEEPLOB / "deeplob.keras", [FEED_DAY1], out, CompileOptions(board="cpu"))
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
