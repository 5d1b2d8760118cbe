"""The HIL pytest plugin across a whole session, as a team runs it (a fresh ``python -m pytest``, the plugin from
its ``pytest11`` entry point): under pytest-xdist (``-n 2``) the ``--edgehft-json`` report and the summary have
every check from every worker, and timed checks say when other tests may have run beside them; a board that is
unavailable here (coral-usb without an Edge TPU) skips every test that needs it with one reason, said once.

The bundles are Coral's Keras LSTM test model (a .tflite, so no TensorFlow converter: a second to compile),
for the cpu board and for coral-usb."""
import json
import os
from pathlib import Path

import pytest

from conftest import ROOT, SHARED
from edgehft.compiler.pipeline import CompileOptions, compile_model

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.needs("edgetpu-pairs")

LSTM = SHARED / "edgetpu_pairs" / "google-coral__test_data" / "keras_lstm_mnist_ptq.tflite"
FAST = ["--edgehft-samples=50", "--edgehft-warmup=5", "--edgehft-budget-p99=1e9", "--edgehft-budget-p999=1e9"]
TEAM_TESTS = """
    def test_runner(edgehft_runner):
        assert edgehft_runner is not None

    def test_target(edgehft_target):
        assert edgehft_target.board

    def test_plain():
        pass

    def test_settings(edgehft_settings):
        assert edgehft_settings.board
"""


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    """``cpu``: the LSTM for the cpu board; ``coral-usb``: for coral-usb without the Edge TPU compiler (no
    compiled model in it); ``coral-usb-compiled``: with the compiler's recorded output (needs libedgetpu and a
    TPU to open)."""
    out = tmp_path_factory.mktemp("hil_bundles")
    bin_dir = out / "bin"
    bin_dir.mkdir()
    (bin_dir / "edgetpu_compiler").symlink_to(ROOT / "tests" / "tools" / "replay_edgetpu_compiler.py")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", "/usr/bin:/bin")
        compile_model(LSTM, [], out / "lstm.cpu", CompileOptions(board="cpu"))
        compile_model(LSTM, [], out / "lstm.coral-usb", CompileOptions(board="coral-usb"))
        mp.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
        compile_model(LSTM, [], out / "lstm.tpu", CompileOptions(board="coral-usb"))
    return {"cpu": out / "lstm.cpu", "coral-usb": out / "lstm.coral-usb", "coral-usb-compiled": out / "lstm.tpu"}


@pytest.fixture
def hil(pytester, monkeypatch):
    """``hil(*args)``: a fresh ``python -m pytest`` in the pytester directory, on a terminal wide enough that
    the summary's lines do not wrap."""
    monkeypatch.setenv("COLUMNS", "400")
    return lambda *args: pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=300)


def _xdist():
    pytest.importorskip("xdist", reason="pytest-xdist is not installed (pip install -e '.[dev]')")


