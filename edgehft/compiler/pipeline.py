"""``compile_model``: Keras model + calibration ticks -> bundle for a board.

load windows -> isolated TensorFlow worker (lower, quantize, float reference outputs) -> read the IR ->
run the quantized model on the CPU runtime (golden vectors, drift) -> report -> atomic bundle write.
"""
from __future__ import annotations

import platform
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from edgehft import __version__, backends
from edgehft.boards import load_board
from edgehft.bundle import (Bundle, Features, Manifest, PlanEntry, Quantization, format_version_for,
                            SourceModel, TensorSpec, plan_files, sha256_arrays, sha256_file, write_bundle)
from edgehft.compiler.drift import measure_drift
from edgehft.compiler.golden import golden_record, run_golden
from edgehft.compiler.plans import NATIVE_PLANS
from edgehft.compiler.isolate import run_worker
from edgehft.compiler.stage import StageInput
from edgehft.errors import ConverterError, DriftError, InputError, LoweringError
from edgehft.ir import TFLiteModel
from edgehft.report import Report
from edgehft.windows import load_windows, parse_pipeline, sidecar_pipeline

_RECURRENT_FIX = {"LSTM": "build the model with keras.Input of a static shape; avoid stateful=True / masking",
                  "GRU": "use LSTM, or pass unroll=True to the layer (what works on each board: "
                         "edgehft.compiler.lowering.GRU_ON_BOARD)", "SimpleRNN": "pass unroll=True"}


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
    select: str = "p99"                      # auto: the percentile the plans are chosen by (p50 | p99 | p99.9)
    candidates: tuple[str, ...] | None = None  # auto: only these plans are measured (None: every plan that applies)
    # a Python whose TFLite interpreter release makes a second golden set (edgehft.compiler.golden_sets): None
    # for $EDGEHFT_GOLDEN_PYTHON, else the board venv where the board's [stack] names another interpreter; "none"
    golden_python: str | None = None
    # options only one board kind takes, as its backend's BoardOptions.collect makes them (edgehft.board_options),
    # e.g. Coral's {"edgetpu": EdgeTPUFlags(...), "edgetpu_model": Path}
    board_options: dict = field(default_factory=dict)


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


def compile_model(model: str | Path, calib: list[str | Path], out: str | Path,
                  opts: CompileOptions | None = None,
                  progress: Callable[[str], None] | None = None) -> CompileResult:
    """Compile ``model`` for ``opts.board`` into the bundle directory ``out``.

    Args:
        model: ``.keras`` / ``.h5`` file or SavedModel directory (quantized here, calibrated on
            ``calib``), or an already quantized ``.tflite`` (taken as is; ``calib`` optional, used for
            golden vectors only).
        calib: ``.npy``/``.npz`` windows or raw feed files (through the feature pipeline); split
            deterministically into calibration windows and held-out drift windows.
    Returns:
        the written bundle, its report and warnings (e.g. drift over the threshold without strict).
    Raises:
        InputError: bad model path, board/quantization mismatch, bad or non-finite windows.
        ConverterError / LoweringError: the converter (or edgetpu_compiler) crashed, hung or refused.
        DriftError: drift over the threshold with ``strict`` (nothing is written).
    """
    opts = opts or CompileOptions()
    say = progress or (lambda s: None)
    model = Path(model)
    board, stage, quant, as_is = _check_request(model, calib, opts)
    pipeline = parse_pipeline(opts.features, Path.cwd()) if opts.features else sidecar_pipeline(model)
    x, source = _load_calib(calib, pipeline, keep_int=as_is) if calib else (None, [])
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="edgehft-compile-") as tmp:
        work = Path(tmp)
        if as_is:
            model_file, info, cal, held, float_outs, quant = _take_tflite(model, x, board, opts)
        else:
            model_file, info, cal, held, float_outs = _convert(model, x, board, stage, quant, opts, work, say)
        ctx = StageInput(board=board, opts=opts, quant=quant, work=work, info=info, source=None, quantization=None,
                         cal=cal, held=held, float_outs=float_outs, say=say)
        if not stage.golden_on_cpu:               # the backend makes its golden vectors and manifest itself
            ctx.source, ctx.quantization = _source_model(model, info), _quantization(quant, cal, held, source)
            return _stage_bundle(stage, ctx, pipeline, out)
        ev = dict(model=model, info=info, board=board, cal=cal, held=held, float_outs=float_outs,
                  source=source, opts=opts, allow_missing=stage.golden_may_be_missing)
        r, quant, plan_section = _evaluate_plan(quant, model_file, work, ev, say)
        _gate_drift(r["drift"], opts, warnings)
        bundle, report = _build_bundle(stage, ctx, r, quant, plan_section, pipeline, out, warnings)
    return CompileResult(bundle, report, warnings)


