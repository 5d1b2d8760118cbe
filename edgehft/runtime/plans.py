"""The execution plans of a bundle where it runs: which one a runner opens, timing them against each other,
choosing one, and the box's record of that choice.

A cpu bundle may carry several plans (:meth:`edgehft.bundle.Bundle.plan`: the top level is the compile
host's choice, the others sub-bundles in ``plans/<name>/``). Which is fastest depends on the CPU, so
``edgehft deploy`` times them on the box (:func:`time_runners`, all interleaved, one pinned core, one
thread), picks one by a percentile (:func:`pick`: ``p50``, ``p99`` or ``p99.9``; ties by p50) and records it
in the install dir, outside the bundle's own files::

    <install_dir>/plan/<version>.json

The record (:func:`make_record`, checked strictly by :func:`check_record` whenever it is read: a box's own
state can be damaged too) holds ``format`` ("edgehft-plan-choice"), ``format_version`` (1), ``version``
(the version id it belongs to), ``manifest_sha256`` (of that version's manifest.json), ``plan`` (the
chosen plan), ``how`` (``timed``: chosen by ``select``; ``forced``: named by the deploy), ``select``,
``measured`` ({plan: {p50_us, p99_us, p99.9_us, mean_us, p99_over_p50}} for every plan timed), ``excluded``
({plan: why it was not timed: golden vectors not reproduced, cannot run on this box}), ``pinned_cpu``,
``rounds``, ``windows``, ``cpu_model`` and ``utc``. :func:`runner_plan` is what
:func:`edgehft.runtime.open` uses: a plan asked for by name, else the one recorded for the version opened
(``<install_dir>/current`` or ``versions/<vid>``), else the bundle's top level. Nothing here imports
TensorFlow; it runs on boxes.
"""
from __future__ import annotations

import gc
import json
import math
import os
import re
import stat
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from edgehft.errors import BundleError, InputError

SELECTS = ("p50", "p99", "p99.9")
DEFAULT_SELECT = "p99"          # a trading box cares about the tail
RECORD_FORMAT = "edgehft-plan-choice"
RECORD_DIR = "plan"
MAX_RECORD_BYTES = 1 << 20
VID = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{12}-[0-9a-f]{4}$")
FIGURES = ("p50_us", "p99_us", "p99.9_us", "mean_us", "p99_over_p50")
HOW = ("timed", "forced")


def check_select(select: str) -> str:
    """``select`` if it is one of :data:`SELECTS`.

    Raises:
        InputError: anything else (exit 3).
    """
    if select not in SELECTS:
        raise InputError(f"--select {select!r}: choose one of {', '.join(SELECTS)}",
                         hint="p99 (the default) picks the plan with the lowest 99th-percentile latency")
    return select


def pick(measured: dict, select: str = DEFAULT_SELECT, eligible=None) -> str:
    """The plan with the lowest ``select`` percentile in ``measured`` ({plan: {"p50_us", "p99_us",
    "p99.9_us", ...}} in µs), among ``eligible`` (default: all); ties go to the lower p50, then to the plan
    listed first.

    Raises:
        InputError: an unknown ``select``.
        ValueError: no eligible plan has figures.
    """
    key = check_select(select) + "_us"
    names = [n for n in measured if eligible is None or n in eligible]
    if not names:
        raise ValueError("no plan to choose from")
    return min(names, key=lambda n: (measured[n][key], measured[n]["p50_us"], names.index(n)))


