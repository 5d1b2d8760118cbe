"""The hardware-in-the-loop checks, run ON the target with an opened runner (``edgehft.runtime.open``).

Every check is ``(runner, plain options) -> dict`` and the dict holds only JSON types (str, int, float,
bool, None, lists, dicts), so the same functions run in this process (local target) or on a box whose
agent sends the dict back (remote target). No pytest, no TensorFlow: this runs on the board.

- :func:`golden`: the bundle's golden vectors, compared as the manifest says (bit-exact for int8).
- :func:`latency`: p99 / p99.9 of ``predict`` (µs) at real tick inter-arrival times against the board's
  ``[latency_budget_us]``.
- :func:`streaming`: the same replay one tick at a time through ``runner.stream()`` (inline prepare between
  ticks): p99 / p99.9 of ``push`` (tick to signal, µs) against the same budget, and the first outputs
  compared with ``predict`` of the same window, bit for bit.
- :func:`soak`: minutes of replay; p50/p99 and resident memory per interval, p99 drift and memory growth.

The streaming result (``check: "streaming"``):

- ``ok``: False when an output differs from ``predict`` or p99 / p99.9 is over budget; None when not judged
  (``not_judged``: an emulated board without a budget given, or no budget) or skipped (``skipped``: why the
  bundle does not stream, the InputError's message and hint); else True.
- ``samples``, ``warmup``, ``mode`` (``recorded`` | ``max``), ``speed``: timed ticks, untimed ticks before
  them, and their timing, as for :func:`latency`.
- ``latency_us``: ``push`` per tick, the row handed over to the output written {p50, p90, p99, p99.9, max,
  mean, std}; ``prepare_us`` the inline ``prepare()`` after each push (same keys) and ``prepare_us_mean``;
  ``push_prepare_us`` both (what a tick costs when the next one is already there, as under ``max``);
  ``start_delay_us`` how late pushes started behind their tick.
- ``prepared_ahead``: share of the timed outputs whose window was prepared before its push (the stream's
  counters); ``prepared_before_tick``: share of prepares done before the next tick arrived (0 under ``max``);
  ``stream_counters``: the timed ticks' ``outputs``, ``prepared_ahead``, ``prepared_late``.
- ``compared``, ``mismatches``, ``first_mismatch`` (output index or None), ``max_abs_diff``: the first
  ``compare`` outputs against ``runner.predict(stream.window())`` (``np.array_equal``).
- ``rows_from``: ``sliding`` (each window is the one before it moved by a row: the stream's windows are the
  source's) or ``newest`` (other windows: each tick is a window's newest row after window 0's first rows).
- ``budget_us``, ``budget_from``, ``verdicts``, ``not_judged``, ``gaps_capped``, ``source`` and the board
  fields as for :func:`latency`; ``stream``: the stream's ``describe()`` (prepare, isa, window, head, MACs).

Where the replayed windows and their timing come from (:func:`replay_source`):
1. the tick files given: ``.npz`` with ``t_ns`` (recorded inter-arrival times), ``.npy`` windows (no
   times: back to back), or raw feeds through the bundle's feature pipeline, which is Python code from
   the bundle and runs only with ``run_features=True`` (``--edgehft-run-features``) given by the person
   running the checks;
2. otherwise the bundle's golden inputs, back to back. Those carry no tick times, so the result says the
   timing is not the feed's.
Each result's ``source`` says which one ran. The checks never open a path named inside the bundle's
manifest (e.g. its calibration feed) on the machine they run on: a bundle is untrusted input on a box.
"""
from __future__ import annotations

import gc
import os
import time

import numpy as np

from edgehft import bundle_checks as _checks
from edgehft.bench import replay as _replay
from edgehft.bench.replay import recorded_gaps, replay, replay_stream, spin_until, stream_rows, summarize_us
from edgehft.errors import InputError

SAMPLES = 2000          # timed calls for the latency check (timed ticks for the streaming check)
STREAM_COMPARE = 200    # streaming check: outputs compared with predict of the same window
WARMUP = _replay.WARMUP  # untimed calls before timing starts (as bench's --warmup and deploy's latency gate)
SOAK_INTERVALS = 10
SOAK_MAX_P99_DRIFT = 0.5         # last interval's p99 at most 50 % above the first's
SOAK_MAX_RSS_GROWTH_MB = 16.0    # resident memory, last interval vs first, MiB
_SOAK_CAP = 1 << 20              # latencies kept per interval (8 MiB, touched before the first reading)
SOAK_WINDOWS = 4096              # windows the soak keeps and cycles (DeepLOB: 64 MiB of float32)


