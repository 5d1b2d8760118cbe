"""The HIL plugin's streaming check (issue 21 item 4): ``--edgehft-checks ...,streaming`` replays ticks one row
at a time through ``runner.stream()`` (inline prepare between ticks), compares the first outputs with
``predict`` of the same window bit for bit and holds the push's p99 / p99.9 to the budget. A fresh pytest
process per run, as a team runs the plugin, on small models from tests/make_stream_runtime_models.py: the
``--quant native`` plan of an LSTM stack (streams), and a Conv1D -> Flatten -> Dense (does not: a skip)."""
import json
from pathlib import Path

import numpy as np
import pytest


pytest_plugins = ["pytester"]
pytestmark = [pytest.mark.slow, pytest.mark.needs("g++")]

T, F = 10, 7                       # lstm_bias: LSTM(12) -> LSTM(9) -> Dense(2) over 10 x 7 rows


@pytest.fixture(scope="module")
def bundles(stream_runtime_bundle):
    """``{"lstm": native plan of lstm_bias, "dense": float plan of flatten_dense}``, compiled for the cpu board
    (conftest's session fixture)."""
    return {"lstm": stream_runtime_bundle("lstm_bias", "native"), "dense": stream_runtime_bundle("flatten_dense", "float")}


@pytest.fixture
def hil(pytester, monkeypatch):
    """``hil(*args)``: a fresh ``python -m pytest`` in the pytester directory, on a wide terminal."""
    monkeypatch.setenv("COLUMNS", "400")
    return lambda *args: pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=600)


@pytest.fixture
def sliding_npz(tmp_path) -> Path:
    """120 windows sliding one row at a time over 129 seeded rows, their ticks 20 µs apart."""
    rows = np.random.default_rng(3).standard_normal((129, F)).astype(np.float32)
    x = np.lib.stride_tricks.sliding_window_view(rows, (T, F))[:, 0]
    p = tmp_path / "slide.npz"
    np.savez(p, x=np.ascontiguousarray(x), t_ns=1_000_000 + 20_000 * np.arange(len(x), dtype=np.int64))
    return p


def test_streaming_passes_bit_identical_within_budget(hil, bundles, sliding_npz, tmp_path):
    """Recorded ticks of sliding windows: 100 outputs compared with predict, none differ; 300 timed pushes after
    20 untimed, every window prepared ahead (inline prepare after each push); a 1e9 µs budget holds."""
    out = tmp_path / "hil.json"
    r = hil("--edgehft-board=cpu", f"--edgehft-bundle={bundles['lstm']}", "--edgehft-checks=golden,streaming",
            f"--edgehft-ticks={sliding_npz}", "--edgehft-samples=300", "--edgehft-warmup=20",
            "--edgehft-stream-compare=100", "--edgehft-budget-p99=1e9", "--edgehft-budget-p999=1e9",
            f"--edgehft-json={out}", "-v")
    r.assert_outcomes(passed=2)
    r.stdout.fnmatch_lines(["*edgehft::golden PASSED*", "*edgehft::streaming PASSED*"], consecutive=True)
    r.stdout.fnmatch_lines(["*streaming*passed*100/100 outputs bit-identical to predict of the same window; push "
                            "p99 * µs ≤ budget 1,000,000,000.0 µs, p99.9 * µs ≤ budget *300 ticks at recorded "
                            "inter-arrival times from slide.npz; native head*"])
    s = json.loads(out.read_text())["checks"]["streaming"]
    assert (s["ok"], s["skipped"], s["compared"], s["mismatches"], s["first_mismatch"], s["max_abs_diff"]) == \
        (True, None, 100, 0, None, 0.0)
    assert (s["samples"], s["warmup"], s["mode"], s["speed"], s["rows_from"]) == (300, 20, "recorded", 1.0, "sliding")
    assert s["stream_counters"] == {"outputs": 320, "prepared_ahead": 320, "prepared_late": 0}
    assert s["prepared_ahead"] == 1.0 and 0.0 <= s["prepared_before_tick"] <= 1.0
    assert s["budget_us"] == {"p99": 1e9, "p999": 1e9} and s["budget_from"] == "options"
    assert {k: v["ok"] for k, v in s["verdicts"].items()} == {"p99": True, "p999": True}
    assert s["verdicts"]["p99"]["value_us"] == s["latency_us"]["p99"]
    assert 0 < s["latency_us"]["p50"] <= s["latency_us"]["p99"] <= s["latency_us"]["p99.9"]
    assert s["prepare_us_mean"] > 0 and s["push_prepare_us"]["p50"] >= s["latency_us"]["p50"]
    assert s["source"]["kind"] == "ticks" and s["source"]["windows"] == 120
    d = s["stream"]
    assert (d["prepare"], d["window"], d["layers"], d["head"], d["row_shape"]) == ("inline", T, [12, 9], "native", [F])


