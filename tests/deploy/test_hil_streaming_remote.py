"""The HIL plugin's streaming check on a box (``--edgehft-host``): the box's agent (``hil streaming``) pushes
the ticks through its own ``runner.stream()`` in its own process (the board venv: Python 3.11, numpy < 2, no
TensorFlow) and sends the result back as JSON. The box is the loopback sshd of conftest's ``ssh_box``; the
bundles are small models from tests/make_stream_runtime_models.py: the ``--quant native`` plan of an LSTM
stack (streams; deployed to the box) and a Conv1D -> Flatten -> Dense (does not: a skip, from a bundle
directory on the box)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import BOARD_PY
from deploy_box import box, deployed  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.needs("g++", "board-venv")]

T, F = 10, 7                       # lstm_bias: LSTM(12) -> LSTM(9) -> Dense(2) over 10 x 7 rows


@pytest.fixture(scope="module")
def bundles(stream_runtime_bundle):
    """``{"lstm": native plan of lstm_bias, "dense": float plan of flatten_dense}``, compiled for the cpu board
    (conftest's session fixture)."""
    return {"lstm": stream_runtime_bundle("lstm_bias", "native"), "dense": stream_runtime_bundle("flatten_dense", "float")}


@pytest.fixture
def sliding_npz(tmp_path) -> Path:
    """120 windows sliding one row at a time over 129 seeded rows, their ticks 20 µs apart (a path the loopback
    box reads as its own)."""
    rows = np.random.default_rng(5).standard_normal((129, F)).astype(np.float32)
    x = np.lib.stride_tricks.sliding_window_view(rows, (T, F))[:, 0]
    p = tmp_path / "slide.npz"
    np.savez(p, x=np.ascontiguousarray(x), t_ns=1_000_000 + 20_000 * np.arange(len(x), dtype=np.int64))
    return p


def hil(box, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """A fresh ``python -m pytest`` with the plugin aimed at the box (``--edgehft-host box``), on a wide terminal."""
    sshd, cfg, root = box
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--edgehft-board=cpu",
                           "--edgehft-host=box", f"--edgehft-ssh-config={cfg}",
                           f"--edgehft-remote-python={sshd.python}", f"--edgehft-install-dir={root}", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "400"})


def test_streaming_runs_on_the_box_bit_identical(box, bundles, sliding_npz, tmp_path):
    """The deployed LSTM's native plan streams on the box: 100 outputs equal the box's predict of the same
    window, 300 timed pushes at the recorded tick times after 20 untimed ones, every window prepared ahead, the
    1e9 µs budget holds; the result names the box and the version it ran."""
    root = box[2]
    v = deployed(box, bundles["lstm"])["version"]
    out = tmp_path / "hil.json"
    r = hil(box, tmp_path, "--edgehft-checks=golden,streaming", f"--edgehft-ticks={sliding_npz}",
            "--edgehft-samples=300", "--edgehft-warmup=20", "--edgehft-stream-compare=100",
            "--edgehft-budget-p99=1e9", "--edgehft-budget-p999=1e9", f"--edgehft-json={out}", "-v")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "edgehft::golden PASSED" in r.stdout and "edgehft::streaming PASSED" in r.stdout
    assert "100/100 outputs bit-identical to predict of the same window; push p99 " in r.stdout
    rep = json.loads(out.read_text())
    g, s = rep["checks"]["golden"], rep["checks"]["streaming"]
    assert (g["ok"], g["matched"], g["count"], g["host"]) == (True, 2, 2, "box")
    assert (s["ok"], s["skipped"], s["compared"], s["mismatches"], s["first_mismatch"], s["max_abs_diff"]) == \
        (True, None, 100, 0, None, 0.0)
    assert (s["host"], s["bundle"], s["board"], s["emulated"]) == ("box", str(root / "versions" / v), "cpu", False)
    assert (s["samples"], s["warmup"], s["mode"], s["rows_from"]) == (300, 20, "recorded", "sliding")
    assert s["stream_counters"] == {"outputs": 320, "prepared_ahead": 320, "prepared_late": 0}
    assert s["budget_from"] == "options" and {k: v["ok"] for k, v in s["verdicts"].items()} == \
        {"p99": True, "p999": True}
    assert 0 < s["latency_us"]["p50"] <= s["latency_us"]["p99"] <= s["latency_us"]["p99.9"]
    assert s["source"]["kind"] == "ticks" and s["source"]["files"] == [str(sliding_npz)]
    d = s["stream"]
    assert (d["prepare"], d["window"], d["layers"], d["head"], d["row_shape"]) == ("inline", T, [12, 9], "native", [F])


def test_a_bundle_that_does_not_stream_is_a_skip_on_the_box(box, bundles, tmp_path):
    """Conv1D -> Flatten -> Dense (a bundle directory on the box, nothing deployed): the box's agent answers the
    check's skipped result, not an error; the plugin skips with the InputError's message and hint, and the
    golden check beside it passes."""
    out = tmp_path / "hil.json"
    r = hil(box, tmp_path, f"--edgehft-remote-bundle={bundles['dense']}", "--edgehft-checks=golden,streaming",
            f"--edgehft-json={out}", "-rs")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 1 skipped" in r.stdout
    skip = next(ln for ln in r.stdout.splitlines() if ln.startswith("SKIPPED"))
    assert "does not stream: flatten_dense.float cannot stream: op #" in skip and "FULLY_CONNECTED" in skip
    s = json.loads(out.read_text())["checks"]["streaming"]
    assert (s["check"], s["ok"], s["host"], s["bundle"]) == ("streaming", None, "box", str(bundles["dense"]))
    assert "every output reads all" in s["skipped"] and "hint: " in s["skipped"] and "compared" not in s


def test_bad_streaming_input_is_an_error_not_a_traceback(box, bundles):
    """Bad option values come back from the box as the check's InputError (a DeployError here, message and hint
    from the box); options that are not a JSON object, or unknown ones, are refused by the agent itself with
    one JSON error line, exit status 1 and no traceback."""
    from edgehft.deploy.remote import RemoteTarget
    from edgehft.errors import DeployError
    sshd, cfg, root = box
    rt = RemoteTarget("box", "cpu", bundle_dir_on_box=str(bundles["lstm"]), ssh_config=str(cfg),
                      remote_python=sshd.python, install_dir=str(root))
    with pytest.raises(DeployError, match=r"box: streaming check: samples 10, compare 0") as exc:
        rt.streaming(samples=10, compare=0)
    assert "compare >= 1" in exc.value.hint
    with pytest.raises(DeployError, match=r"unknown option\(s\) bogus") as exc:
        rt.streaming(samples=10, bogus=1)
    assert "compare" in exc.value.hint and "upgrade edgehft on the box" in exc.value.hint
    for options, says in (("not json", "--options is not JSON"), ("[1, 2]", "--options is a JSON list")):
        p = subprocess.run([str(BOARD_PY), "-m", "edgehft.deploy.agent", "hil", "streaming", "--root", str(root),
                            "--board", "cpu", "--bundle", str(bundles["lstm"]), "--options", options],
                           capture_output=True, text=True, timeout=120)
        lines = [json.loads(ln) for ln in p.stdout.splitlines()]
        assert p.returncode == 1 and len(lines) == 1 and "Traceback" not in p.stderr, (p.stdout, p.stderr)
        assert lines[0]["type"] == "InputError" and lines[0]["exit_code"] == 3
        assert lines[0]["error"].startswith(f"hil streaming: {says}")
