"""The DeepLOB feature pipeline on the shipped real Binance COIN-M capture."""
import sys

import numpy as np
import pytest

from conftest import DEEPLOB, FEED_DAY1, FEED_DAY2

sys.path.insert(0, str(DEEPLOB))
import features  # noqa: E402

sys.path.remove(str(DEEPLOB))


def test_book_rebuild_from_snapshot_and_diffs():
    rows, t_ns, mid, seg = features.read_book_events([FEED_DAY1])
    assert rows.shape == (26824, 40)
    # first event: the snapshot (best bid 61804.7 x 35) with the buffered diffs replayed on top
    assert rows[0, :4].tolist() == [61804.8, 1645.0, 61804.7, 35.0]
    assert t_ns[0] == 1723161256578729165
    assert seg.max() == 0                                   # the diff chain never breaks
    assert np.all(rows[:, 0] > rows[:, 2])                  # never crossed
    assert np.all(np.diff(rows[:, 0::4], axis=1) > 0)       # asks ascending
    assert np.all(np.diff(rows[:, 2::4], axis=1) < 0)       # bids descending


def test_two_days_are_one_stream():
    rows, _, _, seg = features.read_book_events([FEED_DAY1, FEED_DAY2])
    assert len(rows) == 44772 and seg.max() == 0


def test_windows_and_labels():
    d = features.windows_from_feed([FEED_DAY1], labels=True)
    assert d["x"].shape == (26625, 100, 40, 1) and d["x"].dtype == np.float32
    assert np.bincount(d["y"]).tolist() == [4065, 17292, 5268]
    w = d["x"][0, :, :, 0]
    assert abs(w[:, 0::2].mean()) < 1e-5 and abs(w[:, 0::2].std() - 1) < 1e-4
    assert np.all(np.diff(d["t_ns"]) >= 0)


def test_day_two_alone_has_no_snapshot():
    with pytest.raises(features.FeedError, match="snapshot"):
        features.windows_from_feed([FEED_DAY2])
