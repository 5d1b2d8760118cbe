"""Replay windows through a runner and time each ``predict`` with ``time.perf_counter_ns``.

Modes: ``max`` back to back; ``recorded`` at the capture's inter-arrival times (``t_ns``, divided by
``speed``), each call starting when its tick is due; ``burst`` groups of ``burst_size`` back-to-back
calls separated by ``burst_gap_us`` of idle time (caches and branch predictors go cold in the gap).
Latency is the duration of the ``predict`` call; for ``recorded`` the start delay behind the due time
is reported too (it is non-zero when the model cannot keep up). A recorded gap longer than
:data:`MAX_GAP_S` (after ``speed``: a weekend, a capture restart, a forged timestamp) is replayed as
``MAX_GAP_S`` and the result says how many were capped and the largest.

Streaming (``bench --streaming``, issue 21): :func:`replay_stream` feeds the windows' rows one per tick to
``runner.stream()`` and times ``push`` (the row handed to push to the output written), then the inline
``prepare()`` after it, and whether that prepare was done before the next tick arrived; under ``max`` it never
is (the next tick is there as the signal is out), so each tick costs push + prepare, which it reports too.
"""
from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgehft.errors import InputError

MODES = ("max", "recorded", "burst")
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
MAX_GAP_S = 1.0           # longest idle time replayed between two ticks; caches are as cold after 1 s as after a day
WARMUP = 100              # untimed calls before timing starts: bench, the pytest plugin's checks and deploy's gate
MAX_TIMED = 100_000_000   # timed calls a replay by time keeps at most (8 bytes each: 800 MB of latencies)
_NEVER = 1 << 62          # a perf_counter_ns deadline that does not come


def recorded_gaps(t_ns: np.ndarray, speed: float = 1.0) -> tuple[np.ndarray, dict | None]:
    """The wait before each tick: ``t_ns[i] - t_ns[i-1]`` divided by ``speed`` (0 for the first and for
    times that do not advance), each at most :data:`MAX_GAP_S`.

    Args:
        t_ns: (N,) int64 receive times, ns.
    Returns:
        ``(gaps, capped)``: (N,) int64 ns, and None or ``{"count", "largest_s", "cap_s"}`` when gaps were cut.
    """
    t = np.asarray(t_ns, dtype=np.int64)
    gaps = np.clip(np.diff(t, prepend=t[:1]), 0, None).astype(np.float64) / speed
    cap = MAX_GAP_S * 1e9
    capped = None
    if len(gaps) and gaps.max() > cap:
        capped = {"count": int((gaps > cap).sum()), "largest_s": float(gaps.max() / 1e9), "cap_s": MAX_GAP_S}
        gaps = np.minimum(gaps, cap)
    return gaps.astype(np.int64), capped


@dataclass
class ReplayResult:
    mode: str
    latency_ns: np.ndarray           # (samples,) int64, after warm-up
    start_delay_ns: np.ndarray | None
    warmup: int                      # warm-up calls run (those asked, or as many as ``warmup_s`` held)
    gaps_capped: dict | None = None  # recorded: {"count", "largest_s", "cap_s"} when long gaps were cut
    first_call_ns: int | None = None  # the very first call's latency (the first after the runner opened), ns
    warmup_s: float | None = None    # warm-up by time: the seconds asked
    duration_s: float | None = None  # timed calls by time: the seconds asked
    tick_ns: np.ndarray | None = None  # per timed call, the feed's time of the tick whose window it predicts (ns)

    def summary(self) -> dict:
        return {"mode": self.mode, "samples": int(len(self.latency_ns)), "warmup": self.warmup,
                "warmup_s": self.warmup_s, "duration_s": self.duration_s,
                "latency_us": summarize_us(self.latency_ns),
                "start_delay_us": summarize_us(self.start_delay_ns) if self.start_delay_ns is not None else None,
                "gaps_capped": self.gaps_capped}


def summarize_us(ns: np.ndarray) -> dict:
    """p50/p90/p99/p99.9/max/mean/std in µs of a latency array in ns."""
    us = np.asarray(ns, dtype=np.float64) / 1e3
    out = {f"p{p:g}": float(np.percentile(us, p)) for p in PERCENTILES}
    out.update(max=float(us.max()), mean=float(us.mean()), std=float(us.std()))
    return out


def samples_needed(p: float) -> int:
    """Calls a percentile ``p`` (0 < p < 100) needs before it is more than the slowest one: 1 / (1 - p/100),
    rounded up (p99: 100, p99.9: 1000)."""
    return int(np.ceil(100.0 / (100.0 - p) - 1e-9))


