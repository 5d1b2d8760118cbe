"""Bit-exact numpy golden model of LiteRT 2.3.0's int8 FULLY_CONNECTED and int8x8_16 LSTM.

Every step is an explicit integer operation on int64 numpy arrays holding the C++ value of its type:
int32 results wrap like the C++ kernels, int16 fixed-point arithmetic wraps or saturates exactly where
gemmlowp does. No float is used in the datapath, except in the two FULLY_CONNECTED modes that emulate
interpreter paths which themselves requantize in floating point (``"float64"``, ``"fp32"``).

**Rounding mode** (measured in tests/compile/test_kernel_reference.py, LiteRT 2.3.0 wheel, x86-64):

- ``MultiplyByQuantizedMultiplier`` (``internal/common.cc``) is **gemmlowp double rounding**: the wheel
  is built without ``TFLITE_SINGLE_ROUNDING``. ``RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(
  x << left, M), right)``: the high multiply rounds ties up (VQRDMULH), the shift rounds them away from
  zero. The int8 LSTM uses it on every resolver
  path (XNNPACK does not take it; its x86 tensor utils are the portable ones): the double-rounding
  model is bit-exact, a single-rounding one is off by 1 LSB on most sequences.
- int8 FULLY_CONNECTED requantizes differently on each path, none of them with ``common.cc``:
  ``BUILTIN_WITHOUT_DEFAULT_DELEGATES`` runs ruy's x86 kernels: the same high multiply, then a
  rounding shift that ties toward +inf (``"ruy-x86"``, the integer default here); ``BUILTIN_REF`` computes
  ``round(acc * double(s_in * s_w / s_out))`` in double (``"float64"``); ``AUTO`` hands FC to XNNPACK,
  which rounds ``float32(acc) * float32 scale`` to nearest even (``"fp32"``). They differ only near
  ties (0.05-0.1 % of random-input outputs), so "bit-exact" always names the path.

**Sigmoid and tanh**: LiteRT 2.3.0's integer LSTM (``lstm_eval.cc`` ``EvalInteger8x8_16``, on x86 the
portable ``PortableApplySigmoid`` / ``PortableApplyTanh``) runs gemmlowp's fixed-point ``logistic`` on
``FixedPoint<int16, 3>`` and ``tanh`` on ``FixedPoint<int16, IntegerBits>`` (3 for the cell gate,
``15 + cell_scale`` for the output), not the LUT-based int16 LOGISTIC/TANH op kernels. Reproduced here
from gemmlowp ``fixedpoint/fixedpoint.h`` (``exp_on_negative_values``, Newton-Raphson reciprocal).
They are not monotone (they step down by up to 8 / 16 LSB at some inputs): a hardware table must be
generated from :func:`sigmoid_int16` / :func:`tanh_int16` over all 65536 inputs, not from a float
function.

Sources followed: ``tflite/kernels/internal/common.cc`` (``MultiplyByQuantizedMultiplier``, both
variants), ``tflite/kernels/internal/reference/integer_ops/fully_connected.h`` and
``tflite/kernels/fully_connected.cc`` (which variant each kernel type calls), ruy
``kernel_avx512.cc`` (multiplier application), XNNPACK's fp32 requantization (``"fp32"``),
``tflite/kernels/lstm_eval.cc`` (``LstmStepInteger8x8_16``, ``CalculateLstmGateInteger8x8_16``,
``UpdateLstmCellInteger``, ``CalculateLstmOutputInteger8x8_16``),
``tflite/kernels/internal/reference/portable_tensor_utils.cc`` (``MatrixBatchVectorMultiplyAccumulate``
int16 output, ``CwiseMul``, ``CwiseAdd``, ``CwiseClipping``, ``ApplySigmoid``, ``ApplyTanh``), and
gemmlowp ``fixedpoint/fixedpoint.h``.
"""
from __future__ import annotations

import numpy as np

from edgehft.kernels.fpga.params import GATES, FullyConnectedParams, LstmParams

ROUNDING = "gemmlowp"    # MultiplyByQuantizedMultiplier of LiteRT 2.3.0's x86 build (LSTM, all paths)
FC_REQUANTIZE = "ruy-x86"  # its optimized int8 FULLY_CONNECTED (BUILTIN_WITHOUT_DEFAULT_DELEGATES)

_I64 = np.int64


