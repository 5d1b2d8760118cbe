"""Explicit Q/DQ ONNX for TensorRT, with the scales of the int8 TFLite IR. Main process: onnx + numpy only.

:func:`insert_qdq` takes the float ONNX export of the lowered model and the full-int8 ``model.tflite`` the
worker converted from the *same* calibration windows as the cpu/coral/pynq boards, and writes a copy of
the ONNX graph with ``QuantizeLinear``/``DequantizeLinear`` pairs, so that TensorRT 10+ (strongly typed,
no INT8 flag or calibrator) builds an int8 network whose ranges are the IR's.

Matching ONNX tensors to TFLite tensors (both tools keep the Keras layer names):
  1. by name: an ONNX tensor ``deeplob/leaky_re_lu/LeakyRelu:0`` is the TFLite tensor whose name, or one
     ``;``-separated part of it, is ``deeplob/leaky_re_lu/LeakyRelu``;
  2. by op: ONNX nodes are paired with TFLite ops of the same kind and Keras layer (``Conv`` of
     ``conv2d_3`` <-> ``CONV_2D`` of ``conv2d_3``); kinds left unpaired (``LSTM__28`` <->
     ``tfl.unidirectional_sequence_lstm``) are paired by position in graph order when both graphs have
     the same number left. A pair maps output 0 to output 0 and data inputs by index;
  3. graph inputs and outputs by position.
A match is kept only when both tensors hold the same number of elements (layouts differ: NCHW vs NHWC).

Placement: a Q/DQ pair on every matched activation that feeds a ``Conv``/``Gemm``/``MatMul`` (each
weighted op reads a DQ directly, as TensorRT expects) and on matched outputs of ops that requantize in
TFLite (Concat, Gemm, LSTM, Add...). ``placement="tensorrt"`` (the default) leaves out the pair between a
weighted op and the activation it feeds (TensorRT fuses Conv+LeakyRelu+Q) and on graph outputs;
``placement="tflite"`` mirrors every requantization point of the IR. Outputs of data-movement ops
(Reshape, Transpose, Squeeze, Slice, MaxPool...) stay on their input's grid without a new pair unless a
weighted op reads them. Weights of Conv/Gemm/MatMul become int8 initializers + a per-channel
``DequantizeLinear`` along the output-channel axis, with the TFLite filter's per-channel scales when the
layer matched (symmetric, [-127, 127], as TensorRT wants), else max|w|/127. Biases stay float.

The LSTM stays float (TensorRT runs LSTM in fp16/fp32 and has no int8 LSTM): it reads the dequantized
output of the concat (through Transpose/Reshape) and its output gets a Q/DQ pair with the TFLite LSTM
output's range -- Q/DQ around it, none inside.

Zero points: TensorRT accepts only zero point 0 (symmetric int8), while TFLite activations are
asymmetric. ``zero_points="symmetric"`` (the default, for TensorRT) keeps the TFLite tensor's calibrated
range [(-128 - zp)·s, (127 - zp)·s] and covers it with zero point 0: scale = max(-rmin/128, rmax/127),
which equals ``s`` exactly when ``zp == 0`` and is up to ~2·s for one-sided tensors (one bit less).
``zero_points="tflite"`` copies scale and zero point as they are (onnxruntime runs it; TensorRT refuses).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from edgehft.errors import InputError
from edgehft.ir import TFLiteModel
from edgehft.ir.tflite_model import source_layer

WEIGHTED = {"Conv": 0, "Gemm": None, "MatMul": None}      # op type -> weight output-channel axis (None: by attrs)
# ONNX op type -> TFLite op names of the same kind, and which inputs carry activations.
_KINDS = {"Conv": ("CONV_2D", "DEPTHWISE_CONV_2D"), "Gemm": ("FULLY_CONNECTED",),
          "MatMul": ("FULLY_CONNECTED", "BATCH_MATMUL"), "LeakyRelu": ("LEAKY_RELU",), "Relu": ("RELU",),
          "Clip": ("RELU6", "RELU_N1_TO_1"), "MaxPool": ("MAX_POOL_2D",), "AveragePool": ("AVERAGE_POOL_2D",),
          "Concat": ("CONCATENATION",), "Softmax": ("SOFTMAX",), "Add": ("ADD",), "Mul": ("MUL",),
          "Sub": ("SUB",), "Sigmoid": ("LOGISTIC",), "Tanh": ("TANH",), "Reshape": ("RESHAPE",),
          "Transpose": ("TRANSPOSE",), "Slice": ("STRIDED_SLICE", "SLICE"), "Squeeze": ("SQUEEZE",),
          "LSTM": ("UNIDIRECTIONAL_SEQUENCE_LSTM",), "ReduceMean": ("MEAN",), "Pad": ("PAD",)}
_DATA_INPUTS = {"Conv": (0,), "Gemm": (0,), "MatMul": (0,), "LSTM": (0,), "Concat": None, "Add": None,
                "Mul": None, "Sub": None}                 # None: every input; default (0,)
_ACTIVATIONS = {"LeakyRelu", "Relu", "Clip", "Sigmoid", "Tanh", "Elu", "HardSigmoid"}
# Outputs of these stay on their input's quantization grid: no new Q/DQ pair (TFLite keeps the scale).
PASS_THROUGH = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Identity", "MaxPool",
                "Cast", "Gather", "Pad"}


def _base(name: str) -> str:
    return name[:-2] if name.endswith(":0") else name


def symmetric_scale(scale: float, zero_point: int) -> float:
    """The zero-point-0 int8 scale covering the TFLite range ``[(-128 - zp)·s, (127 - zp)·s]``."""
    s = np.float32(scale)
    lo, hi = (-128 - int(zero_point)) * s, (127 - int(zero_point)) * s
    return float(np.float32(max(-lo / np.float32(128), hi / np.float32(127), np.float32(1e-12))))


class _Matcher:
    """ONNX tensor name -> TFLite tensor, by name, by op pairs and by graph I/O."""

    def __init__(self, g, ir: TFLiteModel, elems: dict[str, int]):
        self.g, self.sub, self.elems = g, ir.main, elems
        self.by_part: dict[str, int] = {}
        for t in self.sub.tensors:
            for part in t.name.split(";"):
                self.by_part.setdefault(part, t.index)
        self.match: dict[str, tuple[int, str]] = {}       # onnx tensor -> (tflite tensor index, how)
        self.op_pairs: dict[str, object] = {}             # onnx node name -> tflite OpInfo

    def _ok(self, onnx_name: str, ti: int) -> bool:
        t = self.sub.tensors[ti]
        n = self.elems.get(onnx_name)
        return (t.quant is not None and t.quant.scale.size == 1 and t.dtype in ("int8", "uint8")
                and not t.is_constant and (n is None or n == int(np.prod(t.shape))))

    def _add(self, onnx_name: str, ti: int, how: str) -> None:
        if onnx_name and onnx_name not in self.match and self._ok(onnx_name, ti):
            self.match[onnx_name] = (ti, how)

    def run(self, activations: list[str]) -> None:
        for name in activations:                          # 1. by name
            ti = self.by_part.get(_base(name))
            if ti is not None:
                self._add(name, ti, "name")
        self._pair_ops()                                  # 2. by op pairs
        for node in self.g.node:
            op = self.op_pairs.get(node.name)
            if op is None:
                continue
            if node.output and op.outputs:
                self._add(node.output[0], op.outputs[0], "op:" + op.name)
            idx = _DATA_INPUTS.get(node.op_type, (0,))
            idx = range(min(len(node.input), len(op.inputs))) if idx is None else idx
            for i in idx:
                if i < len(node.input) and i < len(op.inputs) and op.inputs[i] >= 0:
                    self._add(node.input[i], op.inputs[i], "op-input:" + op.name)
        for o_in, t_in in zip(self.g.input, self.sub.inputs):      # 3. graph I/O
            self._add(o_in.name, t_in, "graph-input")
        for o_out, t_out in zip(self.g.output, self.sub.outputs):
            self._add(o_out.name, t_out, "graph-output")

    def _pair_ops(self) -> None:
        tfl_layer = {op.index: source_layer(self.sub.tensors[op.outputs[0]].name) if op.outputs else None
                     for op in self.sub.ops}
        used: set[int] = set()
        left_onnx = []
        for node in self.g.node:
            kinds = _KINDS.get(node.op_type)
            if not kinds:
                continue
            layer = source_layer(node.name) or (source_layer(node.output[0]) if node.output else None)
            cand = [op for op in self.sub.ops if op.index not in used and op.name in kinds
                    and layer is not None and tfl_layer[op.index] == layer]
            if len(cand) == 1:
                self.op_pairs[node.name] = cand[0]
                used.add(cand[0].index)
            else:
                left_onnx.append(node)
        by_kind = defaultdict(list)                       # position fallback, per op kind
        for node in left_onnx:
            by_kind[_KINDS[node.op_type]].append(node)
        for kinds, nodes in by_kind.items():
            ops = [op for op in self.sub.ops if op.index not in used and op.name in kinds]
            if len(ops) == len(nodes):
                for node, op in zip(nodes, ops):
                    self.op_pairs[node.name] = op
                    used.add(op.index)


def _weight_axis(node, w: np.ndarray) -> int:
    if node.op_type == "Conv":
        return 0
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return w.ndim - 1                                    # MatMul: B is (..., K, N)


def insert_qdq(onnx_path: str | Path, tflite_path: str | Path, out_path: str | Path,
               zero_points: str = "symmetric", placement: str = "tensorrt") -> dict:
    """Write ``out_path``: ``onnx_path`` with Q/DQ pairs whose ranges come from ``tflite_path``.

    Args:
        onnx_path: float32 ONNX export of the lowered model.
        tflite_path: full-int8 TFLite model of the same lowered model (the boards' shared IR).
        zero_points: ``symmetric`` (zero point 0, what TensorRT accepts) or ``tflite`` (as in the IR).
        placement: ``tflite`` (every requantization point of the IR) or ``tensorrt`` (no pair between a
            weighted op and the activation it feeds, none on graph outputs: TensorRT fuses Conv+act+Q).
    Returns:
        figures: ``qdq_pairs`` (activation Q/DQ pairs), ``weights_per_channel``, ``weight_scales``
        (``tflite`` / ``computed``), ``activations`` (float activation tensors), ``matched`` /
        ``unmatched`` (counts), ``matched_tensors`` (ONNX name -> TFLite name, how, TFLite scale/zp, ONNX
        scale/zp, whether a pair was inserted), ``unmatched_tensors``, ``zero_points``, ``op_pairs``.
    Raises:
        InputError: a bad mode, or a TFLite model that is not full-int8.
    """
    import onnx

    if zero_points not in ("symmetric", "tflite") or placement not in ("tflite", "tensorrt"):
        raise InputError(f"zero_points must be 'symmetric' or 'tflite' (got {zero_points!r}) and placement "
                         f"'tflite' or 'tensorrt' (got {placement!r})")
    ir = _int8_ir(tflite_path)
    model = onnx.shape_inference.infer_shapes(onnx.load(str(onnx_path)))
    g = model.graph
    facts = _GraphFacts(g)
    m = _Matcher(g, ir, facts.elems)
    m.run(facts.activations)
    matched, plan = _plan_pairs(facts, m, ir, zero_points, placement)
    new_inits: list = []
    nodes = _with_pairs(g, plan, facts.graph_out, new_inits)
    w_stats, per_channel = _quantize_weights(nodes, facts.inits, m, ir, new_inits)
    _replace_graph(g, nodes, new_inits)
    onnx.checker.check_model(model)
    onnx.save(model, str(out_path))
    unmatched = [a for a in facts.activations if a not in matched]
    return {"qdq_pairs": len(plan), "weights_per_channel": per_channel, "weight_scales": w_stats,
            "activations": len(facts.activations), "matched": len(matched), "unmatched": len(unmatched),
            "matched_tensors": matched, "unmatched_tensors": unmatched, "zero_points": zero_points,
            "placement": placement,
            "op_pairs": {k: f"{v.index}:{v.name}" for k, v in m.op_pairs.items()}}


def _int8_ir(tflite_path: str | Path) -> TFLiteModel:
    """The TFLite IR of ``tflite_path``; :class:`InputError` when it has no int8 tensors."""
    ir = TFLiteModel.from_file(tflite_path)
    if not any(t.dtype == "int8" and t.quant is not None for t in ir.main.tensors):
        raise InputError(f"{Path(tflite_path).name} has no int8 tensors: Q/DQ needs the full-int8 TFLite model",
                         hint="convert with quant 'int8' from the same calibration windows")
    return ir


class _GraphFacts:
    """What the placement reads of a shape-inferred ONNX graph: initializers, element counts of tensors
    with static shapes, producers, consumers, graph outputs, float activations and weighted ops' inputs."""

    def __init__(self, g):
        from onnx import TensorProto
        self.inits = {t.name: t for t in g.initializer}
        infos = list(g.value_info) + list(g.input) + list(g.output)
        self.elems = {}
        for vi in infos:
            dims = vi.type.tensor_type.shape.dim
            if dims and all(d.HasField("dim_value") for d in dims):
                self.elems[vi.name] = int(np.prod([d.dim_value for d in dims]))
        float_t = {vi.name for vi in infos if vi.type.tensor_type.elem_type == TensorProto.FLOAT}
        self.producer = {o: n for n in g.node for o in n.output}
        self.consumers = defaultdict(list)
        for n in g.node:
            for i, name in enumerate(n.input):
                self.consumers[name].append((n, i))
        self.activations = [o for n in g.node for o in n.output if o and o in float_t] + \
                           [i.name for i in g.input if i.name not in self.inits]
        self.weighted_inputs = {n.input[0] for n in g.node if n.op_type in WEIGHTED}
        self.graph_out = {o.name for o in g.output}


def _plan_pairs(facts: _GraphFacts, m: _Matcher, ir: TFLiteModel, zero_points: str,
                placement: str) -> tuple[dict, dict]:
    """``(matched, plan)``: per matched activation its TFLite and ONNX scale/zero point and whether it gets
    a pair; ``plan`` maps each tensor that gets one to its ``(scale, zero_point)``."""
    plan, matched = {}, {}                                # tensor -> (scale, zp) of the pair to insert
    consumers, producer = facts.consumers, facts.producer
    weighted_inputs, graph_out = facts.weighted_inputs, facts.graph_out
    for name in facts.activations:
        if name not in m.match:
            continue
        ti, how = m.match[name]
        t = ir.main.tensors[ti]
        s, zp = float(t.quant.scale[0]), int(t.quant.zero_point[0])
        if t.dtype == "uint8":
            zp -= 128                                     # the same grid in int8
        qs, qz = (symmetric_scale(s, zp), 0) if zero_points == "symmetric" else (s, zp)
        prod = producer.get(name)
        insert = bool(consumers.get(name) or name in graph_out) and (
            name in weighted_inputs or (prod is not None and prod.op_type not in PASS_THROUGH))
        if placement == "tensorrt" and name not in weighted_inputs and (name in graph_out or (
                prod is not None and prod.op_type in WEIGHTED
                and all(c.op_type in _ACTIVATIONS for c, _ in consumers.get(name, [])))):
            insert = False
        matched[name] = {"tflite": t.name, "how": how, "tflite_scale": s, "tflite_zero_point": zp,
                         "scale": qs, "zero_point": qz, "qdq": insert}
        if insert:
            plan[name] = (qs, qz)
    return matched, plan


def _with_pairs(g, plan: dict, graph_out: set, new_inits: list) -> list:
    """The graph's nodes with a Q/DQ pair after each planned tensor (graph inputs: at the front) and
    their consumers reading the dequantized tensor; the pairs' initializers are appended to ``new_inits``."""
    from onnx import helper, numpy_helper
    nodes = []
    rename = {}
    for n in g.node:
        nodes.append(n)
        for out in n.output:
            if out in plan:
                nodes.extend(_pair(out, *plan[out], out in graph_out, n, rename, new_inits, helper, numpy_helper))
    for name in (i.name for i in g.input):              # a graph input feeding a weighted op directly
        if name in plan:
            nodes[:0] = _pair(name, *plan[name], False, None, rename, new_inits, helper, numpy_helper)
    for n in nodes:                                       # consumers read the dequantized tensor
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.name.startswith("qdq/"):
            continue
        for i, name in enumerate(n.input):
            if name in rename:
                n.input[i] = rename[name]
    return nodes


def _quantize_weights(nodes: list, inits: dict, m: _Matcher, ir: TFLiteModel,
                      new_inits: list) -> tuple[dict, int]:
    """Give each Conv/Gemm/MatMul in ``nodes`` (edited in place) an int8 weight and a per-channel
    ``DequantizeLinear`` (the matched TFLite filter's scales, else max|w|/127); the new initializers are
    appended to ``new_inits``. Returns ``({"tflite": n, "computed": n}, weights quantized)``."""
    from onnx import helper, numpy_helper
    w_stats = {"tflite": 0, "computed": 0}
    per_channel = 0
    for n in list(nodes):
        if n.op_type not in WEIGHTED or len(n.input) < 2 or n.input[1] not in inits:
            continue
        w = numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)
        axis = _weight_axis(n, w)
        red = tuple(a for a in range(w.ndim) if a != axis)
        scale = np.maximum(np.abs(w).max(axis=red), 1e-12) / 127.0
        op = m.op_pairs.get(n.name)
        tw = ir.main.tensors[op.inputs[1]] if op is not None and len(op.inputs) > 1 and op.inputs[1] >= 0 else None
        if tw is not None and tw.quant is not None and tw.quant.scale.size == w.shape[axis] \
                and not np.any(tw.quant.zero_point):
            scale = tw.quant.scale.astype(np.float32)
            w_stats["tflite"] += 1
        else:
            w_stats["computed"] += 1
        scale = scale.astype(np.float32)
        shape = [1] * w.ndim
        shape[axis] = -1
        q = np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(np.int8)
        base = n.input[1]
        new_inits += [numpy_helper.from_array(q, base + "_int8"),
                      numpy_helper.from_array(scale, base + "_scale"),
                      numpy_helper.from_array(np.zeros(len(scale), np.int8), base + "_zero_point")]
        dq = helper.make_node("DequantizeLinear", [base + "_int8", base + "_scale", base + "_zero_point"],
                              [base + "_dq"], axis=axis, name=f"qdq/{base}/DequantizeLinear")
        nodes.insert(nodes.index(n), dq)
        n.input[1] = base + "_dq"
        per_channel += 1
    return w_stats, per_channel


