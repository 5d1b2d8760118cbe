"""The native CPU LSTM kernel (edgehft/kernels/cpu/cpu_lstm.cpp via edgehft.kernels.cpu.lstm).

Bounds. The kernel computes in fp32 with Eigen's rational tanh (max |error| 3.1e-7) and
sigmoid = 0.5 + 0.5*tanh(x/2) (1.8e-7); h = o*tanh(c) lies in [-1, 1] and the forget gate is < 1, so
activation errors do not grow over the steps. Measured against a float64 LSTM on the shapes below the
largest difference is ~2e-7; the tests assert 2e-6 (10x headroom for other CPUs' / compilers' fp32 sums).
LiteRT's float kernel and Keras use their own fp32 tanh/sigmoid and sum orders, so against them the same
2e-6 bound holds (measured ~5e-7): tests/compile/test_native_lstm_keras.py checks it there.
"""
from __future__ import annotations

import numpy as np
import pytest

from edgehft.errors import BoardUnavailableError, DTypeError, InputError, ShapeError
from edgehft.kernels.cpu import lstm as native_lstm
from edgehft.kernels.cpu.build import force_target
from edgehft.kernels.cpu.lstm import NativeLSTM, activations
from native_reference import BOUND, SAT_BOUND, bf16, cpu_targets, reference_lstm, sigmoid, simd_target

TARGETS = cpu_targets()      # every dispatch target this CPU runs (amx, avx3_bf16, avx3, avx2, neon, scalar)


def random_layers(rng, in_size, hidden):
    layers = []
    for H in hidden:
        layers.append((rng.normal(0, 1 / np.sqrt(in_size), (in_size, 4 * H)).astype(np.float32),
                       rng.normal(0, 1 / np.sqrt(H), (H, 4 * H)).astype(np.float32),
                       rng.normal(0, 0.3, 4 * H).astype(np.float32)))
        in_size = H
    return layers


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("H", [1, 7, 64, 100, 130])
def test_matches_float64_lstm(H, target):
    """Every input size {1, 13, 192} x T {1, 5, 100} x return_sequences, one and two stacked layers
    (the second with another H so layer sizes differ), on every dispatch target this CPU runs."""
    rng = np.random.default_rng(H)
    for in_size in (1, 13, 192):
        for T in (1, 5, 100):
            x = rng.normal(0, 1, (T, in_size)).astype(np.float32)
            for hidden in ([H], [H, 33]):
                layers = random_layers(rng, in_size, hidden)
                for rs in (False, True):
                    with force_target(target):
                        k = NativeLSTM(layers, T, rs)
                    assert k.isa == simd_target(target)
                    y = k.run(x)
                    want = reference_lstm(layers, x, rs)
                    assert y.shape == want.shape == ((T, hidden[-1]) if rs else (hidden[-1],))
                    err = np.abs(y - want).max()
                    assert err < BOUND, (H, in_size, T, hidden, rs, err)


@pytest.mark.parametrize("target", TARGETS)
def test_projected_input_runs_only_the_recurrence(target):
    """projected(): the input is x_t @ W + b for every step (what the native-bf16 plan computes on the conv
    kernel); given it exactly, the output is the full LSTM's. Stacked nets refuse it."""
    rng = np.random.default_rng(11)
    for H, in_size, T in ((64, 192, 100), (7, 13, 5), (100, 3, 20)):
        (W, U, b), = layers = random_layers(rng, in_size, [H])
        x = rng.normal(0, 1, (T, in_size)).astype(np.float32)
        g = (x.astype(np.float64) @ W + b).astype(np.float32)
        with force_target(target):
            k = NativeLSTM(layers, T, True).projected()
        assert k.input_shape == (T, 4 * H)
        k.run_ptr(np.ascontiguousarray(g).ctypes.data)
        assert np.abs(k.out - reference_lstm(layers, x, True)).max() < BOUND
        assert np.abs(k.run(g) - reference_lstm([(np.eye(4 * H), U, b * 0)], g, True)).max() < BOUND
    with pytest.raises(ShapeError, match="single-layer"):
        NativeLSTM(random_layers(rng, 4, [3, 3]), 5).projected()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("H", [1, 7, 64, 100, 130])