def runner_info(runner) -> dict:
    return {"board": runner.board, "emulated": bool(runner.emulated), "bundle": str(runner.bundle.path),
            "model_sha256": runner.bundle.manifest.source.sha256}


def golden(runner) -> dict:
    """The bundle's golden vectors on ``runner`` (see :func:`edgehft.bundle_checks.check_golden`).

    Returns:
        ``{"check": "golden", "ok", "count", "matched", "compare", "max_diff", "atol", "path",
        "expected_path", "board", "emulated", "bundle", "model_sha256"}``; ``max_diff`` in the outputs'
        raw units (LSB for int8).
    Raises:
        BundleError: the bundle has no golden vectors.
    """
    res = _checks.check_golden(runner)
    return {"check": "golden", **res, "atol": runner.bundle.manifest.golden.atol, **runner_info(runner)}


def _first(w, limit: int | None):
    """The first ``limit`` windows and times, copied, so the rest of a long feed is freed (a board has
    0.5-8 GB; a day of DeepLOB windows is gigabytes)."""
    if limit is None or len(w) <= limit:
        return np.ascontiguousarray(w.x, np.float32), w.t_ns
    return (np.array(w.x[:limit], np.float32), None if w.t_ns is None else np.array(w.t_ns[:limit]))


def replay_source(runner, ticks: list[str] | None = None, limit: int | None = None,
                  run_features: bool = False) -> tuple[np.ndarray | list, np.ndarray | None, dict]:
    """Windows to replay and their tick times, in the order given in the module docstring; from tick
    files, at most the first ``limit`` windows are kept.

    Returns:
        ``(x, t_ns, source)``: ``x`` (N, *input_shape[1:]) float32 windows (or the golden inputs in their
        raw dtype; a list of arrays for multi-input models), ``t_ns`` (N,) int64 receive times or None,
        ``source`` a JSON dict: ``kind`` (``ticks`` | ``golden``), ``files``,
        ``windows`` (N), ``windows_total`` (before the limit), ``timing`` (``recorded`` | ``back-to-back``), ``note``.
    Raises:
        InputError: unreadable tick files, windows of the wrong shape, a raw feed without
            ``run_features`` (only for ``ticks`` given).
        BundleError: ``run_features`` and the bundle's pipeline is not a verified file inside it.
    """
    bundle = runner.bundle
    if ticks:
        w = _checks.bundle_windows(bundle, [str(t) for t in ticks], run_features=run_features)
        timed = w.t_ns is not None
        x, t_ns = _first(w, limit)
        return (x, t_ns,
                {"kind": "ticks", "files": list(w.source), "windows": len(x), "windows_total": len(w), "timing":
                 "recorded" if timed else "back-to-back",
                 "note": "" if timed else "the tick files carry no timestamps (an .npz with t_ns, or a raw "
                                          "feed through the feature pipeline, does)"})
    ins, _ = bundle.golden()
    names = [s.name for s in bundle.manifest.inputs]
    x = ins[names[0]] if len(names) == 1 else [ins[k] for k in names]
    n = len(ins[names[0]])
    return (x, None, {"kind": "golden", "files": [], "windows": n, "windows_total": n, "timing": "back-to-back",
                      "note": f"no tick files given: the bundle's {n} golden inputs back to back, which is not the "
                              "feed's timing; pass tick files (an .npz with t_ns, or a raw feed with run_features)"})


def predict_fn(runner, x):
    """``(predict, windows)`` for :func:`edgehft.bench.replay.replay` on what :func:`replay_source` gives: ``x`` one
    array of windows (``runner.predict`` on each), or a list of arrays for a multi-input model (indices, each call
    ``runner.predict(*(a[i] for a in x))``)."""
    if isinstance(x, list):
        arrays = x
        return (lambda i: runner.predict(*(a[int(i)] for a in arrays))), np.arange(len(arrays[0]))
    return runner.predict, x