def _check_request(model: Path, calib: list, opts: CompileOptions):
    """(board, its compiler stage, the plan asked for, whether the model is a .tflite taken as is), once the
    request is known to make sense; nothing has run yet.

    Raises:
        InputError: no such model, a plan the board does not take, ``--quant`` for a .tflite, ``auto`` for a
            board that does not run on this host, no ``calib`` for a Keras model, options of another board.
    """
    if not model.exists():
        raise InputError(f"no such model: {model}")
    board = load_board(opts.board)
    stage = backends.get(board.backend).load("compiler")     # the board's part: edgehft.compiler.stage
    stage.validate(board, model, opts)
    as_is = model.suffix == ".tflite"
    if as_is and opts.quant:
        raise InputError(f"--quant does not apply to {model.name}: a .tflite is taken as it was quantized",
                         hint="drop --quant, or compile the Keras model it came from")
    quant = opts.quant or board.default_quantization
    from edgehft.runtime.plans import check_select
    check_select(opts.select)
    if quant == "auto" and not stage.plans_on_host:
        raise InputError(f"--quant auto measures execution plans on this host: it is for the cpu board, "
                         f"not {board.name}", hint=f"choose one of {', '.join(board.quantization)}")
    _check_candidates(opts.candidates, quant)
    if quant not in board.quantization and quant != "auto" and not as_is:
        raise InputError(f"board {board.name} does not take --quant {quant}",
                         hint=f"choose one of {', '.join(board.quantization)}")
    if not calib and not as_is:
        raise InputError("--calib is required to quantize a Keras model", hint="pass tick windows or raw feeds")
    return board, stage, quant, as_is


def _check_candidates(candidates, quant: str) -> None:
    """``opts.candidates`` names auto's plans (int8, dynamic, float, native, native-bf16, ort-float, ort-int8).

    Raises:
        InputError: candidates without ``--quant auto``, none, or a name that is not one of those plans.
    """
    if candidates is None:
        return
    from edgehft.compiler.plans import AUTO_PLANS
    unknown = [c for c in candidates if c not in AUTO_PLANS]
    if quant != "auto" or not candidates or unknown:
        raise InputError(f"candidates {list(candidates)!r}: --quant auto chooses among {', '.join(AUTO_PLANS)}"
                         + (f"; not {', '.join(map(repr, unknown))}" if unknown else ""),
                         hint="name some of those plans with --quant auto, or leave candidates out (every plan)")


