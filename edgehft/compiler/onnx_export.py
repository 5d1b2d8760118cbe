"""ONNX export for the Jetson backend. Runs inside the converter worker (TensorFlow imported there).

:func:`export_onnx` exports the model the worker already lowered -- for a Keras 3 file, its layer-by-layer
tf-keras rebuild -- with tf2onnx at a static batch of 1, so an LSTM stays one ONNX ``LSTM`` node (Keras 3's
own LSTM becomes an ONNX ``Loop``). :func:`to_fp16` makes the float16 variant with the ``onnx`` package
only: float weights and activations in float16, the graph's inputs and outputs still float32.
:func:`onnx_stage` is the worker's optional stage (request ``"onnx": true`` / ``"onnx_fp16": true``).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from edgehft import errors

_FP16_MAX = float(np.finfo(np.float16).max)
# (op type, input index) that ONNX requires in float32 whatever the graph's float type is.
_KEEP_FLOAT32_INPUTS = {("Resize", 2), ("Upsample", 1)}


def _graph_info(model, opset: int) -> dict:
    return {"opset": opset, "op_types": dict(sorted(Counter(n.op_type for n in model.graph.node).items())),
            "input_names": [i.name for i in model.graph.input],
            "output_names": [o.name for o in model.graph.output]}


def export_onnx(model_tfkeras, input_shape, input_name: str, out_path: str | Path, opset: int = 17) -> dict:
    """Export a (tf-keras) Keras model, or a callable returning a tensor / dict of tensors, to ONNX.

    The input is ``input_name`` of static shape ``(1, *input_shape)`` float32. Returns ``opset``,
    ``op_types`` (node op-type counts), ``input_names``, ``output_names`` and ``route``.
    Raises:
        ConverterError: tf2onnx refused the model.
    """
    import tensorflow as tf
    import tf2onnx

    spec = (tf.TensorSpec((1, *[int(d) for d in input_shape]), tf.float32, name=input_name),)
    out_path = Path(out_path)
    try:
        if hasattr(model_tfkeras, "layers"):           # a Keras model: output names from its layers
            route = "tf2onnx.from_keras"
            proto, _ = tf2onnx.convert.from_keras(model_tfkeras, input_signature=spec, opset=opset,
                                                  output_path=str(out_path))
        else:
            route = "tf2onnx.from_function"
            fn = tf.function(lambda x: model_tfkeras(x))
            proto, _ = tf2onnx.convert.from_function(fn, input_signature=spec, opset=opset,
                                                     output_path=str(out_path))
    except Exception as exc:
        msg = str(exc).strip().splitlines() or [type(exc).__name__]
        raise errors.ConverterError(f"tf2onnx could not export the model: {type(exc).__name__}: "
                                    + " | ".join(msg[-4:])[:1500],
                                    hint="tf2onnx takes functional tf-keras models; a Keras 3 model is "
                                         "rebuilt in tf-keras unless --lowering native") from exc
    return {**_graph_info(proto, opset), "route": route}


def _f16_initializer(t, keep32: bool, stats: Counter):
    from onnx import numpy_helper
    a = numpy_helper.to_array(t)
    if keep32 or a.dtype != np.float32:
        return t
    over = np.abs(a) > _FP16_MAX
    stats["clipped_values"] += int(over.sum())
    h = np.clip(a, -_FP16_MAX, _FP16_MAX).astype(np.float16)
    stats["initializers"] += 1
    return numpy_helper.from_array(h, t.name)


def to_fp16(onnx_path: str | Path, out_path: str | Path) -> dict:
    """Write a float16 copy of the float32 model at ``onnx_path`` to ``out_path``; I/O stays float32.

    Float32 initializers and ``Constant``/``ConstantOfShape`` values become float16 (values beyond
    ±65504 are clipped and counted), ``Cast`` to float becomes ``Cast`` to float16, and each float32
    graph input/output gets a ``Cast`` node, so every node -- ``LSTM`` included, whose X, W, R, B and
    initial states must share one type -- sees float16 throughout. Intermediate ``value_info`` is dropped
    (shapes are re-inferred). Returns counts (``initializers``, ``constants``, ``casts_inserted``,
    ``clipped_values``) and the op-type counts of the result. Checked with ``onnx.checker``.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(onnx_path))
    g = model.graph
    if any(n.domain not in ("", "ai.onnx") for n in g.node):
        raise errors.ConverterError("to_fp16 handles standard ONNX ops only; the graph has custom-domain ops")
    for n in g.node:
        if n.op_type in ("Loop", "If", "Scan"):
            raise errors.ConverterError(f"to_fp16 does not convert subgraphs ({n.op_type} node {n.name!r})",
                                        hint="export the tf-keras rebuild, so an LSTM is one LSTM node")
    stats: Counter = Counter()
    keep32 = {n.input[i] for n in g.node for (op, i) in _KEEP_FLOAT32_INPUTS
              if n.op_type == op and len(n.input) > i}
    inits = [_f16_initializer(t, t.name in keep32, stats) for t in g.initializer]
    del g.initializer[:]
    g.initializer.extend(inits)
    for n in g.node:
        for a in n.attribute:
            if n.op_type in ("Constant", "ConstantOfShape") and a.type == onnx.AttributeProto.TENSOR \
                    and a.t.data_type == TensorProto.FLOAT:
                arr = np.clip(numpy_helper.to_array(a.t), -_FP16_MAX, _FP16_MAX).astype(np.float16)
                a.t.CopyFrom(numpy_helper.from_array(arr, a.t.name))
                stats["constants"] += 1
            elif n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.FLOAT16
                stats["casts_retargeted"] += 1
    new_nodes = []
    for inp in g.input:                                 # float32 in -> Cast -> float16 for the consumers
        if inp.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        h = inp.name + "_fp16"
        for n in g.node:
            for k, name in enumerate(n.input):
                if name == inp.name:
                    n.input[k] = h
        new_nodes.append(helper.make_node("Cast", [inp.name], [h], to=TensorProto.FLOAT16,
                                          name=inp.name + "_to_fp16"))
    tail = []
    for out in g.output:                                # producer -> float16 -> Cast -> float32 out
        if out.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        h = out.name + "_fp16"
        for n in g.node:
            for k, name in enumerate(n.output):
                if name == out.name:
                    n.output[k] = h
            for k, name in enumerate(n.input):          # another node reading the output tensor
                if name == out.name:
                    n.input[k] = h
        tail.append(helper.make_node("Cast", [h], [out.name], to=TensorProto.FLOAT, name=out.name + "_to_fp32"))
    stats["casts_inserted"] = len(new_nodes) + len(tail)
    nodes = new_nodes + list(g.node) + tail
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    onnx.checker.check_model(model)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.save(model, str(out_path))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return {**dict(stats), **_graph_info(model, opset)}


