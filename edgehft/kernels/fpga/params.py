"""Integer parameters of one int8 op, derived from our IR exactly as LiteRT's ``Prepare()`` derives them.

Floats appear only here, where TFLite itself turns scales into (Q31 multiplier, shift) pairs, and with
TFLite's float widths: a ``float`` product in the C++ source is a float32 product here, a ``double`` one
is a Python float. Sources followed (LiteRT 2.3.0, ``tflite/`` = ``tensorflow/lite/``):

- ``kernels/internal/quantization_util.cc``: ``QuantizeMultiplier`` (frexp, round half away from zero,
  2^31 -> 2^30 renormalisation, flush below 2^-31, saturate shifts above 30 in single-rounding builds),
  ``CheckedLog2``;
- ``kernels/fully_connected.cc`` (``PrepareImpl``) and ``kernels/kernel_util.cc``
  (``GetQuantizedConvolutionMultipler``, ``CalculateActivationRangeQuantized``);
- ``kernels/unidirectional_sequence_lstm.cc`` (``PopulateQuantizedLstmParams8x8_16``,
  ``PopulatePrecomputedZPTimesWeightsWithBias``), input numbering of ``kernels/lstm_shared.h``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgehft.errors import InputError
from edgehft.ir.tflite_model import OpInfo, TensorInfo, TFLiteModel

# Fused activations (schema.fbs ActivationFunctionType)
_ACT_NONE, _ACT_RELU, _ACT_RELU_N1_TO_1, _ACT_RELU6, _ACT_TANH = 0, 1, 2, 3, 4
_ACT_NAMES = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}
# UNIDIRECTIONAL_SEQUENCE_LSTM inputs (lstm_shared.h, namespace lstm::full)
_LSTM_IN = dict(input=0, w_x=(1, 2, 3, 4), w_h=(5, 6, 7, 8), peephole=(9, 10, 11), bias=(12, 13, 14, 15),
                projection=(16, 17), output_state=18, cell_state=19, layer_norm=(20, 21, 22, 23))
GATES = ("input", "forget", "cell", "output")


class UnsupportedOpError(InputError):
    """The op is not one the integer golden model covers (not int8, or a feature it does not model)."""


def round_half_away(x: float) -> int:
    """``TfLiteRound`` / ``std::round``: nearest integer, ties away from zero (exact for any double)."""
    a = abs(float(x))
    r = math.floor(a)
    if a - r >= 0.5:
        r += 1
    return int(r) if x >= 0 else -int(r)


def quantize_multiplier(real: float, single_rounding: bool = False) -> tuple[int, int]:
    """``QuantizeMultiplier``: ``real ~= multiplier * 2^(shift - 31)`` with ``multiplier`` in
    ``[2^30, 2^31)`` (or 0). Returns ``(multiplier, shift)``; ``shift`` > 0 is a left shift.
    ``single_rounding``: a ``TFLITE_SINGLE_ROUNDING`` build, which saturates shifts above 30; LiteRT
    2.3.0's x86 wheel is not one (see :mod:`edgehft.kernels.fpga.reference`)."""
    real = float(real)
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)
    q_fixed = round_half_away(q * float(1 << 31))
    if q_fixed > (1 << 31):
        raise ValueError(f"QuantizeMultiplier({real!r}) overflowed")
    if q_fixed == (1 << 31):
        q_fixed //= 2
        shift += 1
    if shift < -31:                       # flush multipliers below ~2^-31 to zero
        shift, q_fixed = 0, 0
    if single_rounding and shift > 30:    # TFLITE_SINGLE_ROUNDING builds saturate large shifts
        shift, q_fixed = 30, (1 << 31) - 1
    return int(q_fixed), int(shift)


def checked_log2(x: float) -> int | None:
    """``CheckedLog2``: the integer log2 of ``x`` when ``x`` is a power of two (within 1e-3), else None."""
    if x <= 0:
        return None
    x_log2 = np.float32(np.log(np.float32(x))) * (np.float32(1.0) / np.float32(np.log(np.float32(2.0))))
    rounded = round_half_away(float(x_log2))
    return rounded if abs(float(x_log2) - rounded) < 1e-3 else None