def test_xdist_report_and_summary_have_every_check(hil, pytester, bundles, tmp_path):
    """The same session without xdist and with ``-n 2`` (team tests beside the checks): the JSON report has the
    same checks with the same figures' kinds and golden counts, and the summary table all of them, once; under
    xdist each result says which worker ran it, and the timed one what other workers ran meanwhile."""
    _xdist()
    pytester.makepyfile(test_team=TEAM_TESTS)
    base = ["--edgehft-board=cpu", f"--edgehft-bundle={bundles['cpu']}", *FAST, "--strict-markers",
            "--edgehft-checks=golden,latency,streaming", "-rs"]
    alone, spread = tmp_path / "alone.json", tmp_path / "spread.json"
    r = hil(*base, "-p", "no:xdist", f"--edgehft-json={alone}")
    r.assert_outcomes(passed=6, skipped=1)                 # streaming: the LSTM does not stream
    r = hil(*base, "-n", "2", f"--edgehft-json={spread}")
    r.assert_outcomes(passed=6, skipped=1)
    a, b = json.loads(alone.read_text()), json.loads(spread.read_text())
    assert list(a["checks"]) == list(b["checks"]) == ["golden", "latency", "streaming"]
    for name in ("golden", "latency", "streaming"):
        assert b["checks"][name]["ok"] == a["checks"][name]["ok"], name
        assert "xdist" not in a["checks"][name]
        x = b["checks"][name]["xdist"]
        assert x["worker"] in ("gw0", "gw1") and x["workers"] == 2 and x["started"] <= x["ended"]
    g = b["checks"]["golden"]
    assert (g["matched"], g["count"]) == (a["checks"]["golden"]["matched"], a["checks"]["golden"]["count"]) == (16, 16)
    assert b["checks"]["latency"]["samples"] == a["checks"]["latency"]["samples"] == 50
    lat = b["checks"]["latency"]["xdist"]
    assert isinstance(lat["beside"], list)
    assert lat.get("note") == (f"measured under pytest-xdist (2 workers) while other workers ran {lat['beside'][0]}"
                               if len(lat["beside"]) == 1 else lat.get("note"))
    assert ("note" in lat) == bool(lat["beside"])
    assert "note" not in b["checks"]["golden"]["xdist"] and "note" not in b["checks"]["streaming"]["xdist"]
    assert b["target"]["interpreter"] == a["target"]["interpreter"] and b["unavailable"] is None
    text = r.stdout.str()
    assert text.count("edgehft hardware-in-the-loop") == 1
    r.stdout.fnmatch_lines(["*golden*passed*16/16 golden vectors bit-exact*", "*latency*passed*p99 * µs ≤ budget*",
                            "*streaming*skipped*does not stream*"])
    assert ("NOTE: latency was timed while other tests ran" in text) == bool(lat["beside"])


WAITS_FOR_LATENCY = """
    import pathlib, time
    import pytest

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(item):
        here = pathlib.Path(str(item.config.rootpath))
        if item.nodeid.startswith("edgehft::latency"):
            (here / "latency-started").touch()
            try:
                return (yield)
            finally:
                (here / "latency-done").touch()
        return (yield)
"""
TEAM_WAITS = """
    import pathlib, time

    def test_busy_while_latency_is_timed(request):
        here = pathlib.Path(str(request.config.rootpath))
        deadline = time.monotonic() + 120
        while not (here / "latency-done").exists():
            assert (here / "latency-started").exists() or time.monotonic() < deadline, "latency never started"
            sum(range(10_000))                    # busy: another worker using a core while latency is timed
"""


def test_xdist_timed_check_names_the_tests_beside_it(hil, pytester, bundles, tmp_path):
    """``--dist loadfile`` puts the built-in checks (scope ``edgehft``) and test_team.py on the two workers; the
    team test spins from before the latency check starts until it is done. The latency result names it, the
    table and the NOTE line say so; golden, not timed, gets no note; without it the checks alone get none."""
    _xdist()
    pytester.makeconftest(WAITS_FOR_LATENCY)
    pytester.makepyfile(test_team=TEAM_WAITS)
    out, xml = tmp_path / "hil.json", tmp_path / "junit.xml"
    base = ["--edgehft-board=cpu", f"--edgehft-bundle={bundles['cpu']}", *FAST, "-n", "2", "--dist", "loadfile"]
    r = hil(*base, f"--edgehft-json={out}", f"--junitxml={xml}")
    r.assert_outcomes(passed=3)
    checks = json.loads(out.read_text())["checks"]
    lat = checks["latency"]["xdist"]
    assert checks["golden"]["xdist"]["worker"] == lat["worker"]
    assert "test_team.py::test_busy_while_latency_is_timed" in lat["beside"]
    assert lat["note"].startswith("measured under pytest-xdist (2 workers) while other workers ran ")
    assert "note" not in checks["golden"]["xdist"]
    r.stdout.fnmatch_lines(["*latency*passed*measured under pytest-xdist (2 workers) while other workers ran*",
                            "NOTE: latency was timed while other tests ran on other pytest-xdist workers (see the "
                            "figures); for figures that hold, run the timed checks alone: -n 0, or only the edgehft "
                            "checks selected (-m edgehft_board) with --dist loadfile, which keeps them on one worker"])
    import xml.etree.ElementTree as ET       # the worker's headline: it cannot know yet, so it says "may"
    props = {p.get("name"): p.get("value") for p in ET.parse(xml).iter("property")}
    assert "run under pytest-xdist (2 workers): other tests may have run beside it" in props["edgehft_latency"]
    assert "pytest-xdist" not in props["edgehft_golden"]

    r = hil(*base, "-m", "edgehft_board", f"--edgehft-json={out}")      # the checks alone: nothing else ran
    r.assert_outcomes(passed=2)                            # (xdist's workers deselect: no count here)
    checks = json.loads(out.read_text())["checks"]
    assert checks["golden"]["xdist"]["worker"] == checks["latency"]["xdist"]["worker"]
    assert not any(b.startswith("test_") for b in checks["latency"]["xdist"]["beside"])


