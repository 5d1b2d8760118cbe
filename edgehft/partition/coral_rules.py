"""What the Edge TPU compiler maps, op by op: the supported-op table and its per-op constraints.

Sources: Coral's "TensorFlow models on the Edge TPU" requirements and supported-operations table
(coral.ai/docs/edgetpu/models-intro), and what the real compiler did to the models in
``../shared/data/edgetpu_pairs`` (each rule that comes from an observation says so). Each check
returns ``None`` (the op may map) or a :class:`Refusal` carrying the compiler's own status string, our
reason code, the concrete values that failed and a suggested fix.

Statuses are the strings the compiler writes in its ``.log``/``-s`` table; see :data:`STATUSES`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from edgehft.ir.tflite_model import OpInfo, SubgraphInfo, TFLiteModel

MAPPED = "Mapped to Edge TPU"
MORE_THAN_ONE_SUBGRAPH = "More than one subgraph is not supported"
UNSPECIFIED_LIMITATION = "Operation is otherwise supported, but not mapped due to some unspecified limitation"
UNSUPPORTED_DTYPE = "Operation is working on an unsupported data type"
UNSUPPORTED_RANK = "Tensor has unsupported rank (up to 3 innermost dimensions mapped)"
NOT_SUPPORTED = "Operation not supported"
VERSION_NOT_SUPPORTED = "Operation version not supported"
STATUSES = (MAPPED, MORE_THAN_ONE_SUBGRAPH, UNSPECIFIED_LIMITATION, UNSUPPORTED_DTYPE, UNSUPPORTED_RANK,
            NOT_SUPPORTED, VERSION_NOT_SUPPORTED)

NONE_ACTIVATION = 0                   # tflite.ActivationFunctionType.NONE
SOFTMAX_MAX_ELEMENTS = 16_000
# Largest spatial up-sampling factor of RESIZE_* the compiler was seen to map (movenet: 6->12, 12->24,
# 24->48; tiny-yolo: 2x nearest). Refused in the pairs: 1->33 (deeplabv3) and 33->513 (deeplab slim).
# Coral only says "depending on input/output size ... may not be mapped to avoid loss in precision".
RESIZE_MAX_MAPPED_FACTOR = 2.0


@dataclass(frozen=True)
class Refusal:
    status: str                        # the compiler's status string
    code: str                          # our reason code
    detail: str                        # concrete values that failed
    fix: str | None = None


@dataclass(frozen=True)
class OpRule:
    """A supported op: the lowest runtime that maps it and its extra constraint (None: none)."""

    min_runtime: int = 10
    check: Callable[[OpInfo, SubgraphInfo, TFLiteModel], Refusal | None] | None = None
    note: str = ""


def _t(g: SubgraphInfo, i: int):
    return g.tensors[i]


def _activation(op: OpInfo, g, m) -> Refusal | None:
    act = op.options.get("FusedActivationFunction", NONE_ACTIVATION)
    if act != NONE_ACTIVATION:
        return Refusal(UNSPECIFIED_LIMITATION, "FUSED_ACTIVATION",
                       f"{op.name} has a fused activation (ActivationFunctionType {act})",
                       "apply the activation as its own layer after the op")
    return None


def _concat(op: OpInfo, g, m) -> Refusal | None:
    r = _activation(op, g, m)
    if r:
        return r
    consts = [i for i in op.inputs if i >= 0 and _t(g, i).is_constant]
    if consts:
        zero = all(not np.any(m.buffer(_t(g, i))) for i in consts)
        if len(op.inputs) != 2 or not zero:
            return Refusal(UNSPECIFIED_LIMITATION, "CONCAT_CONSTANT_INPUT",
                           f"{len(op.inputs)} inputs, {len(consts)} constant"
                           + ("" if zero else " and not all zeros"),
                           "a constant input is only allowed as the second of two inputs and all zeros "
                           "(zero padding); feed the constant another way or pad with PAD")
    return None


def _same_dilation(op: OpInfo, g, m) -> Refusal | None:
    """Unequal dilation along height and width does not map, except that dilation along an axis where the
    kernel is 1 wide has no effect: a TCN over (1, T, 1, C) with 3x1 kernels and dilation (2, 1) / (4, 1)
    mapped whole on compiler 16.0 (reported in ../shared/DESIGN.md; edgetpu_pairs holds no such pair). The
    kernel is the weights' (kh, kw): dims 1-2 of CONV_2D's (O, kh, kw, I) and DEPTHWISE_CONV_2D's (1, kh, kw, C)."""
    dh, dw = op.options.get("DilationHFactor", 1), op.options.get("DilationWFactor", 1)
    w = _t(g, op.inputs[1]).shape if len(op.inputs) > 1 and op.inputs[1] >= 0 else ()
    kh, kw = (w[1], w[2]) if len(w) == 4 else (None, None)
    if dh != dw and kh != 1 and kw != 1:
        kernel = f" with a {kh}x{kw} kernel" if kh is not None else ""
        return Refusal(UNSPECIFIED_LIMITATION, "UNEQUAL_DILATION", f"dilation (h, w) = ({dh}, {dw}){kernel}",
                       "use the same dilation rate along height and width (or a kernel 1 wide along the "
                       "axis with the other rate)")
    return _constant_params(op, g, m)


