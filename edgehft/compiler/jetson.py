"""The Jetson stage of ``compile`` (layers 1-2): the lowered model as ONNX (float32, float16 weights and
activations with float32 I/O, or int8 as explicit Q/DQ), checked against Keras with onnxruntime on the
held-out windows, golden vectors from onnxruntime, and the predicted TensorRT parser / DLA / GPU placement
per ONNX node.

``--quant int8``: the worker converts the full-int8 TFLite model from the same calibration windows as the
cpu/coral/pynq boards and exports the float ONNX of the same lowered model; :func:`edgehft.compiler.onnx_qdq.
insert_qdq` puts Q/DQ pairs with the TFLite ranges into it (zero point 0, as TensorRT requires; see there),
``model_int8_qdq.onnx``. It is checked against the int8 TFLite model's outputs on the held-out windows
(LiteRT in this process, LSTM state reset before every window): max |diff| <= ``QDQ_VS_TFLITE_MAX_ABS`` and
argmax agreement >= ``QDQ_VS_TFLITE_ARGMAX`` -- not bit-equal, onnxruntime computes Q/DQ in float, the
LSTM stays float and the zero points differ -- and against Keras (drift). Golden atol: ``QDQ_GOLDEN_ATOL``.
All three figures come from onnxruntime with graph optimizations off (:func:`edgehft.compiler.onnx_check.
session`): the Q/DQ semantics, not this host's int8 kernels, whose pairwise sums saturate on CPUs without
VNNI; the kernels that ran (one window, from onnxruntime's profile) are in ``report.golden["onnxruntime"]``.

The engine itself is built on the board by its own TensorRT (engines are not portable); until then the
report says "predicted". Golden vectors are compared with a tolerance (``allclose``): TensorRT's fp16
kernels do not round as onnxruntime's CPU provider does. The tolerance is stated in the manifest: four
times the export's measured difference against Keras, at least 1e-3 for fp16 and 1e-5 for float32.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from edgehft.bundle import Golden, Manifest, TensorSpec
from edgehft.compiler.drift import measure_drift
from edgehft.compiler.stage import StageInput, StageOutput
from edgehft.errors import ConverterError
from edgehft.partition.jetson_predict import tensorrt_report


# --quant int8: the Q/DQ ONNX against the int8 TFLite model (softmax probabilities for DeepLOB; measured
# max |diff| 0.17, argmax agreement 0.99 on 500 windows), and the golden tolerance on the board.
QDQ_VS_TFLITE_MAX_ABS = 0.25
QDQ_VS_TFLITE_ARGMAX = 0.98
QDQ_GOLDEN_ATOL = 0.05


def worker_request(quant: str) -> dict:
    """What the worker must produce for a Jetson board: always the float ONNX of the lowered model; for
    ``int8`` also the full-int8 TFLite model from the calibration windows (``quant``); otherwise the
    TFLite conversion is float (it is not shipped)."""
    if quant == "int8":
        return {"onnx": True, "onnx_fp16": False, "quant": "int8"}
    return {"onnx": True, "onnx_fp16": quant == "fp16", "quant": "float"}


def tflite_outputs(tflite_path: Path, windows: np.ndarray) -> list[np.ndarray]:
    """Dequantized outputs of a TFLite model on float ``windows`` (N, ...) one window per invoke, with the
    variable tensors (LSTM state) reset before each; inputs quantized with the input's scale/zero point."""
    from edgehft.runtime.litert import make_interpreter
    interp = make_interpreter(str(tflite_path), threads=1)
    (inp,) = interp.get_input_details()
    outs = interp.get_output_details()
    res = [np.empty((len(windows), *o["shape"][1:]), np.float32) for o in outs]
    for n, x in enumerate(windows):
        x = x[None].astype(np.float32)
        if np.dtype(inp["dtype"]).kind in "iu":
            s, z = inp["quantization"]
            info = np.iinfo(inp["dtype"])
            x = np.clip(np.rint(x / s) + z, info.min, info.max).astype(inp["dtype"])
        interp.reset_all_variables()
        interp.set_tensor(inp["index"], x)
        interp.invoke()
        for k, o in enumerate(outs):
            y = interp.get_tensor(o["index"])
            s, z = o["quantization"]
            res[k][n] = (y.astype(np.float32) - z) * s if np.dtype(o["dtype"]).kind in "iu" else y[0]
    return res


def jetson_stage(ctx: StageInput) -> StageOutput:
    """The bundle's ONNX model, golden vectors, report and manifest for ``ctx.board`` from the worker's ONNX
    export in ``ctx.work / "worker"`` (float32, fp16, or, for ``int8``, the Q/DQ ONNX made here).

    Raises:
        OnnxCheckError / LoweringError: the export or the Q/DQ insertion failed its checks.
    """
    return (_int8_stage if ctx.quant == "int8" else _float_stage)(ctx)