def time_runners(runners: dict, windows: list, rounds: int = 300, warmup: int = 30, core: int | None = None) -> dict:
    """Latency of ``predict`` per runner, all measured interleaved (one call of each per round, the order
    reversed every other round so none has a fixed position), this process pinned to one CPU (``core``;
    default the highest of its affinity) with the garbage collector off; the affinity is restored.

    Args:
        runners: plan name -> an opened :class:`~edgehft.runtime.base.Runner` (one thread each).
        windows: what one call takes, cycled: arrays (one input) or tuples of arrays (several inputs).
    Returns:
        ``{plan: {"p50_us", "p99_us", "p99.9_us", "mean_us", "p99_over_p50"}, "_core": cpu}`` (µs).
    Raises:
        InputError: ``core`` is not one this process may run on.
    """
    from edgehft.bench.replay import summarize_us
    before = os.sched_getaffinity(0)
    if core is None:
        core = max(before)
    elif core not in before:
        raise InputError(f"core {core} is not one this process may run on (allowed: {sorted(before)})",
                         hint="pin the plans' timing to a core the box serves on")
    calls = [w if isinstance(w, tuple) else (w,) for w in windows]
    lat = {p: np.empty(rounds, np.int64) for p in runners}
    perf = time.perf_counter_ns
    gc_was = gc.isenabled()
    try:
        os.sched_setaffinity(0, {core})
        gc.collect()
        gc.disable()
        order = list(runners.items())
        for r in range(-warmup, rounds):
            x = calls[r % len(calls)]
            for p, run in (order if r % 2 else order[::-1]):
                t0 = perf()
                run.predict(*x)
                t1 = perf()
                if r >= 0:
                    lat[p][r] = t1 - t0
    finally:
        if gc_was:
            gc.enable()
        os.sched_setaffinity(0, before)
    out: dict = {}
    for p, ns in lat.items():
        s = summarize_us(ns)
        out[p] = {"p50_us": s["p50"], "p99_us": s["p99"], "p99.9_us": s["p99.9"], "mean_us": s["mean"],
                  "p99_over_p50": s["p99"] / s["p50"]}
    out["_core"] = core
    return out


def timing_windows(bundles: list) -> list:
    """The windows the plans of one bundle are timed on: the golden inputs as float32 windows, taken from the
    first of ``bundles`` (the plans' :class:`~edgehft.bundle.Bundle` objects) whose inputs are float (all
    plans' golden inputs are the same held-out windows), else the first one's quantized inputs dequantized
    (``(q - zero_point) * scale``, which ``predict`` quantizes back to the same values).

    Returns:
        a list of arrays (one input) or of tuples of arrays, one entry per golden vector.
    """
    def float_inputs(b):
        ins, _ = b.golden()
        out = []
        for s in b.manifest.inputs:
            a = ins[s.name]
            if a.dtype.kind in "iu" and s.quantized:
                a = ((a.astype(np.float32) - np.float32(s.zero_point[0])) * np.float32(s.scale[0]))
            out.append(np.ascontiguousarray(a, dtype=np.float32) if a.dtype.kind == "f" else a)
        return out
    best = next((b for b in bundles if all(np.dtype(s.dtype).kind == "f" for s in b.manifest.inputs)), bundles[0])
    arrays = float_inputs(best)
    n = len(arrays[0])
    return [arrays[0][i] for i in range(n)] if len(arrays) == 1 else [tuple(a[i] for a in arrays) for i in range(n)]


def record_path(install_dir: str | Path, vid: str) -> Path:
    """``<install_dir>/plan/<vid>.json``: where the box records the plan chosen for version ``vid``."""
    return Path(install_dir) / RECORD_DIR / f"{vid}.json"


