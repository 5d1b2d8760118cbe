"""The byte layout the edgehft FPGA kernels read (``bitstreams/kernels/dense_int8.cpp``, ``lstm_int8.cpp``).

A :class:`KernelBlob` is what mode 0 of a kernel loads into an on-chip slot: ``weights`` (int8, DDR
buffer at the ``weights`` argument) and ``params`` (int32 little-endian words, at ``params``), plus
``dims``, the scalar arguments of the calls (``n_in``/``n_out`` or ``n_in``/``n_hidden``, and
``rows``/``steps`` when given). The kernels take the op's integer parameters exactly as LiteRT's
``Prepare()`` derives them (:mod:`edgehft.kernels.fpga.params`); nothing is recomputed on the fabric.

``weights``: dense ``[n_out][n_in]`` (row-major, as TFLite stores FULLY_CONNECTED weights); LSTM
``[4 gates in GATES order: input, forget, cell, output][n_hidden][n_in + n_hidden]``: each row holds the
gate's input weights then its recurrent weights.

``params`` header (32 words, both kernels; offsets in int32 words, floats stored as their IEEE bits):

======  =====================  =================================================================
offset  name                   meaning
======  =====================  =================================================================
0       magic                  ``0x54464845`` ("EHFT" in little-endian bytes)
1       version                layout version, 1
2       kind                   1 dense, 2 LSTM
3       header_words           32: the arrays start here
4       total_words            length of the whole blob in words
5       n_in                   input features
6       n_out / n_hidden       output features (dense) or cells = hidden units (LSTM)
7       rounding               requantize mode code: 0 gemmlowp, 1 ruy-x86, 2 fp32, 3 single,
                               4 float64 (:data:`REQUANTIZE`); the LSTM takes 0 or 3
**dense**
8       input_zero_point       informational: already folded into ``eff_bias``
9       output_zero_point      added after requantization
10      activation_min         int8 output clamp (fused RELU / RELU6 / RELU_N1_TO_1)
11      activation_max
12      per_channel            1 when the weights have one scale per output channel
13      keep_num_dims          FULLY_CONNECTED option, informational
14      input_scale            float32 bits, informational
15      output_scale           float32 bits, informational
16-31   reserved               0
**LSTM**
8       input_zero_point       informational: folded into ``input_eff_bias``
9       output_state_zero_pt   h0 of every call (a reset interpreter's output state)
10      hidden_zero_point      added to the requantized ``o * tanh(c)``
11      output_zero_point      informational (the output is the hidden state)
12      hidden_multiplier      Q31, rescales ``o * tanh(c)`` (scale 2^-30) to the hidden scale
13      hidden_shift           left shift if > 0
14      cell_scale_exponent    cell state scale is 2^this (-15..-9); tanh(c) has 15 + this int bits
15      cell_clip              quantized cell clip, int16; 0 = no clip
16      time_major             informational (batch 1: the same bytes either way)
17      input_scale            float32 bits, informational
18      output_state_scale     float32 bits, informational
19      hidden_scale           float32 bits, informational
20-31   reserved               0
======  =====================  =================================================================

Arrays after the header (``H`` = 32, ``n`` = n_out or n_hidden):

======================  ==========================================================================
offset                  array
======================  ==========================================================================
**dense**
H                       ``eff_bias[n]``: ``bias - input_zp * rowsum(W)``, wrapped to int32
H + n                   ``multiplier[n]``: Q31 in [2^30, 2^31) or 0 (per-tensor pairs repeated)
H + 2n                  ``shift[n]``
H + 3n                  ``scale_f32[n]``: float32 ``s_in * s_w / s_out`` (XNNPACK's, ``fp32`` mode)
H + 4n                  ``scale_f64[n]``: float64 of the same in double (``float64`` mode), 2 words
                        per channel, low word first
H + 6n                  ``weight_scale[n]``: float32 weight scales as stored (broadcast), informational
H + 7n                  end (total_words)
**LSTM**
H                       ``input_multiplier[4]``, per gate in GATES order
H + 4                   ``input_shift[4]``
H + 8                   ``recurrent_multiplier[4]``
H + 12                  ``recurrent_shift[4]``
H + 16                  ``input_eff_bias[4][n]``: ``bias - input_zp * rowsum(W_x)``, int32 wrap
H + 16 + 4n             ``recurrent_eff_bias[4][n]``: ``-output_state_zp * rowsum(W_h)``
H + 16 + 8n             end (total_words)
======================  ==========================================================================

The zero-point folding is exact modulo 2^32, which is how both TFLite and the kernels accumulate.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgehft.kernels.fpga.params import (GATES, FullyConnectedParams, LstmGateParams, LstmParams, fully_connected_params,
                                    lstm_params)

MAGIC = 0x54464845
VERSION = 1
HEADER_WORDS = 32
KIND_DENSE, KIND_LSTM = 1, 2
KERNEL = {KIND_DENSE: "dense_int8", KIND_LSTM: "lstm_int8"}
#: requantize / rounding mode name -> code in header word 7 (same codes as int8_ops.h ``Requantize``)
REQUANTIZE = {"gemmlowp": 0, "ruy-x86": 1, "fp32": 2, "single": 3, "float64": 4}
_ALIASES = {"double": "gemmlowp"}
_MODE_NAME = {v: k for k, v in REQUANTIZE.items()}
LSTM_ROUNDINGS = ("gemmlowp", "single")
# header words
_W_MAGIC, _W_VERSION, _W_KIND, _W_HEADER, _W_TOTAL, _W_N_IN, _W_N_OUT, _W_ROUNDING = range(8)


@dataclass(frozen=True, eq=False)
class KernelBlob:
    """What one kernel slot holds: int8 ``weights``, int32 ``params`` (header + arrays, see the module
    docstring) and ``dims``, the kernel's scalar arguments for this layer."""

    kernel: str                       # "dense_int8" | "lstm_int8"
    weights: np.ndarray               # int8, 1-D (the flattened layout above)
    params: np.ndarray                # int32, 1-D
    dims: dict[str, int] = field(default_factory=dict)

    @property
    def header(self) -> dict[str, int]:
        return read_header(self.params)

    @classmethod
    def from_arrays(cls, weights: np.ndarray, params: np.ndarray) -> "KernelBlob":
        """A blob from the raw arrays (e.g. read back from device memory), ``dims`` from its header."""
        params = np.ascontiguousarray(params, np.int32).reshape(-1)
        h = read_header(params)
        kind = h["kind"]
        dims = {"n_in": h["n_in"], "n_out" if kind == KIND_DENSE else "n_hidden": h["n_out"]}
        return cls(KERNEL[kind], np.ascontiguousarray(weights, np.int8).reshape(-1), params, dims)