def _budget(runner, budget_p99, budget_p999) -> tuple[dict, str]:
    """``(budget, where)``: the board file's ``[latency_budget_us]`` p99 / p999 (µs), each replaced by the
    option given, and where they came from."""
    board = dict(runner.board_spec.latency_budget_us)
    given = {k: float(v) for k, v in (("p99", budget_p99), ("p999", budget_p999)) if v is not None}
    where = f"boards/{runner.board}.toml [latency_budget_us]"
    if given:
        where = "options" if len(given) == 2 or not board else f"options, else {where}"
    return {**{k: float(v) for k, v in board.items() if k in ("p99", "p999")}, **given}, where


def latency(runner, ticks: list[str] | None = None, samples: int = SAMPLES, warmup: int = WARMUP,
            speed: float = 1.0, budget_p99: float | None = None, budget_p999: float | None = None,
            run_features: bool = False) -> dict:
    """Time ``runner.predict`` on replayed windows and hold p99 and p99.9 (µs) to the latency budget.

    Windows come from :func:`replay_source`; with tick times the calls start at the recorded
    inter-arrival times (divided by ``speed``), otherwise back to back. The budget is the board file's
    ``[latency_budget_us]`` (``p99``, ``p999``), each replaced by ``budget_p99`` / ``budget_p999`` when
    given. On an emulated board the board file's budget is not applied (the timing is the emulation's,
    not the device's): ``ok`` is None unless a budget is given explicitly.

    Returns:
        ``{"check": "latency", "ok" (bool, or None = not judged), "samples", "warmup", "mode", "speed",
        "latency_us": {p50, p90, p99, p99.9, max, mean, std}, "start_delay_us" (recorded mode: how late
        calls started, same keys) , "budget_us": {p99, p999}, "budget_from", "verdicts": {p99|p999:
        {"value_us", "budget_us", "ok"}}, "not_judged" (why ok is None), "source", board fields}``.
    Raises:
        InputError: ``samples`` < 1, ``speed`` <= 0, unreadable ticks.
    """
    if samples < 1 or warmup < 0 or not speed > 0:
        raise InputError(f"latency check: samples {samples}, warmup {warmup}, speed {speed}",
                         hint="samples >= 1, warmup >= 0, speed > 0")
    x, t_ns, source = replay_source(runner, ticks, limit=warmup + samples, run_features=run_features)
    predict, windows = predict_fn(runner, x)
    mode = "recorded" if t_ns is not None else "max"
    res = replay(predict, windows, t_ns, mode=mode, warmup=warmup, samples=samples, speed=speed)
    lat = summarize_us(res.latency_ns)
    judged = judge_latency(runner, lat, budget_p99, budget_p999)
    ok = None if judged["not_judged"] else all(v["ok"] for v in judged["verdicts"].values())
    return {"check": "latency", "ok": ok,
            "samples": int(len(res.latency_ns)), "warmup": warmup, "mode": mode,
            "speed": speed if mode == "recorded" else None, "latency_us": lat,
            "start_delay_us": summarize_us(res.start_delay_ns) if res.start_delay_ns is not None else None,
            **judged, "gaps_capped": res.gaps_capped, "source": source, **runner_info(runner)}


def judge_latency(runner, lat: dict, budget_p99, budget_p999) -> dict:
    """Hold the p99 and p99.9 of ``lat`` (:func:`summarize_us`, µs) to the budget (:func:`_budget`); the HIL
    checks' verdict, and what the serving process holds a shadow run to (:mod:`edgehft.serving`).

    Returns:
        ``{"budget_us", "budget_from", "verdicts": {p99|p999: {"value_us", "budget_us", "ok"}}, "not_judged"}``;
        ``not_judged`` (why there are no verdicts) for an emulated board without a budget given, or no budget.
    """
    budget, budget_from = _budget(runner, budget_p99, budget_p999)
    explicit = budget_p99 is not None or budget_p999 is not None
    verdicts, not_judged = {}, None
    if runner.emulated and not explicit:
        not_judged = "EMULATED: the timing is the emulation's, not the device's; the board budget does not apply"
    elif not budget:
        not_judged = f"boards/{runner.board}.toml has no [latency_budget_us]; give a budget (p99, p99.9 in µs)"
    else:
        for key, pct in (("p99", "p99"), ("p999", "p99.9")):
            if key in budget:
                verdicts[key] = {"value_us": lat[pct], "budget_us": budget[key], "ok": lat[pct] <= budget[key]}
    return {"budget_us": budget, "budget_from": budget_from, "verdicts": verdicts, "not_judged": not_judged}


