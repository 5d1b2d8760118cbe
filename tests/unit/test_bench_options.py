"""``edgehft bench`` options of issue 19 on a tiny bundle built without TensorFlow (tests/tiny_bundle.py): the
timed run and the warm-up each by count or by time, one warm-up default for bench, the pytest plugin and deploy's
gate. No timed assertions: a fake clock where counts must be exact, otherwise only what any timing gives."""
from __future__ import annotations

import inspect
import json
import types

import numpy as np
import pytest
from click.testing import CliRunner

from edgehft.bench import replay as replay_mod
from edgehft.cli import main
from tiny_bundle import write_tiny_bundle


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_bundle(tmp_path_factory.mktemp("tiny"))


def _bench(*args):
    res = CliRunner().invoke(main, ["bench", *map(str, args)], terminal_width=80)
    return res, (json.loads(res.output.strip().splitlines()[-1]) if res.exit_code == 0 and "--json" in args else None)


def _fake_clock(monkeypatch, step_ns: int = 1000) -> None:
    """``replay``'s ``time.perf_counter_ns`` advances ``step_ns`` per reading (a call is t0, t1: 1 step)."""
    now = [0]

    def perf():
        now[0] += step_ns
        return now[0]
    monkeypatch.setattr(replay_mod, "time", types.SimpleNamespace(perf_counter_ns=perf, sleep=lambda s: None))


def test_replay_by_time_counts_calls_on_a_fake_clock(monkeypatch):
    """Warm-up 10 µs and timing 20 ms on a clock that moves 1 µs per reading (2 readings per call): 5 warm-up
    calls, then 10,000 timed ones (the latency array grew past its first 4,096), each 1 µs."""
    _fake_clock(monkeypatch)
    calls = []
    res = replay_mod.replay(calls.append, np.arange(7), warmup_s=1e-5, duration_s=0.02)
    assert res.warmup == 5 and len(res.latency_ns) == 10_000 and len(calls) == 10_005
    assert calls[:9] == [0, 1, 2, 3, 4, 5, 6, 0, 1]           # the windows cycle from the warm-up on
    assert set(res.latency_ns.tolist()) == {1000} and res.first_call_ns == 1000
    s = res.summary()
    assert (s["warmup"], s["warmup_s"], s["duration_s"], s["samples"]) == (5, 1e-5, 0.02, 10_000)


def test_replay_by_time_stops_at_max_samples_and_mixes_with_counts(monkeypatch):
    _fake_clock(monkeypatch)
    res = replay_mod.replay(lambda x: None, np.arange(3), warmup=2, duration_s=10.0, max_samples=5000)
    assert (res.warmup, len(res.latency_ns)) == (2, 5000)
    res = replay_mod.replay(lambda x: None, np.arange(3), warmup_s=4e-6, samples=6)
    assert (res.warmup, len(res.latency_ns), res.duration_s) == (2, 6, None)
    res = replay_mod.replay(lambda x: None, np.arange(3), warmup=0, samples=4)
    assert (res.warmup, len(res.latency_ns), res.first_call_ns) == (0, 4, 1000)


def test_replay_refuses_a_count_and_a_time_for_the_timed_calls():
    from edgehft.errors import InputError
    with pytest.raises(InputError, match="both samples and duration_s"):
        replay_mod.replay(lambda x: None, np.arange(3), samples=5, duration_s=1.0)


def test_bench_duration_and_warmup_seconds(tiny, tmp_path):
    """``--warmup-s 0.05 --duration 0.2``: the report says what was asked and how many calls that made; every
    timed call is in --export-times; the table's title says it by time (80 columns, nothing cut)."""
    out = tmp_path / "t.json"
    res, rep = _bench(tiny, "--warmup-s", "0.05", "--duration", "0.2", "--export-times", out, "--json")
    assert res.exit_code == 0, res.output
    assert rep["warmup_s"] == 0.05 and rep["duration_s"] == 0.2 and rep["warmup"] >= 1 and rep["samples"] >= 1
    assert len(json.loads(out.read_text())["latency_ns"]) == rep["samples"]
    res, _ = _bench(tiny, "--warmup-s", "0.01", "--duration", "0.05")
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert " samples in 0.05 s after 0.01 s warm-up (" in text and all(len(x) <= 80 for x in res.output.splitlines())


