"""The kernel entry points the streaming chain executor (edgehft/streaming/chain.py) relies on: a conv or pool over
a slab of a window's rows with explicit padding gives exactly those rows of the whole-window call, and an LSTM's
steps run in pieces give the whole recurrence's bits. On every dispatch target this CPU runs."""
from __future__ import annotations

import numpy as np
import pytest

from edgehft.errors import ShapeError
from edgehft.kernels.cpu.build import force_target
from edgehft.kernels.cpu.conv import NativeConv2D, geometry, supported
from edgehft.kernels.cpu.lstm import NativeLSTM
from edgehft.kernels.cpu.ops import NativeMaxPool2D
from native_reference import cpu_targets

pytestmark = pytest.mark.needs("g++")


def test_explicit_padding_geometry():
    """(top, bottom, left, right) gives TFLite's output size; SAME's pads written out give SAME's geometry; a
    leading pad as large as the kernel and negative pads are refused."""
    assert geometry((100, 20), (4, 1), (1, 1), "SAME") == (100, 20, 1, 0)
    assert geometry((100, 20), (4, 1), (1, 1), (1, 2, 0, 0)) == (100, 20, 1, 0)
    assert geometry((7, 40), (1, 2), (1, 2), (0, 0, 0, 0)) == (7, 20, 0, 0)
    assert geometry((5, 8), (3, 3), (1, 1), (2, 0, 1, 1)) == (5, 8, 2, 1)      # causal in time
    assert "smaller than the kernel" in supported((5, 8), (3, 3), (1, 1), (3, 0, 0, 0))
    with pytest.raises(ShapeError, match=">= 0"):
        geometry((5, 8), (3, 3), (1, 1), (-1, 0, 0, 0))


def _slab_rows(full_rows, a, b, pt, k):
    lo, hi = max(0, a - pt), min(full_rows, b - pt + k - 1)
    return lo, hi, lo - (a - pt), (b - pt + k - 1) - hi


@pytest.mark.parametrize("target", cpu_targets())
def test_conv_and_pool_rows_from_a_slab_equal_the_whole_window(target):
    """A 4x1 SAME conv (+ leaky relu) and a 3x1 SAME max pool on a 30 x 10 x 8 window: the top 2 rows, an interior
    run and the bottom 5 rows, each computed from only the input rows they read with the window's edges as
    explicit padding, are np.array_equal to those rows of the whole-window call."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((30, 10, 8)).astype(np.float32)
    w = rng.standard_normal((16, 4, 1, 8)).astype(np.float32)
    bias = rng.standard_normal(16).astype(np.float32)
    with force_target(target):
        full = NativeConv2D(w, bias, (30, 10), 8, (1, 1), "SAME", activation="leaky_relu", alpha=0.01)
        want = full.run(x)[0].copy()
        pool_want = NativeMaxPool2D((30, 10), 8, (3, 1), (1, 1), "SAME").run(x[None])[0].copy()
        for a, b in ((0, 2), (11, 17), (25, 30)):
            lo, hi, top, bottom = _slab_rows(30, a, b, 1, 4)
            k = NativeConv2D(w, bias, (hi - lo, 10), 8, (1, 1), (top, bottom, 0, 0), activation="leaky_relu",
                             alpha=0.01)
            assert np.array_equal(k.run(x[lo:hi])[0], want[a:b]), (target, a, b)
            lo, hi, top, bottom = _slab_rows(30, a, b, 1, 3)
            p = NativeMaxPool2D((hi - lo, 10), 8, (3, 1), (1, 1), (top, bottom, 0, 0))
            assert np.array_equal(p.run(x[lo:hi][None])[0], pool_want[a:b]), (target, a, b)


@pytest.mark.parametrize("target", [t for t in cpu_targets() if t not in ("amx", "avx3_bf16")])
def test_lstm_steps_in_pieces_equal_the_whole_recurrence(target):
    """A projected LSTM(24) over 40 steps: steps 0-26 then 27-39 (two calls), and 0-39 in one, give the last h of
    the whole run bit for bit; a call that does not continue the previous one is refused."""
    rng = np.random.default_rng(9)
    T, F, H = 40, 12, 24
    W = (0.3 * rng.standard_normal((F, 4 * H))).astype(np.float32)
    U = (0.3 * rng.standard_normal((H, 4 * H))).astype(np.float32)
    b = (0.1 * rng.standard_normal(4 * H)).astype(np.float32)
    g = rng.standard_normal((T, 4 * H)).astype(np.float32)
    with force_target(target):
        k = NativeLSTM([(W, U, b)], T, True, cell_clip=3.0).projected()
    last = k.run(g)[-1].copy()
    h = np.zeros(H, np.float32)
    k.steps(g[:27], 0)
    k.steps(g[27:], 27, h)
    assert np.array_equal(h, last)
    h[:] = 0
    k.steps(g, 0, h)
    assert np.array_equal(h, last)
    with pytest.raises(ShapeError, match="continuing"):
        k.steps(g[5:9], 5)
    with pytest.raises(ShapeError, match="continuing"):
        k.steps(g[:30], 20)


def test_activation_and_pad_kernels():
    """TANH / LOGISTIC give the same bits on every target, within 2 fp32 ulps of float64's; PAD writes zeros
    around the rows, also for an input of no rows (padding only)."""
    from edgehft.kernels.cpu.ops import NativeActivation, NativePad
    x = (3 * np.random.default_rng(2).standard_normal((7, 9))).astype(np.float32)
    got = {}
    for t in cpu_targets():
        with force_target(t):
            got[t] = [NativeActivation((7, 9), kind).run(x).copy() for kind in ("tanh", "logistic")]
    first = next(iter(got.values()))
    assert all(np.array_equal(a, b) for v in got.values() for a, b in zip(v, first))
    x64 = x.astype(np.float64)
    for y, want in zip(first, (np.tanh(x64), 1 / (1 + np.exp(-x64)))):
        assert np.abs(y - want).max() <= 2 * np.finfo(np.float32).eps
    y = NativePad((3, 2), 4, (1, 2, 1, 0)).run(np.ones((3, 2, 4), np.float32))
    assert y.shape == (1, 6, 3, 4) and y.sum() == 24 and y[0, 1:4, 1:, :].min() == 1
    assert not NativePad((0, 2), 4, (2, 0, 0, 0)).run(np.zeros(0, np.float32)).any()
    with pytest.raises(ShapeError):
        NativeActivation((3,), "relu")
