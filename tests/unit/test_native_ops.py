"""edgehft's native MAX_POOL_2D, CONCATENATION, FULLY_CONNECTED and SOFTMAX (edgehft/kernels/cpu/cpu_ops.cpp),
and the chain's slice views: against numpy versions of the TFLite reference kernels (pool and concat
exactly, the fp32 sums to fp32 rounding)."""
import numpy as np
import pytest

from edgehft.errors import DTypeError, ShapeError
from edgehft.kernels.cpu.build import force_target
from edgehft.kernels.cpu.ops import NativeConcat, NativeDense, NativeMaxPool2D, NativeSoftmax
from native_reference import cpu_targets, reference_maxpool, simd_target

TARGETS = cpu_targets()      # every dispatch target this CPU runs: pool and dense run each one's SIMD code

pytestmark = pytest.mark.needs("g++")


@pytest.mark.parametrize("case", [((100, 1, 64), (3, 1), (1, 1), "SAME"), ((28, 28, 3), (2, 2), (2, 2), "VALID"),
                                  ((13, 11, 5), (3, 3), (2, 2), "SAME"), ((7, 9, 16), (7, 2), (1, 3), "VALID")])
@pytest.mark.parametrize("target", TARGETS)
def test_maxpool_is_exact(case, target):
    (H, W, C), f, stride, padding = case
    x = np.random.default_rng(H).standard_normal((1, H, W, C)).astype(np.float32) - 2.0   # mostly negative
    for act in ("none", "relu", "relu6"):
        with force_target(target):
            pool = NativeMaxPool2D((H, W), C, f, stride, padding, act)
        assert pool.isa == simd_target(target)
        y = pool.run(x)
        np.testing.assert_array_equal(y[0], reference_maxpool(x[0], f, stride, padding, act))


def test_concat_is_exact_on_every_axis():
    rng = np.random.default_rng(1)
    for axis, shapes in ((3, [(1, 100, 1, 64), (1, 100, 1, 32), (1, 100, 1, 64)]), (1, [(1, 3, 4), (1, 5, 4)]),
                         (-1, [(2, 3), (2, 1)]), (0, [(2, 3), (4, 3)])):
        xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        cat = NativeConcat(shapes, axis)
        np.testing.assert_array_equal(cat.run(xs), np.concatenate(xs, axis))
        assert cat.run(xs) is cat.out


@pytest.mark.parametrize("target", TARGETS)
def test_dense_matches_float64(target):
    rng = np.random.default_rng(2)
    for rows, N, M in ((1, 64, 3), (5, 100, 1), (3, 17, 40)):
        w = rng.standard_normal((M, N)).astype(np.float32)
        b = rng.standard_normal(M).astype(np.float32)
        x = rng.standard_normal((rows, N)).astype(np.float32)
        for act, f in (("none", lambda v: v), ("relu", lambda v: np.maximum(v, 0))):
            with force_target(target):
                y = NativeDense(w, b, rows, activation=act).run(x)
            ref = f(x.astype(np.float64) @ w.T.astype(np.float64) + b)
            mag = np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64) + np.abs(b)
            assert y.shape == (rows, M) and (np.abs(y - ref) <= 1e-6 * mag).all()
    d = NativeDense(np.ones((2, 3)), None, 4, out_shape=(2, 2, 2))            # rows of a (.., N) input
    np.testing.assert_array_equal(d.run(np.ones((1, 4, 3), np.float32)), np.full((2, 2, 2), 3.0))


def test_softmax_matches_float64():
    x = (np.random.default_rng(4).standard_normal((2, 7, 5)) * 20).astype(np.float32)
    for beta in (1.0, 0.3):
        z = np.exp(beta * (x.astype(np.float64) - x.max(-1, keepdims=True)))
        ref = z / z.sum(-1, keepdims=True)
        y = NativeSoftmax(x.shape, beta).run(x)
        assert np.abs(y - ref).max() < 1e-6 and np.allclose(y.sum(-1), 1, atol=1e-6)


def test_slice_views_follow_numpy():
    from edgehft.runtime.native_chain import _view_of
    x = np.arange(2 * 100 * 64, dtype=np.float32).reshape(2, 100, 64)
    last = [{"start": None, "stop": None, "step": 1}, {"index": -1}, {"start": None, "stop": None, "step": 1}]
    v = _view_of(x, last, (2, 64))
    np.testing.assert_array_equal(v, x[:, -1, :])
    one = [{"index": 1}, {"start": 10, "stop": 12, "step": 1}, {"start": None, "stop": None, "step": 1}]
    v = _view_of(x, one, (1, 2, 64))
    assert np.shares_memory(v, x) and v.flags.c_contiguous and np.array_equal(v[0], x[1, 10:12])


def test_bad_input_is_refused():
    with pytest.raises(ShapeError, match="empty output"):
        NativeMaxPool2D((2, 2), 3, (3, 3))
    with pytest.raises(ShapeError, match="activation"):
        NativeMaxPool2D((4, 4), 3, (2, 2), activation="tanh")
    with pytest.raises(ShapeError, match="differ off axis"):
        NativeConcat([(1, 3, 4), (1, 3, 5)], 1)
    with pytest.raises(ShapeError, match="out of range"):
        NativeConcat([(1, 3)], 2)
    cat = NativeConcat([(2, 3), (2, 1)], 1)
    with pytest.raises(ShapeError, match="1 inputs, the concat takes 2"):
        cat.run([np.zeros((2, 3), np.float32)])
    with pytest.raises(DTypeError):
        cat.run([np.zeros((2, 3)), np.zeros((2, 1), np.float32)])
    with pytest.raises(ShapeError, match="input shape"):
        NativeMaxPool2D((4, 4), 3, (2, 2)).run(np.zeros((1, 4, 4, 2), np.float32))