@pytest.mark.parametrize("args, says", [
    (["--warmup", "3", "--warmup-s", "1"], "--warmup N and --warmup-s SECONDS both set the warm-up: give one"),
    (["--samples", "3", "--duration", "1"], "--samples N and --duration SECONDS both set how long to time: give one"),
    (["--profile", "--duration", "1"], "--warmup-s and --duration time the replay"),
    (["--batch", "2", "--warmup-s", "1"], "--warmup-s and --duration time the replay"),
    (["--duration", "0"], "0.0 is not in the range 0.001<=x<=86400"),
    (["--warmup-s", "-1"], "is not in the range 0<x<=3600"),
    (["--duration", "nan"], "nan is not a finite number"),
    (["--warmup-s", "inf"], "is not in the range 0<x<=3600"),
    (["--replay", "burst", "--burst-gap-us", "nan"], "nan is not a finite number"),
    (["--speed", "1e-300"], "is not in the range 0.001<=x<=1000000.0"),
    (["--profile", "--plot", "p.png"], "--profile (and --export-profile) time each op instead of the replay"),
])
def test_bench_run_length_usage_errors_exit_2(tiny, args, says):
    res, _ = _bench(tiny, *args)
    assert res.exit_code == 2 and says in " ".join(res.output.split()), res.output


def test_one_warmup_default_for_bench_the_plugin_and_the_deploy_gate(tiny):
    """The issue: bench warmed up 200 calls, the plugin 100. Now one constant, and bench's report shows it."""
    from edgehft.deploy.deploy import GATE_WARMUP
    from edgehft.hil import checks
    assert replay_mod.WARMUP == checks.WARMUP == GATE_WARMUP == 100
    assert all(inspect.signature(f).parameters["warmup"].default == 100
               for f in (checks.latency, checks.streaming, checks.soak, replay_mod.replay, replay_mod.replay_stream))
    res, rep = _bench(tiny, "--samples", "20", "--json")
    assert res.exit_code == 0, res.output
    assert rep["warmup"] == 100 and rep["warmup_s"] is None and rep["samples"] == 20
    help_text = " ".join(CliRunner().invoke(main, ["bench", "--help"], terminal_width=120).output.split())
    assert "(default 100, as the pytest plugin's" in help_text


def test_bench_reports_open_first_call_and_memory(tiny, tmp_path):
    """Open time (ms), the first call (µs: with --warmup 0 it is the first exported latency) and the memory
    footprint (MiB) in --json and in the table (80 columns)."""
    out = tmp_path / "t.csv"
    res, rep = _bench(tiny, "--warmup", "0", "--samples", "30", "--export-times", out, "--json")
    assert res.exit_code == 0, res.output
    first_ns = int(out.read_text().splitlines()[1].split(",")[1])
    assert rep["first_call_us"] == first_ns / 1e3 and rep["open_ms"] > 0
    mem = rep["memory"]
    assert mem["rss_from"] in ("psutil", "statm") and 10 < mem["rss_mib"] <= mem["peak_rss_mib"]
    res, _ = _bench(tiny, "--samples", "30")
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "open " in text and " ms, first call " in text and " µs; memory: RSS " in text and " MiB, peak " in text
    assert all(len(x) <= 80 for x in res.output.splitlines())


def test_process_memory_sees_a_new_array():
    """Touching a 128 MiB array raises the resident size (and so the peak) by about that much."""
    from edgehft.bench.fingerprint import process_memory
    before = process_memory()
    a = np.ones(128 << 17, dtype=np.float64)           # 128 MiB, every page written
    after = process_memory()
    assert after["rss_mib"] - before["rss_mib"] > 100 and after["peak_rss_mib"] >= after["rss_mib"]
    assert a[-1] == 1.0