def percentile_report(res, percentiles) -> dict:
    """The bench report's figures beyond :func:`summarize_us` for a :class:`ReplayResult`: ``percentiles_us``
    {``p50``: µs, ...} for each of ``percentiles``, ``thin_percentiles`` [{``p``, ``needs``}] those with fewer
    samples than :func:`samples_needed`, ``min_us``, and ``throughput_per_s`` (calls per second of time spent in
    the calls: samples / their summed latency)."""
    us = np.asarray(res.latency_ns, dtype=np.float64) / 1e3
    n = len(us)
    return {"percentiles_us": {f"p{p:g}": float(np.percentile(us, p)) for p in percentiles},
            "thin_percentiles": [{"p": p, "needs": samples_needed(p)} for p in percentiles if n < samples_needed(p)],
            "min_us": float(us.min()), "throughput_per_s": float(n / (us.sum() / 1e6)) if us.sum() > 0 else 0.0}


EXPORT_SUFFIXES = (".csv", ".json")


def export_target(path) -> None:
    """Check ``--export-times PATH`` before the run: a .csv or .json file in an existing directory.

    Raises:
        click.BadParameter (exit 2): another suffix, or a directory that does not exist."""
    import click
    p = Path(path)
    if p.suffix.lower() not in EXPORT_SUFFIXES:
        raise click.BadParameter(f"{path}: give a .csv or .json file", param_hint="--export-times")
    if not p.parent.resolve().is_dir():
        raise click.BadParameter(f"{path}: directory {p.parent} does not exist", param_hint="--export-times")


def export_latencies(res, path) -> str:
    """Every timed call of ``res`` (:class:`ReplayResult`) to ``path``: CSV with a header ``call,latency_ns`` (then
    ``tick_ns``: the feed's time of the tick whose window the call predicts, when the ticks have times; and
    ``start_delay_ns``: the call's start behind its recorded tick time, ``--replay recorded``), or JSON ``{"unit":
    "ns", "latency_ns": [...], "tick_ns": [...] | null, "start_delay_ns": [...] | null, "mode", "warmup"}``.
    Returns the path written."""
    lat = np.asarray(res.latency_ns, dtype=np.int64)
    delay = None if res.start_delay_ns is None else np.asarray(res.start_delay_ns, dtype=np.int64)
    tick = getattr(res, "tick_ns", None)
    p = Path(path)
    if p.suffix.lower() == ".json":
        p.write_text(json.dumps({"unit": "ns", "mode": res.mode, "warmup": res.warmup, "latency_ns": lat.tolist(),
                                 "tick_ns": None if tick is None else tick.tolist(),
                                 "start_delay_ns": None if delay is None else delay.tolist()}))
    else:
        cols = [np.arange(len(lat)), lat] + ([] if tick is None else [tick]) + ([] if delay is None else [delay])
        header = "call,latency_ns" + ("" if tick is None else ",tick_ns") + ("" if delay is None else ",start_delay_ns")
        np.savetxt(p, np.stack(cols, axis=1), fmt="%d", delimiter=",", header=header, comments="")
    return str(p)


def spin_until(t_ns: int) -> None:
    """Wait until ``time.perf_counter_ns()`` reaches ``t_ns``: sleep while more than 2 ms are left, then spin
    (a sleep can overshoot by a scheduler tick; the spin starts the call on time)."""
    while True:
        left = t_ns - time.perf_counter_ns()
        if left <= 0:
            return
        if left > 2_000_000:
            time.sleep((left - 1_000_000) / 1e9)


