"""Jetson layers 3-4 (engine build, runtime) on an NVIDIA GPU with TensorRT: skipped with the reason where
none is present (``needs("tensorrt")``, tests/conftest.py), where tests/compile/test_jetson_no_gpu.py tests the
refusal path instead. Nothing here imports or fakes `tensorrt` in this process unless a GPU answered the probe."""
import numpy as np
import pytest

pytestmark = pytest.mark.needs("tensorrt")


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