def _golden(ctx: StageInput, ys: list, reference: str, atol: float):
    """(inputs, outputs, Golden, golden.npz bytes): the first ``golden_count`` held-out windows and the
    candidate's outputs ``ys`` on them, float32 I/O named as the worker exported them."""
    held, in_name, out_names = ctx.held, ctx.info["input_names"][0], ctx.info["output_names"]
    g = min(ctx.opts.golden_count, len(held))
    inputs = [TensorSpec(name=in_name, index=0, shape=[1, *held.shape[1:]], dtype="float32")]
    outputs = [TensorSpec(name=n, index=k, shape=[1, *y.shape[1:]], dtype="float32")
               for k, (n, y) in enumerate(zip(out_names, ys))]
    golden = Golden(count=g, reference_path=reference, compare="allclose", atol=atol)
    buf = io.BytesIO()
    arrays = {f"inputs/{in_name}": held[:g].astype(np.float32)}
    arrays.update({f"outputs/{o.name}": y[:g].astype(np.float32) for o, y in zip(outputs, ys)})
    np.savez(buf, **arrays)
    return inputs, outputs, golden, buf.getvalue()


def _output(ctx: StageInput, report, name: str, model_path: Path, pieces, warnings) -> StageOutput:
    """The stage's result: the model and golden.npz as bundle files, and the manifest they make."""
    inputs, outputs, golden, npz = pieces
    manifest = Manifest(board=ctx.board.name, backend=ctx.board.backend, model_file=name, source=ctx.source,
                        quantization=ctx.quantization, inputs=inputs, outputs=outputs, golden=golden)
    return StageOutput(report, files={name: model_path, "golden.npz": npz}, warnings=warnings, manifest=manifest)


def _float_stage(ctx: StageInput) -> StageOutput:
    work, info, quant, board = ctx.work, ctx.info, ctx.quant, ctx.board
    variant = "float16" if quant == "fp16" else "float32"
    entry = info["onnx"][variant]
    onnx_path = work / "worker" / entry["file"]
    with np.load(work / "worker" / entry["outputs_file"]) as z:
        onnx_outs = [z[f"out{k}"] for k in range(len(z.files))]
    measured = float(entry["vs_keras"]["max_abs_diff"])
    atol = max(4 * measured, 1e-3 if variant == "float16" else 1e-5)
    pieces = _golden(ctx, onnx_outs, f"onnxruntime CPU ({variant} ONNX)", atol)
    golden, g = pieces[2], pieces[2].count
    report = tensorrt_report(str(onnx_path), board, quant)
    from edgehft.compiler.onnx_check import softmax_outputs
    report.drift = measure_drift(ctx.float_outs, onnx_outs, ctx.info["output_names"], softmax_outputs(onnx_path),
                                 ctx.opts.drift_threshold, reference=f"Keras float model ({info['flavour']})",
                                 candidate=f"{variant} ONNX on onnxruntime")
    report.golden = {"count": g, "reference_path": golden.reference_path, "atol": atol,
                     "export_vs_keras_max_abs": measured}
    report.notes.append(f"golden outputs come from onnxruntime on the {variant} ONNX; on the board the TensorRT "
                        f"engine is compared with atol {atol:g} (4x the export's measured {measured:.3g}, floor "
                        f"{'1e-3' if variant == 'float16' else '1e-5'}). Nothing here ran on NVIDIA hardware.")
    warnings = [] if report.drift.passed else [f"drift over the gate for the {variant} ONNX"]
    name = "model.onnx" if variant == "float32" else "model_fp16.onnx"
    return _output(ctx, report, name, onnx_path, pieces, warnings)


def _qdq_outputs(qdq_path: Path, held: np.ndarray) -> tuple[list[np.ndarray], dict]:
    """The Q/DQ ONNX's outputs on ``held`` (N, *input_shape) by the Q/DQ semantics -- onnxruntime with graph
    optimizations off, every node as itself -- and ``{"graph_optimization", "kernels"}``: the kernels that
    ran for one window (op type -> count, from onnxruntime's profile).

    Raises:
        ConverterError: onnxruntime fused or inserted kernels all the same (the figures would be those of this
            CPU's int8 kernels, not of the Q/DQ model).
    """
    from edgehft.compiler.onnx_check import foreign_kernels, kernels_run, run_onnx
    ys = run_onnx(qdq_path, held)
    kernels = kernels_run(qdq_path, held[:1])
    foreign = foreign_kernels(kernels, qdq_path)
    if foreign:
        raise ConverterError(f"onnxruntime did not run {qdq_path.name} node by node (kernels {', '.join(foreign)} "
                             "differ from its nodes): its figures would depend on this CPU's int8 kernels",
                             hint="use an onnxruntime whose ORT_DISABLE_ALL leaves the graph as it is (1.32 does)")
    return ys, {"graph_optimization": "ORT_DISABLE_ALL", "kernels": kernels}