def replay(predict, windows: np.ndarray, t_ns: np.ndarray | None = None, mode: str = "max",
           warmup: int = WARMUP, samples: int | None = None, speed: float = 1.0,
           burst_size: int = 32, burst_gap_us: float = 1000.0, duration_s: float | None = None,
           warmup_s: float | None = None, max_samples: int = MAX_TIMED) -> ReplayResult:
    """Call ``predict(windows[i])`` (cycling over the windows) and time each call: first the warm-up, ``warmup``
    calls or, with ``warmup_s``, as many as start within that many seconds; then the timed calls, ``samples``
    (default one per window) or, with ``duration_s``, as many as start within that many seconds (at most
    ``max_samples``; the latency array grows between calls, never inside a timed one).

    Raises:
        InputError: unknown mode, ``recorded`` without timestamps, or both a count and a time for one phase.
    """
    if mode not in MODES:
        raise InputError(f"unknown replay mode {mode!r}", hint=f"choose one of {', '.join(MODES)}")
    if mode == "recorded" and t_ns is None:
        raise InputError("--replay recorded needs tick timestamps",
                         hint="use a raw feed with the model's feature pipeline, or an .npz with 't_ns'")
    if samples and duration_s is not None:
        raise InputError("replay: both samples and duration_s given", hint="give one: a count or seconds")
    n = len(windows)
    timed = None if duration_s is not None else (samples or n)
    gaps, capped = recorded_gaps(t_ns, speed) if mode == "recorded" else (None, None)
    pace = _Pace(mode, gaps, n, burst_size, burst_gap_us)
    warm_calls = None if warmup_s is not None else warmup
    lat, delay, w = _timed_calls(predict, windows, pace, (warm_calls, warmup_s), (timed, duration_s), max_samples)
    ticks = None if t_ns is None else np.asarray(t_ns, np.int64)[(w + np.arange(len(lat) - w)) % n]
    return ReplayResult(mode, lat[w:], delay[w:] if delay is not None else None, w, capped,
                        int(lat[0]) if len(lat) else None, warmup_s, duration_s, ticks)


@dataclass
class _Pace:
    """When :func:`replay`'s calls start: ``recorded`` at the (capped) gaps, ``burst`` a gap after each
    ``burst_size`` calls, ``max`` back to back."""
    mode: str
    gaps: np.ndarray | None
    n: int
    burst_size: int
    burst_gap_us: float


def _timed_calls(predict, windows, pace: _Pace, warm: tuple, timed: tuple, max_samples: int):
    """The calls of :func:`replay`: ``warm`` and ``timed`` are ``(calls or None, seconds or None)``. Returns
    ``(latency_ns, start_delay_ns or None, warm-up calls run)``, both arrays over every call, warm-up first."""
    perf = time.perf_counter_ns
    by_time = warm[0] is None or timed[0] is None
    cap = 4096 if by_time else warm[0] + timed[0]
    lat = np.empty(cap, dtype=np.int64)
    delay = np.zeros(cap, dtype=np.int64) if pace.mode == "recorded" else None
    n, gaps = pace.n, pace.gaps
    gc_was = gc.isenabled()
    gc.disable()
    try:
        due = t1 = perf()
        warming, w, i = True, 0, 0
        stop_i = _NEVER if warm[0] is None else warm[0]
        stop_ns = _NEVER if warm[1] is None else t1 + int(warm[1] * 1e9)
        while True:
            if i >= stop_i or t1 >= stop_ns:
                if not warming:
                    break
                warming, w = False, i
                stop_i = w + (max_samples if timed[0] is None else timed[0])
                stop_ns = _NEVER if timed[1] is None else t1 + int(timed[1] * 1e9)
                continue
            if i == cap:                       # by time: room for more calls (between calls, not inside one)
                cap *= 2
                lat = np.concatenate([lat, np.empty_like(lat)])
                delay = None if delay is None else np.concatenate([delay, np.zeros_like(delay)])
            x = windows[i % n]
            if pace.mode == "recorded":
                due += int(gaps[i % n]) if i % n else 0
                spin_until(due)
            elif pace.mode == "burst" and i and i % pace.burst_size == 0:
                spin_until(perf() + int(pace.burst_gap_us * 1e3))
            t0 = perf()
            predict(x)
            t1 = perf()
            lat[i] = t1 - t0
            if delay is not None:
                delay[i] = max(0, t0 - due)
            i += 1
    finally:
        if gc_was:
            gc.enable()
    return lat[:i], None if delay is None else delay[:i], w


def check_plot_target(path: str) -> None:
    """Fail before a benchmark, not after it, when its ``--plot`` PNG cannot be written: no matplotlib, a
    missing or read-only directory, or a directory where the file should be.

    Raises:
        MissingExtraError (exit 7): no matplotlib (the ``bench`` extra); click.BadParameter (exit 2, as
            ``--export-times`` and ``--export-profile``): not a .png path, a directory that does not exist, or
            a place no file can be written.
    """
    import importlib.util
    from pathlib import Path

    import click
    from edgehft.errors import MissingExtraError
    if importlib.util.find_spec("matplotlib") is None:
        raise MissingExtraError("--plot needs matplotlib", hint="pip install 'edgehft[bench]'")
    target = Path(path)
    parent = target.resolve().parent
    if target.suffix.lower() != ".png":
        raise click.BadParameter(f"{path}: the plot is a PNG file (e.g. {target.with_suffix('.png')})",
                                 param_hint="--plot")
    if not parent.is_dir():
        raise click.BadParameter(f"{path}: the directory {parent} does not exist (mkdir -p {parent})",
                                 param_hint="--plot")
    existed = target.exists()
    try:
        with open(target, "ab"):            # the real test of writability (os.access is not, e.g. in /proc)
            pass
    except OSError as exc:
        raise click.BadParameter(f"{path}: cannot write a file there ({exc.strerror or exc}); give a writable "
                                 "PNG file path", param_hint="--plot") from None
    if not existed:
        target.unlink()