def _convert(model: Path, x: np.ndarray, board, stage, quant: str, opts: CompileOptions, work: Path, say):
    """Split the windows ``x`` into calibration and held-out sets (seeded) and run the converter worker
    (:mod:`edgehft.compiler.worker`, isolated) for ``quant``. Returns (the int8 or plan TFLite file, the
    worker's record, cal, held, the float model's outputs on held)."""
    order = np.random.default_rng(opts.seed).permutation(len(x))
    n_cal = min(opts.calib_windows, max(1, len(x) // 2))
    cal, held = x[order[:n_cal]], x[order[n_cal:n_cal + opts.drift_windows]]
    np.savez(work / "calib.npz", x=cal)
    np.savez(work / "eval.npz", x=held)
    req = {"model": str(model.resolve()), "quant": quant, "lowering": opts.lowering, "backend": board.backend,
           "calib_npz": str(work / "calib.npz"), "eval_npz": str(work / "eval.npz")}
    if quant == "auto" or quant.startswith("native"):  # int8 is model.tflite; others model_<plan>.tflite
        from edgehft.compiler.plans import CANDIDATES
        req.update(quant="int8", plans=list(CANDIDATES))
    if stage.plans_on_host and _wanted(opts, "ort-float", "ort-int8"):   # ONNX Runtime plans: the ONNX export
        from edgehft.compiler.ort_plans import worker_request
        req.update(worker_request(quant))
    req.update(stage.worker_request(board, quant))
    info = run_worker(req, work / "worker", timeout_s=opts.timeout_s, on_stage=say)
    with np.load(work / "worker" / "float_outputs.npz") as z:
        float_outs = [z[f"out{k}"] for k in range(len(z.files))]
    return work / "worker" / "model.tflite", info, cal, held, float_outs


def _evaluate_plan(quant: str, model_file: Path, work: Path, ev: dict, say):
    """Golden vectors and drift on the cpu runtime for the plan ``quant``; for ``auto`` for every candidate,
    then the candidates timed interleaved on one pinned core and the best by ``opts.select`` chosen. Returns
    (the evaluation of the plan kept, its name, the report's plan section or None); for ``auto`` the
    evaluation's ``other_plans`` holds the other candidates that pass the drift gate (shipped as
    ``plans/<plan>/``), each with this host's figures."""
    if quant == "auto":
        from edgehft.compiler.plans import CANDIDATES, Candidate, choose, passes, time_plans
        cands = []
        for plan in (p for p in CANDIDATES if _wanted(ev["opts"], p)):
            f = work / "worker" / ("model.tflite" if plan == "int8" else f"model_{plan}.tflite")
            say(f"plan {plan}: golden vectors and drift on the cpu runtime")
            r = _evaluate(f, plan, work / f"plan_{plan}", **ev)
            cands.append(Candidate(plan, r["draft"], r["gold"], r["drift"], r))
        for more, names in ((_native_candidates, ("native", "native-bf16")),
                            (_ort_candidates, ("ort-float", "ort-int8"))):
            if _wanted(ev["opts"], *names):
                cands += [c for c in more(work, ev, say) if _wanted(ev["opts"], c.plan)]
        if not cands:
            raise InputError(f"none of the candidate plans {', '.join(ev['opts'].candidates)} applies to "
                             f"{ev['model'].name} here", hint="name other candidates, or leave them out (every plan)")
        say("plans: time " + ", ".join(c.plan for c in cands) + " interleaved on one pinned core")
        timing = time_plans({c.plan: c.bundle for c in cands}, ev["board"], ev["held"])
        best, plan_section = choose(cands, timing, ev["opts"].select)
        best.evaluated["timing"] = timing[best.plan]
        best.evaluated["other_plans"] = [{**c.evaluated, "timing": timing[c.plan]} for c in cands
                                         if c is not best and passes(c) and passes(best)]
        return best.evaluated, best.plan, plan_section
    if quant.startswith("native"):               # one native plan, asked for by name (e.g. for another host)
        return _native_candidates(work, ev, say, only=quant)[0].evaluated, quant, None
    if quant.startswith("ort-"):                  # an ONNX Runtime plan, asked for by name
        return _ort_candidates(work, ev, say, only=quant)[0].evaluated, quant, None
    say("golden vectors and drift on the cpu runtime")
    return _evaluate(model_file, quant, work / "draft", **ev), quant, None


def _wanted(opts: CompileOptions, *plans: str) -> bool:
    """Whether any of ``plans`` is a candidate of ``--quant auto`` under ``opts.candidates`` (None: all)."""
    return opts.candidates is None or any(p in opts.candidates for p in plans)


def _gate_drift(drift, opts: CompileOptions, warnings: list) -> None:
    """Drift over ``opts.drift_threshold``: a warning, or with ``opts.strict`` an error.

    Raises:
        DriftError: over the threshold with ``strict`` (nothing is written; exit 5).
    """
    if drift is None or drift.passed:
        return
    worst = max(drift.outputs, key=lambda o: o.mae_rel)
    msg = (f"drift over the gate: output {worst.name!r} relative MAE {worst.mae_rel:.2%} > "
           f"{opts.drift_threshold:.2%}")
    if opts.strict:
        raise DriftError(msg + "; nothing was written",
                         hint="calibrate on more representative ticks, or try --quant dynamic/fp16")
    warnings.append(msg)


def _build_bundle(stage, ctx: StageInput, r: dict, quant: str, plan_section, pipeline, out, warnings: list):
    """The golden record, the board's stage (:meth:`~edgehft.compiler.stage.CompilerStage.build`) and the
    bundle written to ``out`` from the evaluation ``r`` of the plan ``quant`` (with ``r["other_plans"]`` as
    ``plans/<plan>/`` sub-bundles, :func:`_plan_bundles`). Returns (bundle, report)."""
    board, work, info = ctx.board, ctx.work, ctx.info
    ir, inputs, outputs, manifest, draft, gold, drift, model_file = (r[k] for k in (
        "ir", "inputs", "outputs", "manifest", "draft", "gold", "drift", "model_file"))
    manifest.golden, golden, golden_files = golden_record(draft, board, gold, inputs, outputs)
    _golden_floor(manifest, golden, r)
    manifest.format_version = format_version_for(quant, r.get("native_files"))
    files: dict[str, bytes | Path] = {manifest.model_file: model_file, **golden_files}
    manifest.toolchain = {**info["versions"], "edgehft": __version__, "interpreter": gold.path,
                          "python": platform.python_version()}
    ctx.quant, ctx.source, ctx.quantization, ctx.model_file, ctx.ir, ctx.gold, ctx.golden, ctx.drift = (
        quant, manifest.source, manifest.quantization, model_file, ir, gold, golden, drift)
    if r.get("ort"):                              # an ONNX Runtime plan: its report is the ONNX graph's
        from edgehft.compiler.ort_plans import build as ort_build
        built = ort_build(ctx, r)
    else:
        built = stage.build(ctx)
    report = built.report
    report.drift, report.golden = drift, golden
    files.update(built.files)
    manifest.artifacts.update(built.artifacts)
    manifest.accelerator.update(built.accelerator)
    manifest.toolchain.update(built.toolchain)
    warnings += built.warnings
    if r.get("native_files"):
        files.update(r["native_files"])
        report.notes.append(f"{quant} plan: {NATIVE_PLANS[quant]}. `bench --profile` times each step of that "
                            "chain")
    if plan_section:
        report.plan = plan_section
        if quant != "int8":
            files["model_int8.tflite"] = work / "worker" / "model.tflite"
            manifest.artifacts["int8_ir"] = "model_int8.tflite"
    if drift is None:
        report.notes.append("no drift figures: the model came quantized (.tflite), so there is no float "
                            "reference to compare with")
    _attach_features(manifest, files, pipeline, warnings)
    if r.get("other_plans"):
        files.update(_plan_bundles(ctx, r, quant, manifest, pipeline))
        report.notes.append(f"the bundle carries {len(manifest.plans)} plans ({', '.join(manifest.plans)}): the top "
                            f"level is this host's choice by {ctx.opts.select}; `edgehft deploy` times them on the "
                            "box and records the one it runs; `edgehft run/bench --plan NAME` runs one by name")
    _golden_sets(ctx, manifest, files, report, warnings)
    ctx.say("write bundle")
    return write_bundle(out, manifest, files, report=report.model_dump()), report


def _golden_sets(ctx: StageInput, manifest: Manifest, files: dict, report, warnings: list) -> None:
    """The golden set of the board's interpreter release (:mod:`edgehft.compiler.golden_sets`), where a side
    Python is asked for or the board's stack calls for one (else the warning that says how)."""
    from edgehft.compiler.golden_sets import add_golden_set, golden_python
    if manifest.golden is None:
        return
    python, warning = golden_python(ctx.board, ctx.opts.golden_python)
    if warning:
        warnings.append(warning)
    if python:
        add_golden_set(python, manifest, files, report, ctx.work, ctx.say)


def _plan_entry(r: dict, where: str | None) -> PlanEntry:
    """The manifest's :class:`~edgehft.bundle.PlanEntry` of the evaluation ``r`` (in ``where``; None: top level)."""
    drift, t = r["drift"], r.get("timing") or {}
    return PlanEntry(dir=where, drift_rel_mae=max(o.mae_rel for o in drift.outputs) if drift else None,
                     drift_passed=drift.passed if drift else None,
                     compile_host={k: round(float(t[k]), 3) for k in ("p50_us", "p99_us", "p99.9_us", "mean_us")
                                   if k in t})


def _plan_bundles(ctx: StageInput, r: dict, quant: str, manifest: Manifest, pipeline) -> dict:
    """The files of each other plan in ``r["other_plans"]`` as a complete sub-bundle ``plans/<plan>/`` (its
    manifest, model, golden vectors, native chain, feature pipeline), and ``manifest.plans`` listing the top
    level ``quant`` and each of them."""
    from edgehft.bundle import PLANS_DIR
    files: dict = {}
    manifest.plans = {quant: _plan_entry(r, None)}
    for o in r["other_plans"]:
        m, plan = o["manifest"], o["manifest"].quantization.mode
        m.golden, section, golden_files = golden_record(o["draft"], ctx.board, o["gold"], o["inputs"], o["outputs"])
        _golden_floor(m, section, o)
        m.format_version = format_version_for(plan, o.get("native_files"))
        m.toolchain = {**manifest.toolchain, "interpreter": o["gold"].path}
        sub = {m.model_file: o["model_file"], **golden_files, **(o.get("native_files") or {})}
        _attach_features(m, sub, pipeline)
        files.update(plan_files(plan, m, sub))
        manifest.plans[plan] = _plan_entry(o, f"{PLANS_DIR}/{plan}")
    return files


def _golden_floor(manifest: Manifest, section: dict, r: dict) -> None:
    """Raise the golden tolerance of the evaluation ``r`` to its ``golden_atol_floor`` (ort-int8: one step of
    the output's int8 grid), and say so in the report's golden ``section``."""
    floor = r.get("golden_atol_floor")
    if manifest.golden is not None and floor and floor > manifest.golden.atol:
        manifest.golden.atol = float(floor)
        section["atol"] = float(floor)
        section["atol_rule"] = ("one step of the output's int8 grid (int8 kernels of another CPU may round one "
                                "requantization the other way), above twice the distance from the reference path")


def _ort_candidates(work: Path, ev: dict, say, only: str | None = None) -> list:
    """The ONNX Runtime plans (:mod:`edgehft.compiler.ort_plans`) from the worker's float ONNX export:
    ``ort-float`` as it is and ``ort-int8`` (ONNX Runtime's static Q/DQ quantization on the calibration
    windows), each evaluated on the cpu runtime like the other plans. A plan that cannot be made or run here
    is said and left out; ``only``: that plan alone, asked for by name, whose failure is an error.

    Raises:
        ConverterError: (``only``) the export or the quantization failed.
        BundleError: (``only``) ONNX Runtime refused the model.
    """
    from edgehft.compiler import ort_plans
    from edgehft.compiler.plans import Candidate
    from edgehft.errors import EdgeHFTError
    export = ev["info"].get("onnx") or {}
    float_onnx = work / "worker" / "model.onnx"
    if not float_onnx.is_file() or "error" in export:
        why = export.get("error") or ort_plans.unavailable() or "the converter gave no ONNX export"
        if only:
            raise ConverterError(f"the {only} plan needs the model's ONNX export: {why}")
        say(f"plans {', '.join(ort_plans.ORT_PLANS)}: skipped ({why})")
        return []
    out = []
    for plan in ort_plans.ORT_PLANS:
        if only and plan != only:
            continue
        where = work / f"plan_{plan}"
        try:
            say(f"plan {plan}: golden vectors and drift on the cpu runtime (ONNX Runtime)")
            model_file, qdq = float_onnx, None
            if plan == "ort-int8":
                where.mkdir(parents=True, exist_ok=True)
                model_file = where / "model_qdq.onnx"
                qdq = ort_plans.make_qdq(float_onnx, ev["cal"], model_file)
            r = _evaluate_onnx(model_file, plan, where, softmax=ort_plans.softmax_flags(float_onnx), **ev)
        except EdgeHFTError as exc:
            if only:
                raise
            say(f"plan {plan}: skipped ({exc.args[0]})")
            continue
        r.update(ort=True, qdq=qdq, ort_kernels=ort_plans.kernels_ran(model_file, ev["held"][:1]))
        if plan == "ort-int8":
            r["golden_atol_floor"] = ort_plans.output_step(model_file)
        out.append(Candidate(plan, r["draft"], r["gold"], r["drift"], r))
    return out


def _evaluate_onnx(model_file: Path, quant: str, where: Path, *, model, info, board, cal, held, float_outs, source,
                   opts, softmax: list, allow_missing: bool = False) -> dict:
    """:func:`_evaluate` for an ONNX Runtime plan: ``model_file`` (ONNX) as ``model.onnx`` of a draft bundle
    whose float32 I/O specs are the TFLite plans' names (:func:`edgehft.compiler.ort_plans.io_specs`), golden
    vectors and drift vs Keras on the cpu runtime (ONNX Runtime); ``softmax``: per output, whether a Softmax
    makes it. Returns what :func:`_evaluate` returns (``ir`` None)."""
    from edgehft.compiler.ort_plans import io_specs
    inputs, outputs = io_specs(info, held, float_outs)
    manifest = Manifest(board=board.name, backend=board.backend, model_file="model.onnx",
                        source=_source_model(model, info), quantization=_quantization(quant, cal, held, source),
                        inputs=inputs, outputs=outputs)
    where.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_file, where / "model.onnx")
    draft = Bundle(where, manifest)
    gold = run_golden(draft, board, held, opts.golden_count, opts.seed, allow_missing=allow_missing)
    drift = None
    if float_outs is not None and gold.missing is None:
        drift = measure_drift(float_outs, gold.dequantized, [o.name for o in outputs], softmax, opts.drift_threshold,
                              reference=f"Keras float model ({info['flavour']})", candidate=f"{quant} on {gold.path}")
    return dict(ir=None, inputs=inputs, outputs=outputs, manifest=manifest, draft=draft, gold=gold, drift=drift,
                model_file=where / "model.onnx")


def _native_candidates(work: Path, ev: dict, say, only: str | None = None) -> list:
    """The native plans (:mod:`edgehft.compiler.native`) that apply here: ``native`` when the model has
    LSTM ops the kernel takes (the dynamic-range graph, LSTM weights from the float conversion);
    ``native-bf16`` when it has CONV_2D or LSTM ops the kernels take, on every host: where bf16 products run
    in hardware (AMX-BF16 tiles, AVX512_BF16's VDPBF16PS) on those, elsewhere on the conv kernel's fp32 loop
    over the same bf16 operands, which the timing judges like any plan (on an AVX2-only AMD EPYC, Zen 3, it
    was chosen for LSTM_A, and DeepLOB's ran 1,354 µs p50 alone against ONNX Runtime int8's 1,538, though
    interleaved at compile it lost to the native plan). Each is said when skipped.
    ``only``: that plan alone, asked for by name."""
    from edgehft.compiler.native import native_files
    from edgehft.compiler.plans import Candidate
    from edgehft.errors import BoardUnavailableError
    from edgehft.kernels.cpu.build import bf16_in_hardware
    dyn, flt = work / "worker" / "model_dynamic.tflite", work / "worker" / "model_float.tflite"
    if not (dyn.is_file() and flt.is_file()):
        if only:
            raise LoweringError(f"the converter gave no dynamic-range and float graphs for the {only} plan")
        return []
    out = []
    for plan, graph, kw in (("native", dyn, {"weights_from": flt}), ("native-bf16", flt, {"convs": True})):
        if only and plan != only:
            continue
        try:
            files = native_files(graph, **kw)
            if plan == "native-bf16" and not bf16_in_hardware():
                say("plan native-bf16: this host has no bf16 products in hardware (AMX-BF16, AVX512_BF16): its "
                    "convs run the conv kernel's fp32 loop on the same bf16 operands (golden vectors and drift from "
                    "there), timed like the other plans; a box with AMX or AVX512_BF16 runs it faster")
        except LoweringError as exc:
            if only:
                raise InputError(f"the {plan} plan does not apply to {ev['model'].name}: {exc}",
                                 hint="compile with --quant auto to choose among the plans that apply") from None
            if "nothing for the native kernels" not in str(exc):
                say(f"plan {plan}: not applicable ({exc})")
            continue
        except BoardUnavailableError as exc:
            if only:
                raise
            say(f"plan {plan}: skipped ({exc})")
            continue
        say(f"plan {plan}: golden vectors and drift on the cpu runtime (native kernels)")
        try:
            r = _evaluate(graph, plan, work / f"plan_{plan}", extra_files=files, **ev)
        except BoardUnavailableError as exc:
            if only:
                raise
            say(f"plan {plan}: skipped ({exc})")
            continue
        bad = sum(int((~np.isfinite(np.asarray(o, np.float64))).sum()) for o in r["gold"].outputs)
        if bad:
            msg = (f"the {plan} plan gives {bad} non-finite golden output value(s) on held-out windows where the "
                   "Keras model does not")
            if only:
                raise LoweringError(msg, hint="compile with --quant auto or --quant float")
            say(f"plan {plan}: skipped ({msg})")
            continue
        r["native_files"] = files
        out.append(Candidate(plan, r["draft"], r["gold"], r["drift"], r))
    return out


def _evaluate(model_file: Path, quant: str, where: Path, *, model, info, board, cal, held, float_outs, source,
              opts, allow_missing: bool = False, extra_files: dict[str, bytes] | None = None) -> dict:
    """Read ``model_file`` (one plan), run it on the cpu runtime: golden vectors and drift vs Keras.
    Returns ``ir``, ``inputs``/``outputs`` specs, the draft ``manifest`` and ``draft`` bundle, ``gold``,
    ``drift`` (None without a float reference) and ``model_file``."""
    ir = TFLiteModel.from_file(model_file)
    _check_no_loops(ir, info["layers"])
    inputs = [_spec(ir, i, info["input_names"][k]) for k, i in enumerate(ir.main.inputs)]
    out_names = info["output_names"]
    outputs = [_spec(ir, i, out_names[k] if k < len(out_names) else f"output_{k}")
               for k, i in enumerate(ir.main.outputs)]
    manifest = Manifest(board=board.name, backend=board.backend, model_file="model.tflite",
                        source=_source_model(model, info), quantization=_quantization(quant, cal, held, source),
                        inputs=inputs, outputs=outputs)
    where.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_file, where / "model.tflite")
    if extra_files:                     # the native plan: its chain next to the graph
        from edgehft.compiler.native import NATIVE_JSON
        for rel, data in extra_files.items():
            (where / rel).parent.mkdir(parents=True, exist_ok=True)
            (where / rel).write_bytes(data)
        manifest.artifacts["native"] = NATIVE_JSON
    draft = Bundle(where, manifest)
    gold = run_golden(draft, board, held, opts.golden_count, opts.seed, allow_missing=allow_missing)
    drift = None
    if float_outs is not None and gold.missing is None:
        drift = measure_drift(float_outs, gold.dequantized, [o.name for o in outputs],
                              [_is_classifier(ir, o.index) for o in outputs], opts.drift_threshold,
                              reference=f"Keras float model ({info['flavour']})",
                              candidate=f"{quant} on {gold.path}")
    return dict(ir=ir, inputs=inputs, outputs=outputs, manifest=manifest, draft=draft, gold=gold, drift=drift,
                model_file=model_file)


