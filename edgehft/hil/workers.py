"""The HIL plugin under pytest-xdist (``-n N``), with xdist's own mechanism: each worker puts what it found (its
check results, the target it opened, a board found unavailable) into ``config.workeroutput``; the controller gets
it back as ``node.workeroutput`` in ``pytest_testnodedown`` and merges it, so that the ``--edgehft-json`` report and
the terminal summary, written by the controller, have every check from every worker.

Whether a timed check ran beside other tests is measured, not assumed: the controller keeps when each test phase
ran on which worker (the reports' ``start`` / ``stop``, :class:`Timeline`, with each worker's start-up and
finish) and, for each timed check, names what other workers ran while it was timing (:func:`concurrency_note`). They ran alone when the session holds only
the built-in checks and ``--dist loadfile`` keeps those on one worker (they share the scope ``edgehft``; they also
carry the ``xdist_group`` marker :data:`GROUP` for ``--dist loadgroup``). Without xdist nothing here does anything.
"""
from __future__ import annotations

import json
import time

import pytest

KEY = "edgehft"          # the key of config.workeroutput that carries the plugin's payload
GROUP = "edgehft"        # the xdist_group of the built-in checks (one worker under --dist loadgroup)


def worker_id(config) -> str | None:
    """This process's xdist worker id (``gw0``, ``gw1``, ...), or None in the controller or without xdist."""
    return (getattr(config, "workerinput", None) or {}).get("workerid")


def worker_count(config) -> int:
    """How many xdist workers the session has, seen from a worker (1 without xdist, and in the controller)."""
    return int((getattr(config, "workerinput", None) or {}).get("workercount", 1))


def xdist_active(config) -> bool:
    """True when pytest-xdist is loaded: the built-in checks then get the ``xdist_group`` marker."""
    return config.pluginmanager.has_plugin("xdist")


class Timeline:
    """In the controller: when each test phase (setup, call, teardown) ran, on which worker, from the reports
    the workers send (``report.node`` is the worker; ``start`` / ``stop`` are wall-clock seconds). Registered as
    a pytest plugin; without xdist the reports have no worker and nothing is kept."""

    def __init__(self):
        self.spans: list[tuple[str, str, float, float]] = []      # (worker, nodeid or what it did, start, stop)
        self._started: dict[str, float] = {}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_newgateway(self, gateway) -> None:
        """A worker starts (its Python, imports, then collection: busy before its first test)."""
        self._started[gateway.id] = time.time()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        """A worker has collected: its start-up is a span too (``gw1 starting and collecting tests``)."""
        wid = node.gateway.id
        if wid in self._started:
            self.spans.append((wid, f"{wid} starting and collecting tests", self._started.pop(wid), time.time()))

    def add(self, report) -> None:
        """Record one report's phase (reports without a worker or a time are left out)."""
        gateway = getattr(getattr(report, "node", None), "gateway", None)
        start, stop = getattr(report, "start", 0) or 0, getattr(report, "stop", 0) or 0
        if gateway is not None and stop > 0:
            self.spans.append((gateway.id, report.nodeid, float(start), float(stop)))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """A worker is done: from its last test to now it tore down and finished its session (a span too)."""
        wid, now = node.gateway.id, time.time()
        last = max((b for w, _, _, b in self.spans if w == wid), default=None)
        if last is not None:
            self.spans.append((wid, f"{wid} finishing its session", last, now))

    def pytest_runtest_logreport(self, report) -> None:
        """The hook (the plugin registers the timeline with pytest): :meth:`add` every report."""
        self.add(report)

    def beside(self, worker: str, start: float, stop: float) -> list[str]:
        """The tests other workers ran between ``start`` and ``stop`` (node ids, sorted, each once)."""
        return sorted({n for w, n, a, b in self.spans if w != worker and a < stop and b > start})


def concurrency_note(beside: list[str], workers: int) -> str | None:
    """The words a timed check's figures get when other xdist workers ran ``beside`` it (None when nothing ran
    beside it): the first few things they ran, and how many more."""
    if not beside:
        return None
    names = ", ".join(beside[:3]) + (f" and {len(beside) - 3} more" if len(beside) > 3 else "")
    return f"measured under pytest-xdist ({workers} workers) while other workers ran {names}"


ADVICE = ("for figures that hold, run the timed checks alone: -n 0, or only the edgehft checks selected "
          "(-m edgehft_board) with --dist loadfile, which keeps them on one worker")


def send(config, payload: dict) -> None:
    """In a worker: hand ``payload`` (JSON-able) to the controller through ``config.workeroutput``."""
    out = getattr(config, "workeroutput", None)
    if out is not None:
        out[KEY] = json.dumps(payload)          # a string: execnet carries only plain Python types


def received(node) -> dict | None:
    """In the controller: the payload a worker sent with :func:`send` (None when it sent none, e.g. it
    crashed)."""
    raw = (getattr(node, "workeroutput", None) or {}).get(KEY)
    return json.loads(raw) if raw else None
