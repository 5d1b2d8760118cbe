"""Jetson without a GPU: where no NVIDIA GPU with TensorRT answers the probe, opening a Jetson bundle is
refused cleanly (tests/hw/test_jetson_gpu.py builds and runs the engine where one does). Nothing here
imports or fakes `tensorrt`."""
import pytest

from conftest import gpu_probe, missing
from edgehft.errors import BoardUnavailableError

PROBE = gpu_probe()


@pytest.mark.skipif(missing("tensorrt") is None, reason="a GPU is present: the refusal path does not apply")
def test_without_gpu_open_refuses_cleanly(deeplob_jetson):
    from edgehft import runtime
    assert PROBE["gpus"] == 0 and PROBE["error"]
    with pytest.raises(BoardUnavailableError, match="no NVIDIA GPU here"):
        runtime.open(deeplob_jetson)