def _source_model(model: Path, info: dict) -> SourceModel:
    """The manifest's record of the model compiled (file name, hash, flavour, lowering)."""
    return SourceModel(file=model.name, sha256=model_sha256(model), flavour=info["flavour"], lowering=info["lowering"])


def _quantization(quant: str, cal, held, source: list) -> Quantization:
    """The manifest's quantization record: ``quant`` and the calibration/held-out windows (None: none)."""
    return Quantization(mode=quant, calibration_sha256=sha256_arrays(cal) if cal is not None else None,
                        calibration_windows=len(cal) if cal is not None else 0, calibration_source=source,
                        drift_windows=len(held) if held is not None else 0)


def _stage_bundle(stage, ctx: StageInput, pipeline, out) -> CompileResult:
    """The bundle of a backend that makes its own golden vectors (``golden_on_cpu`` False): its
    :meth:`~edgehft.compiler.stage.CompilerStage.build` returns the manifest, files and report."""
    built = stage.build(ctx)
    files = dict(built.files)
    _attach_features(built.manifest, files, pipeline, built.warnings)
    ctx.say("write bundle")
    bundle = write_bundle(out, built.manifest, files, report=built.report.model_dump())
    return CompileResult(bundle, built.report, built.warnings)


def _attach_features(manifest: Manifest, files: dict, pipeline, warnings: list | None = None) -> None:
    """The model's feature pipeline goes with the bundle as a copy of its one source file (a module pipeline
    too: boxes run only code the bundle carries and hashes). A module that is not one plain ``.py`` file
    (a package, an extension) is left out, with a warning."""
    if pipeline is None:
        return
    src = pipeline.source_file()
    if src is None:
        if warnings is not None:
            warnings.append(f"feature pipeline {pipeline.spec} is not one .py file, so the bundle carries none: "
                            "replaying raw feeds from the bundle needs .npy/.npz windows instead")
        return
    files[f"features/{src.name}"] = src
    manifest.features = Features(file=f"features/{src.name}", callable=pipeline.callable)


