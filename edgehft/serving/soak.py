"""The soak across swaps (issue 17 item 5): :func:`soak_swaps` serves a bundle with :func:`edgehft.serve` from an
install directory, calls ``predict`` continuously on replayed windows from this thread, and installs the same
bundle again every ``swap_every_s`` seconds from a side thread (:func:`edgehft.deploy.local.install_local`: each
install is a new version, so the server loads it, shadow-runs it on the live calls and swaps, A -> B -> C ...).

What it measures, all from the caller's side (``time.perf_counter_ns`` around each ``predict``):

- per interval of the soak (``minutes / intervals``): calls, p50 / p99 / p99.9 (µs), resident memory at its end
  (after a ``gc.collect()``; the collector is off inside intervals, as in the HIL soak) and the swaps in it;
- the calls **near a swap** against the calls **away from swaps**: near is within ``window_s`` seconds either side
  of each version's verdict (``swapped``, ``refused`` or ``rolled_back`` event), and from its install on where
  that was earlier (so the install, the load and the whole shadow run count as near); their p50 / p99 / p99.9;
- the tries: each install's version, its verdict with the shadow run's figures (live and golden calls, relative
  MAE against the active version, the candidate's p99 / p99.9 there), seconds from the install to the verdict;
- failed calls (a ``predict`` that raised: counted, the first few kept; the soak goes on) and RSS growth, first
  interval against last, as :func:`edgehft.hil.checks.soak` reports them.

Latencies go into log-spaced histograms (bins 2^(1/128) wide: a percentile is within 0.3 % of the exact value)
kept per 0.1 s slot, so memory stays flat over a soak of hours: only the slots of the last few seconds are held
until it is known whether they were near a swap.

The next install waits for the previous version's verdict (a shadow run longer than ``swap_every_s`` spaces the
installs out; the report says how many were done). The installer thread does its work in this process (tar,
SHA-256, file writes: it takes the GIL as a deploy's agent process would not); pin it and the server's manager to
``shadow_core``, and this thread to ``caller_core``, to keep them off the caller's core.
"""
from __future__ import annotations

import collections
import gc
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import numpy as np

from edgehft.errors import InputError

