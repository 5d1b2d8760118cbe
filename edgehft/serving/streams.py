"""The streaming side of the server (issue 17 with issue 21): ``push(row)`` answers from the active version's
stream (``runner.stream()``), and a swap keeps every stream's window right.

A stream's output depends on its last T rows, so a version can take over only with the same window as the one
it replaces. The server keeps a **row log**: each push appends ``(seq, row, output)`` (copies) once the log is on
(from the first shadow run). The manager thread feeds the log's rows, in order, to the streams it keeps current:
the candidate during its shadow run (its outputs compared with the logged outputs of the active version, once its
window is full) and, after a swap, the previous version's stream (so a rollback needs no replay). A switch of
the stream that answers is a **handoff**: the manager stops feeding that stream and publishes it with the next
row it lacks; the caller's next ``push`` first pushes it the logged rows from there (a few: what the manager had
not fed yet), then makes it the active stream and hands the one it replaces to the manager to keep current. So
no stream is ever used by two threads at once, every stream sees every row once and in order, and the caller
never waits on the manager.
"""
from __future__ import annotations

import collections
import threading
import time

import numpy as np


class RowLog:
    """``(seq, row, output)`` entries from the caller's pushes; consumers read from a sequence number on, the
    manager trims what every consumer has seen. ``limit``: entries kept at most (a consumer that falls further
    behind is dropped: :meth:`behind`)."""

    def __init__(self, limit: int = 100_000):
        self.entries, self.next_seq, self.limit = collections.deque(), 0, int(limit)
        self._lock = threading.Lock()         # held for an append, a snapshot or a trim: never long

    def append(self, row, out) -> None:
        with self._lock:
            self.entries.append((self.next_seq, row, out))
            self.next_seq += 1

    def since(self, seq: int) -> list:
        """Entries with sequence number >= ``seq`` (a snapshot)."""
        with self._lock:
            snap = list(self.entries)
        return [e for e in snap if e[0] >= seq]

    def trim(self, keep_from: int) -> None:
        with self._lock:
            while self.entries and self.entries[0][0] < keep_from:
                self.entries.popleft()

    def behind(self, seq: int) -> bool:
        return self.next_seq - seq > self.limit


class Feed:
    """A stream the manager keeps current: the next sequence number it needs; with ``compare`` its outputs are
    paired with the logged ones (the shadow run)."""

    def __init__(self, version, stream, seq: int, compare: bool):
        self.version, self.stream, self.seq, self.compare = version, stream, seq, compare
        self.pairs, self.lat = [], []

    def take(self, entries) -> None:
        for seq, row, want in entries:
            if seq < self.seq:
                continue
            t0 = time.perf_counter_ns()
            got = self.stream.push(row)
            dt = time.perf_counter_ns() - t0
            self.stream.prepare()
            self.seq = seq + 1
            if self.compare and got is not None and want is not None:
                self.pairs.append(((want,), (got.copy(),)))
                self.lat.append(dt)


class StreamLane:
    """What :class:`~edgehft.serving.server.Server` holds in stream mode (see the module docstring)."""

    def __init__(self, stream):
        self.stream = stream                  # the active version's stream: the caller's
        self.log: RowLog | None = None
        self.handoff = None                   # (version, stream, seq): the caller's next push takes it
        self.taken = collections.deque()      # (version, stream, seq) the caller handed back to the manager
        self.feeds: list = []                 # manager-side: the Feeds it keeps current (shadow, previous)

    def push(self, row):
        """The caller's push (see the module docstring)."""
        h = self.handoff
        if h is not None:
            self._take(h)
        y = self.stream.push(row)
        log = self.log
        if log is not None:
            log.append(np.array(row, copy=True), None if y is None else y.copy())
        return y

    def _take(self, h) -> None:
        stream, seq, old_version = h
        for _, row, _ in self.log.since(seq):
            stream.push(row)
        old, self.stream = self.stream, stream
        self.handoff = None
        self.taken.append((old_version, old, self.log.next_seq))

    # --- the manager's side ------------------------------------------------------------------------------
    def start_log(self) -> None:
        """From now on every push is logged."""
        if self.log is None:
            self.log = RowLog()

    def feed(self) -> None:
        """Push the logged rows each of :attr:`feeds` (the streams the manager keeps current) lacks into it, then
        trim what none of them, nor a handoff the caller has not taken, needs any more."""
        if self.log is None:
            return
        feeds = list(self.feeds)
        entries = self.log.since(min([f.seq for f in feeds] + self._held()))
        for f in feeds:
            f.take(entries)
        self.log.trim(min([f.seq for f in feeds] + self._held()))

    def _held(self) -> list:
        """Sequence numbers the log must keep from beside the feeds': a handoff not taken yet, streams the caller
        handed back that the manager has not registered yet, and the next row."""
        h = self.handoff
        return ([h[1]] if h is not None else []) + [t[2] for t in list(self.taken)] + [self.log.next_seq]

    def hand_over(self, stream, seq: int, old_version) -> None:
        """Publish ``stream`` (it has seen every logged row before ``seq``) for the caller's next push."""
        self.handoff = (stream, seq, old_version)

    def taken_back(self) -> list:
        """``[(version, stream, seq)]`` the caller handed back since the last call (the streams it replaced)."""
        out = []
        while self.taken:
            out.append(self.taken.popleft())
        return out