def onnx_outputs(onnx_path: str | Path, windows: np.ndarray) -> list[np.ndarray]:
    """onnxruntime outputs (CPUExecutionProvider, 1 thread) on ``windows`` (N, *input_shape), batch 1."""
    from edgehft.compiler.onnx_check import run_onnx
    return run_onnx(onnx_path, windows)


def onnx_stage(req: dict, out: Path, model, in_shape, in_name: str, held: np.ndarray,
               float_outs: list[np.ndarray], stage) -> dict:
    """The worker's optional ONNX stage. Writes ``model.onnx`` + ``onnx_outputs.npz`` and, with
    ``onnx_fp16``, ``model_fp16.onnx`` + ``onnx_fp16_outputs.npz`` (keys ``out0``… as
    ``float_outputs.npz``). Returns the ``onnx`` entry of ``info.json``: per variant the file, export info
    and the differences against the Keras float outputs on the held-out windows."""
    from edgehft.compiler.onnx_check import diff_figures, softmax_outputs
    opset = int(req.get("onnx_opset", 17))
    stage(out, "export ONNX (tf2onnx)")
    variants = {"float32": (out / "model.onnx", out / "onnx_outputs.npz")}
    info = {"float32": export_onnx(model, in_shape, in_name, variants["float32"][0], opset)}
    if req.get("onnx_fp16"):
        stage(out, "convert ONNX to float16")
        variants["float16"] = (out / "model_fp16.onnx", out / "onnx_fp16_outputs.npz")
        info["float16"] = to_fp16(variants["float32"][0], variants["float16"][0])
    for name, (path, npz) in variants.items():
        stage(out, f"onnxruntime outputs ({name})")
        ys = onnx_outputs(path, held)
        np.savez(npz, **{f"out{i}": y for i, y in enumerate(ys)})
        info[name].update(file=path.name, outputs_file=npz.name,
                          vs_keras=diff_figures(ys, float_outs, softmax=softmax_outputs(path)))
    json.dumps(info)                                   # info.json must take it
    return info