def _constant_params(op: OpInfo, g, m) -> Refusal | None:
    for k in op.inputs[1:3]:
        if k >= 0 and not _t(g, k).is_constant:
            return Refusal(UNSPECIFIED_LIMITATION, "PARAM_NOT_CONSTANT",
                           f"{op.name} input {_t(g, k).name!r} (weights/bias) is not a compile-time constant",
                           "make the weights constant (no weight sharing through a runtime tensor)")
    return None


def model_batch(g: SubgraphInfo) -> int:
    """The batch of the graph's inputs: the largest leading dimension of an input of rank >= 2 (1 when
    every input has batch 1 or rank < 2)."""
    return max((g.tensors[i].shape[0] for i in g.inputs if len(g.tensors[i].shape) >= 2), default=1)


def batch_refusal(t, batch: int) -> Refusal | None:
    """The Edge TPU compiler takes batch-1 models only (Coral's model requirements, ../shared/DESIGN.md): in
    a model whose inputs have ``batch`` > 1, an op on a tensor ``t`` of rank >= 2 with a leading dimension
    above 1 does not map. The status is the compiler's rank string for a rank-4+ tensor (only the 3
    innermost dimensions may exceed 1), else its "unspecified limitation" string."""
    if batch <= 1 or len(t.shape) < 2 or t.shape[0] <= 1:
        return None
    return Refusal(UNSUPPORTED_RANK if len(t.shape) > 3 else UNSPECIFIED_LIMITATION, "BATCH_NOT_1",
                   f"tensor {t.name!r} shape {tuple(t.shape)}: batch {t.shape[0]}; the Edge TPU compiler takes "
                   "batch-1 models only",
                   "convert the model with a batch of 1 (keras.Input(batch_shape=(1, ...))) and call it once "
                   "per window")


def _non_unit_dims(shape) -> int:
    return sum(1 for d in shape if d != 1)


def _fully_connected(op: OpInfo, g, m) -> Refusal | None:
    if op.options.get("WeightsFormat", 0) != 0:
        return Refusal(UNSPECIFIED_LIMITATION, "FC_WEIGHTS_FORMAT",
                       f"weights format {op.options['WeightsFormat']} (only DEFAULT maps)",
                       "convert without the shuffled-weights optimisation")
    out = _t(g, op.outputs[0]).shape
    if _non_unit_dims(out) > 1:
        return Refusal(UNSPECIFIED_LIMITATION, "FC_OUTPUT_NOT_1D", f"output shape {out} is not one-dimensional",
                       "flatten before the Dense layer so its output is (1, units), or apply it per step "
                       "as a 1x1 Conv2D")
    return _constant_params(op, g, m)


def _softmax(op: OpInfo, g, m) -> Refusal | None:
    shape = _t(g, op.inputs[0]).shape
    n = int(np.prod(shape)) if shape else 1
    if _non_unit_dims(shape) > 1:
        return Refusal(UNSPECIFIED_LIMITATION, "SOFTMAX_NOT_1D", f"input shape {shape} is not 1-D",
                       "reshape to (1, N) before the Softmax, or move the Softmax to the host")
    if n > SOFTMAX_MAX_ELEMENTS:
        return Refusal(UNSPECIFIED_LIMITATION, "SOFTMAX_TOO_LARGE", f"{n} elements > {SOFTMAX_MAX_ELEMENTS}",
                       "move the Softmax to the host (argmax of the logits needs no Softmax)")
    return None


def _strided_slice(op: OpInfo, g, m) -> Refusal | None:
    strides = m.buffer(_t(g, op.inputs[3])) if len(op.inputs) > 3 and _t(g, op.inputs[3]).is_constant else None
    if strides is None:
        return Refusal(UNSPECIFIED_LIMITATION, "SLICE_PARAMS_NOT_CONSTANT", "strides are not constant",
                       "use constant begin/end/strides")
    if np.any(strides != 1):
        return Refusal(UNSPECIFIED_LIMITATION, "SLICE_STRIDE", f"strides {strides.tolist()} (all must be 1)",
                       "slice with stride 1, then subsample with a strided Conv2D or pooling")
    for mask in ("EllipsisMask", "NewAxisMask"):
        if op.options.get(mask, 0):
            return Refusal(UNSPECIFIED_LIMITATION, "SLICE_MASK", f"{mask} = {op.options[mask]} (must be 0)",
                           "index without ellipsis / new axes (reshape instead)")
    return None