def _f32_bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).reshape(-1).view(np.int32)


def _wrap32(x) -> np.ndarray:
    return ((np.asarray(x, np.int64) + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)


def _mode_code(name: str, allowed) -> int:
    name = _ALIASES.get(name, name)
    if name not in allowed:
        raise ValueError(f"requantize mode {name!r} is not one the kernel runs; choose one of {list(allowed)}")
    return REQUANTIZE[name]


def read_header(params: np.ndarray) -> dict[str, int]:
    """The common header words of a params blob, checked (magic, version, kind, lengths).

    Raises:
        ValueError: not a blob of this layout version, or truncated.
    """
    p = np.asarray(params).reshape(-1)
    if p.size < HEADER_WORDS:
        raise ValueError(f"params blob has {p.size} words, the header alone has {HEADER_WORDS}")
    p = p.astype(np.int64)
    if p[_W_MAGIC] != MAGIC or p[_W_VERSION] != VERSION or p[_W_KIND] not in KERNEL or p[_W_HEADER] != HEADER_WORDS:
        raise ValueError(f"not an edgehft kernel blob v{VERSION} (magic {int(p[0]) & 0xFFFFFFFF:#x}, "
                         f"version {int(p[1])}, kind {int(p[2])}, header {int(p[3])})")
    if p[_W_TOTAL] > p.size:
        raise ValueError(f"params blob is truncated: header says {int(p[_W_TOTAL])} words, got {p.size}")
    return {"kind": int(p[_W_KIND]), "total_words": int(p[_W_TOTAL]), "n_in": int(p[_W_N_IN]),
            "n_out": int(p[_W_N_OUT]), "rounding": int(p[_W_ROUNDING])}


def _header(kind: int, total: int, n_in: int, n_out: int, rounding: int) -> np.ndarray:
    h = np.zeros(HEADER_WORDS, np.int64)
    h[:8] = (MAGIC, VERSION, kind, HEADER_WORDS, total, n_in, n_out, rounding)
    return h


def pack_fc(p: FullyConnectedParams, requantize: str, rows: int = 1) -> KernelBlob:
    """The dense kernel's blob for an int8 FULLY_CONNECTED, requantizing with ``requantize``
    (``"gemmlowp"``, ``"ruy-x86"``, ``"fp32"``, ``"single"`` or ``"float64"``: pick the mode of the
    interpreter path the golden vectors come from, see :mod:`edgehft.kernels.fpga.reference`).
    ``rows``: the input rows of one call (``prod(x.shape) // n_in``; :func:`pack_op` derives it)."""
    code = _mode_code(requantize, REQUANTIZE)
    n_out, n_in = p.n_out, p.n_in
    w = np.ascontiguousarray(p.weights, np.int8)
    w_scales = np.broadcast_to(np.asarray(p.weight_scales, np.float32).reshape(-1), (n_out,))
    s_in, s_out = np.float32(p.input_scale), np.float32(p.output_scale)
    # exactly the effective scales reference.fully_connected_int8 computes for the float modes
    scale32 = (s_in * w_scales / s_out).astype(np.float32)
    scale64 = float(s_in) * w_scales.astype(np.float64) / float(s_out)
    eff_bias = _wrap32(p.bias.astype(np.int64) - p.input_zero_point * w.astype(np.int64).sum(axis=1))
    total = HEADER_WORDS + 7 * n_out
    h = _header(KIND_DENSE, total, n_in, n_out, code)
    h[8:16] = (p.input_zero_point, p.output_zero_point, p.activation_min, p.activation_max, int(p.per_channel),
               int(p.keep_num_dims), _f32_bits(s_in)[0], _f32_bits(s_out)[0])
    params = np.concatenate([h.astype(np.int32), eff_bias, np.asarray(p.multiplier, np.int64).astype(np.int32),
                             np.asarray(p.shift, np.int64).astype(np.int32), _f32_bits(scale32),
                             np.ascontiguousarray(scale64, np.float64).view(np.int32), _f32_bits(w_scales)])
    assert params.size == total
    dims = {"rows": int(rows), "n_in": n_in, "n_out": n_out}
    return KernelBlob("dense_int8", w.reshape(-1), params, dims)


def unpack_fc(blob: KernelBlob) -> tuple[FullyConnectedParams, str]:
    """``(params, requantize)`` back from a dense blob (the raw bias is recovered from ``eff_bias``)."""
    h = read_header(blob.params)
    if h["kind"] != KIND_DENSE:
        raise ValueError(f"not a dense blob (kind {h['kind']})")
    p, n_in, n = blob.params, h["n_in"], h["n_out"]
    w = np.asarray(blob.weights, np.int8).reshape(n, n_in)
    arr = lambda k, width=1: p[HEADER_WORDS + k * n: HEADER_WORDS + (k + width) * n]  # noqa: E731
    in_zp = int(p[8])
    bias = _wrap32(arr(0).astype(np.int64) + in_zp * w.astype(np.int64).sum(axis=1))
    per_channel = bool(p[12])
    w_scales = arr(6).view(np.float32).copy()
    return FullyConnectedParams(
        weights=w, bias=bias, input_zero_point=in_zp, output_zero_point=int(p[9]),
        multiplier=arr(1).astype(np.int64), shift=arr(2).astype(np.int64), activation_min=int(p[10]),
        activation_max=int(p[11]), per_channel=per_channel, input_scale=float(p[14:15].view(np.float32)[0]),
        output_scale=float(p[15:16].view(np.float32)[0]), weight_scales=w_scales if per_channel else w_scales[:1],
        keep_num_dims=bool(p[13])), _MODE_NAME[h["rounding"]]


def pack_lstm(p: LstmParams, rounding: str = "gemmlowp", steps: int | None = None) -> KernelBlob:
    """The LSTM kernel's blob for an int8x8_16 UNIDIRECTIONAL_SEQUENCE_LSTM (no projection: n_cell ==
    n_output). ``rounding``: ``"gemmlowp"`` (what LiteRT 2.3.0 runs on every path) or ``"single"``.
    ``steps``: the time steps of one call, recorded in ``dims`` when given (the kernel's mode-1 call
    needs it: :func:`pack_op` takes it from the input shape)."""
    code = _mode_code(rounding, LSTM_ROUNDINGS)
    if p.n_cell != p.n_output:
        raise ValueError(f"n_cell {p.n_cell} != n_output {p.n_output}: the kernel has no projection")
    n, n_in = p.n_cell, p.n_input
    gs = [p.gates[g] for g in GATES]
    w = np.stack([np.concatenate([np.asarray(g.input_weights, np.int8), np.asarray(g.recurrent_weights, np.int8)],
                                 axis=1) for g in gs])
    total = HEADER_WORDS + 16 + 8 * n
    h = _header(KIND_LSTM, total, n_in, n, code)
    h[8:20] = (p.input_zero_point, p.output_state_zero_point, p.hidden_zero_point, p.output_zero_point,
               p.hidden_multiplier, p.hidden_shift, p.cell_scale_exponent, p.quantized_cell_clip, int(p.time_major),
               _f32_bits(p.input_scale)[0], _f32_bits(p.output_state_scale)[0], _f32_bits(p.hidden_scale)[0])
    per_gate = np.array([[g.input_multiplier for g in gs], [g.input_shift for g in gs],
                         [g.recurrent_multiplier for g in gs], [g.recurrent_shift for g in gs]], np.int64)
    params = np.concatenate([h, per_gate.reshape(-1),
                             np.concatenate([np.asarray(g.input_effective_bias, np.int64) for g in gs]),
                             np.concatenate([np.asarray(g.recurrent_effective_bias, np.int64) for g in gs])])
    assert params.size == total
    dims = {**({"steps": int(steps)} if steps is not None else {}), "n_in": n_in, "n_hidden": n}
    return KernelBlob("lstm_int8", w.reshape(-1), params.astype(np.int32), dims)


def unpack_lstm(blob: KernelBlob) -> tuple[LstmParams, str]:
    """``(params, rounding)`` back from an LSTM blob (raw gate biases recovered from the effective ones)."""
    h = read_header(blob.params)
    if h["kind"] != KIND_LSTM:
        raise ValueError(f"not an LSTM blob (kind {h['kind']})")
    p, n_in, n = blob.params.astype(np.int64), h["n_in"], h["n_out"]
    w = np.asarray(blob.weights, np.int8).reshape(4, n, n_in + n)
    per_gate = p[HEADER_WORDS:HEADER_WORDS + 16].reshape(4, 4)
    b_x = p[HEADER_WORDS + 16:HEADER_WORDS + 16 + 4 * n].reshape(4, n)
    b_h = p[HEADER_WORDS + 16 + 4 * n:HEADER_WORDS + 16 + 8 * n].reshape(4, n)
    in_zp = int(p[8])
    gates = {}
    for k, g in enumerate(GATES):
        wx, wh = w[k, :, :n_in].copy(), w[k, :, n_in:].copy()
        # eff = wrap(bias + wrap(rowsum * -zp)), so bias = wrap(eff - wrap(rowsum * -zp))
        bias = _wrap32(b_x[k] - _wrap32(wx.astype(np.int64).sum(axis=1) * -in_zp))
        gates[g] = LstmGateParams(wx, wh, bias, b_x[k].astype(np.int32), b_h[k].astype(np.int32),
                                  int(per_gate[0, k]), int(per_gate[1, k]), int(per_gate[2, k]), int(per_gate[3, k]))
    f32 = lambda i: float(blob.params[i:i + 1].view(np.float32)[0])  # noqa: E731
    return LstmParams(
        gates=gates, n_input=n_in, n_cell=n, n_output=n, input_zero_point=in_zp,
        output_state_zero_point=int(p[9]), hidden_zero_point=int(p[10]), output_zero_point=int(p[11]),
        hidden_multiplier=int(p[12]), hidden_shift=int(p[13]), cell_scale_exponent=int(p[14]),
        quantized_cell_clip=int(p[15]), time_major=bool(p[16]), input_scale=f32(17), output_state_scale=f32(18),
        hidden_scale=f32(19)), _MODE_NAME[h["rounding"]]


def pack_op(model, op, requantize: str = "ruy-x86", rounding: str = "gemmlowp") -> KernelBlob:
    """The blob of op ``op`` (index or OpInfo) of ``model`` (a :class:`~edgehft.ir.tflite_model.TFLiteModel`)
    with complete ``dims``: ``rows`` of a FULLY_CONNECTED (``prod(input shape) // n_in``) or ``steps``
    of a batch-1 LSTM, from the input tensor's static shape. ``requantize`` applies to FULLY_CONNECTED,
    ``rounding`` to the LSTM."""
    op = model.main.ops[op] if isinstance(op, int) else op
    shape = [int(d) for d in model.main.tensors[op.inputs[0]].shape]
    if op.name == "FULLY_CONNECTED":
        p = fully_connected_params(model, op)
        return pack_fc(p, requantize, rows=int(np.prod(shape)) // p.n_in)
    p = lstm_params(model, op)
    if len(shape) != 3 or int(np.prod(shape)) != shape[0 if p.time_major else 1] * p.n_input:
        raise ValueError(f"op {op.index}: the LSTM kernel runs one sequence per call; input shape {shape}")
    return pack_lstm(p, rounding, steps=shape[0 if p.time_major else 1])
