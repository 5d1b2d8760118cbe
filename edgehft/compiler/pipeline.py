"""``compile_model``: Keras model + calibration ticks -> bundle for a board.

load windows -> isolated TensorFlow worker (lower, quantize, float reference outputs) -> read the IR ->
run the quantized model on the CPU runtime (golden vectors, drift) -> report -> atomic bundle write.
"""
from __future__ import annotations

import io
import platform
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from edgehft import __version__
from edgehft.boards import load_board
from edgehft.bundle import (Bundle, Features, Golden, Manifest, Quantization, SourceModel, TensorSpec,
                            sha256_arrays, sha256_file, write_bundle)
from edgehft.compiler.drift import measure_drift
from edgehft.compiler.isolate import run_worker
from edgehft.errors import DriftError, InputError, LoweringError
from edgehft.ir import TFLiteModel
from edgehft.ir.tflite_model import source_layer
from edgehft.report import OpPlacement, Report, segments_of
from edgehft.runtime import cpu as cpu_runtime
from edgehft.windows import load_windows, parse_pipeline, sidecar_pipeline

_RECURRENT_FIX = {"LSTM": "build the model with keras.Input of a static shape; avoid stateful=True / masking",
                  "GRU": "use LSTM, or pass unroll=True to the layer", "SimpleRNN": "pass unroll=True"}


@dataclass
class CompileOptions:
    board: str = "cpu"
    quant: str | None = None                 # None: the board's default
    features: str | None = None              # 'file.py:fn' or 'module:fn'; None: the model's sidecar
    calib_windows: int = 300
    drift_windows: int = 500
    golden_count: int = 16
    drift_threshold: float = 0.01
    strict: bool = False
    timeout_s: float = 1800.0
    lowering: str = "auto"                   # auto | native (Keras 3 graph as is; for diagnosis)
    seed: int = 0


@dataclass
class CompileResult:
    bundle: Bundle
    report: Report
    warnings: list[str] = field(default_factory=list)


def _spec(ir: TFLiteModel, index: int, name: str) -> TensorSpec:
    t = ir.main.tensors[index]
    q = t.quant
    return TensorSpec(name=name, index=index, shape=list(t.shape), dtype=t.dtype,
                      scale=[float(s) for s in q.scale] if q else None,
                      zero_point=[int(z) for z in q.zero_point] if q else None)


def _is_classifier(ir: TFLiteModel, tensor: int) -> bool:
    op = ir.main.producer(tensor)
    while op is not None and op.name in ("QUANTIZE", "DEQUANTIZE", "RESHAPE"):
        op = ir.main.producer(op.inputs[0])
    return op is not None and op.name == "SOFTMAX"


def _check_no_loops(ir: TFLiteModel, layers: list) -> None:
    names = ir.op_names()
    if "WHILE" not in names:
        return
    rnn = [(n, c) for n, c in layers if c in _RECURRENT_FIX or c in ("RNN", "Bidirectional")]
    which = ", ".join(f"{n!r} ({c})" for n, c in rnn) or "a recurrent or loop layer"
    fix = "; ".join(sorted({_RECURRENT_FIX.get(c, "unroll it") for _, c in rnn})) or "unroll the loop"
    raise LoweringError(f"{which} lowered to a TFLite WHILE loop, not a fused sequence op", hint=fix)


def _op_report(ir: TFLiteModel, kernels: dict[int, str], layers: list) -> list[OpPlacement]:
    lstm_layers = [n for n, c in layers if c == "LSTM"]
    ops = []
    for op in ir.main.ops:
        out = ir.main.tensors[op.outputs[0]] if op.outputs else None
        layer = source_layer(out.name) if out else None
        if op.name == "UNIDIRECTIONAL_SEQUENCE_LSTM" and lstm_layers:
            layer = lstm_layers.pop(0)
        kernel = kernels.get(op.index, "builtin")
        reason = "delegated to XNNPACK" if kernel == "XNNPACK" else "XNNPACK does not take it"
        ops.append(OpPlacement(index=op.index, op=op.name, version=op.version, layer=layer, placement="cpu",
                               reason_code=f"CPU_{kernel.upper()}", reason=reason, kernel=kernel,
                               dtype=out.dtype if out else None))
    return ops