def _axis_not_batch(name: str, axis_key: str):
    def check(op: OpInfo, g, m) -> Refusal | None:
        rank = len(_t(g, op.outputs[0]).shape)
        axis = op.options.get(axis_key, 1)
        if rank >= 2 and axis % max(rank, 1) == 0 and _t(g, op.outputs[0]).shape[0] != 1:
            return Refusal(UNSPECIFIED_LIMITATION, f"{name}_BATCH_AXIS", f"{name.lower()} along axis 0 (batch)",
                           "keep batch 1 and operate on the inner axes")
        return None
    return check


def _split(op: OpInfo, g, m) -> Refusal | None:
    axis_t = _t(g, op.inputs[0])
    data = _t(g, op.inputs[1])
    if axis_t.is_constant:
        axis = int(m.buffer(axis_t).reshape(-1)[0]) % max(len(data.shape), 1)
        # A 1-way split along a batch of 1 is a copy and maps (yamnet_spectra_in pair).
        if axis == 0 and len(data.shape) > 1 and data.shape[0] != 1:
            return Refusal(UNSPECIFIED_LIMITATION, "SPLIT_BATCH_AXIS", "split along axis 0 (batch)",
                           "split along an inner axis")
    return None


def _reduce(op: OpInfo, g, m) -> Refusal | None:
    data = _t(g, op.inputs[0])
    axes_t = _t(g, op.inputs[1])
    if not axes_t.is_constant:
        return Refusal(UNSPECIFIED_LIMITATION, "REDUCE_AXES_NOT_CONSTANT", "reduction axes are not constant",
                       "use constant axes")
    rank = len(data.shape)
    axes = sorted({int(a) % rank for a in m.buffer(axes_t).reshape(-1)})
    if 0 in axes and rank > 1:
        return Refusal(UNSPECIFIED_LIMITATION, "REDUCE_BATCH_AXIS", f"reduces axes {axes}, including batch",
                       "do not reduce over the batch dimension")
    if op.name == "MEAN" and rank - 1 in axes and data.shape[-1] % 4:
        return Refusal(UNSPECIFIED_LIMITATION, "MEAN_Z_NOT_MULTIPLE_OF_4",
                       f"z-reduction over {data.shape[-1]} channels (must be a multiple of 4)",
                       "pad the channels to a multiple of 4 or reduce over x/y only")
    return None


def _pad(op: OpInfo, g, m) -> Refusal | None:
    pads = _t(g, op.inputs[1])
    if not pads.is_constant:
        return Refusal(UNSPECIFIED_LIMITATION, "PAD_NOT_CONSTANT", "paddings are not constant", "use constant paddings")
    p = m.buffer(pads)
    if p.shape[0] > 1 and np.any(p[0] != 0):
        return Refusal(UNSPECIFIED_LIMITATION, "PAD_BATCH", f"pads the batch dimension by {p[0].tolist()}",
                       "pad only the inner dimensions")
    return None


def _prelu(op: OpInfo, g, m) -> Refusal | None:
    alpha = _t(g, op.inputs[1]).shape
    if _non_unit_dims(alpha[:-1]) > 0:
        return Refusal(UNSPECIFIED_LIMITATION, "PRELU_ALPHA_SHAPE",
                       f"alpha shape {alpha}: only the innermost dimension may exceed 1",
                       "pass shared_axes=[1, 2] to keras.layers.PReLU (one alpha per channel)")
    return None


def _resize(op: OpInfo, g, m) -> Refusal | None:
    src, dst = _t(g, op.inputs[0]).shape, _t(g, op.outputs[0]).shape
    if len(src) != 4:
        return Refusal(UNSPECIFIED_LIMITATION, "RESIZE_RANK", f"input shape {src} is not (1, H, W, C)",
                       "resize a (1, H, W, C) tensor")
    fh, fw = dst[1] / src[1], dst[2] / src[2]
    if max(fh, fw) > RESIZE_MAX_MAPPED_FACTOR:
        return Refusal(UNSPECIFIED_LIMITATION, "RESIZE_FACTOR",
                       f"{src[1]}x{src[2]} -> {dst[1]}x{dst[2]} (factor {max(fh, fw):.3g}; up to "
                       f"{RESIZE_MAX_MAPPED_FACTOR:g} was seen mapped)",
                       "up-sample in steps of at most 2x, or resize on the host after the Edge TPU segment")
    return None


