"""DeepLOB feature pipeline: Binance raw depth feed -> 100x40 limit-order-book windows.

This file is the model's *feature pipeline*: ``edgehft compile --features features.py:windows_from_feed``
(or the sidecar ``deeplob.edgehft.toml``) makes edgehft call it on raw feed files, and the bundle carries a
copy so ``edgehft run/bench`` on the box can replay raw feeds too. It needs numpy only.

Input format (the hftbacktest captures in ``data/``): gzip text, one message per line,
``<local receive timestamp> <JSON>``; the timestamp is ns (µs in 2023 ``.dat.gz`` files, detected by
magnitude). A depth stream (``<sym>@depth@0ms`` or ``@depth@100ms``) of diff updates and one REST
snapshot line (``lastUpdateId``, ``bids``, ``asks``) per capture day. Files passed together are one
continuous stream, in the order given.

Book rebuild follows Binance's documented procedure: drop diffs with ``u`` < ``lastUpdateId``; the first
applied diff must straddle the snapshot; later diffs must chain (``pu`` == previous ``u`` on futures,
``U`` == previous ``u`` + 1 on spot). A quantity of 0 removes the level. A broken chain is counted and no
window spans it.

Each applied diff is one *event*; after it the top 10 levels give one row of 40 features in DeepLOB's
order ``[ask_price_1, ask_size_1, bid_price_1, bid_size_1, ..., level 10]``. Per window (causal, only the
window's own rows): prices become basis points from the window's last mid, sizes become log1p(size);
each group is then z-scored over the window. Labels follow DeepLOB (Zhang et al. 2019, eq. 3-4):
``l = (m+ - m-) / m-`` with m-/m+ the mean mid over the previous/next ``HORIZON`` events;
0 = up (l > ALPHA), 1 = stationary, 2 = down (l < -ALPHA).
"""
from __future__ import annotations

import gzip
import heapq
import json
from collections import deque
from pathlib import Path

import numpy as np

LEVELS = 10
WINDOW = 100
HORIZON = 100          # events
ALPHA = 0.5e-4         # 0.5 basis point
_EPS = 1e-6


class FeedError(ValueError):
    """The feed cannot be turned into windows (no snapshot, no depth stream, too few events)."""


def _open_text(path: Path):
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path, "rt")


def _top_levels(bids: dict, asks: dict):
    """One 40-feature row from the current book, or None when a side is short or the book is crossed."""
    if len(bids) < LEVELS or len(asks) < LEVELS:
        return None
    top_b = heapq.nlargest(LEVELS, bids)
    top_a = heapq.nsmallest(LEVELS, asks)
    if top_b[0] >= top_a[0]:
        return None
    row = np.empty(4 * LEVELS)
    row[0::4] = top_a
    row[1::4] = [asks[p] for p in top_a]
    row[2::4] = top_b
    row[3::4] = [bids[p] for p in top_b]
    return row


def read_book_events(paths) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rebuild the 10-level book after every depth diff.

    Args:
        paths: one path or a list of paths (str or Path), read as one continuous stream.
    Returns:
        ``(rows, t_ns, mid, segment)``: rows float64 (E, 40) raw prices and sizes in DeepLOB order,
        t_ns int64 (E,) local receive time in ns, mid float64 (E,), segment int32 (E,) which increases
        at every broken diff chain.
    Raises:
        FeedError: no snapshot before the first diff, no depth stream, or a malformed line.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    bids: dict[float, float] = {}
    asks: dict[float, float] = {}
    last_id = None          # lastUpdateId of the snapshot, until synced
    prev_u = None
    segment = 0
    early = deque(maxlen=4096)   # diffs received before the snapshot, replayed once it arrives
    rows, times, seg = [], [], []
    for path in map(Path, paths):
        with _open_text(path) as fh:
            for lineno, line in enumerate(fh, 1):
                ts_text, _, body = line.partition(" ")
                if not body:
                    continue
                try:
                    ts = int(ts_text)
                    msg = json.loads(body)
                except ValueError as exc:
                    raise FeedError(f"{path}:{lineno}: not '<timestamp> <json>': {exc}") from exc
                if ts < 10**17:          # µs capture (2023 files)
                    ts *= 1000
                if "lastUpdateId" in msg:
                    bids = {float(p): float(q) for p, q in msg["bids"]}
                    asks = {float(p): float(q) for p, q in msg["asks"]}
                    last_id, prev_u = msg["lastUpdateId"], None
                    pending = [(t, d) for t, d in early if d["u"] >= last_id]
                    early.clear()
                elif "@depth" in msg.get("stream", ""):
                    pending = [(ts, msg["data"])]
                else:
                    continue
                for ts_d, d in pending:
                    if last_id is None and prev_u is None:
                        early.append((ts_d, d))           # no snapshot yet: keep for replay
                        continue
                    if prev_u is None:                    # first diff after a snapshot
                        if d["u"] < last_id:
                            continue
                        if d["U"] > last_id + 1:          # diffs missing between snapshot and stream
                            segment += 1
                    elif not (d["pu"] == prev_u if "pu" in d else d["U"] == prev_u + 1):
                        segment += 1                      # broken chain
                    prev_u, last_id = d["u"], None
                    for side, book in (("b", bids), ("a", asks)):
                        for p, q in d[side]:
                            p, q = float(p), float(q)
                            if q == 0.0:
                                book.pop(p, None)
                            else:
                                book[p] = q
                    row = _top_levels(bids, asks)
                    if row is not None:
                        rows.append(row)
                        times.append(ts_d)
                        seg.append(segment)
    if not rows:
        raise FeedError(f"no book events in {[str(p) for p in paths]}: the feed needs a depth stream "
                        "and a REST snapshot line ('lastUpdateId') before the first diff; if this file "
                        "continues an earlier capture, pass the earlier file (with the snapshot) first")
    rows = np.asarray(rows)
    mid = (rows[:, 0] + rows[:, 2]) / 2.0
    return rows, np.asarray(times, dtype=np.int64), mid, np.asarray(seg, dtype=np.int32)