@pytest.mark.parametrize("xdist", [False, True], ids=["one-process", "n2"])
@pytest.mark.parametrize("which", ["coral-usb", "coral-usb-compiled"])
def test_unavailable_board_skips_with_one_reason(hil, pytester, bundles, tmp_path, which, xdist):
    """coral-usb without an Edge TPU and without --edgehft-emulate: the board is opened once (per process); the
    two checks and the two team tests that need it skip with one reason, folded by -rs into one line; the
    summary says it once with the fix; tests that do not need the board run; no failure, no error, exit 0."""
    if xdist:
        _xdist()
    if which == "coral-usb-compiled":
        from edgehft.errors import BoardUnavailableError
        from edgehft.runtime import coral_device
        try:
            coral_device.list_devices(coral_device.load_library())
            pytest.skip("libedgetpu is installed here: with an Edge TPU attached the board is available")
        except BoardUnavailableError:
            pass
    pytester.makepyfile(test_team=TEAM_TESTS)
    out = tmp_path / "hil.json"
    r = hil("--edgehft-board=coral-usb", f"--edgehft-bundle={bundles[which]}", "-rs", f"--edgehft-json={out}",
            *(["-n", "2"] if xdist else []))
    r.assert_outcomes(passed=2, skipped=4)
    assert r.ret == 0
    text = r.stdout.str()
    skips = [line for line in text.splitlines() if line.startswith("SKIPPED")]
    assert len(skips) == 1, skips
    assert skips[0].startswith("SKIPPED [4] ")
    assert "edgehft: board coral-usb is unavailable on this machine: " in skips[0]
    assert skips[0].endswith("fix: run where the board is attached with its runtime installed (the hint is in the "
                             "edgehft summary), or add --edgehft-emulate to run its emulation (results say EMULATED)")
    assert "Traceback" not in text and "FAILED" not in text and "ERROR" not in text
    r.stdout.fnmatch_lines(["board coral-usb UNAVAILABLE on this machine: 4 tests that need it skipped (the built-in "
                            "checks, and tests taking edgehft_target or edgehft_runner)",
                            "  BoardUnavailableError: *", "  hint: *--edgehft-emulate*"])
    assert text.count("UNAVAILABLE") == 1 and text.count("BoardUnavailableError") == 1
    rep = json.loads(out.read_text())
    assert rep["checks"] == {} and rep["unavailable"]["error"] == "BoardUnavailableError"
    assert "--edgehft-emulate" in rep["unavailable"]["hint"]


def test_emulate_opens_the_same_board(hil, pytester, bundles):
    """The fix the skip names: --edgehft-emulate runs the checks and the team tests on coral-usb's emulation."""
    pytester.makepyfile(test_team=TEAM_TESTS)
    r = hil("--edgehft-board=coral-usb", f"--edgehft-bundle={bundles['coral-usb']}", "--edgehft-emulate",
            "--edgehft-samples=50", "--edgehft-warmup=5", "-rs")
    r.assert_outcomes(passed=5, skipped=1)                 # latency: reported, not judged on an emulation
    r.stdout.fnmatch_lines(["*golden*passed*EMULATED board; 16/16 golden vectors bit-exact*"])
    assert "UNAVAILABLE" not in r.stdout.str()
