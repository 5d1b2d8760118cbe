"""The Coral stage of ``compile``: partition the int8 model for the Edge TPU, run ``edgetpu_compiler``
where it is installed, and return the report and the bundle artifacts.

Without the compiler the report's verdict is "predicted" and the bundle holds only the int8 model (the
runtime can emulate it on the CPU; a real Edge TPU needs the compiled model). With it, the compiled
model goes into the bundle, the verdict is "confirmed", and every op where the prediction and the
compiler disagree is listed.
"""
from __future__ import annotations

from pathlib import Path

from edgehft.boards import Board
from edgehft.compiler.stage import StageOutput
from edgehft.errors import InputError
from edgehft.ir import TFLiteModel
from edgehft.partition.coral_predict import EdgeTPUOptions
from edgehft.partition.coral_compiled import read_compiled
from edgehft.partition.coral_options import EdgeTPUFlags, edgetpu_options
from edgehft.partition.coral_report import edgetpu_report
from edgehft.toolchains import edgetpu_compiler as etc

# Int8 model I/O needs an Edge TPU runtime of at least this version; older runtimes take uint8.
INT8_IO_MIN_RUNTIME = 12


def io_dtype(board: Board) -> str:
    """``int8`` or ``uint8`` model I/O, as the board's Edge TPU runtime allows."""
    runtime = int(board.runtime.get("edgetpu_runtime", 14))
    return "int8" if runtime >= INT8_IO_MIN_RUNTIME else "uint8"


def recorded_version(v: str | None) -> str:
    """A compiler version as recorded, or ``"not recorded"``: released compilers write only ``"cl/"`` (an
    empty changelist) into a compiled model's DWN1 package."""
    v = (v or "").strip()
    return v if (v[3:] if v.startswith("cl/") else v).strip() else "not recorded"


def golden_notes(golden: dict) -> tuple[list[str], list[str]]:
    """``(report notes, compile warnings)`` on a Coral bundle's golden vectors, from the report's ``golden``
    section (:func:`edgehft.compiler.golden.golden_record`): where they come from, or why there are none."""
    if golden.get("missing"):
        why = golden["missing"].rstrip(".")
        return ([f"no golden vectors: {why}. The bundle keeps the Edge TPU partition above; `run --golden`, "
                 "deploy and the HIL golden check refuse it (exit 6) instead of passing it unchecked"],
                [f"the bundle has no golden vectors: {why}"])
    if "max_diff_vs_reference_kernels" in golden:
        lsb = golden["max_diff_vs_reference_kernels"]
        paths = (f"LiteRT's own kernel paths differ by up to {lsb:g} LSB here" if lsb else
                 "LiteRT's own kernel paths give identical outputs here")
    else:
        paths = f"LiteRT's reference kernels did not run it: {golden.get('reference_kernels_error', '?')}"
    notes = [f"golden outputs come from the int8 graph on {golden['reference_path']}. --emulate reproduces them "
             "exactly; on a real Edge TPU `run --golden` compares them bit for bit with the TPU's outputs, and the "
             f"TPU's int8 arithmetic is not guaranteed to equal LiteRT's ({paths}): a mismatch there measures that "
             "difference (not yet measured on hardware)"]
    return notes + [f"golden vectors: {n}" for n in golden.get("notes", [])], []


