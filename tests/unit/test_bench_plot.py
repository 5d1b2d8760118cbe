"""bench --plot (issue 19): the PNG shows the body of the distribution (log-x histogram) and the tail
(HdrHistogram-style percentile curve), the percentiles asked for named in legends."""
import numpy as np
import pytest

from edgehft.bench.replay import histogram_png

pytest.importorskip("matplotlib")


class _Result:
    def __init__(self, ns):
        self.latency_ns = ns


def test_plot_marks_the_percentiles_asked_for_and_is_two_panels(tmp_path):
    ns = np.random.default_rng(0).lognormal(np.log(40e3), 0.2, 20_000).astype(np.int64)
    png = tmp_path / "lat.png"
    marks = histogram_png(_Result(ns), str(png), "synthetic", (50, 99, 99.99), what="push")
    assert [p for p, _ in marks] == [50, 99, 99.99]
    assert np.allclose([v for _, v in marks], np.percentile(ns / 1e3, [50, 99, 99.99]))
    from matplotlib.image import imread
    h, w = imread(str(png)).shape[:2]
    assert (w, h) == (1210, 495)                      # 11 x 4.5 inches at 110 dpi: the two panels side by side


def test_plot_of_identical_samples_still_draws(tmp_path):
    """All calls the same (a coarse clock): no zero-width bin range, no log of zero."""
    png = tmp_path / "flat.png"
    marks = histogram_png(_Result(np.full(100, 5_000, np.int64)), str(png), "flat")
    assert png.stat().st_size > 1000 and all(v == 5.0 for _, v in marks)


def test_a_profile_column_with_one_value_becomes_a_note():
    """The per-step profile at 80 columns (issue 19): `placement` the same on every step is said once under the
    table instead of filling a column."""
    from rich.console import Console
    from edgehft.bench.profile import print_profile
    seg = lambda i, what: {"index": i, "placement": "native", "what": what, "ops": [i],      # noqa: E731
                           "us": {"p50": 1.0 + i, "p90": 2.0 + i}, "share": 0.5}
    console = Console(width=80, record=True)
    print_profile({"segments": [seg(0, "conv2d"), seg(1, "lstm")], "rounds": 9, "sum_p50_us": 3.0}, console)
    text = console.export_text()
    assert "every step: placement native" in text and "placement │" not in text and "conv2d" in text