def test_streaming_over_budget_fails_with_the_figures(hil, bundles, tmp_path):
    """The bundle's 2 golden inputs (not sliding: each tick is a window's newest row, cycled), back to back,
    against a 0.001 µs budget: the outputs still equal predict, the push percentiles fail the budget."""
    out = tmp_path / "hil.json"
    r = hil("--edgehft-board=cpu", f"--edgehft-bundle={bundles['lstm']}", "--edgehft-checks=streaming",
            "--edgehft-samples=200", "--edgehft-warmup=10", "--edgehft-stream-compare=50",
            "--edgehft-budget-p99=0.001", "--edgehft-budget-p999=0.001", f"--edgehft-json={out}")
    r.assert_outcomes(failed=1)
    r.stdout.re_match_lines([r"edgehft::streaming FAILED: 50/50 outputs bit-identical to predict of the same "
                             r"window; push p99 [\d,.]+ µs > budget 0.001 µs, p99.9 [\d,.]+ µs > budget 0.001 µs "
                             r"\(p50 [\d,.]+ µs\); inline prepare .* back to back, so the prepare cannot hide before "
                             r"the next tick: push \+ prepare p99 [\d,.]+ µs \(200 ticks back to back over the "
                             r"bundle's 2 golden inputs; NOT the feed's timing, each a window's newest row;"])
    s = json.loads(out.read_text())["checks"]["streaming"]
    assert (s["ok"], s["compared"], s["mismatches"], s["mode"], s["rows_from"]) == (False, 50, 0, "max", "newest")
    assert {k: v["ok"] for k, v in s["verdicts"].items()} == {"p99": False, "p999": False}
    assert s["stream_counters"]["outputs"] == 210 and s["samples"] == 200
    assert s["source"]["kind"] == "golden" and s["prepared_before_tick"] == 0.0


def test_a_bundle_that_does_not_stream_is_a_skip_with_the_reason(hil, bundles, tmp_path):
    """Conv1D -> Flatten -> Dense cannot stream (the Dense reads every row): the check skips with the
    InputError's message and hint, the JSON says why, and the golden check beside it still passes."""
    out = tmp_path / "hil.json"
    r = hil("--edgehft-board=cpu", f"--edgehft-bundle={bundles['dense']}", "--edgehft-checks=golden,streaming",
            f"--edgehft-json={out}", "-rs")
    r.assert_outcomes(passed=1, skipped=1)
    r.stdout.fnmatch_lines(["SKIPPED*does not stream: flatten_dense.float cannot stream: op #* FULLY_CONNECTED*"])
    s = json.loads(out.read_text())["checks"]["streaming"]
    assert s["ok"] is None and s["check"] == "streaming"
    assert "cannot stream" in s["skipped"] and "every output reads all" in s["skipped"]
    assert "hint: " in s["skipped"] and "compared" not in s
    r = hil("--edgehft-board=cpu", f"--edgehft-bundle={bundles['lstm']}", "--edgehft-checks=streaming",
            "--edgehft-stream-compare=0")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    assert "--edgehft-stream-compare 0 is out of range" in r.stderr.str()


def test_an_output_that_differs_from_predict_fails_the_check(bundles):
    """In process, a runner whose predict is one float32 step off (its stream is the real one): every compared
    output counts as a mismatch, with the first index and the size, and the check fails whatever the budget."""
    from edgehft import runtime
    from edgehft.hil import checks, summary

    class OffByOne:
        def __init__(self, runner):
            self.runner = runner

        def __getattr__(self, name):
            return getattr(self.runner, name)

        def predict(self, window):
            y = self.runner.predict(window)
            return np.nextafter(y, np.float32(np.inf))

    with runtime.open(bundles["lstm"]) as r:
        s = checks.streaming(OffByOne(r), samples=20, warmup=0, compare=7, budget_p99=1e9, budget_p999=1e9)
    assert (s["ok"], s["compared"], s["mismatches"], s["first_mismatch"]) == (False, 7, 7, 0)
    assert 0 < s["max_abs_diff"] < 1e-5
    assert {k: v["ok"] for k, v in s["verdicts"].items()} == {"p99": True, "p999": True}
    assert summary.headline(s).startswith("7 of 7 outputs differ from predict of the same window (first at output 0")
    assert summary.verdict(s) == "FAILED"
