"""The LiteRT line "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." is not printed on every command
(issue 19): :func:`edgehft.runtime.litert.quiet_runtime_info` holds file descriptor 2 around interpreter creation
and gives back everything but that line. Checked at the file-descriptor level (capfd, and a CLI subprocess)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT
from edgehft.runtime import litert
from tiny_bundle import write_tiny_bundle

LINE = "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_bundle(tmp_path_factory.mktemp("tiny"))


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_litert_itself_prints_the_line(tiny):
    """The premise: an interpreter made without the wrapper prints the line on fd 2 (if a LiteRT release stops
    printing it, this fails and the quiet wrapper can go)."""
    code = ("from ai_edge_litert import interpreter as m; "
            f"i = m.Interpreter(model_path={str(tiny / 'model.tflite')!r}); i.allocate_tensors()")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env())
    assert res.returncode == 0 and LINE in res.stderr, res.stderr


def test_edgehft_run_golden_does_not_print_it(tiny):
    res = subprocess.run([sys.executable, "-m", "edgehft", "run", str(tiny), "--golden"], capture_output=True,
                         text=True, timeout=120, env=_env())
    assert res.returncode == 0, res.stdout + res.stderr
    assert "8/8 reproduced" in " ".join(res.stdout.split()) and "XNNPACK delegate" not in res.stderr, res.stderr


def test_other_output_in_the_block_still_reaches_stderr(capfd):
    """Only the INFO line is dropped: an error line written inside the block comes out after it, in order;
    the lines after the block are not held; an exception inside the block gives fd 2 back too."""
    os.write(2, b"before\n")
    with litert.quiet_runtime_info():
        os.write(2, f"{LINE}\nERROR: a real one\nINFO: something else\n".encode())
        os.write(1, b"stdout is not touched\n")
    os.write(2, b"after\n")
    with pytest.raises(ZeroDivisionError):
        with litert.quiet_runtime_info():
            os.write(2, b"from a block that raised\n")
            1 / 0
    os.write(2, b"last\n")
    out, err = capfd.readouterr()
    assert err == "before\nERROR: a real one\nINFO: something else\nafter\nfrom a block that raised\nlast\n"
    assert out == "stdout is not touched\n"

