"""Check an exported ONNX model against reference (Keras float) outputs with onnxruntime. Main process:
numpy, onnx and onnxruntime only, no TensorFlow (the converter worker uses the same figures).

Figures, over all windows and output elements: ``max_abs_diff`` = max |y - ref|; ``max_rel_diff`` =
max |y - ref| / max(|ref|, 1e-6); ``argmax_agreement`` = share of windows whose argmax matches, for
outputs produced by a ``Softmax`` node (None otherwise). The gate is numpy's ``allclose`` rule per
element: |y - ref| <= atol + rtol * |ref|.

Q/DQ graphs (the Jetson int8 model) run with graph optimizations off, so their figures are those of the
ONNX Q/DQ semantics and not of this host's int8 kernels: at its default level onnxruntime fuses
DequantizeLinear -> MatMul/Conv/Gemm -> QuantizeLinear into int8 kernels (QLinearConv, QGemm,
MatMulIntegerToFloat, QLinearConcat...) with the activations moved to uint8, and on x86 CPUs without VNNI
those add uint8 x int8 products pairwise with int16 saturation (``vpmaddubsw``): the drift then depended on
the compile host (1.5 % for DeepLOB, 7.7 % for the MLP on AVX2, under 1 % with VNNI). :func:`kernels_run`
says which kernels ran.
"""
from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from edgehft.errors import DriftError, InputError

_REL_FLOOR = 1e-6
_PASS_THROUGH = ("Cast", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze")
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def graph_ops(onnx_path: str | Path) -> dict[str, int]:
    """Op type -> number of nodes of that type in the main graph of ``onnx_path`` (sorted by op type)."""
    import onnx
    g = onnx.load(str(onnx_path), load_external_data=False).graph
    return dict(sorted(Counter(n.op_type for n in g.node).items()))


def has_qdq(onnx_path: str | Path) -> bool:
    """Whether the main graph of ``onnx_path`` holds a QuantizeLinear or DequantizeLinear node."""
    return any(op in QDQ_OPS for op in graph_ops(onnx_path))


def session(onnx_path: str | Path, profile_prefix: str | Path | None = None):
    """An onnxruntime session on the CPUExecutionProvider, one intra-op and one inter-op thread, sequential.

    A graph with Q/DQ nodes (:func:`has_qdq`) gets ``ORT_DISABLE_ALL`` and ``session.disable_quant_qdq``
    (without it onnxruntime copies a DequantizeLinear read by several nodes even then): every node runs as
    itself, QuantizeLinear as saturate(round_half_even(x / scale) + zero_point) and DequantizeLinear as
    (q - zero_point) * scale in float32, MatMul/Conv/Gemm in float -- the same figures on any x86 CPU
    (AVX2, AVX-512, AMX), no int8 kernel. Other graphs keep onnxruntime's default level (ORT_ENABLE_ALL).
    ``profile_prefix``: also profile the session (:func:`kernels_run` reads the profile).
    """
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    if has_qdq(onnx_path):
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.add_session_config_entry("session.disable_quant_qdq", "1")     # else a shared DQ is copied per reader
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile_prefix)
    return ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])