def normalize_windows(rows: np.ndarray, mid: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Windows of WINDOW rows ending at each index in ``ends``, normalized as the module doc says.

    Returns float32 (len(ends), WINDOW, 40, 1).
    """
    out = np.empty((len(ends), WINDOW, 4 * LEVELS), dtype=np.float32)
    offsets = np.arange(WINDOW - 1, -1, -1)[None, :]
    for lo in range(0, len(ends), 2048):
        e = ends[lo:lo + 2048]
        w = rows[e[:, None] - offsets]                       # (n, 100, 40) float64
        ref = mid[e][:, None, None]
        groups = ((w[:, :, 0::2] - ref) * (1e4 / ref),       # bps from the window's last mid
                  np.log1p(w[:, :, 1::2]))
        for k, g in enumerate(groups):
            mu = g.mean(axis=(1, 2), keepdims=True)
            sd = g.std(axis=(1, 2), keepdims=True)
            out[lo:lo + 2048, :, k::2] = (g - mu) / (sd + _EPS)
    return out[..., None]


def label_moves(mid: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """DeepLOB smoothed mid-price labels for the event at each index of ``ends`` (int64: 0 up, 1 flat, 2 down)."""
    c = np.concatenate([[0.0], np.cumsum(mid)])
    m_minus = (c[ends + 1] - c[ends + 1 - HORIZON]) / HORIZON
    m_plus = (c[ends + 1 + HORIZON] - c[ends + 1]) / HORIZON
    l = (m_plus - m_minus) / m_minus
    return np.where(l > ALPHA, 0, np.where(l < -ALPHA, 2, 1)).astype(np.int64)


def windows_from_feed(paths, labels: bool = False) -> dict:
    """The pipeline edgehft calls: raw Binance depth capture(s) -> model-input windows.

    Args:
        paths: a path or list of paths, read in order as one stream.
        labels: also return DeepLOB labels (drops the last HORIZON events, which have no future).
    Returns:
        dict with ``x`` float32 (N, 100, 40, 1), ``t_ns`` int64 (N,) receive time of each window's last
        event, and with ``labels=True`` also ``y`` int64 (N,).
    Raises:
        FeedError: as :func:`read_book_events`, or fewer than WINDOW events.
    """
    rows, t_ns, mid, seg = read_book_events(paths)
    n = len(rows)
    last = n - HORIZON if labels else n
    ends = np.arange(WINDOW - 1, max(last, WINDOW - 1))
    ends = ends[seg[ends] == seg[ends - (WINDOW - 1)]]      # no window spans a broken chain
    if labels and len(ends):
        ends = ends[seg[ends] == seg[ends + HORIZON]]
    if len(ends) == 0:
        raise FeedError(f"only {n} book events: a window needs {WINDOW}"
                        + (f" plus {HORIZON} for the label" if labels else ""))
    out = {"x": normalize_windows(rows, mid, ends), "t_ns": t_ns[ends]}
    if labels:
        out["y"] = label_moves(mid, ends)
    return out