def test_bf16_recurrent_weights_are_the_fp32_kernel_on_rounded_weights(H, target):
    """recurrent_bf16 (the native-bf16 plan): the bits of the fp32 kernel given U rounded to bf16 (nearest
    even), stacked or not, whole window, projected and step by step, on every target (the vector-pair layout
    differs with the lanes: H = 130 takes several chunks on AVX2); and the rounding is there: the outputs
    differ from the fp32 weights' by more than the fp32 bound but stay within bf16's."""
    rng = np.random.default_rng(100 + H)
    for in_size, T in ((13, 9), (192, 40)):
        layers = random_layers(rng, in_size, [H, 33])
        rounded = [(W, bf16(U), b) for W, U, b in layers]
        x = rng.normal(0, 1, (T, in_size)).astype(np.float32)
        with force_target(target):
            half = NativeLSTM(layers, T, True, cell_clip=3.0, recurrent_bf16=True).run(x).copy()
            want = NativeLSTM(rounded, T, True, cell_clip=3.0).run(x).copy()
            one = NativeLSTM(layers[:1], T, True, recurrent_bf16=True).projected()
            one_ref = NativeLSTM(rounded[:1], T, True).projected()
        assert np.array_equal(half, want), (H, in_size, T)
        err = np.abs(half - reference_lstm(layers, x, True, cell_clip=3.0)).max()
        assert BOUND < err < 0.05, err
        g = rng.normal(0, 1, (T, 4 * H)).astype(np.float32)
        whole = one.run(g).copy()
        assert np.array_equal(whole, one_ref.run(g))
        h = np.zeros(H, np.float32)
        one.steps(g[: T // 2], 0)
        one.steps(g[T // 2:], T // 2, h)
        assert np.array_equal(h, whole[-1])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("H", [1, 7, 64, 100, 130])
@pytest.mark.parametrize("bf16_u", [False, True])
def test_a_recurrent_sum_run_ahead_gives_the_steps_bits(H, target, bf16_u):
    """The stream executor sums the first tick step's h @ U in prepare (steps(..., ahead=True)); the next call adds
    it to its projection: the whole window's bits, bit for bit, fp32 and bf16 recurrent weights, one column chunk
    or several (H = 130), at every split point; with nothing left to sum ahead it is refused."""
    rng = np.random.default_rng(300 + H)
    T = 9
    layers = random_layers(rng, 4 * H, [H])
    with force_target(target):
        one = NativeLSTM(layers, T, True, cell_clip=3.0, recurrent_bf16=bf16_u).projected()
    g = rng.normal(0, 1, (T, 4 * H)).astype(np.float32)
    whole = one.run(g).copy()
    h = np.zeros(H, np.float32)
    for split in (1, 4, T - 1):
        one.steps(g[:split], 0, ahead=True)
        one.steps(g[split:], split, h)
        assert np.array_equal(h, whole[-1]), split
    with pytest.raises(ShapeError, match="leave no step"):
        one.steps(g, 0, ahead=True)
    # a whole-window run overwrites the state a steps call would continue: continuing is refused, not wrong
    one.steps(g[:4], 0, ahead=True)
    one.run(g)
    with pytest.raises(ShapeError, match="not continuing"):
        one.steps(g[4:], 4, h)


def test_recurrent_precision_of_a_native_json_step():
    """A native.json LSTM step's "recurrent" field: absent or fp32 -> fp32, bf16 -> bf16, anything else (a
    newer or damaged bundle) a BundleError that says what to do."""
    from edgehft.errors import BundleError
    from edgehft.kernels.cpu.lstm import recurrent_bf16_of
    assert recurrent_bf16_of({}) is False and recurrent_bf16_of({"recurrent": "fp32"}) is False
    assert recurrent_bf16_of({"recurrent": "bf16"}) is True
    for bad in ("int8", None, 1, ["bf16"]):
        with pytest.raises(BundleError, match="recompile the bundle|upgrade edgehft") as e:
            recurrent_bf16_of({"recurrent": bad})
        assert "fp32 or bf16" in str(e.value)


@pytest.mark.parametrize("target", TARGETS)
def test_cell_clip(target):
    """c driven up by ~1 per step for 15 steps, then down (make_native_lstm_models.saturating): with
    cell_clip 10 the kernel follows the clipped reference, without it the unclipped one (and the two
    differ, so the clip really engaged)."""
    from make_native_lstm_models import saturating
    rng = np.random.default_rng(5)
    for H in (3, 100):
        (W, U, b), = random_layers(rng, 4, [H])
        x = rng.normal(0, 1, (1, 30, 4)).astype(np.float32)
        saturating(W, U, b, x)
        x = x[0]
        clipped, free = (reference_lstm([(W, U, b)], x, True, clip) for clip in (10.0, 0.0))
        assert np.abs(clipped - free).max() > 1e-3
        for clip, want in ((10.0, clipped), (0.0, free)):
            with force_target(target):
                y = NativeLSTM([(W, U, b)], 30, True, cell_clip=clip).run(x)
            assert np.abs(y - want).max() < SAT_BOUND, (H, clip, np.abs(y - want).max())
    with pytest.raises(InputError):
        NativeLSTM([(W, U, b)], 30, cell_clip=-1)


@pytest.mark.parametrize("target", TARGETS)
def test_activation_error(target):
    x = np.linspace(-20, 20, 1 << 18).astype(np.float32)
    with force_target(target):
        th, sg = activations(x)
    x64 = x.astype(np.float64)
    assert np.abs(th - np.tanh(x64)).max() < 4e-7
    assert np.abs(sg - sigmoid(x64)).max() < 2.5e-7


def test_run_reuses_one_buffer_and_accepts_batch_of_one(rng):
    layers = random_layers(rng, 13, [7])
    k = NativeLSTM(layers, 5, True)
    x = rng.normal(0, 1, (5, 13)).astype(np.float32)
    a = k.run(x)
    first = a.copy()
    b = k.run(x[None])
    assert a is b is k.out
    np.testing.assert_array_equal(b, first)               # no state carried between calls
    y = np.empty_like(k.out)
    k.run_ptr(x.ctypes.data, y.ctypes.data)
    np.testing.assert_array_equal(y, first)
    k.run(np.asfortranarray(x))                              # non-contiguous input: copied, same result
    np.testing.assert_array_equal(k.out, first)
    k.close()
    k.close()


def test_typed_errors(rng):
    layers = random_layers(rng, 13, [7, 5])
    k = NativeLSTM(layers, 5)
    with pytest.raises(ShapeError):
        k.run(np.zeros((5, 12), np.float32))
    with pytest.raises(ShapeError):
        k.run(np.zeros((2, 5, 13), np.float32))
    with pytest.raises(DTypeError):
        k.run(np.zeros((5, 13), np.float64))
    with pytest.raises(DTypeError):
        k.run([[0.0] * 13] * 5)
    W, U, b = layers[1]
    for bad in ([layers[0], (W[:-1], U, b)],            # layer 1's input rows != layer 0's H
                [(W, U[:, :-1], b)],                       # recurrent kernel not (H, 4H)
                [(W, U, b[:-1])],                          # bias not (4H,)
                []):
        with pytest.raises(InputError):
            NativeLSTM(bad, 5)
    with pytest.raises(ShapeError):
        NativeLSTM(layers, 0)


def test_no_compiler_or_failed_build_is_board_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEHFT_CACHE", str(tmp_path))         # nothing cached: it must build
    from edgehft.kernels.cpu import build
    monkeypatch.setattr(build, "PREBUILT_DIR", tmp_path / "no-prebuilt")   # nor a prebuilt one (an install's)
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(BoardUnavailableError, match="no C\\+\\+ compiler"):
        native_lstm.load_library()
    monkeypatch.setenv("CXX", "false")                          # a "compiler" that fails
    with pytest.raises(BoardUnavailableError, match="failed"):
        NativeLSTM(random_layers(np.random.default_rng(0), 3, [2]), 2)
    assert not list(tmp_path.rglob("*.so"))
