"""Jetson layers 3-4 (engine build, runtime): run only where an NVIDIA GPU and TensorRT are present;
elsewhere the refusal path is what is tested. Nothing here imports or fakes `tensorrt` in this process
unless a GPU answered the probe."""
import importlib.util

import numpy as np
import pytest

from conftest import DEEPLOB, FEED_DAY1
from edgehft.errors import BoardUnavailableError
from edgehft.toolchains.tensorrt import probe_gpu

PROBE = probe_gpu()
HAS_TRT = bool(PROBE["gpus"]) and importlib.util.find_spec("tensorrt") is not None
needs_gpu = pytest.mark.skipif(not HAS_TRT, reason=f"no NVIDIA GPU with TensorRT here ({PROBE['error'] or 'no tensorrt'})")


@pytest.fixture(scope="module")
def deeplob_jetson(tmp_path_factory):
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    out = tmp_path_factory.mktemp("jetson-gpu") / "deeplob.jetson"
    compile_model(DEEPLOB / "deeplob.keras", [FEED_DAY1], out, CompileOptions(board="jetson-agx-orin"))
    return out


@pytest.mark.skipif(HAS_TRT, reason="a GPU is present: the refusal path does not apply")
def test_without_gpu_open_refuses_cleanly(deeplob_jetson):
    from edgehft import runtime
    assert PROBE["gpus"] == 0 and PROBE["error"]
    with pytest.raises(BoardUnavailableError, match="no NVIDIA GPU here"):
        runtime.open(deeplob_jetson)


@needs_gpu
def test_engine_build_and_golden(deeplob_jetson, tmp_path, monkeypatch):
    from edgehft import runtime
    from edgehft.bundle import load_bundle
    from edgehft.toolchains import tensorrt as T
    monkeypatch.setenv("EDGEHFT_CACHE", str(tmp_path))
    b = load_bundle(deeplob_jetson)
    data, layers, version = T.build_engine(b.model_path, b.manifest.quantization.mode)
    assert data and layers
    key = T.cache_key(version, T.board_identity(), None, b.manifest.quantization.mode,
                      b.manifest.files[b.manifest.model_file])
    T.save_engine(key, data, {"tensorrt": version, "identity": T.board_identity(), "dla_core": None,
                              "layers": layers})
    ins, outs = b.golden()
    with runtime.open(deeplob_jetson) as r:
        got = np.stack([r.predict(x)[0].copy() for x in ins["lob"]])
    assert np.allclose(got, outs["signal"], atol=b.manifest.golden.atol)
