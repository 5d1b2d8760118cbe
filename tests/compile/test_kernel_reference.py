"""Bit-exactness of the numpy golden model (edgehft.kernels) against LiteRT 2.3.0, per interpreter path.

Each op's actual input is captured from LiteRT (``experimental_preserve_all_tensors``, variables reset
before every invoke) and the golden model's output is compared with LiteRT's op output, bit for bit.
Measured: the int8 LSTM is bit-exact on all three resolver paths with gemmlowp double rounding; int8
FULLY_CONNECTED is bit-exact per path with that path's requantization (``FC_MODE``).

The stress tests' small tf-keras models come from tests/make_kernel_models.py, run in a subprocess so
TensorFlow stays out of the pytest process (the ``kernel_models`` fixture, tests/kernel_io.py).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from edgehft.ir.tflite_model import TFLiteModel
from edgehft.kernels.fpga import params as P
from edgehft.kernels.fpga import reference as R
from kernel_io import (FC_MODE, PATHS, capture, deeplob_inputs, kernel_models, op_io,  # noqa: F401 (a fixture)
                       patch_scales, stress_inputs)

FC_MODES = ("ruy-x86", "gemmlowp", "single", "float64", "fp32")
slow = pytest.mark.slow


def mismatching(out: np.ndarray, ref: np.ndarray) -> int:
    """How many windows (rows) differ anywhere."""
    return int(np.any(out.reshape(len(out), -1) != ref.reshape(len(ref), -1), axis=1).sum())


# ---- DeepLOB: 16 golden windows + 200 real windows from the shipped feed ----------------------------


@pytest.fixture(scope="module")
def deeplob(deeplob_bundle, deeplob_windows):
    bundle, model, inputs, lstm, fc = deeplob_inputs(deeplob_bundle, deeplob_windows)
    tensors = (lstm.inputs[0], lstm.outputs[0], lstm.inputs[18], lstm.inputs[19], fc.inputs[0], fc.outputs[0])
    caps = {kind: capture(bundle.model_path, inputs, kind, tensors) for kind in PATHS}
    return model, lstm, fc, caps


@slow
@pytest.mark.parametrize("kind", PATHS)
def test_deeplob_lstm_bit_exact(deeplob, kind):
    model, lstm, _, caps = deeplob
    x, ref = caps[kind][lstm.inputs[0]], caps[kind][lstm.outputs[0]]
    assert x.shape == (216, 100, 192) and ref.shape == (216, 100, 64)
    p = P.lstm_params(model, lstm)
    out, h, c = R.lstm_int8(x, p, return_state=True)
    assert mismatching(out, ref) == 0                                    # 216 of 216 windows
    # the final int16 cell state and int8 hidden state too (variable tensors after Invoke)
    np.testing.assert_array_equal(c, caps[kind][lstm.inputs[19]].reshape(c.shape))
    np.testing.assert_array_equal(h, caps[kind][lstm.inputs[18]].reshape(h.shape))
    # the rounding mode is measured, not assumed: single rounding misses most windows by 1 LSB
    single = R.lstm_int8(x, p, rounding="single")
    assert mismatching(single, ref) > 100 and np.abs(single.astype(int) - ref).max() == 1


@slow
@pytest.mark.parametrize("kind", PATHS)
def test_deeplob_fc_bit_exact_on_its_path(deeplob, kind):
    model, lstm, fc, caps = deeplob
    x, ref = caps[kind][fc.inputs[0]], caps[kind][fc.outputs[0]]
    np.testing.assert_array_equal(x, caps[kind][lstm.outputs[0]][:, -1])  # STRIDED_SLICE: last step
    p = P.fully_connected_params(model, fc)
    assert p.per_channel and p.weights.shape == (3, 64)
    assert mismatching(R.fully_connected_int8(x, p, FC_MODE[kind]), ref) == 0


@slow
def test_deeplob_lstm_params(deeplob):
    model, lstm, _, _ = deeplob
    p = P.lstm_params(model, lstm)
    assert (p.n_input, p.n_cell, p.n_output, p.time_major) == (192, 64, 64, False)
    assert p.cell_scale_exponent == -11 and p.quantized_cell_clip == 20480      # clip 10.0 / 2^-11
    assert p.input_zero_point == -126 and p.output_state_zero_point == p.hidden_zero_point == -1
    for g in p.gates.values():
        assert g.input_weights.dtype == np.int8 and g.input_effective_bias.dtype == np.int32
        assert 1 << 30 <= g.input_multiplier < 1 << 31 and 1 << 30 <= g.recurrent_multiplier < 1 << 31
        rows = g.input_weights.astype(np.int64).sum(axis=1)
        np.testing.assert_array_equal(g.input_effective_bias, g.bias + 126 * rows)
    # the state a reset interpreter starts from: continuing from (h_T, c_T) equals one long run
    x = np.random.default_rng(0).integers(-128, 128, (2, 30, 192)).astype(np.int8)
    full = R.lstm_int8(x, p)
    first, h, c = R.lstm_int8(x[:, :12], p, return_state=True)
    np.testing.assert_array_equal(np.concatenate([first, R.lstm_int8(x[:, 12:], p, h, c)], axis=1), full)


# ---- stress: small tf-keras models, random and saturating int8 inputs, every path -------------------


@slow
@pytest.mark.parametrize("name, n", [("dense_pc", 2000), ("dense_pt", 2000), ("dense_lin", 2000),
                                     ("lstm_seq", 300), ("lstm_dense", 300)])
@pytest.mark.parametrize("kind", PATHS)
def test_small_models_bit_exact(kernel_models, name, n, kind):
    path = kernel_models / f"{name}.tflite"
    model = TFLiteModel.from_file(path)
    ops, tensors = op_io(model)
    shape = model.main.tensors[model.main.inputs[0]].shape[1:]
    caps = capture(path, stress_inputs(shape, n, seed=len(name)), kind, tensors)
    for op in ops:
        p = P.op_params(model, op)
        if op.name == "FULLY_CONNECTED":
            out = R.fully_connected_int8(caps[op.inputs[0]], p, FC_MODE[kind])
        else:
            out, h, c = R.lstm_int8(caps[op.inputs[0]], p, return_state=True)
            np.testing.assert_array_equal(c, caps[op.inputs[19]].reshape(c.shape))     # int16 cell state
            np.testing.assert_array_equal(h, caps[op.inputs[18]].reshape(h.shape))
        assert mismatching(out, caps[op.outputs[0]]) == 0, (name, op.index, op.name, kind)
        if name.startswith("dense") and op.index == 0:
            assert model.main.tensors[op.inputs[0]].quant.zero_point[0] != 0      # asymmetric input
            assert P.fully_connected_params(model, op).per_channel == (name != "dense_pt")


@slow
def test_fc_requantization_identifies_each_path(kernel_models):
    """Scales patched to powers of two make the effective scale exactly 2^-9, so the accumulators hit
    exact ties (every 512th) and double-rounding points (odd ones near a half): there the five modes
    all disagree, and each path matches its own mode and no other."""
    data = (kernel_models / "dense_lin.tflite").read_bytes()
    fc = TFLiteModel(data).main.ops[0]
    data = patch_scales(data, {fc.inputs[0]: 2.0 ** -6, fc.inputs[1]: 2.0 ** -6, fc.inputs[2]: 2.0 ** -12,
                               fc.outputs[0]: 2.0 ** -3})
    p = P.fully_connected_params(TFLiteModel(data), fc)
    assert set(p.multiplier.tolist()) == {1 << 30} and set(p.shift.tolist()) == {-8}   # 2^-9 exactly
    x = stress_inputs((16,), 3000, seed=5)
    for kind in PATHS:
        got = capture(data, x, kind, [fc.outputs[0]])[fc.outputs[0]]
        wrong = {m: int((R.fully_connected_int8(x, p, m) != got).sum()) for m in FC_MODES}
        assert [m for m, v in wrong.items() if v == 0] == [FC_MODE[kind]], (kind, wrong)


# ---- fixed-point helpers and parameter derivation (no interpreter) ----------------------------------

def test_multiply_by_quantized_multiplier_rounding_modes():
    m, s = 1 << 30, -1                        # x * 2^-2: 0.5, -0.5, 1.5, -1.5, 1.25, -1.25, 0.75
    x = np.array([2, -2, 6, -6, 5, -5, 3])
    mbqm = R.multiply_by_quantized_multiplier
    # gemmlowp: SRDHM rounds x/2 half up, then the shift rounds half away (1.25 -> 2.5 -> 3 -> 2)
    np.testing.assert_array_equal(mbqm(x, m, s, "gemmlowp"), [1, -1, 2, -2, 2, -1, 1])
    np.testing.assert_array_equal(mbqm(x, m, s, "single"), [1, 0, 2, -1, 1, -1, 1])
    np.testing.assert_array_equal(mbqm(x, m, s, "ruy-x86"), [1, 0, 2, -1, 2, -1, 1])
    assert mbqm(100, 1 << 30, 3, "gemmlowp") == mbqm(100, 1 << 30, 3, "single") == 400      # left shift
    np.testing.assert_array_equal(R.rounding_divide_by_pot([5, -5, 4, -3, 3], 1), [3, -3, 2, -2, 2])
    np.testing.assert_array_equal(R.saturating_rounding_doubling_high_mul([5, -5], 1 << 30), [3, -2])
    lo = -(1 << 31)
    assert R.saturating_rounding_doubling_high_mul(lo, lo) == (1 << 31) - 1
    assert R.saturating_rounding_doubling_high_mul(-32768, -32768, bits=16) == 32767


def test_quantize_multiplier_matches_tflite():
    assert P.quantize_multiplier(0.5) == (1 << 30, 0)
    assert P.quantize_multiplier(1.0) == (1 << 30, 1)
    assert P.quantize_multiplier(0.0) == (0, 0)
    assert P.quantize_multiplier(2.0 ** -40) == (0, 0)                # flushed below 2^-31
    assert P.quantize_multiplier(1 - 2.0 ** -40) == (1 << 30, 1)      # q rounds to 2^31: renormalised
    assert P.quantize_multiplier(2.0 ** 40) == (1 << 30, 41)
    assert P.quantize_multiplier(2.0 ** 40, single_rounding=True) == ((1 << 31) - 1, 30)
    assert P.activation_range(3, 0.05, -128) == (-128, -8)            # RELU6: -128 + round(6 / 0.05)
    assert P.activation_range(1, 0.05, 5) == (5, 127)


def test_fixed_point_activations_are_well_formed():
    x = np.arange(-32768, 32768)
    s = R.sigmoid_int16(x).astype(np.int64)
    # gemmlowp's int16 functions are not monotone: they step down by up to 8 (sigmoid) / 16 (tanh) LSB
    # at some inputs, so a hardware table must come from this model, not from a float sigmoid
    assert s[32768] == 16384 and np.diff(s).min() == -8
    np.testing.assert_array_equal(s[32769:] + s[32767:0:-1], 32767)  # logistic(-x) = 1 - logistic(x)
    assert np.abs(s - 32768 / (1 + np.exp(-x / 4096))).max() < 8
    for bits in range(7):
        t = R.tanh_int16(x, bits).astype(np.int64)
        assert t[32768] == 0 and np.diff(t).min() >= -16
        np.testing.assert_array_equal(t[32769:], -t[32767:0:-1])
        assert np.abs(t - 32768 * np.tanh(x / 2.0 ** (15 - bits))).max() < 16


@slow
def test_unsupported_ops_are_refused_by_name(deeplob):
    model, lstm, fc, _ = deeplob
    with pytest.raises(P.UnsupportedOpError, match="covers FULLY_CONNECTED and"):
        P.op_params(model, 0)
    with pytest.raises(P.UnsupportedOpError, match="not FULLY_CONNECTED"):
        P.fully_connected_params(model, lstm)
    ins = list(lstm.inputs)
    cases = {"CIFG": {1: -1, 5: -1, 12: -1}, "peephole": {10: ins[2]}, "projection": {16: ins[2]},
             "layer norm": {21: ins[13]}, "fully integer": {0: ins[19]}}
    for what, change in cases.items():
        bad = dataclasses.replace(lstm, inputs=tuple(change.get(i, t) for i, t in enumerate(ins)))
        with pytest.raises(P.UnsupportedOpError, match=what):
            P.lstm_params(model, bad)
    with pytest.raises(P.UnsupportedOpError, match="intermediates"):
        P.lstm_params(model, dataclasses.replace(lstm, intermediates=()))
    with pytest.raises(P.UnsupportedOpError, match="TANH"):
        P.fully_connected_params(model, dataclasses.replace(fc, options={**fc.options, "FusedActivationFunction": 4}))

