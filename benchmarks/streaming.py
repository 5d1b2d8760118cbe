"""Tick-to-signal latency of the streaming runtime (issue 21) on the STAC-ML LSTM_A shape, beside full-window
``predict`` of the same plan, in one run on one pinned core.

LSTM_A (benchmarks/lstm_a.py: LSTM(100) x 2 over 50 x 100 rows, Dense(1), seeded random weights) is compiled for
the cpu board with ``--quant native`` (or ``--bundle`` names one). A seeded stream of rows is fed one row at a
time; on the same core:

  push        ``stream.push(row)``: from the row handed to push to the output written (the critical path: the
              last step of each LSTM, its input projection and gates, and the head: 80,100 MACs run; each
              layer's recurrent sum h_48 @ U of that step runs in prepare, which the analysis' 160,100 counts)
  library     the same pushes again, each timed inside the native library (``stream.time_pushes``: what a C or
              C++ caller of the executor sees, without Python's row check, copy and call)
  prepare     ``stream.prepare()``: the next window's 49 steps of each layer (5.88 M MACs), run between ticks
  predict     ``runner.predict(window)``: the same plan on the whole 50-row window (8.0 M MACs)

Timed in alternating blocks of 500 rows (the stream, then predict on the same windows), so both see the same
machine over the run without one evicting the other's weights between two calls. An untimed pass first compares
every push's output with predict of its window (np.array_equal); the script fails (exit 1) on a mismatch.
With ``--helper-core C`` a second pass runs ``prepare="thread"`` (the helper pinned to C) with ticks
``--gap-us`` apart and reports push latency and the share of ticks found prepared.

Prepare keeps up with the real feed (``--feed-ticks N``, 0 to skip): the recorded tick times of the shipped feed
days (examples/deeplob/data/*.gz, one continuous Binance depth stream: one tick per applied book diff, the times
``edgehft bench --replay recorded`` replays, gaps over 1 s cut to 1 s) are replayed at their real pace on the
busiest N-tick stretch, the loop spinning until each tick's time (``--sleep``: sleeping while > 2 ms are left,
as ``edgehft bench --replay recorded`` does; the wake-up is then late by what the scheduler adds) and running
``prepare()`` inline in the idle time before it; a tick that is already there when the loop comes back from its
push gets no prepare (the push prepares late, as an event loop that serves the socket first would). Per pace:
the share of ticks whose prepare was done before they arrived (the 99 % criterion), ``stream.counters``
prepared_ahead / outputs (prepare run before the push, done in time or not), the push's start behind its tick
and tick-to-signal from the tick's arrival. Paces: the recorded gaps at 1x, then compressed 10x, 100x, ... until
the share drops below 99 %, then a geometric bisection between the last pace that kept up and the first that did
not; likewise for a feed of uniform gaps (1,000 ticks/s doubled or halved, then bisected). LSTM_A's rows are
synthetic: the feed's tick *times* with LSTM_A's seeded rows. A bundle that carries a feature pipeline (DeepLOB
``--quant native-bf16``: ``--bundle``) is fed the rows of its own features of the feed (the windows
``edgehft bench --run-features --ticks FEED`` builds, each window's newest row; DeepLOB's windows are normalized
per window, so they do not slide) with their tick times. A plan that does not stream prints
``not streaming: <reason>`` and exits 3.

Our figure is in process: a float32 row already in memory to the output in memory, Python's push included
(the row check, one copy, one native call). It is not STAC's harness (no network, no order path, no STAC-ML
audit); the audited STAC-ML Markets (Inference) LSTM_A p99 records are printed beside it for scale only.

    python benchmarks/streaming.py [--rows 20000] [--core N] [--bundle DIR] [--helper-core C] [--feed-ticks 2000] [--json]
    python benchmarks/streaming.py --bundle build/deeplob.bf16       # DeepLOB --quant native-bf16, once it streams
    EDGEHFT_CPU_TARGET=avx2 python benchmarks/streaming.py        # the AVX2 kernels on the same machine
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
RECORDS = (("NVIDIA A100 (STAC-ML audited)", 35.2), ("Myrtle VOLLO on FPGA (STAC-ML audited)", 5.07),
           ("NVIDIA GH200 (STAC-ML audited)", 4.61))
PCT = (50, 99, 99.9)
FEED_DIR = HERE.parent / "examples" / "deeplob" / "data"
KEEP_UP = 0.99              # share of ticks whose prepare must be done before they arrive
LEVEL_MIN_TICKS = 500       # ticks per pace at least (a 1 % share needs a few hundred)
LEVEL_SECONDS = 3.0         # a pace other than the recorded 1x replays at most ~this long (at least the minimum)


def compile_lstm_a(work: Path) -> Path:
    """LSTM_A built (subprocess: TensorFlow) and compiled ``--quant native`` into ``work``; the bundle's path."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1"}
    subprocess.run([sys.executable, str(HERE / "lstm_a.py"), str(work / "lstm_a.keras")], check=True, env=env,
                   capture_output=True)
    np.save(work / "x.npy", np.random.default_rng(0).standard_normal((24, 50, 100)).astype(np.float32))
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    out = work / "lstm_a.native"
    compile_model(work / "lstm_a.keras", [work / "x.npy"], out,
                  CompileOptions(board="cpu", quant="native", calib_windows=12, drift_windows=8, golden_count=2))
    return out