WINDOW_S = 2.0          # seconds either side of a swap that count as near it
SLOT_S = 0.1            # the histograms' time resolution
_SUB = 128              # histogram bins per octave of nanoseconds
_BINS = 40 * _SUB       # up to 2^40 ns (18 minutes)
_SLOT_CAP = 1 << 18     # calls kept per slot (2.6 M calls/s)
_SETTLE_NS = 500_000_000  # a slot is classified this long after its window closed (the verdict's event is late)
_ERRORS_KEPT = 5
VERDICTS = ("swapped", "refused", "rolled_back")
# the parts of a near window: the window before the install (when the verdict came within window_s of it), the
# install, the server's load (open, golden vectors, pre-warm), the shadow run, the window after the verdict
PHASES = ("before", "install", "load", "shadow", "after")
_BUSY = ("before", "after", "install", "load", "shadow")
_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """``"90s"``, ``"10m"``, ``"1.5h"``, ``"500ms"`` or a bare number (seconds) as seconds > 0.

    Raises:
        InputError: anything else."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*", str(text))
    if not m or not float(m.group(1)) > 0:
        raise InputError(f"duration {text!r}: give a number > 0 with a unit, e.g. 90s, 10m, 1h",
                         hint="units: ms, s, m, h (a bare number is seconds)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def _bins(ns: np.ndarray) -> np.ndarray:
    """Histogram bin of each latency (ns, int64): floor(log2(ns) * 128), clipped to the bins."""
    b = np.floor(np.log2(np.maximum(ns, 1).astype(np.float64)) * _SUB).astype(np.int64)
    return np.clip(b, 0, _BINS - 1)


def hist_summary(h: np.ndarray) -> dict:
    """``{"calls", "p50_us", "p99_us", "p99.9_us", "max_us"}`` of a latency histogram (counts per bin, the
    bins of this module; values at the bin's geometric centre, µs); None figures for an empty one."""
    total = int(h.sum())
    if not total:
        return {"calls": 0, "p50_us": None, "p99_us": None, "p99.9_us": None, "max_us": None}
    cum = np.cumsum(h)

    def at(b: int) -> float:
        return float(2.0 ** ((b + 0.5) / _SUB) / 1e3)

    pct = {f"p{q:g}_us": at(int(np.searchsorted(cum, max(1, int(np.ceil(q / 100.0 * total)))))) for q in (50, 99, 99.9)}
    return {"calls": total, **pct, "max_us": at(int(np.flatnonzero(h)[-1]))}


class _Tries:
    """The installs and their verdicts, written by the installer and the server's manager thread (through
    ``on_event``), read by the caller between slots. Times are ``perf_counter_ns``."""

    def __init__(self, user_on_event=None):
        self.lock = threading.Lock()
        self.tries: list = []                 # {"version", "install_ns", "installed_ns", "verdict"}
        self.shadow: dict = {}                # version -> the shadow event
        self.loaded: dict = {}                # version -> when its "loaded" event came (ns)
        self.changed = threading.Event()
        self.errors: list = []                # the server's "error" events
        self.user_on_event = user_on_event

    def on_event(self, e: dict) -> None:
        now = time.perf_counter_ns()
        with self.lock:
            if e.get("event") == "shadow":
                self.shadow[e.get("version")] = e
            elif e.get("event") == "loaded":
                self.loaded[e.get("version")] = now
            elif e.get("event") == "error":
                self.errors.append(e.get("what"))
            elif e.get("event") in VERDICTS:
                for t in self.tries:
                    if t["version"] == e.get("version") and t["verdict"] is None:
                        t["verdict"] = {**e, "at_ns": now}
                        break
                else:                          # a rollback to a version installed before: a verdict of its own
                    self.tries.append({"version": e.get("version"), "install_ns": None, "installed_ns": None,
                                       "verdict": {**e, "at_ns": now}})
        self.changed.set()
        if self.user_on_event is not None:
            self.user_on_event(e)

    def installed(self, mine: dict, vid: str) -> None:
        """The installer's entry ``mine`` is version ``vid`` (merged into the entry of a verdict that came first)."""
        with self.lock:
            mine["version"], mine["installed_ns"] = vid, time.perf_counter_ns()
            early = next((t for t in self.tries if t is not mine and t["version"] == vid and t["install_ns"] is None),
                         None)
            if early is not None:
                early.update(install_ns=mine["install_ns"], installed_ns=mine["installed_ns"])
                self.tries.remove(mine)

    def pending(self) -> bool:
        with self.lock:
            return any(t["verdict"] is None for t in self.tries)

    def spans(self, window_ns: int) -> tuple[list, int | None]:
        """``(near spans [(lo, hi, phase starts)], earliest install still without a verdict or None)``; phase
        starts: ``[(ns, phase)]`` in time order, the phases of :data:`PHASES`."""
        with self.lock:
            spans, open_from = [], None
            for t in self.tries:
                if t["verdict"] is None:
                    open_from = t["install_ns"] if open_from is None else min(open_from, t["install_ns"])
                    continue
                at, ins = t["verdict"]["at_ns"], t["install_ns"]
                lo = at - window_ns if ins is None else min(at - window_ns, ins)
                marks = [(lo, "before")]
                if ins is not None:
                    loaded = self.loaded.get(t["version"])
                    marks += [(ins, "install"), (t["installed_ns"], "load")]
                    marks += [] if loaded is None or loaded < t["installed_ns"] else [(loaded, "shadow")]
                spans.append((lo, at + window_ns, marks + [(at, "after")]))
            return spans, open_from


class _Hists:
    """Slot histograms: each interval's (dense), the delay line of recent slots (sparse) until they are known to
    be near a swap or not, and the near / away totals (dense)."""

    def __init__(self, window_ns: int):
        self.window_ns = window_ns
        self.interval, self.near, self.away = (np.ones(_BINS, np.int64) for _ in range(3))
        self.phases = {ph: np.ones(_BINS, np.int64) for ph in PHASES}
        for h in (self.interval, self.near, self.away, *self.phases.values()):   # touched now: counted in the
            h.fill(0)                                                            # first RSS reading
        self.delay: collections.deque = collections.deque()

    def add_slot(self, lat: np.ndarray, lo_ns: int, hi_ns: int) -> None:
        if not len(lat):
            return
        h = np.bincount(_bins(lat), minlength=_BINS)
        self.interval += h
        nz = np.flatnonzero(h)
        self.delay.append(((lo_ns + hi_ns) // 2, nz.astype(np.uint16), h[nz]))

    def classify(self, tries: _Tries, now_ns: int | None) -> None:
        """Move the slots whose nearness is settled (all of them with ``now_ns`` None) to near or away."""
        spans, open_from = tries.spans(self.window_ns)
        while self.delay:
            mid, nz, counts = self.delay[0]
            if now_ns is not None and (mid + self.window_ns + _SETTLE_NS > now_ns
                                       or (open_from is not None and mid >= open_from - self.window_ns)):
                break
            self.delay.popleft()
            inside = [[ph for at, ph in marks if at <= mid][-1] for lo, hi, marks in spans if lo <= mid <= hi]
            (self.near if inside else self.away)[nz] += counts
            if inside:             # a slot in one try's window and another's install: the busier phase
                self.phases[max(inside, key=_BUSY.index)][nz] += counts


def _slot(predict, windows, n: int, state: dict, gaps, slot_end: int, buf: np.ndarray) -> int:
    """Call ``predict`` on ``windows`` cycled until ``slot_end`` (ns; the next due tick past it, with ``gaps``),
    each call's latency (ns) into ``buf``; ``state`` holds ``i`` (next window), ``due`` (ns), ``failed`` and
    ``errors``. Returns the calls made."""
    perf = time.perf_counter_ns
    i, due, m, cap = state["i"], state["due"], 0, len(buf)
    while m < cap:
        if perf() >= slot_end:
            break
        if gaps is not None:
            g = int(gaps[i % n])
            if due + g >= slot_end:
                break
            due += g
            while perf() < due:
                pass
        t0 = perf()
        try:
            predict(windows[i % n])
        except Exception as exc:                  # counted and kept: the soak goes on
            state["failed"] += 1
            if len(state["errors"]) < _ERRORS_KEPT:
                state["errors"].append(f"{type(exc).__name__}: {exc}")
        buf[m] = perf() - t0
        m += 1
        i += 1
    state["i"], state["due"] = i, due
    return m


def _run_intervals(predict, windows, gaps, tries: _Tries, window_s: float, span: int, intervals: int) -> dict:
    """The caller's loop: ``intervals`` intervals of ``span`` ns in slots of about :data:`SLOT_S`, the collector
    off inside each. Returns ``{"rows", "hists", "seconds", "rss_kind", "failed", "errors"}``."""
    from edgehft.hil.checks import rss_bytes
    n = len(windows)
    per = max(1, int(round(span / (SLOT_S * 1e9))))
    buf = np.ones(_SLOT_CAP, np.int64)           # touched now: its pages count before the first reading
    hists = _Hists(int(window_s * 1e9))
    start = time.perf_counter_ns()
    state = {"i": 0, "due": start, "failed": 0, "errors": []}
    rows, rss_kind, gc_was = [], None, gc.isenabled()
    try:
        for k in range(intervals):
            hists.interval[:] = 0
            gc.disable()
            for s in range(per):
                lo, hi = start + k * span + s * span // per, start + k * span + (s + 1) * span // per
                m = _slot(predict, windows, n, state, gaps, hi, buf)
                hists.add_slot(buf[:m], lo, hi)
                hists.classify(tries, time.perf_counter_ns())
                if gaps is not None:
                    while time.perf_counter_ns() < hi:
                        pass
            gc.enable()
            gc.collect()
            rss, rss_kind = rss_bytes()
            lo, hi = start + k * span, start + (k + 1) * span
            with tries.lock:
                swaps = sum(1 for t in tries.tries if t["verdict"] and lo <= t["verdict"]["at_ns"] < hi)
            rows.append({"index": k, **hist_summary(hists.interval), "rss_bytes": rss, "swaps": swaps})
    finally:
        gc.enable() if gc_was else gc.disable()
    seconds = (time.perf_counter_ns() - start) / 1e9
    return {"rows": rows, "hists": hists, "seconds": seconds, "rss_kind": rss_kind, "failed": state["failed"],
            "errors": state["errors"], "start_ns": start}


def _installer(root: Path, bundle_dir: Path, every_s: float, tries: _Tries, stop: threading.Event, keep: int,
               core, errors: list, limit: int | None, until: float) -> None:
    """The side thread: install ``bundle_dir`` into ``root`` every ``every_s`` seconds, each after the previous
    version's verdict, until ``stop``, ``limit`` installs or ``until`` (``time.monotonic``: none starts later);
    pinned to ``core`` (a set of CPUs) when given."""
    from edgehft.deploy.local import install_local
    if core is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, core)
        except OSError as exc:
            errors.append(f"cannot pin the installer to {sorted(core)}: {exc}")
    due, done = time.monotonic() + every_s, 0
    while (limit is None or done < limit) and not stop.wait(max(0.0, due - time.monotonic())):
        while tries.pending() and not stop.is_set():
            tries.changed.wait(0.05)
            tries.changed.clear()
        if stop.is_set() or time.monotonic() > until:
            return
        mine = {"version": None, "install_ns": time.perf_counter_ns(), "installed_ns": None, "verdict": None}
        with tries.lock:
            tries.tries.append(mine)             # pending from the install's start: its slots wait for the verdict
        try:
            vid = install_local(root, bundle_dir, keep=keep)["version"]
        except Exception as exc:                 # reported; the soak goes on serving what it serves
            errors.append(f"install failed: {type(exc).__name__}: {exc}")
            with tries.lock:
                tries.tries.remove(mine)
            due = time.monotonic() + every_s
            continue
        tries.installed(mine, vid)
        done += 1
        due = max(due + every_s, time.monotonic())


def _windows(bundle, ticks, run_features: bool, limit: int):
    """``(windows, t_ns or None, source, several)`` from :func:`edgehft.hil.checks.replay_source`: an array of
    windows, or for a model of several inputs a list of tuples (``several`` True)."""
    from edgehft.hil.checks import replay_source
    x, t_ns, source = replay_source(types.SimpleNamespace(bundle=bundle), ticks, limit=limit,
                                    run_features=run_features)
    if isinstance(x, list):                      # several inputs: one tuple of windows per call
        return [tuple(a[i] for a in x) for i in range(len(x[0]))], t_ns, source, True
    return x, t_ns, source, False


def _pin(core) -> set | None:
    """Pin this thread to CPU ``core`` (None: leave it); returns the CPUs it had, to restore."""
    if core is None or not hasattr(os, "sched_setaffinity"):
        return None
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {int(core)})
    except OSError as exc:
        raise InputError(f"cannot pin the caller to CPU {core}: {exc}",
                         hint=f"give a CPU this process may use: {sorted(before)}") from None
    return before


def _check_args(minutes, swap_every_s, intervals, warmup, speed, window_s) -> None:
    if not (minutes > 0 and swap_every_s > 0 and intervals >= 2 and warmup >= 0 and speed > 0 and window_s > 0):
        raise InputError(f"soak across swaps: minutes {minutes}, swap every {swap_every_s} s, intervals {intervals}, "
                         f"warmup {warmup}, speed {speed}, window {window_s} s",
                         hint="minutes > 0, swap_every_s > 0, intervals >= 2, warmup >= 0, speed > 0, window_s > 0")
    if minutes * 60.0 / intervals < 2 * SLOT_S:
        raise InputError(f"soak across swaps: {intervals} intervals of {minutes * 60.0 / intervals:.3g} s",
                         hint=f"intervals of at least {2 * SLOT_S:g} s: soak longer or use fewer intervals")


def soak_swaps(bundle_dir, minutes: float, swap_every_s: float, *, install_dir=None, ticks=None,
               intervals: int = 10, warmup: int = 100, speed: float = 1.0, recorded: bool | None = None,
               window_s: float = WINDOW_S, policy=None, caller_core: int | None = None,
               shadow_core: int | None = None, threads: int = 1, require_signature=None, keep: int = 3,
               max_p99_drift: float | None = None, max_rss_growth_mb: float | None = None,
               max_installs: int | None = None, run_features: bool = False, on_event=None) -> dict:
    """Serve ``bundle_dir`` for ``minutes`` while installing it again every ``swap_every_s`` seconds (see the
    module docstring). ``install_dir``: where (created when missing; None: a fresh temporary one, removed after);
    windows from ``ticks`` (as :func:`edgehft.hil.checks.replay_source`: the first 4096, cycled; else the golden
    inputs) at their recorded times ÷ ``speed`` when they have them and ``recorded`` is not False, else back to
    back; ``policy`` the server's :class:`~edgehft.serving.ShadowPolicy`; ``caller_core`` pins this thread,
    ``shadow_core`` the server's manager and the installer; ``max_installs`` stops installing after that many
    (None: until the end); ``max_p99_drift`` / ``max_rss_growth_mb`` as the HIL soak (None: its defaults).

    Returns:
        a JSON dict: ``check`` ("soak"), ``ok``, ``failures`` [text], ``minutes``, ``seconds``, ``calls``,
        ``failed_calls``, ``call_errors``, ``intervals`` [{``index``, ``calls``, ``p50_us``, ``p99_us``,
        ``p99.9_us``, ``max_us``, ``rss_bytes``, ``swaps``}], ``near_swaps`` / ``away`` ({``calls``, ``p50_us``,
        ``p99_us``, ``p99.9_us``, ``max_us``}), ``near_phases`` (the same per phase of :data:`PHASES`: a slot
        in one version's window and another's install counts in the busier phase), ``p999_near_over_away``,
        ``tries`` [{``version``, ``event`` (swapped | refused | rolled_back | pending), ``at_s`` (the verdict, s
        from the soak's start), ``install_s``, ``install_to_verdict_s``, ``phases_s`` {install, load, shadow}
        (s), ``live_calls``, ``golden_calls``, ``rel_mae``, ``shadow_p99_us``, ``shadow_p999_us``, ``why``}], ``installs``, ``swapped``, ``refused``,
        ``rolled_back``, ``pending``, ``p99_drift``, ``rss_growth_bytes``, ``rss_kind``, the limits, ``mode``,
        ``speed``, ``window_s``, ``swap_every_s``, ``source``, ``install_dir``, cores, board fields.
    Raises:
        InputError: values out of range, unreadable ticks, a core this process may not use; BundleError: not a
            bundle; what :func:`edgehft.serve` raises for the first version.
    """
    from edgehft.bench.replay import recorded_gaps
    from edgehft.bundle import load_bundle
    from edgehft.hil import checks
    from edgehft.serving.server import serve
    _check_args(minutes, swap_every_s, intervals, warmup, speed, window_s)
    bundle = load_bundle(bundle_dir, verify=True)
    windows, t_ns, source, several = _windows(bundle, ticks, run_features, checks.SOAK_WINDOWS)
    gaps, capped = (recorded_gaps(t_ns, speed) if t_ns is not None and recorded is not False else (None, None))
    made = install_dir is None
    root = Path(tempfile.mkdtemp(prefix="edgehft-soak-") if made else install_dir)
    switch = sys.getswitchinterval()
    tries, errors = _Tries(on_event), []
    try:
        from edgehft.deploy.local import install_local
        first = install_local(root, bundle.path, keep=keep)["version"]
        kw = {"policy": policy} if policy is not None else {}
        with serve(root, on_event=tries.on_event, shadow_core=shadow_core, threads=threads,
                   require_signature=require_signature, **kw) as srv:
            run = _serve_soak(srv, root, bundle.path, windows, several, gaps, tries, errors, dict(
                minutes=minutes, every_s=float(swap_every_s), intervals=intervals, warmup=warmup, window_s=window_s,
                caller_core=caller_core, shadow_core=shadow_core, keep=keep, max_installs=max_installs))
            active = srv.active
        run["hists"].classify(tries, None)
    finally:
        sys.setswitchinterval(switch)
        if made:
            shutil.rmtree(root, ignore_errors=True)
    return _report(run, tries, errors, first, active, dict(
        minutes=minutes, swap_every_s=float(swap_every_s), window_s=float(window_s),
        max_p99_drift=checks.SOAK_MAX_P99_DRIFT if max_p99_drift is None else float(max_p99_drift),
        max_rss_growth_mb=checks.SOAK_MAX_RSS_GROWTH_MB if max_rss_growth_mb is None else float(max_rss_growth_mb),
        mode="recorded" if gaps is not None else "max", speed=speed if gaps is not None else None,
        gaps_capped=capped, source=source, install_dir=None if made else str(root), caller_core=caller_core,
        shadow_core=shadow_core, board=bundle.manifest.board, emulated=False, bundle=str(bundle.path),
        model_sha256=bundle.manifest.source.sha256))



def soak_check(runner, minutes: float, swap_every_s: float, **options) -> dict:
    """The HIL soak check across swaps, wherever the plugin's target runs its checks (the local target in the pytest
    process, the box's agent for ``--edgehft-host``): :func:`soak_swaps` on ``runner``'s bundle with its thread
    count, in a fresh temporary install directory (removed after: a box's own install directory and its active
    version are never touched), and ``runner``'s board fields. ``options``: :func:`edgehft.hil.checks.soak`'s
    (``ticks``, ``intervals``, ``warmup``, ``speed``, ``max_p99_drift``, ``max_rss_growth_mb``, ``run_features``).

    Returns:
        :func:`soak_swaps`' dict with ``board``, ``emulated``, ``bundle``, ``model_sha256`` from ``runner``.
    Raises:
        what :func:`soak_swaps` raises.
    """
    from edgehft.hil.checks import runner_info
    res = soak_swaps(runner.bundle.path, minutes, swap_every_s, threads=getattr(runner, "threads", 1), **options)
    return {**res, **runner_info(runner)}

def _serve_soak(srv, root: Path, bundle_path: Path, windows, several: bool, gaps, tries: _Tries, errors: list,
                o: dict) -> dict:
    """The soak on server ``srv``: warm-up calls, the installer thread started, the intervals run from this thread
    (pinned to ``o["caller_core"]`` meanwhile), the installer stopped; :func:`_run_intervals`' result."""
    side = None if o["shadow_core"] is None else {int(o["shadow_core"])}
    if side is None and hasattr(os, "sched_getaffinity"):
        side = os.sched_getaffinity(0)           # the installer keeps this process's CPUs, not the caller's
    call = (lambda w: srv.predict(*w)) if several else srv.predict
    stop, inst, before = threading.Event(), None, _pin(o["caller_core"])
    try:
        for i in range(o["warmup"]):
            call(windows[i % len(windows)])
        until = time.monotonic() + o["minutes"] * 60.0 - o["window_s"]   # the last verdict's window in the soak
        inst = threading.Thread(target=_installer, name="edgehft-soak-install", daemon=True,
                                args=(root, bundle_path, o["every_s"], tries, stop, o["keep"], side, errors,
                                      o["max_installs"], until))
        inst.start()
        return _run_intervals(call, windows, gaps, tries, o["window_s"], int(o["minutes"] * 60e9 / o["intervals"]),
                              o["intervals"])
    finally:
        stop.set()
        if inst is not None:
            inst.join(timeout=120)
        if before is not None:
            os.sched_setaffinity(0, before)


def _try_row(t: dict, tries: _Tries, start_ns: int) -> dict:
    """One install's figures for the report (times in seconds from the soak's start)."""
    v = t["verdict"] or {}
    sh = tries.shadow.get(t["version"]) or {}
    lat = sh.get("latency_us") or {}

    def s(ns):
        return None if ns is None else round((ns - start_ns) / 1e9, 3)
    def d(a, b):
        return None if a is None or b is None else round((b - a) / 1e9, 3)
    loaded = tries.loaded.get(t["version"])
    return {"version": t["version"], "event": v.get("event", "pending"), "at_s": s(v.get("at_ns")),
            "install_s": s(t["install_ns"]), "install_to_verdict_s": d(t["install_ns"], v.get("at_ns")),
            "phases_s": {"install": d(t["install_ns"], t["installed_ns"]), "load": d(t["installed_ns"], loaded),
                         "shadow": d(loaded, v.get("at_ns"))},
            "live_calls": sh.get("live_calls"), "golden_calls": sh.get("golden_calls"), "rel_mae": sh.get("rel_mae"),
            "shadow_p99_us": lat.get("p99"), "shadow_p999_us": lat.get("p99.9"),
            "why": v.get("why") or ("; ".join(sh.get("why") or []) or None)}


def _report(run: dict, tries: _Tries, errors: list, first: str, active: str, fields: dict) -> dict:
    from edgehft.hil.checks import soak_verdict
    rows, hists = run["rows"], run["hists"]
    span = int(fields["minutes"] * 60e9 / len(rows))
    drift, growth, failures = soak_verdict(rows, span, fields["max_p99_drift"], fields["max_rss_growth_mb"])
    with tries.lock:
        table = [_try_row(t, tries, run["start_ns"]) for t in tries.tries]
    count = collections.Counter(t["event"] for t in table)
    near, away = hist_summary(hists.near), hist_summary(hists.away)
    phases = {ph: hist_summary(h) for ph, h in hists.phases.items()}
    if run["failed"]:
        failures.append(f"{run['failed']} failed call(s): {run['errors'][0]}")
    if not count["swapped"]:
        failures.append(f"no version was swapped in ({len(table)} installed): soak longer than a shadow run "
                        "or swap more often")
    if count["refused"]:
        why = next(t["why"] for t in table if t["event"] == "refused")
        failures.append(f"{count['refused']} of {len(table)} versions of the same bundle refused: {why}")
    if count["rolled_back"]:
        why = next(t["why"] for t in table if t["event"] == "rolled_back")
        failures.append(f"{count['rolled_back']} rollback(s) while serving: {why}")
    failures += errors + [f"server error: {w}" for w in tries.errors]
    ratio = (near["p99.9_us"] / away["p99.9_us"]) if near["calls"] and away["calls"] else None
    return {"check": "soak", "ok": not failures, "failures": failures, "seconds": run["seconds"],
            "calls": int(sum(r["calls"] for r in rows)), "failed_calls": run["failed"], "call_errors": run["errors"],
            "intervals": rows, "near_swaps": near, "away": away, "near_phases": phases,
            "p999_near_over_away": ratio, "tries": table,
            "installs": len([t for t in table if t["install_s"] is not None]), "swapped": count["swapped"],
            "refused": count["refused"], "rolled_back": count["rolled_back"], "pending": count["pending"],
            "first_version": first, "active": active, "p99_drift": drift, "rss_growth_bytes": int(growth),
            "rss_kind": run["rss_kind"], "latency_from": f"log histograms, {_SUB} bins per octave (0.54 %)",
            **fields}


def _f(v, fmt: str = "{:,.1f}") -> str:
    return "—" if v is None else fmt.format(v)


def _table(*columns: str):
    """A rich table in the compact style of these tables (80 columns), the first column left-aligned."""
    from rich import box
    from rich.table import Table
    t = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, collapse_padding=True)
    for k, c in enumerate(columns):
        t.add_column(c, justify="left" if k == 0 else "right", no_wrap=True)
    return t