@dataclass(frozen=True)
class FullyConnectedParams:
    """Integer parameters of an int8 FULLY_CONNECTED.

    ``weights`` int8 ``(n_out, n_in)``; ``bias`` int32 ``(n_out,)`` (zeros when the op has none);
    ``multiplier`` int64 ``(n_out,)`` Q31 values in ``[2^30, 2^31)`` and ``shift`` int64 ``(n_out,)``
    (left shift if > 0): one pair per output channel, the per-tensor pair repeated when ``per_channel``
    is False. ``activation_min/max``: the int8 output clamp after the fused activation.
    """

    weights: np.ndarray
    bias: np.ndarray
    input_zero_point: int
    output_zero_point: int
    multiplier: np.ndarray
    shift: np.ndarray
    activation_min: int
    activation_max: int
    per_channel: bool
    input_scale: float
    output_scale: float
    weight_scales: np.ndarray           # float32 (1,) or (n_out,), as stored
    keep_num_dims: bool = False

    @property
    def n_in(self) -> int:
        return int(self.weights.shape[1])

    @property
    def n_out(self) -> int:
        return int(self.weights.shape[0])


@dataclass(frozen=True)
class LstmGateParams:
    """One gate of the integer LSTM (``gate = act(Mx(W_x x + b_x) + Mh(W_h h + b_h))`` in Q3.12).

    ``input_weights`` int8 ``(n_cell, n_input)``, ``recurrent_weights`` int8 ``(n_cell, n_output)``;
    ``bias`` int32 ``(n_cell,)`` as stored; ``input_effective_bias`` int32 ``(n_cell,)`` =
    ``bias - input_zp * rowsum(W_x)`` and ``recurrent_effective_bias`` int32 ``(n_cell,)`` =
    ``-output_state_zp * rowsum(W_h)`` (TFLite folds the zero points into these, so the matmuls take the
    raw int8 vectors). ``(input_multiplier, input_shift)`` rescales ``W_x x`` from
    ``input_scale * w_x_scale`` to 2^-12, ``(recurrent_multiplier, recurrent_shift)`` ``W_h h`` from
    ``output_state_scale * w_h_scale`` to 2^-12.
    """

    input_weights: np.ndarray
    recurrent_weights: np.ndarray
    bias: np.ndarray
    input_effective_bias: np.ndarray
    recurrent_effective_bias: np.ndarray
    input_multiplier: int
    input_shift: int
    recurrent_multiplier: int
    recurrent_shift: int


@dataclass(frozen=True)
class LstmParams:
    """Integer parameters of an int8x8_16 UNIDIRECTIONAL_SEQUENCE_LSTM (no CIFG, peephole, projection,
    layer norm). Gate activations are int16 Q3.12 in, Q0.15 out; the cell state is int16 with scale
    ``2^cell_scale_exponent``; hidden/output are int8 with ``hidden_zero_point``.

    ``(hidden_multiplier, hidden_shift)`` rescales ``o * tanh(c)`` (scale 2^-30) to the hidden scale.
    ``quantized_cell_clip`` int16 (0: no clip). ``h0`` of a reset interpreter is
    ``output_state_zero_point``, ``c0`` is 0.
    """

    gates: dict[str, LstmGateParams]     # keys GATES: "input", "forget", "cell", "output"
    n_input: int
    n_cell: int
    n_output: int
    input_zero_point: int
    output_state_zero_point: int
    hidden_zero_point: int
    output_zero_point: int
    hidden_multiplier: int
    hidden_shift: int
    cell_scale_exponent: int             # e.g. -11: cell state is Q4.11
    quantized_cell_clip: int
    time_major: bool
    input_scale: float
    output_state_scale: float
    hidden_scale: float

    @property
    def cell_tanh_integer_bits(self) -> int:
        """Integer bits of the cell state as the tanh of the output sees it (``15 + cell_scale``)."""
        return 15 + self.cell_scale_exponent


def _op(model: TFLiteModel, op: OpInfo | int) -> OpInfo:
    return model.main.ops[op] if isinstance(op, int) else op


def _tensor(model: TFLiteModel, op: OpInfo, i: int) -> TensorInfo | None:
    idx = op.inputs[i] if i < len(op.inputs) else -1
    return None if idx < 0 else model.main.tensors[idx]


def _scale_zp(t: TensorInfo, what: str, op: OpInfo) -> tuple[np.float32, int]:
    if t.quant is None:
        raise UnsupportedOpError(f"op {op.index} {op.name}: {what} tensor {t.name!r} is not quantized")
    return np.float32(t.quant.scale[0]), int(t.quant.zero_point[0])


def _const(model: TFLiteModel, t: TensorInfo, dtype: str, what: str, op: OpInfo) -> np.ndarray:
    if t.dtype != dtype:
        raise UnsupportedOpError(f"op {op.index} {op.name}: {what} is {t.dtype}, the integer kernel needs {dtype}")
    data = model.buffer(t)
    if data is None:
        raise UnsupportedOpError(f"op {op.index} {op.name}: {what} {t.name!r} is not a constant tensor",
                                 hint="the golden model needs constant weights and biases")
    return np.array(data, dtype=dtype)