def kernels_run(onnx_path: str | Path, window: np.ndarray) -> dict[str, int]:
    """Op type -> how many kernels of that type onnxruntime ran for one call of ``onnx_path`` on ``window``
    (float32, the model's input shape with batch 1), in the session :func:`run_onnx` uses, from
    onnxruntime's profile (written to a temporary directory and removed). Sorted by op type.

    For a Q/DQ graph this equals :func:`graph_ops`: nothing fused, no int8 kernel (see :func:`session`).
    """
    with tempfile.TemporaryDirectory(prefix="edgehft-ort-profile-") as tmp:
        sess = session(onnx_path, profile_prefix=Path(tmp) / "ort")
        (inp,) = sess.get_inputs()
        sess.run(None, {inp.name: np.ascontiguousarray(window, dtype=np.float32)})
        events = json.loads(Path(sess.end_profiling()).read_text())
    ran = Counter(e["args"]["op_name"] for e in events
                  if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"))
    return dict(sorted(ran.items()))


def foreign_kernels(kernels: dict[str, int], onnx_path: str | Path) -> list[str]:
    """Op types in ``kernels`` (as :func:`kernels_run` returns them) that ran more or fewer times than the
    graph of ``onnx_path`` has nodes of that type, or that it has none of: what onnxruntime fused or
    inserted. Empty when every node ran as itself."""
    ops = graph_ops(onnx_path)
    return sorted(op for op in set(kernels) | set(ops) if kernels.get(op, 0) != ops.get(op, 0))


def run_onnx(onnx_path: str | Path, windows: np.ndarray) -> list[np.ndarray]:
    """Outputs (one array per graph output, first axis = window) of the single-input model on
    ``windows`` (N, *input_shape), one window per call when the input batch is static, in
    :func:`session` (a Q/DQ graph with graph optimizations off: the Q/DQ semantics, no int8 kernel).

    Raises:
        InputError: the windows do not have the model's input shape.
    """
    sess = session(onnx_path)
    (inp,) = sess.get_inputs()
    x = np.ascontiguousarray(windows, dtype=np.float32)
    shape = inp.shape
    if len(shape) != x.ndim or any(isinstance(d, int) and d != s for d, s in zip(shape[1:], x.shape[1:])):
        raise InputError(f"windows have shape {x.shape[1:]}, {Path(onnx_path).name} takes {shape[1:]}")
    batch = shape[0] if isinstance(shape[0], int) else 256
    names = [o.name for o in sess.get_outputs()]
    parts = [sess.run(names, {inp.name: x[lo:lo + batch]}) for lo in range(0, len(x), batch)]
    return [np.concatenate([p[k] for p in parts]).astype(np.float32) for k in range(len(names))]


def softmax_outputs(onnx_path: str | Path) -> list[bool]:
    """Per graph output: whether a ``Softmax`` node produces it (through Cast/Reshape/Identity...)."""
    import onnx
    g = onnx.load(str(onnx_path), load_external_data=False).graph
    producer = {o: n for n in g.node for o in n.output}
    flags = []
    for out in g.output:
        n = producer.get(out.name)
        while n is not None and n.op_type in _PASS_THROUGH:
            n = producer.get(n.input[0])
        flags.append(n is not None and n.op_type == "Softmax")
    return flags


def diff_figures(outputs: list[np.ndarray], reference: list[np.ndarray], softmax: list[bool] | None = None,
                 atol: float | None = None, rtol: float = 0.0) -> dict:
    """Figures of ``outputs`` against ``reference`` (lists of (N, ...) arrays), per output and overall;
    with ``atol`` also ``violations`` (elements outside atol + rtol·|ref|)."""
    if len(outputs) != len(reference):
        raise InputError(f"{len(outputs)} outputs against {len(reference)} reference outputs")
    softmax = softmax or [False] * len(outputs)
    per = []
    for k, (y, r) in enumerate(zip(outputs, reference)):
        y = np.asarray(y, np.float64)
        r = np.asarray(r, np.float64)
        if y.shape != r.shape:
            y = y.reshape(r.shape) if y.size == r.size else y
        if y.shape != r.shape:
            raise InputError(f"output {k}: shape {y.shape} against reference {r.shape}")
        d = np.abs(y - r)
        fig = {"max_abs_diff": float(d.max(initial=0.0)),
               "max_rel_diff": float((d / np.maximum(np.abs(r), _REL_FLOOR)).max(initial=0.0)),
               "argmax_agreement": None}
        if softmax[k] and r.ndim >= 2 and len(r):
            fig["argmax_agreement"] = float(np.mean(y.reshape(len(r), -1).argmax(1) == r.reshape(len(r), -1).argmax(1)))
        if atol is not None:
            fig["violations"] = int((d > atol + rtol * np.abs(r)).sum())
        per.append(fig)
    res = {"windows": int(len(reference[0])) if reference else 0,
           "max_abs_diff": max((p["max_abs_diff"] for p in per), default=0.0),
           "max_rel_diff": max((p["max_rel_diff"] for p in per), default=0.0),
           "argmax_agreement": min((p["argmax_agreement"] for p in per if p["argmax_agreement"] is not None),
                                   default=None),
           "outputs": per}
    if atol is not None:
        res.update(atol=atol, rtol=rtol, violations=sum(p["violations"] for p in per))
    return res


def compare_onnx(onnx_path: str | Path, windows: np.ndarray, reference_outputs, atol: float,
                 rtol: float = 0.0) -> dict:
    """Run ``onnx_path`` on ``windows`` with onnxruntime and compare with ``reference_outputs`` (one
    array or a list, first axis = window).

    Returns :func:`diff_figures` plus ``onnx`` (the file) and ``passed``.
    Raises:
        DriftError: any element differs by more than ``atol + rtol * |reference|``.
        InputError: windows or reference outputs do not fit the model.
    """
    ref = [reference_outputs] if isinstance(reference_outputs, np.ndarray) else list(reference_outputs)
    ys = run_onnx(onnx_path, windows)
    fig = diff_figures(ys, ref, softmax_outputs(onnx_path), atol=atol, rtol=rtol)
    fig.update(onnx=str(onnx_path), passed=fig["violations"] == 0)
    if not fig["passed"]:
        raise DriftError(f"{Path(onnx_path).name} differs from the reference on {fig['violations']} output "
                         f"elements over {fig['windows']} windows: max |diff| {fig['max_abs_diff']:.3g}, max "
                         f"relative {fig['max_rel_diff']:.3g} (tolerance atol {atol:g}, rtol {rtol:g})",
                         hint="a float16 model needs a looser tolerance than float32; a large float32 "
                              "difference means the export changed the graph (check the op types)")
    return fig
