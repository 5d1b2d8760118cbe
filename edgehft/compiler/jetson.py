"""The Jetson stage of ``compile`` (layers 1-2): the lowered model as ONNX (float32, or float16 weights and
activations with float32 I/O), checked against Keras with onnxruntime on the held-out windows, golden
vectors from onnxruntime, and the predicted TensorRT parser / DLA / GPU placement per ONNX node.

The engine itself is built on the board by its own TensorRT (engines are not portable); until then the
report says "predicted". Golden vectors are compared with a tolerance (``allclose``): TensorRT's fp16
kernels do not round as onnxruntime's CPU provider does. The tolerance is stated in the manifest: four
times the export's measured difference against Keras, at least 1e-3 for fp16 and 1e-5 for float32.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgehft.bundle import Golden, TensorSpec
from edgehft.compiler.drift import measure_drift
from edgehft.errors import InputError
from edgehft.partition.tensorrt import tensorrt_report
from edgehft.report import Report


@dataclass
class JetsonResult:
    report: Report
    model_file: str
    files: dict
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    golden: Golden
    warnings: list[str]


def worker_request(quant: str) -> dict:
    """What the worker must add for a Jetson board."""
    if quant == "int8":
        raise InputError("--quant int8 for Jetson boards needs the ONNX Q/DQ export, which is not built yet",
                         hint="use --quant fp16 (the default) or float")
    return {"onnx": True, "onnx_fp16": quant == "fp16"}


def jetson_stage(work: Path, info: dict, quant: str, board, held: np.ndarray, float_outs, golden_count: int,
                 drift_threshold: float, in_name: str, out_names: list[str]) -> JetsonResult:
    """Bundle pieces for ``board`` from the worker's ONNX outputs in ``work / "worker"``."""
    variant = "float16" if quant == "fp16" else "float32"
    entry = info["onnx"][variant]
    onnx_path = work / "worker" / entry["file"]
    with np.load(work / "worker" / entry["outputs_file"]) as z:
        onnx_outs = [z[f"out{k}"] for k in range(len(z.files))]
    g = min(golden_count, len(held))
    inputs = [TensorSpec(name=in_name, index=0, shape=[1, *held.shape[1:]], dtype="float32")]
    outputs = [TensorSpec(name=n, index=k, shape=[1, *y.shape[1:]], dtype="float32")
               for k, (n, y) in enumerate(zip(out_names, onnx_outs))]
    measured = float(entry["vs_keras"]["max_abs_diff"])
    atol = max(4 * measured, 1e-3 if variant == "float16" else 1e-5)
    golden = Golden(count=g, reference_path=f"onnxruntime CPU ({variant} ONNX)", compare="allclose", atol=atol)
    buf = io.BytesIO()
    arrays = {f"inputs/{in_name}": held[:g].astype(np.float32)}
    arrays.update({f"outputs/{o.name}": y[:g].astype(np.float32) for o, y in zip(outputs, onnx_outs)})
    np.savez(buf, **arrays)
    report = tensorrt_report(str(onnx_path), board, quant)
    from edgehft.compiler.onnx_check import softmax_outputs
    report.drift = measure_drift(float_outs, onnx_outs, out_names, softmax_outputs(onnx_path),
                                 drift_threshold, reference=f"Keras float model ({info['flavour']})",
                                 candidate=f"{variant} ONNX on onnxruntime")
    report.golden = {"count": g, "reference_path": golden.reference_path, "atol": atol,
                     "export_vs_keras_max_abs": measured}
    report.notes.append(f"golden outputs come from onnxruntime on the {variant} ONNX; on the board the TensorRT "
                        f"engine is compared with atol {atol:g} (4x the export's measured {measured:.3g}, floor "
                        f"{'1e-3' if variant == 'float16' else '1e-5'}). Nothing here ran on NVIDIA hardware.")
    warnings = [] if report.drift.passed else [f"drift over the gate for the {variant} ONNX"]
    name = "model.onnx" if variant == "float32" else "model_fp16.onnx"
    return JetsonResult(report, name, {name: onnx_path, "golden.npz": buf.getvalue()}, inputs, outputs, golden,
                        warnings)