def _wrap(x, bits: int) -> np.ndarray:
    """Two's-complement wrap of int64 values to ``bits`` (C++ conversion to a narrower signed type)."""
    h = _I64(1) << _I64(bits - 1)
    return ((np.asarray(x, _I64) + h) & ((h << _I64(1)) - _I64(1))) - h


def _sat(x, bits: int) -> np.ndarray:
    h = 1 << (bits - 1)
    return np.clip(np.asarray(x, _I64), -h, h - 1)


def _div_trunc(n: np.ndarray, d: int) -> np.ndarray:
    """C++ integer division (truncates toward zero) of int64 ``n`` by positive ``d``."""
    q = np.abs(n) // _I64(d)
    return np.where(n < 0, -q, q)


# ---- gemmlowp fixedpoint.h primitives (bits = 32 or 16: the raw type) -------------------------------

def saturating_rounding_doubling_high_mul(a, b, bits: int = 32) -> np.ndarray:
    """``SaturatingRoundingDoublingHighMul`` (VQRDMULH): ``round(a * b / 2^(bits-1))`` with ties toward
    +inf (a sign-dependent nudge, then C++ truncating division); ``min * min`` saturates to max."""
    a, b = np.asarray(a, _I64), np.asarray(b, _I64)
    lo = -(1 << (bits - 1))
    ab = a * b
    nudge = np.where(ab >= 0, _I64(1 << (bits - 2)), _I64(1 - (1 << (bits - 2))))
    res = _wrap(_div_trunc(ab + nudge, 1 << (bits - 1)), bits)
    return np.where((a == lo) & (b == lo), _I64((1 << (bits - 1)) - 1), res)


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """``RoundingDivideByPOT``: arithmetic shift right by ``exponent`` (0..31), rounding to nearest,
    ties away from zero. ``exponent`` may be an array (broadcast)."""
    x, e = np.asarray(x, _I64), np.asarray(exponent, _I64)
    mask = (_I64(1) << e) - _I64(1)
    remainder = x & mask
    threshold = (mask >> _I64(1)) + (x < 0).astype(_I64)
    return (x >> e) + (remainder > threshold).astype(_I64)


def multiply_by_quantized_multiplier(x, multiplier, shift, rounding: str = ROUNDING) -> np.ndarray:
    """``MultiplyByQuantizedMultiplier(int32 x, int32 M, int shift)`` -> int32: ``x * M * 2^(shift-31)``.

    ``rounding``:

    - ``"gemmlowp"`` (alias ``"double"``): ``RoundingDivideByPOT(SRDHM(x << left, M), right)``, two
      roundings (ties up, then ties away from zero). TFLite's ``common.cc`` without
      ``TFLITE_SINGLE_ROUNDING``: what LiteRT 2.3.0's x86 build runs (its LSTM, every resolver path).
    - ``"ruy-x86"``: ``((x << left) * M + 2^30) >> 31`` (= SRDHM), then ``(v + 2^(right-1)) >> right``:
      two roundings, both ties toward +inf. Measured on the ruy x86 kernels in the wheel, behind the
      optimized (BUILTIN) int8 FULLY_CONNECTED (current ruy sources round once; the wheel's do not).
    - ``"single"``: ``(x * M + 2^(30 - shift)) >> (31 - shift)`` in 64 bits (``TFLITE_SINGLE_ROUNDING``,
      ruy's reference); no LiteRT 2.3.0 x86 path measured here uses it.
    """
    x, m, s = np.asarray(x, _I64), np.asarray(multiplier, _I64), np.asarray(shift, _I64)
    left, right = np.maximum(s, 0), np.maximum(-s, 0)
    if rounding == "single":
        total = _I64(31) - s
        return _wrap((x * m + (_I64(1) << (total - _I64(1)))) >> total, 32)
    if rounding in ("gemmlowp", "double"):
        return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(_wrap(x << left, 32), m), right)
    if rounding == "ruy-x86":
        v = (_wrap(x << left, 32) * m + (_I64(1) << _I64(30))) >> _I64(31)
        return _wrap((v + ((_I64(1) << right) >> _I64(1))) >> right, 32)
    raise ValueError(f"rounding must be 'gemmlowp', 'ruy-x86' or 'single', got {rounding!r}")


# ---- int16 fixed point (FixedPoint<int16, IntegerBits>): raw int16 values in int64 arrays ----------

