"""The hardware-in-the-loop pytest plugin (edgehft.hil), as a team runs it: a fresh pytest process (the
plugin comes from the ``pytest11`` entry point) against the real DeepLOB bundle on the cpu board, and
on the emulated PYNQ-Z2 in the board venv (pynq 4.0.0, numpy < 2, no TensorFlow)."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import BOARD_PY, DEEPLOB, FEED_DAY1
from edgehft.bundle import load_bundle, sha256_file

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow

FAST = ["--edgehft-samples=100", "--edgehft-warmup=10"]


@pytest.fixture
def hil(pytester, monkeypatch):
    """``hil(*args)``: a fresh ``python -m pytest`` in the pytester directory (no test files unless a test
    made some), on a terminal wide enough that the summary table does not wrap its figures."""
    monkeypatch.setenv("COLUMNS", "400")
    return lambda *args: pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=600)


def golden_count(bundle: Path) -> int:
    return json.loads((bundle / "manifest.json").read_text())["golden"]["count"]


@pytest.fixture(scope="module")
def windows_npz(deeplob_windows, tmp_path_factory) -> Path:
    """The first 400 real DeepLOB windows and their receive times (the shipped feed), as a tick file."""
    p = tmp_path_factory.mktemp("ticks") / "windows.npz"
    np.savez(p, x=deeplob_windows["x"][:400], t_ns=deeplob_windows["t_ns"][:400])
    return p


def test_golden_and_latency_pass_from_a_directory_without_tests(hil, deeplob_bundle, tmp_path):
    """No ticks: the latency check replays the bundle's golden inputs back to back, although the calibration
    feed the manifest names is still on this machine (a bundle's paths are never read); a budget of 1e9 µs
    cannot be missed."""
    n = golden_count(deeplob_bundle)
    out = tmp_path / "hil.json"
    r = hil("--edgehft-board=cpu", f"--edgehft-bundle={deeplob_bundle}", *FAST,
            "--edgehft-budget-p99=1e9", "--edgehft-budget-p999=1e9", f"--edgehft-json={out}")
    r.assert_outcomes(passed=2)
    text = r.stdout.str()
    assert "edgehft hardware-in-the-loop" in text
    assert f"{n}/{n} golden vectors bit-exact" in text
    assert f"100 calls back to back over the bundle's {n} golden inputs; NOT the feed's timing" in text
    rep = json.loads(out.read_text())
    g, lat = rep["checks"]["golden"], rep["checks"]["latency"]
    assert (g["ok"], g["matched"], g["count"], g["compare"], g["max_diff"]) == (True, n, n, "exact", 0.0)
    assert lat["ok"] is True and lat["samples"] == 100 and lat["mode"] == "max"
    assert lat["source"]["kind"] == "golden" and lat["source"]["files"] == []
    assert load_bundle(deeplob_bundle).manifest.quantization.calibration_source == [str(FEED_DAY1)]
    assert FEED_DAY1.is_file()
    assert lat["budget_us"] == {"p99": 1e9, "p999": 1e9} and lat["budget_from"] == "options"
    assert 0 < lat["latency_us"]["p50"] <= lat["latency_us"]["p99"] <= lat["latency_us"]["p99.9"]
    assert rep["target"]["interpreter"].startswith("ai-edge-litert") and rep["emulated"] is False


def test_tampered_golden_fails_with_the_count(hil, deeplob_bundle, tmp_path):
    """Three golden outputs changed by one LSB, the manifest re-hashed so the bundle still verifies."""
    b = tmp_path / "tampered.cpu"
    shutil.copytree(deeplob_bundle, b)
    with np.load(b / "golden.npz") as z:
        arrays = {k: z[k].copy() for k in z.files}
    out = next(k for k in arrays if k.startswith("outputs/"))
    arrays[out][:3, 0] = np.where(arrays[out][:3, 0] == 127, 126, arrays[out][:3, 0] + 1)
    np.savez(b / "golden.npz", **arrays)
    m = json.loads((b / "manifest.json").read_text())
    m["files"]["golden.npz"] = sha256_file(b / "golden.npz")
    (b / "manifest.json").write_text(json.dumps(m))
    n = golden_count(b)
    r = hil("--edgehft-board=cpu", f"--edgehft-bundle={b}", "--edgehft-checks=golden")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines([f"edgehft::golden FAILED: 3 of {n} golden vectors differ (max diff 1 LSB; want bit-exact)*"])


def test_latency_over_budget_fails_with_the_figures(hil, deeplob_bundle, windows_npz):
    r = hil("--edgehft-board=cpu", f"--edgehft-bundle={deeplob_bundle}", "--edgehft-checks=latency",
            f"--edgehft-ticks={windows_npz}", *FAST, "--edgehft-budget-p99=0.001", "--edgehft-budget-p999=0.001")
    r.assert_outcomes(failed=1)
    r.stdout.re_match_lines([r"edgehft::latency FAILED: p99 [\d,.]+ µs > budget 0.001 µs, p99.9 [\d,.]+ µs > "
                             r"budget 0.001 µs \(p50 [\d,.]+ µs; 100 calls at recorded inter-arrival times from "
                             r"windows.npz\)"])


def test_soak_reports_intervals_and_memory(hil, deeplob_bundle, windows_npz, tmp_path):
    out = tmp_path / "soak.json"
    r = hil("--edgehft-board=cpu", f"--edgehft-bundle={deeplob_bundle}", "--edgehft-checks=none",
            f"--edgehft-ticks={windows_npz}", "--edgehft-warmup=10", "--edgehft-soak=0.05",
            "--edgehft-soak-intervals=4", "--edgehft-soak-max-drift=1e6", "--edgehft-soak-max-growth-mb=1024",
            f"--edgehft-json={out}")
    r.assert_outcomes(passed=1)
    r.stdout.fnmatch_lines(["*soak*passed*4 intervals over *s: p99 * µs → * µs (drift *, max *), RSS *MiB*",
                            "soak intervals*"])
    s = json.loads(out.read_text())["checks"]["soak"]
    assert s["ok"] is True and s["minutes"] == 0.05 and 2.5 < s["seconds"] < 30
    assert [i["index"] for i in s["intervals"]] == [0, 1, 2, 3]
    assert all(i["calls"] > 0 and i["rss_bytes"] > 0 for i in s["intervals"])
    assert s["calls"] == sum(i["calls"] for i in s["intervals"])
    assert s["rss_growth_bytes"] == s["intervals"][-1]["rss_bytes"] - s["intervals"][0]["rss_bytes"]
    assert s["rss_kind"] == "statm" and s["mode"] == "recorded" and s["source"]["kind"] == "ticks"


def test_team_tests_get_the_fixtures_next_to_the_checks(hil, pytester, deeplob_bundle):
    pytester.makepyfile(test_team="""
        import numpy as np

        def test_first_golden_vector(edgehft_runner, edgehft_bundle, edgehft_board):
            ins, outs = edgehft_bundle.golden()
            spec_in, spec_out = edgehft_bundle.manifest.inputs[0], edgehft_bundle.manifest.outputs[0]
            y = edgehft_runner.predict_raw(ins[spec_in.name][:1])
            assert np.array_equal(y, outs[spec_out.name][:1])
            assert edgehft_board.name == "cpu" and edgehft_board.latency_budget_us["p99"] > 0
    """)
    r = hil("--edgehft-board=cpu", f"--edgehft-bundle={deeplob_bundle}", *FAST,
            "--edgehft-budget-p99=1e9", "--edgehft-budget-p999=1e9", "-v")
    r.assert_outcomes(passed=3)
    r.stdout.fnmatch_lines(["*edgehft::golden PASSED*", "*edgehft::latency PASSED*",
                            "*test_team.py::test_first_golden_vector PASSED*"], consecutive=True)
    r = hil("-rs")                        # without a board: no checks, the fixtures skip
    r.assert_outcomes(skipped=1)
    r.stdout.fnmatch_lines(["*no target: run pytest with --edgehft-board=B --edgehft-bundle=DIR*"])


def test_usage_errors(hil, deeplob_bundle):
    cases = [(["--edgehft-board=cpu"], "--edgehft-board cpu needs --edgehft-bundle DIR"),
             ([f"--edgehft-bundle={deeplob_bundle}"], "--edgehft-bundle need --edgehft-board=B"),
             (["--edgehft-board=nope", f"--edgehft-bundle={deeplob_bundle}"], "--edgehft-board: unknown board 'nope'"),
             (["--edgehft-board=pynq-z2", f"--edgehft-bundle={deeplob_bundle}"], "was compiled for board 'cpu', not 'pynq-z2'"),
             (["--edgehft-board=cpu", f"--edgehft-bundle={deeplob_bundle}", "--edgehft-checks=golden,speed"],
              "--edgehft-checks: unknown check(s) speed"),
             (["--edgehft-board=cpu", f"--edgehft-bundle={deeplob_bundle}", "--edgehft-soak=0"],
              "--edgehft-soak 0.0: give a duration in minutes > 0")]
    cases.append((["--edgehft-board=cpu", "--edgehft-host=edgehft@box", f"--edgehft-bundle={deeplob_bundle}"],
                  "--edgehft-host runs the checks on the box's active bundle"))
    for args, message in cases:
        r = hil(*args)
        assert r.ret == pytest.ExitCode.USAGE_ERROR, (args, r.stderr.str())
        assert message in r.stderr.str(), (args, r.stderr.str())


@pytest.mark.needs("board-venv", "g++")
def test_emulated_pynq_z2_in_the_board_venv(tmp_path):
    """DeepLOB compiled for pynq-z2 here; the plugin runs in .venv-board (its own entry point) on the
    emulated board: the golden vectors pass bit-exactly, the latency is reported but not judged."""
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    bundle = tmp_path / "deeplob.pynq-z2"
    compile_model(DEEPLOB / "deeplob.keras", [FEED_DAY1], bundle, CompileOptions(board="pynq-z2"))
    work = tmp_path / "run"
    work.mkdir()
    out = tmp_path / "hil.json"
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "400"}
    r = subprocess.run([str(BOARD_PY), "-m", "pytest", "-p", "no:cacheprovider", "-rs", "--edgehft-board=pynq-z2",
                        f"--edgehft-bundle={bundle}", "--edgehft-emulate", "--edgehft-samples=20",
                        "--edgehft-warmup=2", f"--edgehft-json={out}"],
                       cwd=work, capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    n = golden_count(bundle)
    assert "board pynq-z2 (EMULATED)" in r.stdout
    assert f"EMULATED board; {n}/{n} golden vectors bit-exact" in r.stdout
    assert "1 passed, 1 skipped" in r.stdout
    rep = json.loads(out.read_text())
    assert rep["emulated"] is True and rep["target"]["emulated"] is True
    assert rep["checks"]["golden"]["ok"] is True and rep["checks"]["golden"]["matched"] == n
    lat = rep["checks"]["latency"]
    assert lat["ok"] is None and lat["not_judged"].startswith("EMULATED") and lat["samples"] == 20
    # bench --profile on the same emulated board: one row per step of the chain, in order
    r = subprocess.run([str(BOARD_PY), "-m", "edgehft", "bench", str(bundle), "--profile", "--emulate", "--json"],
                       cwd=work, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    prof = json.loads(r.stdout)
    steps = json.loads((bundle / "steps.json").read_text())["steps"]
    assert [(s["placement"], s["what"]) for s in prof["segments"]] == \
        [(s["placement"], s.get("kernel") or s.get("model")) for s in steps]
    assert prof["emulated"] is True and abs(sum(s["share"] for s in prof["segments"]) - 1) < 1e-6


def test_help_lists_the_options(hil):
    r = hil("--help")
    assert r.ret == 0, r.stderr.str()
    r.stdout.fnmatch_lines(["edgehft hardware-in-the-loop checks:", "*--edgehft-board=B*",
                            "*--edgehft-soak-max-drift=FRACTION*"])


def test_pytest_never_imports_code_from_a_bundle(hil, pytester, deeplob_bundle, tmp_path):
    """`pytest --edgehft-board cpu --edgehft-bundle B` run in the bundle's parent directory (as the README
    shows): a conftest.py or test file inside the bundle is not collected, so its code never runs."""
    canary = tmp_path / "CANARY"
    b = pytester.path / "deeplob.cpu"
    shutil.copytree(deeplob_bundle, b)
    code = f"import pathlib\npathlib.Path({str(canary)!r}).write_text('ran')\n"
    (b / "conftest.py").write_text(code)
    (b / "test_evil.py").write_text(code + "def test_x():\n    pass\n")
    (b / "features" / "conftest.py").write_text(code)
    r = hil("--edgehft-board=cpu", f"--edgehft-bundle={b}", *FAST, "--edgehft-checks=golden")
    r.assert_outcomes(passed=1)
    assert not canary.exists()


def test_markers_select_checks_and_junit_properties_are_numbers(hil, deeplob_bundle, tmp_path):
    """The built-in checks carry the registered markers (edgehft_board on all, edgehft_latency on the timed ones):
    ``-m "not edgehft_latency"`` keeps golden only; the JUnit XML has each check's figures as numbers."""
    import xml.etree.ElementTree as ET
    r = hil("--markers")
    r.stdout.fnmatch_lines(["@pytest.mark.edgehft_board:*", "@pytest.mark.edgehft_latency:*"])
    xml = tmp_path / "junit.xml"
    base = ["--edgehft-board=cpu", f"--edgehft-bundle={deeplob_bundle}", *FAST, "--edgehft-budget-p99=1e9",
            "--edgehft-budget-p999=1e9", "--strict-markers"]
    r = hil(*base, "-m", "not edgehft_latency")
    r.assert_outcomes(passed=1, deselected=1)
    r = hil(*base, f"--junitxml={xml}")
    r.assert_outcomes(passed=2)
    props = {p.get("name"): p.get("value") for p in ET.parse(xml).iter("property")}
    n = golden_count(deeplob_bundle)
    assert (props["golden_matched"], props["golden_count"], props["golden_max_diff"]) == (str(n), str(n), "0.0")
    assert props["latency_samples"] == "100"
    assert 0 < float(props["latency_p50_us"]) <= float(props["latency_p99_us"]) <= float(props["latency_max_us"])