def compile_model(model: str | Path, calib: list[str | Path], out: str | Path,
                  opts: CompileOptions | None = None,
                  progress: Callable[[str], None] | None = None) -> CompileResult:
    """Compile ``model`` for ``opts.board`` into the bundle directory ``out``.

    Args:
        model: ``.keras`` / ``.h5`` file or SavedModel directory.
        calib: ``.npy``/``.npz`` windows or raw feed files (through the feature pipeline); split
            deterministically into calibration windows and held-out drift windows.
    Returns:
        the written bundle, its report and warnings (e.g. drift over the threshold without strict).
    Raises:
        InputError: bad model path, board/quantization mismatch, bad or non-finite windows.
        ConverterError / LoweringError: the converter crashed, hung or could not lower a layer.
        DriftError: drift over the threshold with ``strict`` (nothing is written).
    """
    opts = opts or CompileOptions()
    say = progress or (lambda s: None)
    model = Path(model)
    if not model.exists():
        raise InputError(f"no such model: {model}")
    board = load_board(opts.board)
    quant = opts.quant or board.default_quantization
    if quant not in board.quantization:
        raise InputError(f"board {board.name} does not take --quant {quant}",
                         hint=f"choose one of {', '.join(board.quantization)}")
    pipeline = parse_pipeline(opts.features, Path.cwd()) if opts.features else sidecar_pipeline(model)
    say("load calibration windows")
    w = load_windows(calib, pipeline)
    x = np.asarray(w.x, dtype=np.float32)
    bad = ~np.isfinite(x)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InputError(f"calibration windows hold {int(bad.sum())} NaN/inf values (first at {first})",
                         hint="repair or drop those ticks before calibrating")
    if len(x) < 2:
        raise InputError(f"{len(x)} calibration window(s): at least 2 are needed (calibration + held-out)")
    order = np.random.default_rng(opts.seed).permutation(len(x))
    n_cal = min(opts.calib_windows, max(1, len(x) // 2))
    cal, held = x[order[:n_cal]], x[order[n_cal:n_cal + opts.drift_windows]]
    warnings: list[str] = []

    with tempfile.TemporaryDirectory(prefix="edgehft-compile-") as tmp:
        work = Path(tmp)
        np.savez(work / "calib.npz", x=cal)
        np.savez(work / "eval.npz", x=held)
        info = run_worker({"model": str(model.resolve()), "quant": quant, "lowering": opts.lowering,
                           "calib_npz": str(work / "calib.npz"), "eval_npz": str(work / "eval.npz")},
                          work / "worker", timeout_s=opts.timeout_s, on_stage=say)
        model_file = work / "worker" / "model.tflite"
        ir = TFLiteModel.from_file(model_file)
        _check_no_loops(ir, info["layers"])
        inputs = [_spec(ir, i, info["input_name"]) for i in ir.main.inputs]
        out_names = info["output_names"]
        outputs = [_spec(ir, i, out_names[k] if k < len(out_names) else f"output_{k}")
                   for k, i in enumerate(ir.main.outputs)]
        with np.load(work / "worker" / "float_outputs.npz") as z:
            float_outs = [z[f"out{k}"] for k in range(len(outputs))]

        say("golden vectors and drift on the cpu runtime")
        manifest = Manifest(board=board.name, backend=board.backend, model_file="model.tflite",
                            source=SourceModel(file=model.name, sha256=_model_sha(model),
                                               flavour=info["flavour"], lowering=info["lowering"]),
                            quantization=Quantization(mode=quant, calibration_sha256=sha256_arrays(cal),
                                                      calibration_windows=len(cal),
                                                      calibration_source=w.source,
                                                      drift_windows=len(held)),
                            inputs=inputs, outputs=outputs)
        shutil.copyfile(model_file, work / "model.tflite")
        draft = Bundle(work, manifest)
        runner = cpu_runtime.Runner(draft, board, threads=1)
        deq = [np.empty((len(held), *o.shape[1:]), np.float32) for o in outputs]
        g = min(opts.golden_count, len(held))
        g_in = [np.empty((g, *s.shape[1:]), np.dtype(s.dtype)) for s in inputs]
        g_out = [np.empty((g, *o.shape[1:]), np.dtype(o.dtype)) for o in outputs]
        for n in range(len(held)):
            res = runner.predict(held[n])
            for k, r in enumerate(res if isinstance(res, tuple) else (res,)):
                deq[k][n] = r[0]
            if n < g:
                g_in[0][n] = runner.inputs[0].dest[0]
                for k, slot in enumerate(runner.outputs):
                    g_out[k][n] = slot.src[0]
        kernels = cpu_runtime.delegated_ops(runner.interp)
        ref_diff = _reference_kernel_diff(draft, board, g_in, g_out)
        path = runner.path
        runner.close()

        drift = measure_drift(float_outs, deq, [o.name for o in outputs],
                              [_is_classifier(ir, o.index) for o in outputs], opts.drift_threshold,
                              reference=f"Keras float model ({info['flavour']})", candidate=f"{quant} on {path}")
        if not drift.passed:
            worst = max(drift.outputs, key=lambda o: o.mae_rel)
            msg = (f"drift over the gate: output {worst.name!r} relative MAE {worst.mae_rel:.2%} > "
                   f"{opts.drift_threshold:.2%}")
            if opts.strict:
                raise DriftError(msg + "; nothing was written",
                                 hint="calibrate on more representative ticks, or try --quant dynamic/fp16")
            warnings.append(msg)
        ops = _op_report(ir, kernels, info["layers"])
        counts: dict[str, int] = {}
        for op in ops:
            counts[op.kernel] = counts.get(op.kernel, 0) + 1
        integer = all(np.dtype(o.dtype).kind in "iu" for o in outputs)
        manifest.golden = Golden(count=g, reference_path=path, compare="exact" if integer else "allclose",
                                 atol=0.0 if integer else 1e-5)
        report = Report(board=board.name, verdict="confirmed", verdict_source=path, ops=ops, counts=counts,
                        segments=segments_of(ops), boundary_copies=0, drift=drift,
                        golden={"count": g, "reference_path": path, **ref_diff},
                        notes=[f"the {board.name} board runs every op on the host CPU; 'kernel' says whether "
                               "XNNPACK or LiteRT's builtin kernel runs it"])
        files: dict[str, bytes | Path] = {"model.tflite": model_file, "golden.npz": _golden_npz(
            inputs, outputs, g_in, g_out)}
        if pipeline is not None:
            if pipeline.file is not None:
                files[f"features/{pipeline.file.name}"] = pipeline.file
                manifest.features = Features(file=f"features/{pipeline.file.name}", callable=pipeline.callable)
            else:
                manifest.features = Features(file="", callable=pipeline.spec)
        manifest.toolchain = {**info["versions"], "edgehft": __version__, "interpreter": path,
                              "python": platform.python_version()}
        say("write bundle")
        bundle = write_bundle(out, manifest, files, report=report.model_dump())
    return CompileResult(bundle, report, warnings)


def _model_sha(model: Path) -> str:
    if model.is_file():
        return sha256_file(model)
    import hashlib
    h = hashlib.sha256()
    for f in sorted(p for p in model.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(model)).encode())
        h.update(sha256_file(f).encode())
    return h.hexdigest()


def _golden_npz(inputs, outputs, g_in, g_out) -> bytes:
    buf = io.BytesIO()
    arrays = {f"inputs/{s.name}": a for s, a in zip(inputs, g_in)}
    arrays.update({f"outputs/{s.name}": a for s, a in zip(outputs, g_out)})
    np.savez(buf, **arrays)
    return buf.getvalue()


def _reference_kernel_diff(draft: Bundle, board, g_in, g_out) -> dict:
    """How the golden outputs compare with LiteRT's reference kernels (BUILTIN_REF), in output LSBs."""
    ref = cpu_runtime.Runner(draft, board, threads=1, op_resolver="reference")
    worst, differing = 0.0, 0
    for n in range(len(g_in[0])):
        res = ref.predict_raw(*(a[n:n + 1] for a in g_in))
        diffs = [np.abs(np.asarray(r, np.float64) - o[n:n + 1].astype(np.float64)).max()
                 for r, o in zip(res if isinstance(res, tuple) else (res,), g_out)]
        d = max(diffs)
        worst = max(worst, float(d))
        differing += int(d > 0)
    path = ref.path
    ref.close()
    return {"reference_kernels_path": path, "max_diff_vs_reference_kernels": worst,
            "windows_differing_from_reference_kernels": differing}