def coral_stage(model_file: Path, work: Path, board: Board, flags: EdgeTPUFlags | None = None, *,
                timeout_s: float = 300.0, compiled_model: Path | None = None, say=lambda s: None) -> StageOutput:
    """Partition ``model_file`` (the int8 IR) for ``board``; compile it when ``edgetpu_compiler`` exists,
    or take ``compiled_model`` (that model's ``*_edgetpu.tflite``, compiled on another machine).

    Raises:
        InputError: bad flags (an ``-i`` tensor not in the model, ``-m`` above the board's runtime), or a
            ``compiled_model`` that is not an Edge TPU model compiled from ``model_file``.
        ConverterError: the compiler is installed but failed, crashed or timed out.
    """
    opts = edgetpu_options(board, flags)
    ir = TFLiteModel.from_file(model_file)
    if compiled_model is not None:
        return _given_compiled(ir, board, opts, Path(compiled_model), say)
    exe = etc.find_compiler()
    if exe is None:
        say("partition for the Edge TPU (predicted: edgetpu_compiler not on PATH)")
        rep = edgetpu_report(ir, board.name, opts, link=getattr(board, "edgetpu", None))
        rep.notes.append("edgetpu_compiler is not on PATH: placements are predicted by edgehft's model of the "
                         "compiler, and the bundle holds no compiled model (a real Edge TPU needs it; "
                         "--emulate runs the int8 graph on the CPU). " + etc.INSTALL_HINT)
        return StageOutput(rep, accelerator={"flags": opts.flags(), "compiled": False})
    say(f"edgetpu_compiler {' '.join(opts.flags())}")
    run = etc.run_compiler(model_file, work / "edgetpu", opts.flags(), executable=exe, timeout_s=timeout_s)
    compiled = TFLiteModel.from_file(run.compiled_model)
    actual = read_compiled(compiled, ir)
    info = {"executable": exe, "argv": run.argv[1:], "version": run.output.version,
            "subgraphs": run.output.subgraphs, "tpu_ops": run.output.tpu_ops, "cpu_ops": run.output.cpu_ops,
            "on_chip_used": run.output.on_chip_used, "off_chip_used": run.output.off_chip_used,
            "log": (run.log or run.output).rows}
    rep = edgetpu_report(ir, board.name, opts, actual=actual, compiler=info, link=getattr(board, "edgetpu", None))
    warnings = [f"prediction and edgetpu_compiler disagree on {len(rep.disagreements)} op(s): "
                + ", ".join(f"#{d['index']} {d['op']}" for d in rep.disagreements)] if rep.disagreements else []
    acc = {"flags": opts.flags(), "compiled": True, "min_runtime_version": actual.min_runtime_version,
           "compiler_version": run.output.version or recorded_version(actual.custom_ops[0].compiler_version)}
    return StageOutput(rep, files={"model_edgetpu.tflite": run.compiled_model},
                       artifacts={"edgetpu_model": "model_edgetpu.tflite"}, accelerator=acc,
                       toolchain={"edgetpu_compiler": run.output.version or "unknown"}, warnings=warnings)


def _given_compiled(ir: TFLiteModel, board: Board, opts: EdgeTPUOptions, path: Path, say) -> StageOutput:
    from edgehft.ir.edgetpu_package import is_compiled
    say(f"check the given compiled model {path.name} against the int8 model")
    compiled = TFLiteModel.from_file(path)
    if not is_compiled(compiled):
        raise InputError(f"{path} holds no edgetpu-custom-op: it is not an edgetpu_compiler output",
                         hint="pass the *_edgetpu.tflite the compiler wrote for this model")
    actual = read_compiled(compiled, ir)
    if actual.unmatched:
        raise InputError(f"{path} was not compiled from {Path(ir.source).name}: its CPU ops "
                         f"{', '.join(actual.unmatched)} match no op of it",
                         hint="compile the same .tflite that you pass to `edgehft compile`")
    rep = edgetpu_report(ir, board.name, opts, actual=actual, link=getattr(board, "edgetpu", None))
    rep.notes.append(f"placements confirmed by {path.name}, compiled elsewhere (flags unknown; the prediction "
                     f"used {' '.join(opts.flags())})")
    warnings = [f"prediction and {path.name} disagree on {len(rep.disagreements)} op(s): "
                + ", ".join(f"#{d['index']} {d['op']}" for d in rep.disagreements)] if rep.disagreements else []
    acc = {"flags": None, "compiled": True, "min_runtime_version": actual.min_runtime_version,
           "compiler_version": recorded_version(actual.custom_ops[0].compiler_version),
           "compiled_elsewhere": path.name}
    return StageOutput(rep, files={"model_edgetpu.tflite": path}, artifacts={"edgetpu_model": "model_edgetpu.tflite"},
                       accelerator=acc, toolchain={"edgetpu_compiler": "elsewhere"}, warnings=warnings)
