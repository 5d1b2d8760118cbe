"""The in-process server (issue 17): ``edgehft.serve(install_dir)`` answers ``predict`` from the box's active
version and swaps versions between two calls, after checking the new one on the live inputs.

    srv = edgehft.serve("/opt/edgehft", on_event=print)     # opens what `current` points to
    y = srv.predict(window)                                  # always the active version's runner
    srv.rollback()                                           # the previous version, kept warm: at once
    srv.close()

A manager thread watches ``<install_dir>/current`` (:mod:`edgehft.serving.watch`). When it points to a version the
server does not run:

1. **load**: the version is opened (:func:`edgehft.runtime.open`: every file's SHA-256 against the manifest, the
   signature when ``require_signature`` says so, the plan recorded on this box), its golden vectors run
   (:func:`edgehft.bundle_checks.check_golden`) and it is pre-warmed (``prewarm`` predictions);
2. **shadow run**: ``predict`` copies each live input into a bounded queue (only while a shadow run is armed: one
   copy of the window per call); the manager runs the candidate on them, and a second runner of the active
   version (its own interpreter: the caller's is never touched off its thread) for the reference outputs, until
   ``calls`` inputs or ``seconds`` have passed (fewer than ``min_calls`` live inputs: the golden inputs fill up,
   and the verdict says how many of each);
3. **verdict**: the candidate's outputs against the active version's (relative MAE, the compile drift gate's
   measure, :func:`edgehft.compiler.drift.measure_drift`, at most ``max_rel_mae``) and its own latency there
   (p99 / p99.9 against ``budget_p99_us`` / ``budget_p999_us``, default the board's ``[latency_budget_us]``, each
   only from as many calls as it needs, :data:`MIN_CALLS`; the active version's latency on the same inputs, timed
   in the same run, is reported beside it);
4. **swap** (an attribute assignment between two calls: no lock on the hot path) or **refuse** (the active version
   keeps serving; a refused version is not retried until ``current`` moves again). The version swapped out stays
   open as ``previous``: :meth:`Server.rollback`, a box ``edgehft rollback`` (``current`` back to it), or a breach
   after the swap (the caller's own p99 over the ``breach_calls`` calls after it above the budget) swap back at
   once. The one before is closed ``grace_s`` seconds later.

**Stream mode** (``serve(install_dir, stream=True)``, a bundle whose plan streams: ``runner.stream()``):
``push(row)`` / ``prepare()`` run the active version's stream; the shadow run feeds the candidate's stream the
live rows and compares its outputs with the active version's as pushed; a swap or rollback is handed to the
caller's next ``push``, which first gives the new stream the few rows it has not seen, so every stream's window
is right and every output equals ``predict`` of its window across swaps (:mod:`edgehft.serving.streams`). After
the first swap each push also logs a copy of its row and output (the previous version's stream is kept current
from that log for an instant rollback).

Every step is an event (``{"event", "version", "time_utc", ...figures}``: ``serving``, ``loaded``, ``shadow``,
``swapped``, ``refused``, ``rolled_back``, ``breach``, ``error``), kept in :attr:`Server.events` (a list of the
newest :data:`MAX_EVENTS` or so; :attr:`Server.events_emitted` counts all), logged on the
``edgehft.serving`` logger, appended to ``events_path`` (JSON lines) when given and passed to ``on_event``.

Off the caller's path, with a cost: the manager is a Python thread, so while it works it competes for the GIL
(the kernels and LiteRT's invoke release it). ``serve`` sets ``sys.setswitchinterval`` to ``switch_interval_s``
(default 100 µs, Python's is 5 ms; ``close()`` puts it back) so a caller waits at most about that long, and pins the manager to
``shadow_core`` when given (give it a core the caller does not use). The benchmark
(``benchmarks/serve_swap.py``) measures the caller's p99.9 around swaps against away from them.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from edgehft.errors import EdgeHFTError, InputError, RunnerStateError
from edgehft.serving.watch import LinkWatch, current_version

log = logging.getLogger("edgehft.serving")


@dataclass
class ShadowPolicy:
    """How a new version is checked before it serves (see the module docstring): ``calls`` live inputs (or
    ``seconds``, whichever first; at least ``min_calls``, golden inputs fill up), outputs within ``max_rel_mae``
    of the active version's, p99 / p99.9 µs within the budgets (None: the board's), ``prewarm`` predictions
    before the shadow run, ``breach_calls`` caller calls watched after a swap. A percentile is held to its
    budget only from as many calls as it needs (:data:`MIN_CALLS`: p99 100, p99.9 1000; :func:`hold_few_calls`):
    the default shadow run (300 calls) judges p99 and leaves p99.9 to the breach watch (1000 calls)."""

    calls: int = 300
    seconds: float = 20.0
    min_calls: int = 50
    max_rel_mae: float = 0.01
    budget_p99_us: float | None = None
    budget_p999_us: float | None = None
    prewarm: int = 30
    breach_calls: int = 1000


# the fewest calls a percentile is held to an absolute budget from: 1 / (1 - q), the count at which the
# percentile is no longer the slowest call (a shadow run of 300 calls has a p99.9 that is its maximum)
MIN_CALLS = {"p99": 100, "p999": 1000}


def hold_few_calls(verdict: dict, key: str, calls: int) -> None:
    """A percentile over the budget from fewer than ``MIN_CALLS[key]`` calls is not judged: the sample cannot
    tell the version from the host (two runs of the same version on 300 calls differ by 1.6x at p99.9 on a
    shared VM). The shadow run leaves such a p99.9 to the breach watch after the swap (``breach_calls``, 1000 by
    default, of the caller's own calls). Updates ``verdict`` (``{"value_us", "budget_us", "ok"}``) in place:
    ``ok`` and ``judged`` (on what it was judged, or why not)."""
    need = MIN_CALLS.get(key, 0)
    if verdict["ok"] or calls >= need:
        verdict["judged"] = f"against the budget ({calls} calls)"
        return
    pct = "p99.9" if key == "p999" else key
    verdict.update(ok=True, judged=f"not judged: {calls} calls, {pct} needs {need}")


class _Version:
    """One opened version: its id, runner, and the manager's own runner of it (reference outputs)."""

    def __init__(self, root: Path, vid: str, open_kw: dict):
        from edgehft import runtime
        self.vid, self.path = vid, root / "versions" / vid
        self.runner = runtime.open(self.path, **open_kw)
        self.reference = self.stream = None
        self.open_kw = open_kw

    def reference_runner(self):
        if self.reference is None:
            from edgehft import runtime
            self.reference = runtime.open(self.path, **self.open_kw)
        return self.reference

    def close(self) -> None:
        for r in (self.stream, self.runner, self.reference):
            if r is not None:
                r.close()


def _rel_mae(o, ref: np.ndarray) -> float:
    """An output's MAE relative to the active version's output range over the shadow run; where that range is 0
    (every window alike, e.g. a quiet feed), relative to the outputs' largest magnitude, and infinite where those
    are all 0 and the candidate's are not: a candidate is never judged equal just because the inputs did not vary."""
    if o.float_range > 0 or o.max_abs == 0:
        return o.mae_rel
    m = float(np.abs(ref).max()) if ref.size else 0.0
    return o.mae / m if m > 0 else float("inf")


def _interface_change(active, cand) -> str:
    """What a caller of ``active`` would see change with ``cand`` (two bundle manifests): e.g. "outputs' shapes
    [[1, 3]] (the active version's [[1, 1]])" for the inputs and outputs whose count or shapes (in order) differ, or
    "" when none. Names may differ (Keras numbers its default layer names; ``predict`` is positional), and so may
    dtypes and quantization (another plan: ``predict`` takes and returns float32 either way)."""
    moved = []
    for k in ("inputs", "outputs"):
        was, now = [list(s.shape) for s in getattr(active, k)], [list(s.shape) for s in getattr(cand, k)]
        if was != now:
            moved.append(f"{k}' shapes {now} (the active version's {was})")
    return " and ".join(moved)


MAX_EVENTS = 10_000      # events kept in Server.events, about (a server that runs for months; the log file keeps all)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _copy(y):
    """A copy of a predict result (an array, or a tuple of arrays)."""
    return tuple(a.copy() for a in y) if isinstance(y, (tuple, list)) else (y.copy(),)


class Server:
    """The server ``serve()`` returns (see the module docstring). :meth:`predict` is safe from one caller
    thread at a time (as a runner is); the other methods from any thread.

    Raises (at construction): InputError when nothing is deployed under ``install_dir`` (no ``current``), and
    what :func:`edgehft.runtime.open` raises for the active version."""

    def __init__(self, install_dir, *, policy: ShadowPolicy | None = None, on_event=None, events_path=None,
                 require_signature=None, threads: int = 1, watch: str = "auto", poll_s: float = 0.2,
                 shadow_core: int | None = None, switch_interval_s: float | None = 1e-4, grace_s: float = 2.0,
                 stream: bool = False):
        self.root = Path(install_dir)
        self.policy = policy or ShadowPolicy()
        self.on_event, self.events_path, self.grace_s = on_event, events_path, float(grace_s)
        self.shadow_core = shadow_core
        self._open_kw = {"threads": threads, "require_signature": require_signature}
        vid = current_version(self.root)
        if vid is None:
            raise InputError(f"nothing is deployed under {self.root}: no 'current' link",
                             hint="edgehft deploy BUNDLE --host BOX puts a version there first")
        self.events: list = []                 # the newest (trimmed past MAX_EVENTS); events_path/on_event get all
        self.events_emitted = 0
        self._lock = threading.Lock()          # the manager's and rollback()'s swaps (never predict)
        self._active, self._previous = _Version(self.root, vid, self._open_kw), None
        self._tap = self._breach = None        # the shadow run's input queue; the caller's latencies after a swap
        self._refused, self._last_seen, self._retired = set(), vid, []
        self._lane = self._prev_feed = self._rollback_req = None
        if stream:
            self._open_lane()
        self._switch_before = sys.getswitchinterval()      # restored by close()
        if switch_interval_s:
            sys.setswitchinterval(float(switch_interval_s))
        self._emit("serving", vid, plan=getattr(self._active.runner, "plan", None))
        self._watch = LinkWatch(self.root, watch, poll_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._manage, name="edgehft-serve", daemon=True)
        self._thread.start()

    # --- the hot path -------------------------------------------------------------------------------------
    def predict(self, *windows):
        """``predict`` of the active version's runner (its result, its errors). While a shadow run is armed the
        inputs are also copied for the candidate; after a swap the call is timed for the breach watch."""
        v, breach = self._active, self._breach
        if breach is None:
            y = v.runner.predict(*windows)
        else:
            t0 = time.perf_counter_ns()
            y = v.runner.predict(*windows)
            breach.append(time.perf_counter_ns() - t0)
        tap = self._tap
        if tap is not None:
            tap.append(tuple(np.array(w, copy=True) for w in windows))
        return y

    def predict_many(self, windows) -> list:
        """``predict_many`` of the active version's runner (:meth:`edgehft.runtime.base.Runner.predict_many`: one
        result per window, as one batch only where that was measured faster on this box): several instruments in
        one call that follows the swaps like :meth:`predict`. While a shadow run is armed each window is also copied
        for the candidate (as a ``predict`` of it). Its calls are not timed for the breach watch: a batch's time is
        not one window's, which the budget is for.

        Raises: what the runner's ``predict_many`` raises."""
        ys = self._active.runner.predict_many(windows)
        tap = self._tap
        if tap is not None:
            for w in windows:
                tap.append(tuple(np.array(x, copy=True) for x in (w if isinstance(w, tuple) else (w,))))
        return ys

    def push(self, row):
        """Stream mode (``stream=True``): the window's newest row into the active version's stream; its output
        (or None while warming up) and its errors, as ``runner.stream().push`` (:mod:`edgehft.serving.streams`).
        Raises InputError when the server was opened without ``stream=True``."""
        if self._lane is None:
            raise InputError("push() needs a server opened with stream=True",
                             hint="edgehft.serve(install_dir, stream=True), for a bundle whose plan streams")
        return self._lane.push(row)

    def prepare(self) -> bool:
        """Stream mode: the active stream's ahead-of-tick work (call it between ticks, from the pushing thread)."""
        if self._lane is None:
            raise InputError("prepare() needs a server opened with stream=True")
        return self._lane.stream.prepare()

    def _open_lane(self) -> None:
        from edgehft.serving.streams import StreamLane
        try:
            self._active.stream = self._active.runner.stream()
        except BaseException:
            self._active.close()
            raise
        self._lane = StreamLane(self._active.stream)
        self.push = self._lane.push           # the hot path: no extra call layer

    # --- what the caller can ask ----------------------------------------------------------------------------
    @property
    def active(self) -> str:
        """The version id that answers :meth:`predict`."""
        return self._active.vid

    @property
    def runner(self):
        """The active version's :class:`edgehft.runtime.Runner` (its ``bundle.manifest``, ``plan``, ``board``): to
        read what serves now; call it only through :meth:`predict` (which follows the swaps)."""
        return self._active.runner

    @property
    def previous(self) -> str | None:
        """The version kept warm for :meth:`rollback` (None before the first swap)."""
        return None if self._previous is None else self._previous.vid

    def rollback(self, why: str = "asked by the caller") -> str:
        """Swap back to the previous version at once; returns the version now active. The version swapped out
        is not retried until ``current`` moves again. Raises InputError when there is no previous version."""
        if self._stop.is_set():
            raise RunnerStateError("the server is closed", hint="serve the install dir again: edgehft.serve(dir)")
        with self._lock:
            if self._previous is None:
                raise InputError("nothing to roll back to: no version was swapped out yet",
                                 hint="a rollback follows a swap (server.previous names the warm version)")
            if self._lane is not None:          # stream mode: the manager hands the previous stream over
                self._rollback_req = why
                return self._previous.vid
            out = self._active
            self._active, self._previous = self._previous, out
            self._breach = None
            self._refused.add(out.vid)
        self._emit("rolled_back", self._active.vid, from_version=out.vid, why=why)
        return self._active.vid

    def close(self) -> None:
        """Stop the manager and close every version (later predicts raise RunnerStateError)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)
        self._watch.close()
        sys.setswitchinterval(self._switch_before)
        for v in [self._active, self._previous, *[r for r, _ in self._retired]]:
            if v is not None:
                v.close()
        self._retired = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- events -----------------------------------------------------------------------------------------
    def _emit(self, event: str, version: str | None, **figures) -> dict:
        e = {"event": event, "version": version, "time_utc": _now(), **figures}
        self.events.append(e)
        self.events_emitted += 1
        if len(self.events) > MAX_EVENTS + MAX_EVENTS // 10:
            del self.events[:len(self.events) - MAX_EVENTS]      # in chunks: a list stays a list (slices, JSON)
        log.info("%s %s %s", event, version, json.dumps(figures, default=str))
        if self.events_path:
            try:
                with open(self.events_path, "a") as f:
                    f.write(json.dumps(e, default=str) + "\n")
            except OSError as exc:
                log.warning("cannot append to %s: %s", self.events_path, exc)
        if self.on_event is not None:
            try:
                self.on_event(e)
            except Exception:              # a user's callback never stops the server
                log.exception("on_event raised")
        return e

    # --- the manager thread -----------------------------------------------------------------------------------
    def _manage(self) -> None:
        if self.shadow_core is not None:
            try:
                os.sched_setaffinity(0, {int(self.shadow_core)})        # this thread only (Linux)
            except (OSError, ValueError) as exc:
                self._emit("error", None, what=f"cannot pin the manager to core {self.shadow_core}: {exc}")
        while not self._stop.is_set():
            try:
                self._stream_tick()
                self._check_current()
                self._check_breach()
                self._close_retired()
            except Exception as exc:         # the server keeps serving what it serves
                self._emit("error", None, what=f"{type(exc).__name__}: {exc}")
            self._watch.wait()

    def _stream_tick(self) -> None:
        """Stream mode: take back the streams the caller replaced (the previous version's, fed from now on), serve
        a rollback asked for, and feed the previous version's stream the rows it lacks."""
        lane = self._lane
        if lane is None:
            return
        from edgehft.serving.streams import Feed
        for version, stream, seq in lane.taken_back():
            if self._previous is version:
                self._set_prev_feed(Feed(version, stream, seq, compare=False))
        req, self._rollback_req = self._rollback_req, None
        if req is not None and not self._swap_back(req, refuse_out=True):
            self._rollback_req = req                       # the swap before is not taken by the caller yet
        lane.feed()                                        # (also trims the log)

    def _set_prev_feed(self, feed) -> None:
        """The previous version's stream the manager keeps current (None: none)."""
        lane = self._lane
        if self._prev_feed is not None and self._prev_feed in lane.feeds:
            lane.feeds.remove(self._prev_feed)
        self._prev_feed = feed
        if feed is not None:
            lane.feeds.append(feed)

    def _stream_shadow(self, cand: _Version):
        """Stream mode's shadow run: the candidate's stream fed the logged rows; its outputs against the active
        version's (as pushed), its push latency; at least ``min_calls`` compared ticks, else refused."""
        from edgehft.serving.streams import Feed
        pol, lane = self.policy, self._lane
        lane.start_log()
        cand.stream = cand.runner.stream()
        feed = Feed(cand, cand.stream, lane.log.next_seq, compare=True)
        lane.feeds.append(feed)
        deadline = time.monotonic() + pol.seconds
        try:
            while len(feed.pairs) < pol.calls and time.monotonic() < deadline and not self._stop.is_set():
                self._stream_tick()
                time.sleep(0.0005)
        finally:
            lane.feeds.remove(feed)
        if len(feed.pairs) < pol.min_calls:
            return {"ok": False, "why": [f"{len(feed.pairs)} compared ticks in {pol.seconds:g} s, fewer than "
                                         f"min_calls {pol.min_calls}: too few to judge"],
                    "live_calls": len(feed.pairs), "golden_calls": 0}, feed
        return self._verdict(cand, feed.pairs, feed.lat, len(feed.pairs)), feed

    def _check_current(self) -> None:
        vid = current_version(self.root)
        if vid != self._last_seen:           # current moved: what was refused may be tried again
            self._refused.clear()
            self._last_seen = vid
        if vid is None or vid == self._active.vid or vid in self._refused:
            return
        with self._lock:                       # the two read together: a rollback() may come between two reads
            prev, act = self._previous, self._active.vid
        if prev is not None and vid == prev.vid:
            self._swap_back("the box's current link went back to it", expect_active=act)
            return
        self._try(vid)

    def _swap_back(self, why: str, refuse_out: bool = False, expect_active: str | None = None) -> bool:
        """The manager's swap back to the previous version (stream mode: its stream handed over to the caller's
        next push). False when there is none yet (stream mode: the last swap's stream not taken yet), or when
        ``expect_active`` is given and another version is active by now (a caller's :meth:`rollback` came
        first: swapping again would bring back the version it judged)."""
        if self._lane is not None and self._prev_feed is None:
            return False                      # the caller has not taken the last swap's stream yet: next round
        with self._lock:
            if self._previous is None or (expect_active is not None and self._active.vid != expect_active):
                return False
            out = self._active
            self._active, self._previous, self._breach = self._previous, out, None
            if refuse_out:
                self._refused.add(out.vid)
        if self._lane is not None:
            f = self._prev_feed
            self._set_prev_feed(None)
            self._lane.hand_over(f.stream, f.seq, out)
        self._emit("rolled_back", self._active.vid, from_version=out.vid, why=why)
        return True

    def _try(self, vid: str) -> None:
        """Load, check, shadow-run and swap in (or refuse) version ``vid``."""
        from edgehft.bundle_checks import check_golden
        t0 = time.monotonic()
        try:
            cand = _Version(self.root, vid, self._open_kw)
        except EdgeHFTError as exc:
            self._refuse(vid, f"it does not open: {exc.args[0]}")
            return
        change = _interface_change(self._active.runner.bundle.manifest, cand.runner.bundle.manifest)
        if change:
            self._refuse(vid, f"its {change} differ: a caller written for one would break on the other (serve it "
                              "from a new process)", cand)
            return
        try:
            g = check_golden(cand.runner)
            if not g["ok"]:
                self._refuse(vid, f"golden vectors differ: {g['count'] - g['matched']} of {g['count']} "
                                  f"(max diff {g['max_diff']:.3g})", cand)
                return
            self._prewarm(cand)
            self._emit("loaded", vid, open_s=round(time.monotonic() - t0, 3), golden=f"{g['matched']}/{g['count']}",
                       plan=getattr(cand.runner, "plan", None))
            feed = None
            if self._lane is not None:
                verdict, feed = self._stream_shadow(cand)
            else:
                verdict = self._shadow(cand)
            self._emit("shadow", vid, **verdict)
            if verdict["ok"]:
                self._swap_in(cand, verdict, feed)
            else:
                self._refuse(vid, "; ".join(verdict["why"]), cand)
        except Exception as exc:
            self._refuse(vid, f"{type(exc).__name__}: {exc}", cand)

    def _refuse(self, vid: str, why: str, cand: _Version | None = None) -> None:
        self._tap = None
        self._refused.add(vid)
        if cand is not None:
            cand.close()
        self._emit("refused", vid, why=why, active=self._active.vid)

    def _golden_inputs(self, v: _Version, as_float: bool = False) -> list:
        """The bundle's golden input windows, one tuple per window: raw (what ``predict_raw`` takes), or as
        ``predict`` takes them (quantized inputs dequantized: scale * (q - zero_point))."""
        ins, _ = v.runner.bundle.golden()
        specs = v.runner.bundle.manifest.inputs
        out = []
        for n in range(len(ins[specs[0].name])):
            xs = []
            for sp in specs:
                x = ins[sp.name][n:n + 1]
                if as_float and sp.quantized:
                    x = ((x.astype(np.float32) - np.float32(sp.zero_point[0])) * np.float32(sp.scale[0])).astype(np.float32)
                xs.append(x)
            out.append(tuple(xs))
        return out

    def _prewarm(self, cand: _Version) -> None:
        xs = self._golden_inputs(cand)
        for i in range(self.policy.prewarm):
            cand.runner.predict_raw(*xs[i % len(xs)])

    def _shadow(self, cand: _Version) -> dict:
        """The shadow run and its verdict (see the module docstring): ``{"ok", "why", "live_calls",
        "golden_calls", "rel_mae", "max_abs", "latency_us", "active_latency_us", "budget_us", "budget_from",
        "verdicts"}`` (each verdict's ``judged``: :func:`hold_few_calls`)."""
        pol = self.policy
        tap = collections.deque(maxlen=4 * pol.calls)
        self._tap = tap                                   # predict copies its inputs from here on
        ref = self._active.reference_runner()
        pairs, lat, ref_lat = [], [], []
        deadline = time.monotonic() + pol.seconds
        try:
            while len(pairs) < pol.calls and time.monotonic() < deadline and not self._stop.is_set():
                try:
                    xs = tap.popleft()
                except IndexError:
                    time.sleep(0.0005)
                    continue
                self._shadow_one(ref, cand, xs, pairs, lat, ref_lat)
        finally:
            self._tap = None
        live = len(pairs)
        golden = self._golden_inputs(cand, as_float=True)
        fill = max(0, pol.min_calls - live)                   # golden inputs up to min_calls count as calls (timed)
        for i in range(fill):
            self._shadow_one(ref, cand, golden[i % len(golden)], pairs, lat, ref_lat)
        compared = list(pairs)                                # and every golden input is compared: a quiet feed's
        for x in golden[fill:]:                               # outputs may not vary, these do (not timed)
            self._shadow_one(ref, cand, x, compared, [], [])
        return self._verdict(cand, compared, lat, live, ref_lat, golden_calls=len(pairs) - live)

    @staticmethod
    def _shadow_one(ref, cand, xs, pairs: list, lat: list, ref_lat: list) -> None:
        t0 = time.perf_counter_ns()
        want = _copy(ref.predict(*xs))
        t1 = time.perf_counter_ns()
        got = cand.runner.predict(*xs)
        lat.append(time.perf_counter_ns() - t1)
        ref_lat.append(t1 - t0)
        pairs.append((want, _copy(got)))

    def _verdict(self, cand: _Version, pairs: list, lat: list, live: int, ref_lat: list | None = None,
                 golden_calls: int | None = None) -> dict:
        """The shadow verdict: ``pairs`` (reference, candidate outputs) compared (drift gate), ``lat`` the
        candidate's timed calls (``live`` of them live, ``golden_calls`` golden fill-up; None: the other pairs)."""
        from edgehft.bench.replay import summarize_us
        from edgehft.compiler.drift import measure_drift
        from edgehft.hil.checks import judge_latency
        pol, why = self.policy, []
        names = [s.name for s in cand.runner.bundle.manifest.outputs]
        ref_outs = [np.concatenate([p[0][k] for p in pairs]) for k in range(len(names))]
        cand_outs = [np.concatenate([p[1][k] for p in pairs]) for k in range(len(names))]
        drift = measure_drift(ref_outs, cand_outs, names, [False] * len(names), pol.max_rel_mae,
                              self._active.vid, cand.vid)
        rel = [_rel_mae(o, r) for o, r in zip(drift.outputs, ref_outs)]
        worst = int(np.argmax(rel))
        if rel[worst] > pol.max_rel_mae:
            o = drift.outputs[worst]
            of = "" if o.float_range > 0 else " of the outputs' magnitude (the active version's did not vary)"
            why.append(f"outputs differ from the active version's: relative MAE {rel[worst]:.3%}{of} on {o.name} "
                       f"(gate {pol.max_rel_mae:.3%})")
        lat_us = summarize_us(np.asarray(lat, np.int64))
        active_us = summarize_us(np.asarray(ref_lat, np.int64)) if ref_lat else None
        judged = judge_latency(cand.runner, lat_us, pol.budget_p99_us, pol.budget_p999_us)
        for key, v in judged["verdicts"].items():
            hold_few_calls(v, key, len(lat))
            if not v["ok"]:
                why.append(f"{'p99.9' if key == 'p999' else key} {v['value_us']:.1f} µs over the budget "
                           f"{v['budget_us']:g} µs ({judged['budget_from']})")
        return {"ok": not why, "why": why, "live_calls": live,
                "golden_calls": len(pairs) - live if golden_calls is None else golden_calls, "compared": len(pairs),
                "rel_mae": float(min(max(rel), 1e9)), "max_abs": max(o.max_abs for o in drift.outputs),
                "latency_us": lat_us, "active_latency_us": active_us, **judged}

    def _swap_in(self, cand: _Version, verdict: dict, feed=None) -> None:
        with self._lock:
            retired, out = self._previous, self._active
            self._previous, self._active = out, cand          # the swap: predict's next call runs cand
            self._breach = collections.deque(maxlen=self.policy.breach_calls)
        if feed is not None:                                  # push's next call takes cand's stream
            self._set_prev_feed(None)                         # (the retired version's stream: no longer fed)
            self._lane.hand_over(feed.stream, feed.seq, out)
        if retired is not None:
            self._retired.append((retired, time.monotonic() + self.grace_s))
        self._emit("swapped", cand.vid, from_version=out.vid, live_calls=verdict["live_calls"],
                   p99_us=verdict["latency_us"]["p99"], rel_mae=verdict["rel_mae"])

    def _check_breach(self) -> None:
        """After a swap: once ``breach_calls`` caller calls were timed, their p99 / p99.9 against the budget;
        over it: back to the previous version at once."""
        from edgehft.bench.replay import summarize_us
        from edgehft.hil.checks import judge_latency
        with self._lock:                       # the calls and the version they timed, as one (rollback() resets both)
            b, judged_v = self._breach, self._active
            if b is None or len(b) < self.policy.breach_calls:
                return
            self._breach = None
        lat = summarize_us(np.asarray(b, np.int64))
        judged = judge_latency(judged_v.runner, lat, self.policy.budget_p99_us, self.policy.budget_p999_us)
        for key, v in judged["verdicts"].items():
            hold_few_calls(v, key, len(b))
        over = [k for k, v in judged["verdicts"].items() if not v["ok"]]
        if over and self._previous is not None:
            self._emit("breach", judged_v.vid, latency_us=lat, over=over, budget_us=judged["budget_us"])
            self._swap_back(f"breach after the swap: {', '.join(over)} over the budget", refuse_out=True,
                            expect_active=judged_v.vid)

    def _close_retired(self) -> None:
        now, keep = time.monotonic(), []
        for v, at in self._retired:
            if now >= at:
                v.close()
            else:
                keep.append((v, at))
        self._retired = keep


def serve(install_dir, **options) -> Server:
    """An in-process :class:`Server` on the box's install directory ``install_dir`` (the board file's
    ``[ssh] install_dir``): ``predict`` from the version ``current`` points to, new versions shadow-run and swapped
    in between two calls. ``options``: ``policy`` (:class:`ShadowPolicy`), ``on_event`` (called with each event
    dict), ``events_path`` (JSON lines), ``require_signature`` (as :func:`edgehft.runtime.open`), ``threads``,
    ``watch`` (``auto`` | ``inotify`` | ``poll``), ``poll_s``, ``shadow_core``, ``switch_interval_s`` (None:
    leave Python's), ``grace_s``.

    Raises:
        InputError: nothing deployed there; what :func:`edgehft.runtime.open` raises for the active version."""
    return Server(install_dir, **options)