def streaming(runner, ticks: list[str] | None = None, samples: int = SAMPLES, warmup: int = WARMUP,
              speed: float = 1.0, budget_p99: float | None = None, budget_p999: float | None = None,
              compare: int = STREAM_COMPARE, run_features: bool = False) -> dict:
    """Replay ticks one row at a time through ``runner.stream(prepare="inline")`` and hold the push's p99 and
    p99.9 (tick to signal, µs) to the latency budget; the first ``compare`` outputs must equal ``predict`` of
    the same window bit for bit.

    The rows are the windows of :func:`replay_source` as :func:`edgehft.bench.replay.stream_rows` makes them:
    window 0's rows, then each window's newest row in order (consecutive windows give consecutive rows). First
    ``compare`` ticks, untimed: each output against ``runner.predict(stream.window())`` (np.array_equal), with
    ``prepare()`` after each push. Then the stream is reset and :func:`edgehft.bench.replay.replay_stream` times
    ``warmup`` + ``samples`` ticks: ``push`` timed with ``perf_counter_ns``, the inline ``prepare()`` after it
    (at the recorded inter-arrival times divided by ``speed`` when the source has them, else back to back). The
    budget and when it is not judged: as :func:`latency`.

    Returns:
        the streaming result (keys in the module docstring); for a bundle, plan or runtime that does not stream,
        ``{"check": "streaming", "ok": None, "skipped": why, board fields}``.
    Raises:
        InputError: ``samples`` or ``compare`` < 1, ``warmup`` < 0, ``speed`` <= 0, unreadable ticks.
    """
    if samples < 1 or compare < 1 or warmup < 0 or not speed > 0:
        raise InputError(f"streaming check: samples {samples}, compare {compare}, warmup {warmup}, speed {speed}",
                         hint="samples >= 1, compare >= 1, warmup >= 0, speed > 0")
    stream = _open_stream(runner)
    if isinstance(stream, str):
        return {"check": "streaming", "ok": None, "skipped": stream, **runner_info(runner)}
    with stream:
        x, t_ns, source = replay_source(runner, ticks, limit=max(compare, warmup + samples),
                                        run_features=run_features)
        rows, sliding = stream_rows(x)
        T = stream.window_rows
        exact = _compare_stream(runner, stream, rows, T, compare)
        stream.reset()
        mode = "recorded" if t_ns is not None else "max"
        res = replay_stream(stream, rows, T, t_ns, mode=mode, warmup=warmup, samples=samples, speed=speed)
        described = stream.describe()
    lat = summarize_us(res.latency_ns)
    judged = judge_latency(runner, lat, budget_p99, budget_p999)
    c = res.counters
    ok = False if exact["mismatches"] else \
        None if judged["not_judged"] else all(v["ok"] for v in judged["verdicts"].values())
    return {"check": "streaming", "ok": ok, "skipped": None, "samples": int(len(res.latency_ns)), "warmup": warmup,
            "mode": mode, "speed": speed if mode == "recorded" else None, "latency_us": lat,
            "prepare_us": summarize_us(res.prepare_ns), "prepare_us_mean": float(res.prepare_ns.mean()) / 1e3,
            "push_prepare_us": summarize_us(res.combined_ns), "start_delay_us": summarize_us(res.start_delay_ns),
            "prepared_ahead": c["prepared_ahead"] / c["outputs"] if c["outputs"] else 0.0,
            "prepared_before_tick": float(res.hidden.mean()) if len(res.hidden) else 0.0,
            "stream_counters": c, **exact, "rows_from": "sliding" if sliding else "newest", **judged,
            "gaps_capped": res.gaps_capped, "stream": described, "source": source, **runner_info(runner)}


def _open_stream(runner):
    """``runner.stream(prepare="inline")``, or why not (str: the InputError's message and hint, or a runtime
    without streams) for the check to skip."""
    if not callable(getattr(runner, "stream", None)):         # (the jetson runner's .stream is a CUDA stream)
        return (f"board {runner.board!r}'s runtime does not stream: runner.stream() runs the cpu board's native "
                "plans (compile with --board cpu --quant native for LSTM stacks, --quant native-bf16 for "
                "convolution front ends)")
    try:
        return runner.stream(prepare="inline")
    except InputError as exc:
        return str(exc)