def _load_calib(calib, pipeline, keep_int: bool = False) -> tuple[np.ndarray, list[str]]:
    """Windows as float32; with ``keep_int`` integer windows keep their dtype (already quantized input)."""
    w = load_windows(calib, pipeline)
    x = np.asarray(w.x)
    if not (keep_int and x.dtype.kind in "iu"):
        x = x.astype(np.float32)         # load_windows refused NaN, inf and values beyond float32 already
    if len(x) < 2:
        raise InputError(f"{len(x)} calibration window(s): at least 2 are needed (calibration + held-out)")
    return x, w.source


def _take_tflite(model: Path, x, board, opts):
    """An already quantized .tflite: checked and taken as is (no converter, no drift). It is validated
    (:mod:`edgehft.ir.validate`) and opened on each LiteRT kernel path in a child process first
    (:func:`edgehft.runtime.isolate.check_models`): one that is corrupt or crashes LiteRT is a ConverterError."""
    from edgehft.ir.validate import InvalidModelError
    try:
        ir = TFLiteModel.from_file(model)
    except InvalidModelError as exc:
        raise ConverterError(exc.args[0], hint=exc.hint) from None
    compiled = backends.compiled_for(ir)
    if compiled:
        raise InputError(f"{model} is already compiled for {compiled}",
                         hint=f"inspect it with `edgehft report {model}`; compile the CPU model it came from")
    g = ir.main
    mode = "int8" if all(g.tensors[i].dtype in ("int8", "uint8") for i in g.inputs) else "float"
    if mode == "float" and any(op.name == "QUANTIZE" for op in g.ops):
        mode = "int8"                              # full-integer inside, float I/O
    if x is not None:
        want = tuple(g.tensors[g.inputs[0]].shape[1:])
        in_dtype = g.tensors[g.inputs[0]].dtype
        if x.dtype.kind in "iu" and x.dtype != np.dtype(in_dtype):
            raise InputError(f"--calib windows are {x.dtype}; {model.name} takes {in_dtype}",
                             hint=f"pass float windows (quantized with the input's scale) or {in_dtype} raw values")
        if len(g.inputs) != 1 or tuple(x.shape[1:]) != want:
            raise InputError(f"--calib windows have shape {x.shape[1:]}; {model.name} takes {want}"
                             + (f" and {len(g.inputs)} inputs" if len(g.inputs) != 1 else ""),
                             hint="give windows of the model's input shape, or no --calib (random golden inputs)")
    _isolated_first_open(model, opts.timeout_s)
    names = _io_names(g, g.inputs)
    info = {"flavour": "tflite", "lowering": "as-is (already quantized .tflite)", "input_names": names,
            "output_names": _io_names(g, g.outputs), "layers": [],
            "versions": {}}
    held = x[:opts.drift_windows] if x is not None else None
    return model, info, None, held, None, mode