def pct(ns) -> dict:
    us = np.asarray(ns, np.float64) / 1e3
    return {f"p{p:g}": float(np.percentile(us, p)) for p in PCT} | {"mean": float(us.mean())}


def exactness_pass(r, rows: np.ndarray) -> tuple[int, int]:
    """Untimed: every push against predict of its window; ``(outputs compared, outputs that differ)``."""
    T = r.bundle.manifest.inputs[0].shape[1]
    compared = differ = 0
    with r.stream() as s:
        for i, row in enumerate(rows):
            y = s.push(row)
            if y is not None:
                compared += 1
                differ += not np.array_equal(y, r.predict(rows[i - T + 1:i + 1]))
            s.prepare()
    return compared, differ


def inline_pass(r, rows: np.ndarray, warmup: int, block: int = 500) -> dict:
    """Timed, in alternating blocks of ``block`` rows: the stream (push, then prepare, per row) and predict on
    the same windows. Blocks, not row by row: the runner's kernels hold their own copy of the weights, and a
    predict between two pushes would evict the stream's from the core's L2 (no deployment interleaves them)."""
    perf = time.perf_counter_ns
    T = r.bundle.manifest.inputs[0].shape[1]
    push_ns, prep_ns, pred_ns = [], [], []
    with r.stream() as s:
        push, prepare, predict = s.push, s.prepare, r.predict
        gc.disable()
        try:
            for b0 in range(0, len(rows), block):
                for i in range(b0, min(b0 + block, len(rows))):
                    t0 = perf()
                    push(rows[i])
                    t1 = perf()
                    prepare()
                    t2 = perf()
                    if i >= warmup:
                        push_ns.append(t1 - t0), prep_ns.append(t2 - t1)
                for i in range(max(b0, T - 1), min(b0 + block, len(rows))):
                    w = rows[i - T + 1:i + 1]
                    t0 = perf()
                    predict(w)
                    t1 = perf()
                    if i >= warmup:
                        pred_ns.append(t1 - t0)
        finally:
            gc.enable()
        c, d = s.counters, s.describe()
        lib_ns = in_library(s, rows, warmup)
    both = np.add(push_ns, prep_ns)
    return {"push_us": pct(push_ns), "prepare_us": pct(prep_ns), "push_prepare_us": pct(both),
            "library_us": pct(lib_ns) if len(lib_ns) else None,
            "predict_us": pct(pred_ns), "samples": len(push_ns),
            "prepared_ahead": c["prepared_ahead"], "prepared_late": c["prepared_late"], "isa": d["isa"],
            "head": d["head"], "macs": d["macs"], "macs_run": d.get("macs_run")}


def in_library(s, rows: np.ndarray, warmup: int) -> np.ndarray:
    """The same rows pushed again, each push timed inside the native library (``stream.time_pushes``: what a C or
    C++ caller sees, no Python), prepare inline between them; ns of the outputs after ``warmup`` rows (empty when
    the stream's head runs in LiteRT)."""
    if s.head == "litert":                     # the library's push ends before a LiteRT head
        return np.empty(0)
    ns = s.time_pushes(np.ascontiguousarray(rows, np.float32))[warmup:]
    return ns[ns > 0]