def make_record(vid: str, manifest_sha256: str, plan: str, how: str, select: str, measured: dict,
                excluded: dict, pinned_cpu: int, rounds: int, windows: int) -> dict:
    """The record of a plan chosen on this box for version ``vid`` (fields in the module docstring)."""
    from edgehft.bench.fingerprint import machine_fingerprint
    return {"format": RECORD_FORMAT, "format_version": 1, "version": vid, "manifest_sha256": manifest_sha256,
            "plan": plan, "how": how, "select": select,
            "measured": {p: {k: float(v[k]) for k in FIGURES} for p, v in measured.items()},
            "excluded": {str(p): str(w) for p, w in excluded.items()}, "pinned_cpu": int(pinned_cpu),
            "rounds": int(rounds), "windows": int(windows), "cpu_model": machine_fingerprint()["cpu_model"],
            "utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def check_record(rec, vid: str, manifest_sha256: str, plans: list[str]) -> list[str]:
    """Why ``rec`` (a parsed record) is not a valid plan record for version ``vid`` whose manifest has SHA-256
    ``manifest_sha256`` and carries ``plans`` (empty when it is)."""
    if not isinstance(rec, dict):
        return [f"it is a JSON {type(rec).__name__}, not an object"]
    problems = []
    want = {"format": RECORD_FORMAT, "format_version": 1, "version": vid, "manifest_sha256": manifest_sha256}
    for k, v in want.items():
        if rec.get(k) != v:
            problems.append(f"{k} is {str(rec.get(k))[:80]!r}, expected {v!r}")
    if rec.get("plan") not in plans:
        problems.append(f"plan {str(rec.get('plan'))[:40]!r} is not one of the bundle's plans ({', '.join(plans)})")
    if rec.get("how") not in HOW or rec.get("select") not in SELECTS:
        problems.append(f"how {str(rec.get('how'))[:20]!r} / select {str(rec.get('select'))[:20]!r} are not "
                        f"one of {HOW} / {SELECTS}")
    measured = rec.get("measured")
    if not isinstance(measured, dict) or not all(
            p in plans and isinstance(f, dict) and all(_number(f.get(k)) for k in FIGURES) for p, f in measured.items()):
        problems.append("measured is not {plan of the bundle: {" + ", ".join(FIGURES) + "}} with numbers >= 0")
    elif rec.get("how") == "timed" and rec.get("plan") not in measured:
        problems.append("a timed choice without figures of the plan it chose")
    excluded = rec.get("excluded")
    if not isinstance(excluded, dict) or not all(isinstance(w, str) for w in excluded.values()):
        problems.append("excluded is not {plan: reason}")
    for k in ("pinned_cpu", "rounds", "windows"):
        if not isinstance(rec.get(k), int) or isinstance(rec.get(k), bool) or rec[k] < 0:
            problems.append(f"{k} is not an integer >= 0")
    return problems


def read_record(install_dir: str | Path, vid: str, manifest_sha256: str, plans: list[str]) -> dict | None:
    """The plan record of version ``vid`` in ``install_dir`` (None when the box has none for it).

    Raises:
        BundleError: the record is not a regular file, too large, not JSON, or fails :func:`check_record`
            (exit 6: the box's state is damaged; deploying again writes a new one).
    """
    path = record_path(install_dir, vid)
    if not os.path.lexists(path):
        return None
    hint = ("deploy the bundle again (it times the plans and records one), or name a plan (runtime.open(..., "
            "plan=NAME), --plan NAME)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise BundleError(f"the box's plan record {path} cannot be read ({exc.strerror or exc}; a symlink is "
                          "refused)", hint=hint) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BundleError(f"the box's plan record {path} is not a regular file", hint=hint)
        data = b""
        while len(data) <= MAX_RECORD_BYTES:
            chunk = os.read(fd, MAX_RECORD_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise BundleError(f"the box's plan record {path} cannot be read ({exc.strerror or exc})", hint=hint) from None
    finally:
        os.close(fd)
    try:
        rec = json.loads(data.decode("utf-8")) if len(data) <= MAX_RECORD_BYTES else None
        problems = check_record(rec, vid, manifest_sha256, plans) if rec is not None else ["it is over 1 MiB"]
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        problems = [f"it is not JSON ({type(exc).__name__}: {str(exc)[:80]})"]
    if problems:
        raise BundleError(f"the box's plan record {path} is damaged: " + "; ".join(problems[:3]), hint=hint)
    return rec


def installed_version(bundle_dir: str | Path) -> tuple[Path, str] | None:
    """``(install_dir, vid)`` for a bundle that is a version of a box's install dir (``<dir>/current`` or
    ``<dir>/versions/<vid>``, symlinks resolved), else None."""
    real = Path(bundle_dir).resolve()
    if real.parent.name == "versions" and VID.match(real.name):
        return real.parent.parent, real.name
    return None


def runner_plan(bundle, asked: str | None = None) -> tuple[object, str, str]:
    """Which plan of ``bundle`` (a loaded, verified :class:`~edgehft.bundle.Bundle`) a runner opens:
    ``asked`` by name; else, for a bundle installed on a box, the plan recorded for its version; else the
    bundle's top level.

    Returns:
        ``(the plan's Bundle, its name, how it was chosen)`` (a sentence for people).
    Raises:
        InputError: ``asked`` is not one of the bundle's plans (exit 3, listing them).
        BundleError: the box's record for this version is damaged (:func:`read_record`).
    """
    from edgehft.bundle import MANIFEST, sha256_file
    names = bundle.plan_names()
    if asked is not None:
        return bundle.plan(asked), asked, "asked for by name"
    if len(names) == 1:
        return bundle, names[0], "the bundle's only plan"
    where = installed_version(bundle.path)
    rec = read_record(where[0], where[1], sha256_file(bundle.path / MANIFEST), names) if where else None
    if rec is None:
        return bundle, names[0], "the bundle's top level, the compile host's choice" + (
            " (no plan record on this box for this version)" if where else "")
    how = (f"recorded on this box: the lowest {rec['select']} of {len(rec['measured'])} plans timed there"
           if rec["how"] == "timed" else "recorded on this box: forced at deploy")
    return bundle.plan(rec["plan"]), rec["plan"], how