def print_soak(report: dict, console) -> None:
    """The soak across swaps as people read it, on a rich ``console`` (fits 80 columns): the intervals, the
    caller's latency near swaps against away from them (and per phase of a swap), the versions installed, the
    failures."""
    from rich.markup import escape
    r = report
    console.print(f"[bold]soak across swaps[/], {r['seconds']:.1f} s, a version every {r['swap_every_s']:g} s: "
                  f"{r['swapped']} swapped, {r['refused']} refused of {r['installs']} installed; "
                  f"{r['calls']:,} calls, {r['failed_calls']} failed", highlight=False)
    t = _table("interval", "calls", "p50 µs", "p99 µs", "p99.9 µs", "max µs", "RSS MiB", "swaps")
    for row in r["intervals"]:
        t.add_row(str(row["index"]), f"{row['calls']:,}", _f(row["p50_us"]), _f(row["p99_us"]), _f(row["p99.9_us"]),
                  _f(row["max_us"]), f"{row['rss_bytes'] / 2**20:,.1f}", str(row["swaps"]))
    console.print(t)
    console.print(f"the caller's predict, µs: within {r['window_s']:g} s of a verdict (and from its install on) "
                  "vs away", highlight=False)
    t = _table("", "calls", "p50", "p99", "p99.9", "max")
    names = {"before": "  before the install", "install": "  install", "load": "  server's load",
             "shadow": "  shadow run", "after": "  after the verdict"}
    rows = [("near swaps", r["near_swaps"]), ("away from swaps", r["away"])]
    rows += [(names[ph], v) for ph, v in r["near_phases"].items() if v["calls"]]
    for name, v in rows:
        t.add_row(name, f"{v['calls']:,}", _f(v["p50_us"]), _f(v["p99_us"]), _f(v["p99.9_us"]), _f(v["max_us"]))
    console.print(t)
    _print_tries(r, console)
    src = r["source"]
    where = "the bundle's golden inputs" if src["kind"] == "golden" else ", ".join(Path(f).name for f in src["files"])
    timing = "at their recorded times" if r["mode"] == "recorded" else "back to back"
    console.print(f"p99.9 near swaps / away: {_f(r['p999_near_over_away'], '{:.2f}x')}; RSS first → last interval "
                  f"{r['rss_growth_bytes'] / 2**20:+.2f} MiB; windows: {src['windows']} of {where}, {timing}; "
                  f"caller on CPU {_f(r['caller_core'], '{}')}, the server's manager and the installer on "
                  f"{_f(r['shadow_core'], '{}')}; latencies from {r['latency_from']}", highlight=False, markup=False)
    for text in r["failures"]:
        console.print(f"[red]{escape(text)}[/]", highlight=False)


def _print_tries(r: dict, console) -> None:
    console.print("versions installed (took: install to verdict; the shadow run's p99 / p99.9 are the candidate's "
                  "own there, µs)", highlight=False)
    t = _table("#", "version", "verdict", "at s", "took s", "live", "rel MAE", "p99", "p99.9")
    t.columns[1].justify = t.columns[2].justify = "left"
    for k, tr in enumerate(r["tries"], 1):
        t.add_row(str(k), "…" + (tr["version"] or "?")[-4:], tr["event"], _f(tr["at_s"], "{:.1f}"),
                  _f(tr["install_to_verdict_s"], "{:.2f}"), _f(tr["live_calls"], "{}"), _f(tr["rel_mae"], "{:.2g}"),
                  _f(tr["shadow_p99_us"], "{:,.0f}"), _f(tr["shadow_p999_us"], "{:,.0f}"))
    console.print(t)
    for k, tr in enumerate(r["tries"], 1):
        if tr["event"] in ("refused", "rolled_back"):
            console.print(f"  #{k} {tr['event'].replace('_', ' ')}: {tr['why']}", highlight=False, markup=False)