def _symmetric(t: TensorInfo, what: str, op: OpInfo) -> None:
    if t.quant is not None and np.any(t.quant.zero_point != 0):
        raise UnsupportedOpError(f"op {op.index} {op.name}: {what} has nonzero zero points; the int8 spec "
                                 "(and TFLite's int8 kernels) need symmetric weights")


def activation_range(activation: int, scale: float, zero_point: int, qmin: int = -128,
                     qmax: int = 127) -> tuple[int, int]:
    """``CalculateActivationRangeQuantized``: the quantized clamp of a fused activation
    (``zero_point + round(f / scale)`` with a float32 quotient)."""
    def q(f: float) -> int:
        return zero_point + round_half_away(float(np.float32(f) / np.float32(scale)))
    if activation == _ACT_RELU:
        return max(qmin, q(0.0)), qmax
    if activation == _ACT_RELU6:
        return max(qmin, q(0.0)), min(qmax, q(6.0))
    if activation == _ACT_RELU_N1_TO_1:
        return max(qmin, q(-1.0)), min(qmax, q(1.0))
    return qmin, qmax


def fully_connected_params(model: TFLiteModel, op: OpInfo | int, single_rounding: bool = False
                           ) -> FullyConnectedParams:
    """The integer parameters of an int8 FULLY_CONNECTED (per-tensor or per-channel weights).

    Raises:
        UnsupportedOpError: not a FULLY_CONNECTED, not int8 in/weights/out (hybrid, 16x8), shuffled
            weights, a fused activation other than NONE/RELU/RELU_N1_TO_1/RELU6, or asymmetric weights.
    """
    op = _op(model, op)
    if op.name != "FULLY_CONNECTED":
        raise UnsupportedOpError(f"op {op.index} is {op.name}, not FULLY_CONNECTED")
    x, w, b = _tensor(model, op, 0), _tensor(model, op, 1), _tensor(model, op, 2)
    out = model.main.tensors[op.outputs[0]]
    if (x.dtype, w.dtype, out.dtype) != ("int8", "int8", "int8"):
        raise UnsupportedOpError(f"op {op.index} FULLY_CONNECTED is {x.dtype} x {w.dtype} -> {out.dtype}; only "
                                 "int8 x int8 -> int8 is modelled (not hybrid float, not 16x8)")
    opts = op.options
    if opts.get("WeightsFormat", 0) != 0:
        raise UnsupportedOpError(f"op {op.index} FULLY_CONNECTED: shuffled weights are not supported")
    act = int(opts.get("FusedActivationFunction", 0))
    if act not in (_ACT_NONE, _ACT_RELU, _ACT_RELU_N1_TO_1, _ACT_RELU6):
        raise UnsupportedOpError(f"op {op.index} FULLY_CONNECTED: fused activation "
                                 f"{_ACT_NAMES.get(act, act)} is not supported by TFLite's int8 kernel")
    weights = _const(model, w, "int8", "weights", op)
    if weights.ndim != 2:
        raise UnsupportedOpError(f"op {op.index} FULLY_CONNECTED: weights of rank {weights.ndim}")
    _symmetric(w, "weights", op)
    n_out = weights.shape[0]
    bias = np.zeros(n_out, np.int32) if b is None else _const(model, b, "int32", "bias", op).reshape(n_out)
    in_scale, in_zp = _scale_zp(x, "input", op)
    out_scale, out_zp = _scale_zp(out, "output", op)
    w_scales = np.asarray(w.quant.scale, np.float32)
    if w_scales.size > 1:       # per channel: double(input) * double(filter[c]) / double(output)
        if w_scales.size != n_out or w.quant.axis != 0:
            raise UnsupportedOpError(f"op {op.index} FULLY_CONNECTED: {w_scales.size} weight scales on axis "
                                     f"{w.quant.axis}, expected {n_out} on axis 0")
        pairs = [quantize_multiplier(float(in_scale) * float(s) / float(out_scale), single_rounding)
                 for s in w_scales]
    else:                       # per tensor: double(float(input * filter)) / double(output)
        pairs = [quantize_multiplier(float(in_scale * w_scales[0]) / float(out_scale), single_rounding)] * n_out
    lo, hi = activation_range(act, out_scale, out_zp)
    return FullyConnectedParams(
        weights=weights, bias=bias.astype(np.int32), input_zero_point=in_zp, output_zero_point=out_zp,
        multiplier=np.array([m for m, _ in pairs], np.int64), shift=np.array([s for _, s in pairs], np.int64),
        activation_min=lo, activation_max=hi, per_channel=w_scales.size > 1, input_scale=float(in_scale),
        output_scale=float(out_scale), weight_scales=w_scales, keep_num_dims=bool(opts.get("KeepNumDims", False)))