def test_bench_export_profile_writes_the_profile_as_json(tiny, tmp_path):
    """``--export-profile FILE.json`` (implies --profile): the same figures as the profile's --json, flattened with
    the unit in every time's key; the table run says where it went."""
    path = tmp_path / "prof.json"
    res, rep = _bench(tiny, "--export-profile", path, "--samples", "5", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(path.read_text())
    assert rep["export_profile"] == str(path) and (doc["kind"], doc["rounds"], doc["board"]) == ("ops", 5, "cpu")
    (op,) = doc["ops"]
    assert (op["index"], op["op"], op["kernel"], op["share"]) == (0, "LOGISTIC", rep["ops"][0]["kernel"], 1.0)
    assert [op[f"{k}_us"] for k in ("p50", "p90", "mean")] == [rep["ops"][0]["us"][k] for k in ("p50", "p90", "mean")]
    assert doc["whole_p50_us"] == rep["whole_us"]["p50"] and doc["sum_p50_us"] == op["p50_us"] and doc["steps"] == []
    assert "us" not in op and doc["chain_max_abs_diff"] == 0.0
    res, _ = _bench(tiny, "--export-profile", path, "--samples", "3")
    assert res.exit_code == 0 and f"profile (µs per op): {path}" in res.output.replace("\n", ""), res.output


def test_export_profile_of_a_chain_flattens_its_steps(tmp_path):
    from edgehft.bench.profile import export_profile
    res = {"ops": [], "rounds": 4, "warmup": 1, "threads": 1, "emulated": True, "sum_p50_us": 30.0,
           "segments": [{"index": 0, "placement": "cpu", "what": "seg0.tflite", "ops": [0, 1], "share": 0.25,
                         "us": {"p50": 7.5, "p90": 8.0, "mean": 7.6}},
                        {"index": 1, "placement": "fpga", "what": "lstm", "ops": [2], "share": 0.75,
                         "us": {"p50": 22.5, "p90": 25.0, "mean": 23.0}}],
           "runner": {"board": "pynq-z2", "plan": "int8", "emulated": True}}
    doc = json.loads(open(export_profile(res, tmp_path / "p.json")).read())
    assert doc["kind"] == "steps" and doc["ops"] == [] and doc["whole_p50_us"] is None
    assert doc["steps"][1] == {"index": 1, "placement": "fpga", "what": "lstm", "ops": [2], "share": 0.75,
                               "p50_us": 22.5, "p90_us": 25.0, "mean_us": 23.0}
    assert (doc["board"], doc["emulated"], doc["sum_p50_us"]) == ("pynq-z2", True, 30.0)


@pytest.mark.parametrize("args, says", [
    (["--export-profile", "p.csv"], "the profile is written as JSON: give a .json file"),
    (["--export-profile", "nodir/p.json"], "directory nodir does not exist"),
    (["--export-profile", "p.json", "--batch", "2"], "--export-profile writes the per-op profile of --profile"),
    (["--export-profile", "p.json", "--streaming"], "--export-profile writes the per-op profile of --profile"),
])
def test_bench_export_profile_usage_errors_exit_2(tiny, tmp_path, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    res, _ = _bench(tiny, *args)
    assert res.exit_code == 2 and says in " ".join(res.output.split()), res.output
    assert not (tmp_path / "p.json").exists()


def test_export_times_has_each_calls_tick_time(tmp_path):
    """--export-times (issue 19): every timed call's latency and the feed's time of the tick whose window it
    predicts (the calls cycle over the windows after the warm-up: call j predicts window (warmup + j) % n)."""
    from edgehft.bench.replay import export_latencies, replay
    windows = np.zeros((5, 2), np.float32)
    t_ns = np.array([10, 20, 30, 40, 50], np.int64) + 1_700_000_000_000_000_000
    res = replay(lambda x: x, windows, t_ns, mode="max", warmup=3, samples=7)
    assert res.tick_ns.tolist() == [t_ns[(3 + j) % 5] for j in range(7)]
    csv = tmp_path / "t.csv"
    export_latencies(res, csv)
    rows = np.loadtxt(csv, delimiter=",", skiprows=1, dtype=np.int64)
    assert csv.read_text().splitlines()[0] == "call,latency_ns,tick_ns"
    assert rows[:, 0].tolist() == list(range(7)) and rows[:, 2].tolist() == res.tick_ns.tolist()
    js = tmp_path / "t.json"
    export_latencies(res, js)
    assert json.loads(js.read_text())["tick_ns"] == res.tick_ns.tolist()
    assert replay(lambda x: x, windows, None, warmup=0, samples=2).tick_ns is None      # no tick times: none