def histogram_png(result: ReplayResult, path: str, title: str, percentiles=PERCENTILES, what: str = "predict") -> list:
    """The latency distribution as a PNG of two panels (needs matplotlib). Left: a histogram on a log latency axis
    (log-spaced bins from the minimum to the maximum, log count axis), so the body and the tail both show; the
    ``percentiles`` as vertical lines, named in the legend (never on the plot, where labels would overlap).
    Right: the percentile curve as HdrHistogram plots it: latency (µs, log axis) against the percentile on an
    axis of nines (x = 1 / (1 - q): 90 %, 99 %, 99.9 % evenly spaced), up to the highest percentile the samples
    resolve (1 - 1/N), with the same percentiles marked. ``result.latency_ns``: per call, ns. Returns the marks,
    ``[(percentile, µs), ...]``."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        from edgehft.errors import MissingExtraError
        raise MissingExtraError("--plot needs matplotlib", hint="pip install 'edgehft[bench]'") from exc
    us = np.sort(np.asarray(result.latency_ns, np.float64)) / 1e3
    n = len(us)
    colors = plt.get_cmap("tab10").colors                      # ten distinct colours, the curve's blue left out
    colors = [c for i, c in enumerate(colors) if i != 0] + [colors[0]]
    marks = [(float(p), float(np.percentile(us, p)), colors[i % len(colors)]) for i, p in enumerate(percentiles)]
    thin = {p: "" if p <= 100 * (1 - 1 / n) else " (thin)" for p, _, _ in marks}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    lo, hi = max(us[0], 1e-3), max(us[-1], us[0] * 1.001, 1e-3)
    left.hist(us, bins=np.geomspace(lo, hi, 120), color="#4477aa")
    left.set_xscale("log")
    left.set_yscale("log")
    for p, v, c in marks:
        left.axvline(v, color=c, lw=1.2, label=f"p{p:g} {v:.1f} µs{thin[p]}")
    left.set_xlabel(f"{what} latency (µs, log)")
    left.set_ylabel("calls (log)")
    left.legend(fontsize=8)
    q = (np.arange(n) + 0.5) / n                                   # each sorted sample's percentile (0..1)
    right.plot(1 / (1 - q), us, color="#4477aa", lw=1.2)
    for p, v, c in marks:
        if p < 100:
            right.plot([1 / (1 - p / 100)], [v], "o", color=c, label=f"p{p:g} {v:.1f} µs{thin[p]}")
    right.set_xscale("log")
    right.set_yscale("log")
    ticks = [t for t in (2, 10, 100, 1e3, 1e4, 1e5, 1e6) if t <= n]
    right.set_xticks(ticks)
    right.set_xticklabels([f"{100 * (1 - 1 / t):g}%" for t in ticks], fontsize=8)
    right.set_xlabel("percentile (HdrHistogram axis: 1 / (1 - q))")
    right.set_ylabel(f"{what} latency (µs, log)")
    right.legend(fontsize=8)
    right.grid(True, which="major", alpha=0.3)
    from matplotlib.ticker import FuncFormatter
    plain = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 10 else f"{v:g}")
    for ax, axis in ((left, left.xaxis), (right, right.yaxis)):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain if us[-1] / lo < 20 else FuncFormatter(lambda v, _: ""))
    fig.suptitle(f"{title}\n(min {us[0]:.1f} µs, max {us[-1]:.1f} µs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [(p, v) for p, v, _ in marks]


# --- streaming (issue 21): one row per tick through runner.stream() -------------------------------------------

def stream_rows(windows: np.ndarray) -> tuple[np.ndarray, bool]:
    """The rows a stream is fed for ``windows`` (N, T, *row) float32: the first window's rows then each later
    window's newest row, when every window is the one before it moved by one row (a feature pipeline's windows
    over a feed); otherwise (windows that do not slide, e.g. random ones) every window's newest row, each after
    the first T-1 rows of window 0. Returns ``(rows (T-1+N, *row), sliding)``."""
    x = np.ascontiguousarray(windows, np.float32)
    sliding = bool(len(x) > 1 and np.array_equal(x[1:, :-1], x[:-1, 1:]))
    return np.concatenate([x[0, :-1], x[:, -1]]), sliding


@dataclass
class StreamReplayResult:
    """A streaming replay: per timed tick the push latency (the row handed to push to the output written),
    the inline prepare after it, whether that prepare finished before the next tick arrived (never under
    ``max``: back to back, the next tick is there as the signal is out), the push's start delay behind its tick
    (the unhidden prepare shows there), and ``combined_ns`` push + prepare (what a back-to-back feed pays per
    tick)."""
    mode: str
    latency_ns: np.ndarray           # (samples,) int64: push
    prepare_ns: np.ndarray           # (samples,) int64: prepare() after the push
    combined_ns: np.ndarray
    start_delay_ns: np.ndarray       # (samples,) int64: the push's start behind its tick's arrival
    hidden: np.ndarray               # (samples - 1,) bool: prepare done before the next tick arrived
    warmup: int
    counters: dict
    gaps_capped: dict | None = None

    def summary(self) -> dict:
        share = float(self.hidden.mean()) if len(self.hidden) else 0.0
        return {"mode": self.mode, "samples": int(len(self.latency_ns)), "warmup": self.warmup,
                "latency_us": summarize_us(self.latency_ns), "prepare_us": summarize_us(self.prepare_ns),
                "push_prepare_us": summarize_us(self.combined_ns),
                "start_delay_us": summarize_us(self.start_delay_ns), "prepared_before_tick": share, "stream_counters": self.counters, "gaps_capped": self.gaps_capped}


def replay_stream(stream, rows: np.ndarray, window: int, t_ns: np.ndarray | None = None, mode: str = "max",
                  warmup: int = WARMUP, samples: int | None = None, speed: float = 1.0, burst_size: int = 32,
                  burst_gap_us: float = 1000.0) -> StreamReplayResult:
    """Feed ``rows`` (from :func:`stream_rows`) one per tick to ``stream`` (``runner.stream()``, inline
    prepare): the first ``window - 1`` untimed, then warm-up + samples ticks (cycling over the ticks' rows),
    each timed as ``push`` (row handed over to output written), then ``prepare()`` timed after it. ``t_ns``:
    one receive time per tick (per window), for ``recorded``.

    Raises:
        InputError: unknown mode, or ``recorded`` without timestamps."""
    if mode not in MODES:
        raise InputError(f"unknown replay mode {mode!r}", hint=f"choose one of {', '.join(MODES)}")
    if mode == "recorded" and t_ns is None:
        raise InputError("--replay recorded needs tick timestamps",
                         hint="use a raw feed with the model's feature pipeline, or an .npz with 't_ns'")
    ticks = rows[window - 1:]
    n = len(ticks)
    total = warmup + (samples or n)
    gaps, capped = recorded_gaps(t_ns, speed) if mode == "recorded" else (None, None)
    push, prepare = stream.push, stream.prepare
    for row in rows[:window - 1]:
        push(row)
        prepare()
    lat, prep, delay, hidden = (np.zeros(total, np.int64) for _ in range(4))
    perf = time.perf_counter_ns
    gc_was = gc.isenabled()
    gc.disable()
    try:
        before = stream.counters
        due = t1 = t2 = perf()
        for i in range(total):
            # when tick i arrives: recorded, at its time; burst, a gap after the signal before it (or, inside a
            # burst, as that signal is out); max, as the signal before it is out (so its prepare cannot hide)
            if mode == "recorded":
                due += int(gaps[i % n]) if i % n else 0
            elif mode == "burst" and i and i % burst_size == 0:
                due = t1 + int(burst_gap_us * 1e3)
            else:
                due = t1 if i else due
            if i:
                hidden[i - 1] = t2 <= due
            spin_until(due)
            t0 = perf()
            push(ticks[i % n])
            t1 = perf()
            prepare()
            t2 = perf()
            lat[i], prep[i], delay[i] = t1 - t0, t2 - t1, max(0, t0 - due)
    finally:
        if gc_was:
            gc.enable()
    after = stream.counters
    counters = {k: after[k] - before[k] for k in ("outputs", "prepared_ahead", "prepared_late")}
    keep = slice(warmup, total - 1)             # the last tick has no next tick to hide its prepare before
    return StreamReplayResult(mode, lat[warmup:], prep[warmup:], (lat + prep)[warmup:], delay[warmup:],
                              hidden[keep].astype(bool), warmup, counters, capped)