def _row_sums_times(weights: np.ndarray, scalar: int) -> np.ndarray:
    """``MatrixScalarMultiplyAccumulate`` onto zeros: ``rowsum(weights) * scalar`` with int32 wrap."""
    acc = weights.astype(np.int64).sum(axis=1) * np.int64(scalar)
    return ((acc + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)


def lstm_params(model: TFLiteModel, op: OpInfo | int, single_rounding: bool = False) -> LstmParams:
    """The integer parameters of an int8x8_16 UNIDIRECTIONAL_SEQUENCE_LSTM.

    Raises:
        UnsupportedOpError: not that op; not fully integer (float or hybrid); CIFG (no input gate),
            peephole, projection, layer norm, diagonal recurrent weights, per-channel or asymmetric
            gate weights; a cell-state scale that is not a power of two within 2^-15..2^-9; no
            hidden-state intermediate.
    """
    op = _op(model, op)
    x, h_state, c_state, hidden, out = _lstm_state_tensors(model, op)
    where = f"op {op.index} UNIDIRECTIONAL_SEQUENCE_LSTM"
    in_scale, in_zp = _scale_zp(x, "input", op)
    h_scale, h_zp = _scale_zp(h_state, "output state", op)
    c_scale, _ = _scale_zp(c_state, "cell state", op)
    hid_scale, hid_zp = _scale_zp(hidden, "hidden intermediate", op)
    _, out_zp = _scale_zp(out, "output", op)
    cell_exp = checked_log2(float(c_scale))
    if cell_exp is None or not -15 <= cell_exp <= -9:
        raise UnsupportedOpError(f"{where}: cell state scale {float(c_scale)!r} is not a power of two in "
                                 "2^-15..2^-9 (TFLite's integer tanh covers 0..6 integer bits)")
    gates = {g: _lstm_gate(model, op, g, ix, ih, ib, (in_scale, in_zp), (h_scale, h_zp), single_rounding)
             for g, ix, ih, ib in zip(GATES, _LSTM_IN["w_x"], _LSTM_IN["w_h"], _LSTM_IN["bias"])}
    # effective_hidden_scale = (double) 2^-15 / hidden_scale * 2^-15, stored in a float
    eff_hidden = np.float32(2.0 ** -15 / float(hid_scale) * 2.0 ** -15)
    hm, hs = quantize_multiplier(float(eff_hidden), single_rounding)
    clip = float(op.options.get("CellClip", 0.0) or 0.0)
    qclip = 0
    if clip > 0.0:
        v = np.float32(clip) / c_scale
        qclip = int(np.trunc(min(max(float(v), -32768.0), 32767.0)))
    n_cell, n_input = gates["output"].input_weights.shape
    return LstmParams(
        gates=gates, n_input=int(n_input), n_cell=int(n_cell),
        n_output=int(gates["output"].recurrent_weights.shape[1]), input_zero_point=in_zp,
        output_state_zero_point=h_zp, hidden_zero_point=hid_zp, output_zero_point=out_zp,
        hidden_multiplier=hm, hidden_shift=hs, cell_scale_exponent=int(cell_exp), quantized_cell_clip=qclip,
        time_major=bool(op.options.get("TimeMajor", False)), input_scale=float(in_scale),
        output_state_scale=float(h_scale), hidden_scale=float(hid_scale))


def _lstm_state_tensors(model: TFLiteModel, op: OpInfo) -> tuple:
    """``(input, output state, cell state, hidden intermediate, output)`` tensors of ``op`` once it is
    checked to be the plain int8x8_16 LSTM the golden model covers; :class:`UnsupportedOpError` otherwise."""
    if op.name != "UNIDIRECTIONAL_SEQUENCE_LSTM":
        raise UnsupportedOpError(f"op {op.index} is {op.name}, not UNIDIRECTIONAL_SEQUENCE_LSTM")
    where = f"op {op.index} UNIDIRECTIONAL_SEQUENCE_LSTM"
    if len(op.inputs) not in (20, 24):
        raise UnsupportedOpError(f"{where}: {len(op.inputs)} inputs, TFLite expects 20 or 24")
    t = lambda i: _tensor(model, op, i)  # noqa: E731
    x, out = t(_LSTM_IN["input"]), model.main.tensors[op.outputs[0]]
    w_x = [t(i) for i in _LSTM_IN["w_x"]]
    if x.dtype != "int8" or w_x[3].dtype != "int8":
        raise UnsupportedOpError(f"{where}: input {x.dtype}, weights {w_x[3].dtype}; only the fully integer "
                                 "int8x8_16 LSTM is modelled (not float, not hybrid)")
    missing = {"CIFG (no input gate)": w_x[0] is None,
               "peephole": any(t(i) is not None for i in _LSTM_IN["peephole"]),
               "projection": t(_LSTM_IN["projection"][0]) is not None,
               "layer norm": len(op.inputs) == 24 and t(_LSTM_IN["layer_norm"][1]) is not None}
    used = [k for k, v in missing.items() if v]
    if used:
        raise UnsupportedOpError(f"{where} uses {', '.join(used)}; the golden model covers the plain LSTM only")
    if op.options.get("DiagonalRecurrentTensors"):
        raise UnsupportedOpError(f"{where}: diagonal recurrent weights are not supported")
    h_state, c_state = t(_LSTM_IN["output_state"]), t(_LSTM_IN["cell_state"])
    if h_state is None or c_state is None or (h_state.dtype, c_state.dtype, out.dtype) != ("int8", "int16", "int8"):
        raise UnsupportedOpError(f"{where}: needs an int8 output state, int16 cell state and int8 output")
    if len(op.intermediates) != 5 or model.main.tensors[op.intermediates[4]].quant is None:
        raise UnsupportedOpError(f"{where}: needs 5 intermediates, the last one quantized (hidden state)",
                                 hint="convert with full-integer quantization (the 8x8_16 LSTM)")
    return x, h_state, c_state, model.main.tensors[op.intermediates[4]], out


def _lstm_gate(model: TFLiteModel, op: OpInfo, g: str, ix: int, ih: int, ib: int, inp: tuple, state: tuple,
               single_rounding: bool) -> LstmGateParams:
    """Gate ``g``'s weights, bias, folded zero-point terms and Q3.12 multipliers (inputs ``ix``/``ih``/``ib``
    of ``op``; ``inp``/``state``: the input's and the output state's ``(scale, zero point)``)."""
    where = f"op {op.index} UNIDIRECTIONAL_SEQUENCE_LSTM"
    (in_scale, in_zp), (h_scale, h_zp) = inp, state
    gate_scale = np.float32(2.0 ** -12)            # Q3.12 gate pre-activations (no layer norm)
    wx_t, wh_t, b_t = _tensor(model, op, ix), _tensor(model, op, ih), _tensor(model, op, ib)
    for wt, what in ((wx_t, f"input-to-{g} weights"), (wh_t, f"recurrent-to-{g} weights")):
        if wt.quant is None or wt.quant.scale.size != 1:
            raise UnsupportedOpError(f"{where}: {what} must be per-tensor quantized")
        _symmetric(wt, what, op)
    wx = _const(model, wx_t, "int8", f"input-to-{g} weights", op)
    wh = _const(model, wh_t, "int8", f"recurrent-to-{g} weights", op)
    if wh.ndim != 2:
        raise UnsupportedOpError(f"{where}: diagonal recurrent weights are not supported")
    bias = _const(model, b_t, "int32", f"{g} gate bias", op)
    # float32 products, as in PopulateQuantizedLstmParams8x8_16: w_scale * in_scale / 2^-12
    eff_x = np.float32(wx_t.quant.scale[0]) * in_scale / gate_scale
    eff_h = np.float32(wh_t.quant.scale[0]) * h_scale / gate_scale
    mx, sx = quantize_multiplier(float(eff_x), single_rounding)
    mh, sh = quantize_multiplier(float(eff_h), single_rounding)
    b_x = (bias.astype(np.int64) + _row_sums_times(wx, -in_zp)).astype(np.int64)
    b_x = ((b_x + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)
    return LstmGateParams(wx, wh, bias, b_x, _row_sums_times(wh, -h_zp), mx, sx, mh, sh)


def op_params(model: TFLiteModel, op: OpInfo | int, single_rounding: bool = False
              ) -> FullyConnectedParams | LstmParams:
    """:func:`fully_connected_params` or :func:`lstm_params`, by the op's name."""
    op = _op(model, op)
    if op.name == "FULLY_CONNECTED":
        return fully_connected_params(model, op, single_rounding)
    if op.name == "UNIDIRECTIONAL_SEQUENCE_LSTM":
        return lstm_params(model, op, single_rounding)
    raise UnsupportedOpError(f"op {op.index} is {op.name}; the golden model covers FULLY_CONNECTED and "
                             "UNIDIRECTIONAL_SEQUENCE_LSTM")