def _add16(a, b):                     # gemmlowp Add on int16: promoted to int, wraps on conversion back
    return _wrap(np.asarray(a, _I64) + b, 16)


def _mul16(a, b):                     # FixedPoint operator*
    return saturating_rounding_doubling_high_mul(a, b, 16)


def _const16(raw32: int) -> int:      # GEMMLOWP_CHECKED_FIXEDPOINT_CONSTANT: int32 constant >> 16, rounded
    return int(_wrap(rounding_divide_by_pot(raw32, 16), 16))


def _sat_mul_pot16(x, exponent: int):
    """``SaturatingRoundingMultiplyByPOT<exponent>`` on int16: saturating left or rounding right shift."""
    x = np.asarray(x, _I64)
    if exponent == 0:
        return x
    if exponent < 0:
        return rounding_divide_by_pot(x, -exponent)
    threshold = (1 << (15 - exponent)) - 1
    res = _wrap(x << _I64(exponent), 16)
    return np.where(x > threshold, _I64(32767), np.where(x < -threshold, _I64(-32768), res))


def _rounding_half_sum16(a, b):
    s = np.asarray(a, _I64) + b
    return _wrap(_div_trunc(s + np.where(s >= 0, 1, -1), 2), 16)


def _exp_quarter16(a):
    """``exp_on_interval_between_negative_one_quarter_and_0_excl`` (Q0.15 in and out)."""
    constant_term, one_third = _const16(1895147668), _const16(715827883)
    x = _add16(a, 1 << 12)                                    # a + 1/8
    x2 = _mul16(x, x)
    x3 = _mul16(x2, x)
    x4 = _mul16(x2, x2)
    x4_over_4 = rounding_divide_by_pot(x4, 2)
    poly = rounding_divide_by_pot(_add16(_mul16(_add16(x4_over_4, x3), one_third), x2), 1)
    return _sat(constant_term + _mul16(constant_term, _add16(x, poly)), 16)   # AddSaturatingIf16Bit


_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308), (2, 39332535),
               (3, 720401), (4, 242))


def _exp_on_negative_values16(a, integer_bits: int):
    """``exp_on_negative_values``: ``exp(a)`` for ``a <= 0`` in Q``integer_bits``, result Q0.15."""
    frac = 15 - integer_bits
    a = np.asarray(a, _I64)
    one_quarter = 1 << (frac - 2)
    a_mod = _add16(a & (one_quarter - 1), -one_quarter)
    result = _exp_quarter16(_sat_mul_pot16(a_mod, integer_bits))     # Rescale<0>
    remainder = _add16(a_mod, -a)
    for exponent, multiplier in _EXP_BARREL:
        if integer_bits > exponent:
            bit = (remainder & _I64(1 << (frac + exponent))) != 0
            result = np.where(bit, _mul16(result, _const16(multiplier)), result)
    if integer_bits > 5:
        result = np.where(a < _const16(-(1 << (36 - integer_bits))), _I64(0), result)
    return np.where(a == 0, _I64(32767), result)


def _newton_reciprocal16(half_denominator):
    """The shared Newton-Raphson loop of ``one_over_one_plus_x_for_x_in_0_1`` and
    ``one_minus_x_over_one_plus_x_for_x_in_0_1``: ``x ~= 1 / half_denominator`` in Q2.13."""
    one_q2 = 1 << 13
    x = _add16(_const16(1515870810), _mul16(half_denominator, _const16(-1010580540)))   # 48/17 - 32/17 d
    for _ in range(3):
        one_minus = _add16(one_q2, -_mul16(half_denominator, x))
        x = _add16(x, _sat_mul_pot16(_mul16(x, one_minus), 2))                          # Rescale<2>(F4)
    return x


def sigmoid_int16(x) -> np.ndarray:
    """``PortableApplySigmoid``: gemmlowp ``logistic`` of Q3.12 int16 input, Q0.15 int16 output."""
    a = np.asarray(x, _I64)
    positive = a > 0
    abs_in = np.where(positive, a, _wrap(-a, 16))
    e = _exp_on_negative_values16(_wrap(-abs_in, 16), 3)
    r_pos = _sat_mul_pot16(_newton_reciprocal16(_rounding_half_sum16(e, 32767)), 1)  # Rescale<0>(F1)
    r_neg = _add16(32767, -r_pos)
    return np.where(a == 0, _I64(_const16(1 << 30)), np.where(positive, r_pos, r_neg)).astype(np.int16)