def thread_pass(r, rows: np.ndarray, core: int, gap_us: float, warmup: int) -> dict:
    """prepare="thread" on ``core``, ticks ``gap_us`` apart (spin-waited): push latency, share prepared ahead."""
    perf = time.perf_counter_ns
    lat = []
    with r.stream(prepare="thread", core=core) as s:
        push = s.push
        due = perf()
        gc.disable()
        try:
            for i, row in enumerate(rows):
                due += int(gap_us * 1e3)
                while perf() < due:
                    pass
                t0 = perf()
                push(row)
                t1 = perf()
                if i >= warmup:
                    lat.append(t1 - t0)
        finally:
            gc.enable()
        c = s.counters
    return {"push_us": pct(lat), "core": core, "gap_us": gap_us, "outputs": c["outputs"],
            "prepared_ahead": c["prepared_ahead"], "prepared_late": c["prepared_late"],
            "late_waited": c["late_waited"], "prepare_us_mean": c["prepare_us_mean"]}


# --- prepare keeps up with the real feed -----------------------------------------------------------------------

def feed_tick_times(paths: list[Path]) -> np.ndarray:
    """(E,) int64 receive times (ns) of the feed's book events, one tick each, read by the DeepLOB example's own
    parser (examples/deeplob/features.py ``read_book_events``; the files are one stream, in order)."""
    spec = importlib.util.spec_from_file_location("deeplob_features", FEED_DIR.parent / "features.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return np.asarray(mod.read_book_events([str(q) for q in paths])[1], np.int64)


_WINDOWS: dict = {}


def _bundle_windows(bundle, paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """The bundle's own features of the feed, as ``edgehft bench --run-features --ticks FEED`` builds them (once
    per run): windows (N, *input_shape[1:]) float32 and their tick times (N,) int64 ns.

    Raises:
        InputError: the pipeline fails on the feed or gives no tick times."""
    from edgehft.bundle_checks import bundle_windows
    from edgehft.errors import InputError
    key = (str(bundle.path), tuple(map(str, paths)))
    if key not in _WINDOWS:
        w = bundle_windows(bundle, list(paths), run_features=True)
        if w.t_ns is None:
            raise InputError(f"the feature pipeline of {bundle.path} gives no tick times (t_ns) for the feed",
                             hint="its pipeline should return a dict with 't_ns'")
        _WINDOWS.clear()
        _WINDOWS[key] = (np.ascontiguousarray(w.x, np.float32), w.t_ns)
    return _WINDOWS[key]


def model_rows(r, n: int, paths: list[Path]) -> tuple[np.ndarray, str]:
    """``n`` rows (n, *row_shape) float32 for the stream and where they come from: the bundle's features of the
    feed when it carries a feature pipeline (each window's newest row after the first window's rows), else
    seeded N(0, 1) rows (LSTM_A)."""
    from edgehft.bench.replay import stream_rows
    T = r.bundle.manifest.inputs[0].shape[1]
    if r.bundle.manifest.features is not None:
        x, _ = _bundle_windows(r.bundle, paths)
        return stream_rows(x[:max(1, n - T + 1)])[0][:n], "the bundle's features of the feed"
    row = tuple(r.bundle.manifest.inputs[0].shape[2:])
    return np.random.default_rng(21).standard_normal((n, *row)).astype(np.float32), "seeded N(0, 1) rows"


def busiest(t_ns: np.ndarray, n: int) -> int:
    """Start index of the ``n`` consecutive ticks of ``t_ns`` (int64 ns, ascending) spanning the least time."""
    if n >= len(t_ns):
        return 0
    return int(np.argmin(t_ns[n - 1:] - t_ns[:len(t_ns) - n + 1]))


def feed_ticks(r, paths: list[Path], n: int) -> dict:
    """The busiest ``n``-tick stretch of the feed for ``r``'s stream: ``warm`` (T-1, *row) rows pushed first,
    ``ticks`` (n, *row) float32 with their receive times ``t_ns`` (n,) int64 ns, the rows' ``source``."""
    from edgehft.bench.replay import stream_rows
    T = r.bundle.manifest.inputs[0].shape[1]
    if r.bundle.manifest.features is not None:
        x, t = _bundle_windows(r.bundle, paths)
        s = busiest(t, n)
        rows = stream_rows(x[s:s + n])[0]
        source = "the bundle's features of the feed (each window's newest row)"
    else:
        t = feed_tick_times(paths)
        s = busiest(t, n)
        n = min(n, len(t))
        rows, _ = model_rows(r, T - 1 + n, paths)
        source = "seeded N(0, 1) rows (synthetic model), the feed's tick times"
    t = t[s:s + n]
    span = (t[-1] - t[0]) / 1e9
    return {"warm": rows[:T - 1], "ticks": rows[T - 1:T - 1 + len(t)], "t_ns": t, "source": source, "start": s,
            "span_s": span, "ticks_per_s": (len(t) - 1) / span if span > 0 else math.inf,
            "files": [q.name for q in paths]}


def spin(t_ns: int) -> None:
    """Busy-wait until ``time.perf_counter_ns()`` reaches ``t_ns`` (a feed handler polling its socket)."""
    perf = time.perf_counter_ns
    while perf() < t_ns:
        pass


def paced_level(stream, ticks: np.ndarray, gaps_ns: np.ndarray, sleep: bool = False) -> dict:
    """One replay of ``ticks`` with ``gaps_ns`` (n,) int64 ns before each (the first: 0), prepare inline in the idle
    time before each tick (none when the tick is already there), waiting by spinning (``sleep``: sleeping while
    more than 2 ms are left, then spinning). Returns the shares and latencies (µs)."""
    from edgehft.bench.replay import spin_until
    wait = spin_until if sleep else spin
    perf = time.perf_counter_ns
    push, prepare = stream.push, stream.prepare
    n = len(ticks)
    lat, delay, sig, prep = (np.zeros(n, np.int64) for _ in range(4))
    ready = np.zeros(n, bool)
    before = stream.counters
    wall = perf()
    gc.disable()
    try:
        due = perf() + 1_000_000
        for i in range(n):
            due += int(gaps_ns[i])
            t = perf()
            if t < due:                            # idle: the next tick's window first
                prepare()
                t2 = perf()
                prep[i], ready[i] = t2 - t, t2 <= due
            wait(due)
            t0 = perf()
            push(ticks[i])
            t1 = perf()
            lat[i], delay[i], sig[i] = t1 - t0, max(0, t0 - due), t1 - due
    finally:
        gc.enable()
    after = stream.counters
    c = {k: after[k] - before[k] for k in ("outputs", "prepared_ahead", "prepared_late")}
    span = gaps_ns[1:].sum() / 1e9
    return {"ticks": n, "ticks_per_s": (n - 1) / span if span > 0 else math.inf,
            "ready_share": float(ready.mean()), "ahead_share": c["prepared_ahead"] / max(1, c["outputs"]),
            "counters": c, "push_us": pct(lat), "start_delay_us": pct(delay), "tick_to_signal_us": pct(sig),
            "prepare_us": pct(prep[prep > 0]) if (prep > 0).any() else None, "wall_s": (perf() - wall) / 1e9}


def bracket(run, start: float, factor: float, lo: float, hi: float, steps: int) -> dict:
    """The pace (a speed-up, or a rate) at which ``run(pace)``'s ready share drops below :data:`KEEP_UP`: from
    ``start``, times ``factor`` while it keeps up (up to ``hi``) or divided while it does not (down to ``lo``),
    then ``steps`` geometric bisections. Returns ``levels`` (in run order), ``kept_up`` and ``fell_behind`` (the
    bracketing levels, None when the range had none)."""
    levels, ok, bad, p = [], None, None, start
    while lo <= p <= hi:
        lv = run(p)
        levels.append(lv)
        if lv["ready_share"] >= KEEP_UP:
            ok = lv
            if bad is not None:
                break
            p *= factor
        else:
            bad = lv
            if ok is not None:
                break
            p /= factor
    for _ in range(steps if ok and bad else 0):
        lv = run(math.sqrt(ok["pace"] * bad["pace"]))
        levels.append(lv)
        if lv["ready_share"] >= KEEP_UP:
            ok = lv
        else:
            bad = lv
    return {"levels": levels, "kept_up": ok, "fell_behind": bad}


def keep_up_pass(r, paths: list[Path], n: int, steps: int, sleep: bool = False) -> dict:
    """Prepare keeps up with the real feed (module docstring): the busiest ``n``-tick stretch at the recorded
    pace, compressed 10x per level, and at uniform gaps, each bracketed and bisected ``steps`` times."""
    from edgehft.bench.replay import recorded_gaps
    feed = feed_ticks(r, paths, n)
    ticks, t_ns = feed.pop("ticks"), feed.pop("t_ns")
    feed["n_ticks"] = len(ticks)
    with r.stream() as s:
        for row in feed.pop("warm"):
            s.push(row)
            s.prepare()

        def recorded(speed):
            gaps, capped = recorded_gaps(t_ns, speed)
            m = len(ticks) if speed == 1 else min(len(ticks), max(LEVEL_MIN_TICKS,
                                                                    int(LEVEL_SECONDS * feed["ticks_per_s"] * speed)))
            return {"pace": speed, "gaps_capped": capped, **paced_level(s, ticks[:m], gaps[:m], sleep)}

        def uniform(rate):
            m = min(len(ticks), max(LEVEL_MIN_TICKS, int(LEVEL_SECONDS * rate)))
            gaps = np.full(m, int(1e9 / rate), np.int64)
            gaps[0] = 0
            return {"pace": rate, **paced_level(s, ticks[:m], gaps, sleep)}
        feed["recorded"] = bracket(recorded, 1.0, 10.0, 1.0, 1e6, steps)
        feed["uniform"] = bracket(uniform, 1000.0, 2.0, 50.0, 1e7, steps)
    feed["wait"] = "sleep, then spin" if sleep else "spin"
    from cpu_peers import interruptions            # benchmarks/cpu_peers.py: the core taken away, per second
    feed["interruptions"] = interruptions(sorted(os.sched_getaffinity(0))[0])
    return feed


def print_report(rep: dict) -> None:
    a, m = rep["inline"], rep["inline"]["macs"] or {}
    mm = {k: f"{v / 1e6:.2g} M MACs" for k, v in m.items()}
    run = a.get("macs_run")                      # what the kernels run (after the kernel-row split, sums ahead)
    if m and run:
        mm.update({k: f"{v / 1e6:.2g} M MACs run" for k, v in run.items()})
    print(f"{rep['model']}, plan {rep['plan']}, kernels {a['isa']} (CPU targets {', '.join(rep['targets'])}), "
          f"{rep['cpu']}, core {rep['core']}, {a['samples']} rows timed ({rep['rows_source']})")
    print(f"{'':48}{'p50':>9}{'p99':>9}{'p99.9':>9}{'mean':>9}   µs")
    rows = (("full-window predict (same plan" + (f", {mm['window']})" if m else ")"), a["predict_us"]),
            ("stream push: tick to signal" + (f" ({mm['critical']})" if m else ""), a["push_us"]),
            *((("  the same, timed in the library (no Python)", a["library_us"]),) if a.get("library_us") else ()),
            ("prepare per tick, between ticks" + (f" ({mm['prepare']})" if m else ""), a["prepare_us"]),
            ("push + prepare per tick (back to back)", a["push_prepare_us"]))
    for name, v in rows:
        print(f"{name[:47]:48}" + "".join(f"{v[k]:9.2f}" for k in ("p50", "p99", "p99.9", "mean")))
    print(f"push vs predict: p50 {a['predict_us']['p50'] / a['push_us']['p50']:.1f}x faster; push equal to predict "
          f"bit for bit: {rep['compared'] - rep['differ']} of {rep['compared']} outputs (untimed pass); head "
          f"{a['head']}; timed pass: {a['prepared_ahead']} windows prepared ahead, {a['prepared_late']} late"
          + (f"; MACs per tick: push {m['critical']:,}, prepare {m['prepare']:,}, window {m['window']:,}" if m else "")
          + (f"; MACs the kernels run per tick (no kernel row over padding, the rows received before the tick "
             f"summed in prepare): push {run['critical']:,}, prepare {run['prepare']:,}" if run else ""))
    if rep.get("thread"):
        t = rep["thread"]
        share = t["prepared_ahead"] / max(1, t["outputs"])
        print(f"prepare on a helper thread (core {t['core']}), ticks {t['gap_us']:g} µs apart: push p50 "
              f"{t['push_us']['p50']:.2f}, p99 {t['push_us']['p99']:.2f}, p99.9 {t['push_us']['p99.9']:.2f} µs; "
              f"{share:.1%} of ticks found their window prepared ({t['prepared_late']} late, {t['late_waited']} "
              f"waited on the helper); prepare {t['prepare_us_mean']:.0f} µs each")
    if rep.get("feed"):
        print_keep_up(rep["feed"])
    if rep["lstm_a"]:
        print("audited STAC-ML Markets (Inference) LSTM_A tick-to-signal p99, for scale (their harness, not ours):")
        for name, us in RECORDS:
            print(f"  {name:44}{us:9.2f}")
        print(f"  {'edgehft stream push, this run':44}{a['push_us']['p99']:9.2f}   (in process: row in memory to "
              "output in memory, Python's push included; one core; no network or order path)")
        if a.get("library_us"):
            print(f"  {'edgehft native push (a C caller), this run':44}{a['library_us']['p99']:9.2f}   (the same, "
                  "timed inside the library: no Python call, row check or copy)")
    print(f"load average {rep['load']}")


def print_keep_up(f: dict) -> None:
    """The keep-up table: one line per pace, then where the ready share drops below :data:`KEEP_UP`."""
    print(f"\nprepare keeps up with the real feed? ticks: the busiest {f['n_ticks']:,}-tick stretch of "
          f"{' + '.join(f['files'])} ({f['span_s']:.1f} s, {f['ticks_per_s']:,.0f} ticks/s; rows: {f['source']}); "
          f"prepare inline in the idle time before each tick, none when the tick is already there; waits: {f['wait']}")
    print(f"{'pace':>14}{'ticks/s':>10}{'ticks':>7}{'ready':>9}{'ahead':>9}{'late':>6}{'push p50':>10}"
          f"{'push p99':>10}{'prep p50':>10}{'start p99':>11}{'signal p50':>12}{'signal p99':>12}   µs")
    for kind, unit in (("recorded", "x"), ("uniform", "/s")):
        for lv in sorted(f[kind]["levels"], key=lambda v: v["pace"]):
            pace = f"{lv['pace']:,.3g}x" if unit == "x" else f"{1e6 / lv['pace']:,.4g} µs gap"
            prep = lv["prepare_us"]["p50"] if lv["prepare_us"] else float("nan")
            print(f"{pace:>14}{lv['ticks_per_s']:10,.0f}{lv['ticks']:7d}{lv['ready_share']:9.1%}"
                  f"{lv['ahead_share']:9.1%}{lv['counters']['prepared_late']:6d}{lv['push_us']['p50']:10.1f}"
                  f"{lv['push_us']['p99']:10.1f}{prep:10.1f}{lv['start_delay_us']['p99']:11.1f}"
                  f"{lv['tick_to_signal_us']['p50']:12.1f}{lv['tick_to_signal_us']['p99']:12.1f}")
    one = next((v for v in f["recorded"]["levels"] if v["pace"] == 1.0), None)
    if one:
        print(f"at the feed's real pace (1x): {one['ready_share']:.1%} of ticks had their prepare done before they "
              f"arrived (stream.counters prepared_ahead / outputs: {one['ahead_share']:.1%}); tick to signal p99 "
              f"{one['tick_to_signal_us']['p99']:.1f} µs")
    for kind, what in (("recorded", "the recorded gaps compressed"), ("uniform", "uniform gaps")):
        ok, bad = f[kind]["kept_up"], f[kind]["fell_behind"]
        print(f"{what}: ready >= {KEEP_UP:.0%} " + (f"up to {ok['ticks_per_s']:,.0f} ticks/s" if ok else
                                                    "at no pace tried")
              + (f"; below {KEEP_UP:.0%} at {bad['ticks_per_s']:,.0f} ticks/s ({bad['ready_share']:.1%})" if bad
                 else "; it never dropped below in the paces tried"))
    if f.get("core_bound_ticks_per_s"):
        b = f["core_bound_ticks_per_s"]
        print(f"the core's own bound, one tick per push + prepare (back to back, inline pass): {b['p50']:,.0f} "
              f"ticks/s at its p50, {b['p99']:,.0f} at its p99; below that a tick loses its prepare to a gap shorter "
              "than push + prepare (the recorded feed is bursty) or to the core being taken away")
    g = f["interruptions"]
    print(f"this core taken away from a clock-reading loop right after (2 s): {g['lost_share']:.1%} of the time; gaps "
          + ", ".join(f"{k}: {v}/s" for k, v in g["gaps_per_s"].items())
          + " (a tick that arrives while the core is away waits, and the ticks behind it lose their prepare)")
    print("ready: prepare done before the tick arrived; ahead: stream.counters prepared_ahead / outputs (prepare run "
          "before the push, in time or not); late: pushes that prepared their own window; start: the push's start "
          "behind its tick; signal: from the tick's arrival to the output written")


def open_checked(r):
    """None when ``r``'s plan streams, else the InputError's reason (its first line)."""
    from edgehft.errors import InputError
    try:
        r.stream().close()
    except InputError as exc:
        return str(exc).splitlines()[0]
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--check-rows", type=int, default=5000, help="rows whose push is compared with predict")
    ap.add_argument("--core", type=int, default=None, help="CPU to pin to (default: the last this process may use)")
    ap.add_argument("--bundle", type=Path, default=None,
                    help="a streamable cpu bundle: LSTM_A --quant native (default: build one), DeepLOB --quant native-bf16")
    ap.add_argument("--helper-core", type=int, default=None, help="also run prepare='thread' on this CPU")
    ap.add_argument("--gap-us", type=float, default=1000.0, help="thread pass: µs between ticks")
    ap.add_argument("--feed", type=Path, nargs="+", default=sorted(FEED_DIR.glob("*.gz")),
                    help="raw feed files, one stream in order (default: the shipped days)")
    ap.add_argument("--feed-ticks", type=int, default=2000,
                    help="keep-up pass: ticks of the busiest stretch (1x replays them in real time; 0: skip)")
    ap.add_argument("--bisect", type=int, default=5, help="keep-up pass: bisection steps per bracket")
    ap.add_argument("--sleep", action="store_true",
                    help="keep-up pass: sleep in gaps over 2 ms instead of spinning (the core is given away)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    core = args.core if args.core is not None else sorted(os.sched_getaffinity(0))[-1]
    from edgehft import runtime
    from edgehft.bench.fingerprint import machine_fingerprint
    from edgehft.kernels.cpu import build
    with tempfile.TemporaryDirectory(prefix="edgehft-streaming-") as tmp:
        bundle = args.bundle or compile_lstm_a(Path(tmp))
        os.sched_setaffinity(0, {core})
        with runtime.open(bundle) as r:
            why = open_checked(r)
            if why:
                print(json.dumps({"bundle": str(bundle), "streaming": False, "reason": why}) if args.json
                      else f"not streaming: {why}")
                return 3
            rows, source = model_rows(r, args.rows, args.feed)
            shape = tuple(r.bundle.manifest.inputs[0].shape)
            lstm_a = shape == (1, 50, 100) and r.bundle.manifest.features is None
            rep = {"model": "LSTM_A (2 x LSTM(100) over 50 x 100, Dense(1))" if lstm_a else
                   f"{r.bundle.path.name} (input {list(shape)})", "lstm_a": lstm_a, "bundle": str(bundle),
                   "plan": getattr(r, "plan", None), "rows_source": source, "core": core,
                   "targets": build.targets(), "cpu": machine_fingerprint()["cpu_model"], "machine": platform.machine()}
            rep["compared"], rep["differ"] = exactness_pass(r, rows[:args.check_rows])
            rep["inline"] = inline_pass(r, rows, min(args.warmup, len(rows) // 2))
            if args.helper_core is not None:
                rep["thread"] = thread_pass(r, rows[:max(2000, args.rows // 4)], args.helper_core, args.gap_us,
                                            min(args.warmup, 200))
            if args.feed_ticks > 0:
                rep["feed"] = keep_up_pass(r, args.feed, args.feed_ticks, args.bisect, args.sleep)
                both = rep["inline"]["push_prepare_us"]
                rep["feed"]["core_bound_ticks_per_s"] = {"p50": 1e6 / both["p50"], "p99": 1e6 / both["p99"]}
        rep["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        print_report(rep)
    return 1 if rep["differ"] else 0


if __name__ == "__main__":
    sys.exit(main())