def _replace_graph(g, nodes: list, new_inits: list) -> None:
    """Set ``g``'s nodes to ``nodes`` and its initializers to the used ones plus ``new_inits``; drop the
    now stale value_info."""
    used = {i for n in nodes for i in n.input}
    keep = [t for t in g.initializer if t.name in used] + new_inits
    del g.initializer[:]
    g.initializer.extend(keep)
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]


def _pair(name, scale, zp, is_output, prod, rename, inits, helper, numpy_helper) -> list:
    """Q/DQ nodes for tensor ``name``; consumers are rewired through ``rename`` (a graph output keeps its
    name: the producer writes ``name/float`` and the DQ writes ``name``)."""
    s_name, z_name = f"qdq/{name}/scale", f"qdq/{name}/zero_point"
    inits += [numpy_helper.from_array(np.array(scale, np.float32), s_name),
              numpy_helper.from_array(np.array(zp, np.int8), z_name)]
    src, dst = name, f"{name}/dq"
    if is_output and prod is not None:
        src, dst = f"{name}/float", name
        prod.output[list(prod.output).index(name)] = src
    else:
        rename[name] = dst
    return [helper.make_node("QuantizeLinear", [src, s_name, z_name], [f"{name}/q"], name=f"qdq/{name}/Quantize"),
            helper.make_node("DequantizeLinear", [f"{name}/q", s_name, z_name], [dst],
                             name=f"qdq/{name}/Dequantize")]