def tanh_int16(x, integer_bits: int) -> np.ndarray:
    """``PortableApplyTanh(integer_bits)``: gemmlowp ``tanh`` of Q``integer_bits`` int16 input (0..6),
    Q0.15 int16 output."""
    if not 0 <= integer_bits <= 6:
        raise ValueError(f"integer_bits must be 0..6, got {integer_bits}")
    a = np.asarray(x, _I64)
    negative = a < 0
    n = np.where(negative, a, _wrap(-a, 16))
    e = _exp_on_negative_values16(n, integer_bits + 1)                 # exp(2n): ExactMulByPot<1>
    t = _sat_mul_pot16(_add16(_newton_reciprocal16(_rounding_half_sum16(e, 32767)), -(1 << 13)), 2)
    return np.where(a == 0, _I64(0), np.where(negative, _wrap(-t, 16), t)).astype(np.int16)


# ---- ops --------------------------------------------------------------------------------------------

def fully_connected_int8(x: np.ndarray, p: FullyConnectedParams, requantize: str = FC_REQUANTIZE
                         ) -> np.ndarray:
    """int8 FULLY_CONNECTED. ``x`` int8 ``(batch, n_in)`` (or ``(..., n_in)``) -> int8 ``(batch, n_out)``:
    ``acc = sum_k W[o,k] * (x[b,k] - zp_in) + bias[o]`` (int32), requantized, ``+ zp_out``, clamped to
    ``[activation_min, activation_max]``.

    ``requantize`` names the interpreter path to reproduce (LiteRT 2.3.0, x86):

    - ``"ruy-x86"`` (default, integer): ``MBQM(acc, M[o], shift[o])`` with ruy's x86 rounding, the
      optimized builtin kernel (``BUILTIN_WITHOUT_DEFAULT_DELEGATES``).
    - ``"gemmlowp"`` / ``"single"`` (integer): the other :func:`multiply_by_quantized_multiplier` modes.
    - ``"float64"``: ``round_half_away(acc * (double(s_in) * double(s_w[o]) / double(s_out)))``, what
      ``reference_integer_ops::FullyConnected[PerChannel]`` does in ``BUILTIN_REF`` (a float datapath).
    - ``"fp32"``: ``rint_even(float32(acc) * float32(s_in * s_w[o] / s_out))``, XNNPACK's fp32
      requantization, the ``AUTO`` path (a float datapath).
    The float modes emulate interpreter paths for comparison; they are not a hardware recipe.
    """
    x = np.asarray(x)
    if x.dtype != np.int8 or x.shape[-1] != p.n_in:
        raise ValueError(f"x must be int8 (..., {p.n_in}), got {x.dtype} {x.shape}")
    xb = x.reshape(-1, p.n_in).astype(_I64) - p.input_zero_point
    acc = _wrap(xb @ p.weights.astype(_I64).T + p.bias.astype(_I64), 32)
    w_scales = np.broadcast_to(np.asarray(p.weight_scales, np.float32), (p.n_out,))
    if requantize == "float64":
        eff = float(np.float32(p.input_scale)) * w_scales.astype(np.float64) / float(np.float32(p.output_scale))
        v = np.abs(acc.astype(np.float64) * eff)
        r = np.floor(v)
        r = r + (v - r >= 0.5)                                          # C round(): ties away from zero
        out = np.where(acc < 0, -r, r).astype(_I64)
    elif requantize == "fp32":
        eff = (np.float32(p.input_scale) * w_scales / np.float32(p.output_scale)).astype(np.float32)
        out = np.rint((acc.astype(np.float32) * eff).astype(np.float32)).astype(_I64)
    else:
        out = multiply_by_quantized_multiplier(acc, p.multiplier, p.shift, requantize)
    return np.clip(out + p.output_zero_point, p.activation_min, p.activation_max).astype(np.int8)


def _gate(x, h, g, rounding):
    """``CalculateLstmGateInteger8x8_16`` before the activation: int16 Q3.12 ``(batch, n_cell)``.
    Each matmul is rescaled on its own and added with int16 saturation (``gate`` starts at 0)."""
    acc = _wrap(x @ g.input_weights.astype(_I64).T + g.input_effective_bias, 32)
    gate = _sat(multiply_by_quantized_multiplier(acc, g.input_multiplier, g.input_shift, rounding), 16)
    acc = _wrap(h @ g.recurrent_weights.astype(_I64).T + g.recurrent_effective_bias, 32)
    return _sat(multiply_by_quantized_multiplier(acc, g.recurrent_multiplier, g.recurrent_shift, rounding)
                + gate, 16)