def _isolated_first_open(model: Path, timeout_s: float) -> None:
    """Open ``model`` on every LiteRT kernel path golden vectors may use, in a child process, before this
    process does (their refusals are left to the golden-vector code, which falls back or says why).

    Raises:
        ConverterError: LiteRT crashed (the signal) or hung on the model, or its ops make an input or output
            of another shape or dtype than the model declares.
    """
    from edgehft.errors import BundleError
    from edgehft.runtime.isolate import check_models
    hint = "the .tflite is corrupt or hostile: convert the model again"
    try:
        found = check_models([model], timeout_s=min(timeout_s, 300.0))
    except BundleError as exc:
        raise ConverterError(exc.args[0], hint=hint) from None
    if found["io"]:
        raise ConverterError(f"{model.name} is inconsistent: {'; '.join(found['io'])}", hint=hint)


def _io_names(g, indices) -> list[str]:
    """Input/output names of a .tflite: tensor names without their ``:N`` suffix, except where that would make
    two equal (PoseNet's outputs are poses, poses:1, poses:2, poses:3): those keep their full names."""
    short = [g.tensors[i].name.split(":")[0] for i in indices]
    return [s if short.count(s) == 1 else g.tensors[i].name for s, i in zip(short, indices)]


def model_sha256(model: Path) -> str:
    """The SHA-256 (hex) a bundle's ``source.sha256`` records for ``model``: the file's, or for a directory (a
    SavedModel) the hash over each file's relative path and SHA-256 in sorted order."""
    if model.is_file():
        return sha256_file(model)
    import hashlib
    h = hashlib.sha256()
    for f in sorted(p for p in model.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(model)).encode())
        h.update(sha256_file(f).encode())
    return h.hexdigest()