def _int8_stage(ctx: StageInput) -> StageOutput:  # long: the Q/DQ checks and the note that states them
    work, info, board, held = ctx.work, ctx.info, ctx.board, ctx.held
    from edgehft.compiler.onnx_check import diff_figures, softmax_outputs
    from edgehft.compiler.onnx_qdq import insert_qdq
    src = work / "worker" / info["onnx"]["float32"]["file"]
    tflite = work / "worker" / "model.tflite"
    qdq_path = work / "model_int8_qdq.onnx"
    fig = insert_qdq(src, tflite, qdq_path)
    ys, ort_run = _qdq_outputs(qdq_path, held)
    soft = softmax_outputs(qdq_path)
    vs_tfl = diff_figures(ys, tflite_outputs(tflite, held), soft)
    agree = vs_tfl["argmax_agreement"]
    vs_tfl.update(tolerance={"max_abs_diff": QDQ_VS_TFLITE_MAX_ABS, "argmax_agreement": QDQ_VS_TFLITE_ARGMAX},
                  passed=vs_tfl["max_abs_diff"] <= QDQ_VS_TFLITE_MAX_ABS
                  and (agree is None or agree >= QDQ_VS_TFLITE_ARGMAX))
    pieces = _golden(ctx, ys, "onnxruntime CPU (int8 Q/DQ ONNX, graph optimizations off: Q/DQ computed in "
                              "float, no int8 kernel)", QDQ_GOLDEN_ATOL)
    golden, g = pieces[2], pieces[2].count
    report = tensorrt_report(str(qdq_path), board, "int8")
    report.drift = measure_drift(ctx.float_outs, ys, ctx.info["output_names"], soft, ctx.opts.drift_threshold,
                                 reference=f"Keras float model ({info['flavour']})",
                                 candidate="int8 Q/DQ ONNX on onnxruntime (Q/DQ in float)")
    summary = {k: fig[k] for k in ("qdq_pairs", "weights_per_channel", "weight_scales", "activations", "matched",
                                   "unmatched", "unmatched_tensors", "zero_points", "placement")}
    summary.update(file=qdq_path.name, vs_tflite_int8=vs_tfl)
    info["onnx"]["int8_qdq"] = summary
    report.accelerator["qdq"] = {**summary, "matched_tensors": fig["matched_tensors"]}
    report.golden = {"count": g, "reference_path": golden.reference_path, "atol": QDQ_GOLDEN_ATOL,
                     "qdq_vs_tflite_int8": {k: vs_tfl[k] for k in ("windows", "max_abs_diff", "argmax_agreement")},
                     "onnxruntime": ort_run}
    report.notes.append(
        f"int8 as explicit Q/DQ: {fig['qdq_pairs']} activation Q/DQ pairs and {fig['weights_per_channel']} "
        f"per-channel int8 weights; {fig['matched']} of {fig['activations']} ONNX activations matched to a "
        f"TFLite tensor (unmatched: {', '.join(fig['unmatched_tensors']) or 'none'}). Zero points are 0 "
        "(TensorRT takes symmetric int8 only): each TFLite range is kept, so one-sided tensors get up to 2x the "
        "TFLite scale. The LSTM runs in float on TensorRT, Q/DQ only around it. Against the int8 TFLite model "
        f"on {vs_tfl['windows']} windows: max |diff| {vs_tfl['max_abs_diff']:.3g}, argmax agreement "
        f"{agree if agree is not None else 'n/a'} (tolerance {QDQ_VS_TFLITE_MAX_ABS}, "
        f">= {QDQ_VS_TFLITE_ARGMAX}). Golden outputs and these figures come from onnxruntime with graph "
        "optimizations off (Q/DQ as float ops, no int8 kernel: the same on any compile host); the board's "
        f"engine is compared with atol {QDQ_GOLDEN_ATOL} (an assumption: nothing here ran on NVIDIA hardware).")
    warnings = [] if report.drift.passed else ["drift over the gate for the int8 Q/DQ ONNX"]
    if not vs_tfl["passed"]:
        warnings.append(f"the int8 Q/DQ ONNX differs from the int8 TFLite model beyond the tolerance: max |diff| "
                        f"{vs_tfl['max_abs_diff']:.3g}, argmax agreement {agree}")
    name = "model_int8_qdq.onnx"
    return _output(ctx, report, name, qdq_path, pieces, warnings)
