"""Predict, per ONNX node, whether TensorRT's ONNX parser takes it for the board's TensorRT version and
whether the layer can run on a DLA core (boards that have one) or falls back to the GPU.

Rules are a table kept from NVIDIA's TensorRT Developer Guide, "DLA Supported Layers and Restrictions"
(8.5, 8.6, 10.x) and the ONNX parser's operator list (onnx-tensorrt ``docs/operators.md``), reduced to the
constraints the ops of our models meet. Everything here is a *prediction*: the engine inspector on the
board confirms or corrects it (the report says which).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from edgehft.report import OpPlacement, Report, Segment

# ONNX ops the TensorRT ONNX parser imports, with the first TensorRT version listed for them (ops of
# our models and their neighbours; anything else is predicted "not in our table").
PARSER_OPS = {op: (8, 0) for op in (
    "Abs", "Add", "AveragePool", "BatchNormalization", "Cast", "Clip", "Concat", "Constant", "Conv",
    "ConvTranspose", "Div", "Dropout", "Elu", "Exp", "Expand", "Flatten", "Gather", "Gemm",
    "GlobalAveragePool", "GlobalMaxPool", "GRU", "HardSigmoid", "Identity", "LeakyRelu", "Log", "LSTM",
    "MatMul", "Max", "MaxPool", "Mean", "Min", "Mul", "Neg", "Pad", "PRelu", "ReduceMax", "ReduceMean",
    "ReduceSum", "Relu", "Reshape", "Resize", "RNN", "Selu", "Shape", "Sigmoid", "Slice", "Softmax",
    "Softplus", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh", "Tile", "TopK", "Transpose",
    "Unsqueeze", "Where")}
PARSER_OPS.update({"QuantizeLinear": (8, 0), "DequantizeLinear": (8, 0), "LayerNormalization": (8, 6),
                   "GroupNormalization": (10, 0)})
# Ops that are pure shape bookkeeping: TensorRT folds them into neighbours or shuffle layers.
SHAPE_OPS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Constant", "Shape", "Dropout"}
DLA_ACTIVATIONS = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip"}
DLA_ELEMENTWISE = {"Add", "Sub", "Mul", "Max", "Min"}
DLA_NEVER = {"LSTM", "GRU", "RNN"}          # recurrent layers: no DLA implementation in any version
QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}   # fused by TensorRT into the int8 layer next to them


@dataclass
class NodeVerdict:
    index: int
    op: str
    name: str
    parser: bool
    place: str            # "dla" | "gpu" | "unsupported"
    code: str
    reason: str


def _attrs(node) -> dict:
    import onnx
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _version(v: str) -> tuple[int, int]:
    parts = [int(p) for p in str(v).split(".")[:2]] + [0]
    return parts[0], parts[1]


def _dla(node, attrs: dict, shapes: dict, dla_version: str, trt: tuple[int, int]) -> tuple[bool, str, str]:
    op = node.op_type
    if op in DLA_NEVER:
        return False, "DLA_NO_RNN", f"{op}: not supported on DLA (no recurrent layers), GPU fallback"
    if op in ("Conv", "ConvTranspose"):
        k = list(attrs.get("kernel_shape", []))
        if len(k) != 2:
            return False, "DLA_CONV_DIMS", f"{op} with {len(k)} spatial dims: DLA runs 2-D only"
        if any(d < 1 or d > 32 for d in k):
            return False, "DLA_CONV_KERNEL", f"kernel {k}: each dimension must be in [1, 32]"
        if any(s > 8 for s in attrs.get("strides", [1, 1])):
            return False, "DLA_CONV_STRIDE", f"strides {attrs.get('strides')}: must be in [1, 8]"
        if any(p > 31 for p in attrs.get("pads", [0])):
            return False, "DLA_CONV_PAD", f"pads {attrs.get('pads')}: must be in [0, 31]"
        return True, "DLA_OK", f"{op}: DLA (kernel {k})"
    if op in ("MaxPool", "AveragePool"):
        k = list(attrs.get("kernel_shape", []))
        if len(k) != 2 or any(d > 8 for d in k):
            return False, "DLA_POOL_WINDOW", f"pool window {k}: 2-D, each dimension in [1, 8]"
        return True, "DLA_OK", f"{op}: DLA (window {k})"
    if op in DLA_ACTIVATIONS:
        return True, "DLA_OK", f"{op}: DLA activation"
    if op in DLA_ELEMENTWISE:
        return True, "DLA_OK", f"{op}: DLA elementwise"
    if op == "Softmax":
        if dla_version == "1":
            return False, "DLA_SOFTMAX_XAVIER", "Softmax: DLA only on Orin (DLA v2); Xavier falls back to the GPU"
        return True, "DLA_OK", "Softmax: DLA on Orin (non-batch axis)"
    if op == "Concat":
        shape = shapes.get(node.output[0])
        axis = attrs.get("axis", 0)
        if shape is not None and axis % len(shape) != 1 and len(shape) == 4:
            return False, "DLA_CONCAT_AXIS", f"Concat on axis {axis}: DLA concatenates channels (axis 1) only"
        return True, "DLA_OK", "Concat: DLA (channel axis)"
    if op in ("Gemm", "MatMul"):
        return False, "DLA_MATMUL", f"{op}: TensorRT imports it as a matrix multiply, which the DLA does not run; " \
                                    "GPU fallback (a 1x1 Conv would run on the DLA)"
    if op in SHAPE_OPS or op == "Transpose":
        return False, "DLA_SHUFFLE", f"{op}: a shuffle between layers; predicted on the GPU next to its neighbours"
    if op == "Slice":
        return False, "DLA_SLICE", "Slice: predicted GPU (DLA slice support depends on version and layout)"
    return False, "DLA_NOT_IN_TABLE", f"{op}: not in our DLA table; predicted GPU"


def predict(onnx_path: str, board) -> list[NodeVerdict]:
    """One verdict per node of the ONNX model at ``onnx_path`` for ``board`` (a jetson Board).

    Raises:
        MissingExtraError: the ``onnx`` package is not installed (``pip install 'edgehft[jetson]'``).
    """
    from edgehft.compat import require_extra
    require_extra("onnx", "jetson", "reading an ONNX model")
    import onnx
    m = onnx.load(onnx_path)
    try:
        m = onnx.shape_inference.infer_shapes(m)
    except Exception:                       # shape inference is a nicety for the Concat rule
        pass
    shapes = {}
    for vi in list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input):
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        shapes[vi.name] = dims
    trt = _version(board.tensorrt["version"])
    dla_cores = int(board.tensorrt.get("dla_cores", 0))
    out = []
    for k, node in enumerate(m.graph.node):
        attrs = _attrs(node)
        since = PARSER_OPS.get(node.op_type)
        if since is None or trt < since:
            out.append(NodeVerdict(k, node.op_type, node.name, False, "unsupported", "PARSER_UNSUPPORTED",
                                   f"{node.op_type}: not imported by TensorRT {board.tensorrt['version']}'s ONNX "
                                   "parser (our table)"))
            continue
        if dla_cores == 0:
            out.append(NodeVerdict(k, node.op_type, node.name, True, "gpu", "NO_DLA",
                                   f"{board.name} has no DLA: GPU"))
            continue
        ok, code, why = _dla(node, attrs, shapes, str(board.tensorrt.get("dla_version", "")), trt)
        out.append(NodeVerdict(k, node.op_type, node.name, True, "dla" if ok else "gpu", code, why))
    _fuse_qdq(m.graph, out)
    return out


def _fuse_qdq(graph, verdicts: list[NodeVerdict]) -> None:
    """A Q/DQ pair is no layer of its own: TensorRT folds it into the int8 layer that reads it (or, at a
    graph output, the one that writes it). Give each Q/DQ node the placement of that layer."""
    consumers: dict[str, list[int]] = {}
    for k, node in enumerate(graph.node):
        for i in node.input:
            consumers.setdefault(i, []).append(k)
    for v in verdicts:
        if v.op not in QDQ_OPS or v.place == "unsupported":
            continue
        k, seen = v.index, set()
        while graph.node[k].op_type in QDQ_OPS and k not in seen:
            seen.add(k)
            nxt = consumers.get(graph.node[k].output[0], [])
            if not nxt:
                break
            k = nxt[0]
        if graph.node[k].op_type in QDQ_OPS:          # ends at a graph output: take the writer's side
            k = max(v.index - 1, 0)
        target = verdicts[k]
        v.place, v.code = target.place, "QDQ_FUSED"
        v.reason = f"{v.op}: fused by TensorRT into #{target.index} {target.op} ({target.place.upper()})"


def tensorrt_report(onnx_path: str, board, precision: str) -> Report:
    """The shared report: per ONNX node, parser support and DLA / GPU placement, predicted."""
    verdicts = predict(onnx_path, board)
    # Both the DLA and the GPU are the accelerator here; ``kernel`` says which (the shared schema's
    # placement is accelerator / cpu / unsupported).
    ops = [OpPlacement(index=v.index, op=v.op, layer=v.name or None,
                       placement="unsupported" if v.place == "unsupported" else "accelerator",
                       reason_code=v.code, reason=v.reason, kernel={"dla": "DLA", "gpu": "GPU"}.get(v.place),
                       status={"dla": "DLA", "gpu": "GPU (fallback)" if int(board.tensorrt.get("dla_cores", 0))
                               else "GPU", "unsupported": "parser: unsupported"}[v.place])
           for v in verdicts]
    runs: list[dict] = []
    for v in verdicts:
        if runs and runs[-1]["on"] == v.place:
            runs[-1]["nodes"].append(v.index)
        else:
            runs.append({"on": v.place, "nodes": [v.index]})
    segs = [Segment(index=k, placement="unsupported" if r["on"] == "unsupported" else "accelerator", ops=r["nodes"])
            for k, r in enumerate(runs)]
    counts = Counter(v.place for v in verdicts)
    rep = Report(board=board.name, verdict="predicted",
                 verdict_source=f"edgehft's TensorRT {board.tensorrt['version']} parser and DLA tables; "
                                "the engine inspector on the board confirms", ops=ops, counts=dict(counts),
                 segments=segs, boundary_copies=max(0, len(runs) - 1))
    dla = int(board.tensorrt.get("dla_cores", 0))
    lines = [f"{len(verdicts)} ONNX nodes, precision {precision}: " + ", ".join(f"{n} {p}" for p, n in counts.items())
             + (f"; {board.name} has {dla} DLA core(s)" if dla else f"; {board.name} has no DLA: all on the GPU")]
    gpu_ops = Counter(v.op for v in verdicts if v.place == "gpu" and v.op not in SHAPE_OPS | QDQ_OPS)
    if dla and gpu_ops:
        lines.append("GPU fallback: " + ", ".join(f"{n}x {op}" for op, n in gpu_ops.items())
                     + f" — each DLA<->GPU switch costs a reformat and a copy ({max(0, len(runs) - 1)} switches)")
    rep.summary = lines
    rep.accelerator = {"vendor": "nvidia-tensorrt", "tensorrt": board.tensorrt["version"],
                       "dla_cores": dla, "onnx_nodes": dict(Counter(v.op for v in verdicts)), "runs": runs}
    return rep