def _quantize(op: OpInfo, g, m) -> Refusal | None:
    src, dst = _t(g, op.inputs[0]).dtype, _t(g, op.outputs[0]).dtype
    if src not in ("int8", "uint8") or dst not in ("int8", "uint8"):
        # The compiler's status for a float input QUANTIZE (seen in published -s tables).
        return Refusal(UNSPECIFIED_LIMITATION, "QUANTIZE_FROM_FLOAT", f"QUANTIZE {src} -> {dst}",
                       "expected at a float model input: the host quantizes (edgehft's runtime does it "
                       "from the input's scale/zero point); convert with int8 or uint8 model I/O to drop it")
    return None


def _lstm(op: OpInfo, g, m) -> Refusal | None:
    if op.options.get("TimeMajor", False):
        return Refusal(UNSPECIFIED_LIMITATION, "LSTM_TIME_MAJOR", "time-major LSTM",
                       "use batch-major input (batch, time, features)")
    return None


_RELU_FIX = "use ReLU, or keras.layers.PReLU(shared_axes=[1, 2]) with alpha initialised to the LeakyReLU slope"
SUPPORTED: dict[str, OpRule] = {
    "ADD": OpRule(), "SUB": OpRule(), "MUL": OpRule(), "MAXIMUM": OpRule(), "MINIMUM": OpRule(),
    "SQUARED_DIFFERENCE": OpRule(min_runtime=14),
    "AVERAGE_POOL_2D": OpRule(check=_activation), "MAX_POOL_2D": OpRule(check=_activation),
    "CONCATENATION": OpRule(check=_concat),
    "CONV_2D": OpRule(check=_same_dilation), "DEPTHWISE_CONV_2D": OpRule(check=_same_dilation),
    "TRANSPOSE_CONV": OpRule(min_runtime=13, check=_constant_params),
    "FULLY_CONNECTED": OpRule(check=_fully_connected),
    "EXPAND_DIMS": OpRule(min_runtime=13), "SQUEEZE": OpRule(min_runtime=13), "RESHAPE": OpRule(
        note="very large reshapes may not map (Coral: 'certain reshapes might not be mapped for large tensors')"),
    "L2_NORMALIZATION": OpRule(), "LOGISTIC": OpRule(), "TANH": OpRule(), "RSQRT": OpRule(min_runtime=14),
    "RELU": OpRule(), "RELU6": OpRule(), "RELU_N1_TO_1": OpRule(), "PRELU": OpRule(check=_prelu),
    "UNIDIRECTIONAL_SEQUENCE_LSTM": OpRule(check=_lstm, note="observed mapped: keras_lstm_mnist_ptq pair"),
    "MEAN": OpRule(check=_reduce), "SUM": OpRule(min_runtime=13, check=_reduce),
    "REDUCE_MAX": OpRule(min_runtime=14, check=_reduce), "REDUCE_MIN": OpRule(min_runtime=14, check=_reduce),
    "PACK": OpRule(check=_axis_not_batch("PACK", "Axis")), "PAD": OpRule(check=_pad),
    "QUANTIZE": OpRule(check=_quantize),
    "RESIZE_BILINEAR": OpRule(check=_resize), "RESIZE_NEAREST_NEIGHBOR": OpRule(check=_resize),
    "SLICE": OpRule(), "STRIDED_SLICE": OpRule(check=_strided_slice),
    "SOFTMAX": OpRule(check=_softmax), "SPACE_TO_DEPTH": OpRule(),
    "SPLIT": OpRule(min_runtime=13, check=_split, note="split_concat pair records runtime 13"),
    "TRANSPOSE": OpRule(min_runtime=14),
    "TILE": OpRule(note="not in Coral's table; observed mapped in the deeplab_mobilenet_edgetpu_slim pair"),
}

# Unsupported ops with a concrete suggestion.
FIXES = {
    "LEAKY_RELU": _RELU_FIX,
    "HARD_SWISH": "use ReLU6-based activations (h-swish has no Edge TPU kernel)",
    "GELU": "use ReLU",
    "ARG_MAX": "return the logits and take argmax on the host",
    "DEQUANTIZE": "expected at a float model output: the host dequantizes (edgehft's runtime does it)",
    "CAST": "keep the arithmetic in int8/uint8; casts run on the host",
    "GATHER": "gather on the host, or express it as a constant-weight FULLY_CONNECTED",
    "BIDIRECTIONAL_SEQUENCE_LSTM": "use two UNIDIRECTIONAL LSTMs (one on the reversed sequence)",
    "WHILE": "unroll the loop, or use a fused LSTM (see `edgehft compile --lowering auto`)",
}
