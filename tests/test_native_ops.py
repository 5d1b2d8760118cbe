"""edgehft's native MAX_POOL_2D and CONCATENATION (edgehft/kernels/cpu_ops.cpp): exact against numpy
versions of the TFLite reference kernels."""
import numpy as np
import pytest

from edgehft.errors import DTypeError, ShapeError
from edgehft.kernels.native_conv import geometry
from edgehft.kernels.native_ops import NativeConcat, NativeMaxPool2D

pytestmark = pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="needs g++")


def reference_maxpool(x, f, stride, padding, act="none"):
    """TFLite MAX_POOL_2D: max over the window clipped to the input. x (H, W, C) -> (Ho, Wo, C)."""
    H, W, C = x.shape
    Ho, Wo, ph, pw = geometry((H, W), f, stride, padding)
    y = np.empty((Ho, Wo, C), np.float32)
    for oy in range(Ho):
        for ox in range(Wo):
            y0, x0 = oy * stride[0] - ph, ox * stride[1] - pw
            win = x[max(y0, 0):min(y0 + f[0], H), max(x0, 0):min(x0 + f[1], W)]
            y[oy, ox] = win.max(axis=(0, 1))
    return {"none": y, "relu": np.maximum(y, 0), "relu6": np.clip(y, 0, 6), "relu_n1_to_1": np.clip(y, -1, 1)}[act]


@pytest.mark.parametrize("case", [((100, 1, 64), (3, 1), (1, 1), "SAME"), ((28, 28, 3), (2, 2), (2, 2), "VALID"),
                                  ((13, 11, 5), (3, 3), (2, 2), "SAME"), ((7, 9, 16), (7, 2), (1, 3), "VALID")])
def test_maxpool_is_exact(case):
    (H, W, C), f, stride, padding = case
    x = np.random.default_rng(H).standard_normal((1, H, W, C)).astype(np.float32) - 2.0   # mostly negative
    for act in ("none", "relu", "relu6"):
        y = NativeMaxPool2D((H, W), C, f, stride, padding, act).run(x)
        np.testing.assert_array_equal(y[0], reference_maxpool(x[0], f, stride, padding, act))


def test_concat_is_exact_on_every_axis():
    rng = np.random.default_rng(1)
    for axis, shapes in ((3, [(1, 100, 1, 64), (1, 100, 1, 32), (1, 100, 1, 64)]), (1, [(1, 3, 4), (1, 5, 4)]),
                         (-1, [(2, 3), (2, 1)]), (0, [(2, 3), (4, 3)])):
        xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        cat = NativeConcat(shapes, axis)
        np.testing.assert_array_equal(cat.run(xs), np.concatenate(xs, axis))
        assert cat.run(xs) is cat.out


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