def _compare_stream(runner, stream, rows: np.ndarray, T: int, compare: int) -> dict:
    """Push ``rows`` (T-1 warming rows, then ticks cycled) until ``compare`` outputs are out, each against
    ``runner.predict`` of the stream's window (np.array_equal), ``prepare()`` after every push.

    Returns:
        ``{"compared", "mismatches", "first_mismatch" (output index or None), "max_abs_diff" (float, in the
        output's units; 0.0 when equal; None when an output's shape differs)}``.
    """
    push, prepare = stream.push, stream.prepare
    for row in rows[:T - 1]:
        push(row)
        prepare()
    ticks = rows[T - 1:]
    mismatches, first, worst = 0, None, 0.0
    for i in range(compare):
        y = np.array(push(ticks[i % len(ticks)]))
        want = np.asarray(runner.predict(stream.window()))
        if not np.array_equal(y, want):
            mismatches += 1
            first = i if first is None else first
            diff = float(np.max(np.abs(y.astype(np.float64) - want))) if y.shape == want.shape else None
            worst = None if diff is None or worst is None else max(worst, diff)
        prepare()
    return {"compared": compare, "mismatches": mismatches, "first_mismatch": first, "max_abs_diff": worst}


def rss_bytes() -> tuple[int, str]:
    """This process's resident memory in bytes, and how it was read: ``statm`` (current, Linux
    ``/proc/self/statm``) or ``maxrss`` (the peak, ``resource.getrusage``, where there is no /proc)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"), "statm"
    except (OSError, ValueError, IndexError):
        import resource
        import sys
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024), "maxrss"


def soak(runner, minutes: float, ticks: list[str] | None = None, intervals: int = SOAK_INTERVALS,
         warmup: int = WARMUP, speed: float = 1.0, max_p99_drift: float = SOAK_MAX_P99_DRIFT,
         max_rss_growth_mb: float = SOAK_MAX_RSS_GROWTH_MB, run_features: bool = False,
         swap_every_s: float | None = None) -> dict:
    """Replay windows for ``minutes`` (recorded inter-arrival times when the source has them, else back to
    back; the first :data:`SOAK_WINDOWS` windows, cycled) and record, per interval of ``minutes / intervals``: calls, p50/p99 of ``predict`` (µs)
    and resident memory at the interval's end (after a ``gc.collect()``; the garbage collector is off
    inside intervals, as in the latency replay).

    Pass when ``p99_drift`` = p99(last interval) / p99(first) - 1 <= ``max_p99_drift`` and
    ``rss_growth_bytes`` = RSS(last) - RSS(first) <= ``max_rss_growth_mb`` MiB.

    With ``swap_every_s`` (None: as above) the soak runs across swaps instead (the plugin's target, local or the
    box's agent, calls :func:`edgehft.serving.soak.soak_check`; here it is refused): the runner's bundle served by
    :func:`edgehft.serve` from a fresh
    install directory and installed again every ``swap_every_s`` seconds, each version shadow-run and swapped in
    while the calls go on. Its result has these keys (the intervals with ``p99.9_us``, ``max_us``, ``swaps``) and
    ``failed_calls``, ``near_swaps`` / ``away``, ``tries``, ``swapped``, ``refused`` (see ``soak_swaps``); it
    also fails on a failed call, a refused version or no swap.

    Returns:
        ``{"check": "soak", "ok", "minutes", "seconds" (measured), "calls", "intervals": [{"index",
        "calls", "p50_us", "p99_us", "rss_bytes"}], "p99_drift" (fraction, or None), "rss_growth_bytes",
        "rss_kind", "max_p99_drift", "max_rss_growth_mb", "failures": [text], "source", board fields}``.
    Raises:
        InputError: ``minutes`` <= 0, ``intervals`` < 2, ``speed`` <= 0, unreadable ticks.
    """
    if not minutes > 0 or intervals < 2 or not speed > 0 or warmup < 0:
        raise InputError(f"soak: minutes {minutes}, intervals {intervals}, speed {speed}, warmup {warmup}",
                         hint="minutes > 0, intervals >= 2, speed > 0, warmup >= 0")
    if swap_every_s is not None:
        raise InputError("soak across swaps runs where the plugin's target runs its checks, not in checks.soak",
                         hint="call edgehft.serving.soak.soak_check (what the local target and the box's agent "
                              "run for --edgehft-soak-swap-every S)")
    x, t_ns, source = replay_source(runner, ticks, limit=SOAK_WINDOWS, run_features=run_features)
    predict, windows = predict_fn(runner, x)
    n = len(windows)
    gaps, capped = recorded_gaps(t_ns, speed) if t_ns is not None else (None, None)
    lat = np.ones(_SOAK_CAP, np.int64)       # touched now, so its pages count before the first reading
    for i in range(warmup):
        predict(windows[i % n])
    span = int(minutes * 60e9 / intervals)
    rows, calls, seconds, rss_kind = _soak_intervals(predict, windows, gaps, lat, span, intervals)
    drift, growth, failures = soak_verdict(rows, span, max_p99_drift, max_rss_growth_mb)
    return {"check": "soak", "ok": not failures, "minutes": minutes, "seconds": seconds, "calls": calls,
            "intervals": rows, "p99_drift": drift, "rss_growth_bytes": int(growth), "rss_kind": rss_kind,
            "max_p99_drift": max_p99_drift, "max_rss_growth_mb": max_rss_growth_mb, "failures": failures,
            "mode": "recorded" if gaps is not None else "max", "speed": speed if gaps is not None else None,
            "gaps_capped": capped, "source": source, **runner_info(runner)}


def _soak_intervals(predict, windows: list, gaps, lat: np.ndarray, span: int,
                    intervals: int) -> tuple[list[dict], int, float, str]:
    """Run ``intervals`` intervals of ``span`` ns each, ``predict`` on ``windows`` cycled (at the recorded
    ``gaps`` when given, else back to back), the garbage collector off inside each; ``lat`` holds an
    interval's latencies (ns). Returns ``(rows, calls, seconds, rss_kind)``; the collector's state is
    restored on the way out."""
    n = len(windows)
    perf = time.perf_counter_ns
    rows, calls, i = [], 0, 0
    start = due = perf()
    gc_was = gc.isenabled()
    rss_kind = None
    try:
        for k in range(intervals):
            end, m = start + (k + 1) * span, 0
            gc.disable()
            while True:
                if perf() >= end:           # also bounds the wall time when calls fall behind the feed
                    break
                if gaps is not None:
                    if due + int(gaps[i % n]) >= end:
                        break
                    due += int(gaps[i % n])
                    spin_until(due)
                t0 = perf()
                predict(windows[i % n])
                t1 = perf()
                if m < _SOAK_CAP:
                    lat[m] = t1 - t0
                m += 1
                i += 1
            gc.enable()
            gc.collect()
            rss, rss_kind = rss_bytes()
            kept = lat[:min(m, _SOAK_CAP)] / 1e3
            rows.append({"index": k, "calls": m,
                         "p50_us": float(np.percentile(kept, 50)) if m else None,
                         "p99_us": float(np.percentile(kept, 99)) if m else None, "rss_bytes": rss})
            calls += m
            if gaps is not None:
                spin_until(end)
    finally:
        if gc_was:
            gc.enable()
        else:
            gc.disable()
    return rows, calls, (perf() - start) / 1e9, rss_kind


def soak_verdict(rows: list[dict], span: int, max_p99_drift: float,
                  max_rss_growth_mb: float) -> tuple[float | None, int, list[str]]:
    """``(p99 drift or None, RSS growth in bytes, failures)`` of the first and last interval in ``rows``."""
    first, last = rows[0], rows[-1]
    drift = (last["p99_us"] / first["p99_us"] - 1.0) if first["p99_us"] and last["p99_us"] is not None else None
    growth = last["rss_bytes"] - first["rss_bytes"]
    failures = []
    if drift is None:
        failures.append("an interval had no calls: the replay is slower than the interval "
                        f"({span / 1e9:.3g} s); soak longer or use fewer intervals")
    elif drift > max_p99_drift:
        failures.append(f"p99 drift {drift:+.1%} > {max_p99_drift:+.1%}")
    if growth > max_rss_growth_mb * 2**20:
        failures.append(f"RSS growth {growth / 2**20:.2f} MiB > {max_rss_growth_mb:g} MiB")
    return drift, growth, failures