def lstm_step_int8(x: np.ndarray, h: np.ndarray, c: np.ndarray, p: LstmParams, rounding: str = ROUNDING
                   ) -> tuple[np.ndarray, np.ndarray]:
    """One ``LstmStepInteger8x8_16``: ``x`` int8 ``(batch, n_input)``, ``h`` int8 ``(batch, n_output)``,
    ``c`` int16 ``(batch, n_cell)`` -> new ``(h, c)``; ``h`` is also the step's output."""
    xs, hs, cs = (np.asarray(v, _I64) for v in (x, h, c))
    i_gate, f_gate, g_gate, o_gate = (_gate(xs, hs, p.gates[k], rounding) for k in GATES)
    i_gate, f_gate = sigmoid_int16(i_gate).astype(_I64), sigmoid_int16(f_gate).astype(_I64)
    g_gate = tanh_int16(g_gate, 3).astype(_I64)
    # UpdateLstmCellInteger: c = sat16(wrap16(rdbpot(f*c, 15)) + wrap16(rdbpot(i*g, 30 + cell_scale)))
    c_new = _sat(_wrap(rounding_divide_by_pot(f_gate * cs, 15), 16)
                 + _wrap(rounding_divide_by_pot(i_gate * g_gate, 30 + p.cell_scale_exponent), 16), 16)
    if p.quantized_cell_clip > 0:
        c_new = np.clip(c_new, -p.quantized_cell_clip, p.quantized_cell_clip)
    o_gate = sigmoid_int16(o_gate).astype(_I64)
    # CalculateLstmOutputInteger8x8_16 (no projection): h = sat8(MBQM(o * tanh(c), M_h) + hidden_zp)
    tanh_c = tanh_int16(c_new, p.cell_tanh_integer_bits).astype(_I64)
    h_new = multiply_by_quantized_multiplier(o_gate * tanh_c, p.hidden_multiplier, p.hidden_shift, rounding)
    h_new = _sat(h_new + p.hidden_zero_point, 8)
    return h_new.astype(np.int8), c_new.astype(np.int16)


def lstm_int8(x: np.ndarray, p: LstmParams, h0: np.ndarray | None = None, c0: np.ndarray | None = None,
              rounding: str = ROUNDING, return_state: bool = False):
    """int8x8_16 UNIDIRECTIONAL_SEQUENCE_LSTM over a sequence.

    ``x`` int8 ``(batch, T, n_input)`` (``(T, batch, n_input)`` if ``p.time_major``) -> int8 output of the
    same layout with ``n_output`` features. The state starts as TFLite's after allocation or
    ``reset_all_variables()``: ``h0`` = the output-state zero point, ``c0`` = 0 (override with int8
    ``(batch, n_output)`` / int16 ``(batch, n_cell)``). Batches are independent, as in TFLite. With
    ``return_state`` returns ``(output, h_T, c_T)``.
    """
    x = np.asarray(x)
    if x.dtype != np.int8 or x.ndim != 3 or x.shape[-1] != p.n_input:
        raise ValueError(f"x must be int8 (batch, T, {p.n_input}), got {x.dtype} {x.shape}")
    seq = x if p.time_major else x.transpose(1, 0, 2)              # (T, batch, n_input)
    batch = seq.shape[1]
    h = np.full((batch, p.n_output), p.output_state_zero_point, np.int8) if h0 is None else np.asarray(h0, np.int8)
    c = np.zeros((batch, p.n_cell), np.int16) if c0 is None else np.asarray(c0, np.int16)
    if h.shape != (batch, p.n_output) or c.shape != (batch, p.n_cell):
        raise ValueError(f"h0 must be (batch, {p.n_output}) int8 and c0 (batch, {p.n_cell}) int16")
    outs = []
    for t in range(seq.shape[0]):
        h, c = lstm_step_int8(seq[t], h, c, p, rounding)
        outs.append(h)
    out = np.stack(outs, axis=0)
    out = out if p.time_major else out.transpose(1, 0, 2)
    return (out, h, c) if return_state else out
