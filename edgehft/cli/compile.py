"""``edgehft compile``: a Keras model (or a quantized .tflite) and calibration ticks into a bundle for a board."""
from __future__ import annotations

import json
from pathlib import Path

import click
from click.core import ParameterSource

from edgehft.cli.common import board_options_of, board_opts, err, handles_errors, json_opt, main, out, select_opt
from edgehft.errors import EdgeHFTError

@main.command("compile")
@click.argument("model", type=click.Path(exists=True))
@click.option("--board", default="cpu", show_default=True, help="Target board (see `edgehft boards`).")
@click.option("--calib", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Calibration ticks: windows (.npy/.npz) or raw feed files; repeat for several. Required "
                   "for Keras models; for a quantized .tflite only used for golden vectors.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Bundle directory.")
@click.option("--quant", type=click.Choice(["int8", "dynamic", "fp16", "float", "auto", "native", "native-bf16",
                                           "ort-float", "ort-int8"]),
              default=None,
              help="Quantization (default: the board file's: auto for cpu, int8 for Coral and PYNQ, fp16 for Jetson). "
                   "cpu board: auto measures the int8, dynamic and float plans (and the native plans that apply "
                   "here, and ONNX Runtime's float and int8 runs where onnxruntime and tf2onnx are installed), "
                   "makes the fastest by --select that passes the drift gate the bundle's top level and "
                   "ships every other passing plan in plans/<plan>/ for deploy to choose on the box; native / "
                   "native-bf16 / ort-float / ort-int8 take that plan alone (native-bf16: CONV_2D and LSTM input "
                   "projections on edgehft's bf16 AMX kernel, for a box with AMX-BF16; ort-*: the model's ONNX "
                   "export on ONNX Runtime, for a box with onnxruntime).")
@select_opt("--quant auto, measured on this host (deploy measures again on the box)")
@click.option("--features", default=None, help="Feature pipeline 'file.py:function' (default: the model's sidecar).")
@click.option("--calib-windows", default=300, show_default=True, help="Windows used for calibration.")
@click.option("--drift-windows", default=500, show_default=True, help="Held-out windows for the drift check.")
@click.option("--golden-count", "golden_count", default=16, show_default=True, type=int,
              metavar="N", help="Golden vectors to store (`edgehft run --golden` checks them).")
@click.option("--golden", "golden_legacy", default=None, type=int, hidden=True,
              help="Deprecated spelling of --golden-count N.")
@click.option("--drift-threshold", default=0.01, show_default=True, help="Gate on relative MAE (0.01 = 1 %).")
@click.option("--strict", is_flag=True, help="Drift over the threshold is an error (exit 5), not a warning.")
@click.option("--timeout", "timeout_s", default=1800.0, show_default=True, help="Converter time limit, s.")
@click.option("--lowering", type=click.Choice(["auto", "native"]), default="auto", show_default=True,
              help="native: no tf-keras rebuild and no pre-conversion checks; the graph goes to the "
                   "converter as is (diagnosis only).")
@click.option("--force", is_flag=True,
              help="Replace a bundle already in --out that was compiled for another board or from another model.")
@click.option("--ops", "full", is_flag=True,
              help="The op-by-op table however many ops; a report of more than 60 ops shows one row per Keras "
                   "layer (its ops, where they run, dtype) without it.")
@board_opts("compile")
@click.option("--sign", "sign_key", type=click.Path(exists=True, dir_okay=False), default=None, metavar="KEY",
              help="Sign the bundle's manifest with this SSH key (ssh-keygen -Y sign, namespace edgehft-bundle) "
                   "into manifest.json.sig; boxes with an allowed_signers file take only signed bundles.")
@click.option("--golden-python", "golden_python", default=None, metavar="PY", envvar="EDGEHFT_GOLDEN_PYTHON",
              help="Also make the golden outputs of the TFLite interpreter release in this Python (a board venv, "
                   "edgehft's box side installed; the accelerator emulated): a box running that release is checked "
                   "against them. Default: the checkout's board venv where the board's [stack] names another "
                   "interpreter than this host's (PYNQ-Z2: .venv-board-z2); 'none': only this host's.")
@json_opt
@handles_errors
def compile_cmd(model, board, calib, out_dir, quant, select, features, calib_windows, drift_windows, golden_count,
                golden_legacy, drift_threshold, strict, timeout_s, lowering, force, full, sign_key, golden_python,
                as_json, **board_values):
    """Quantize MODEL (.keras, .h5 or SavedModel dir; or take a quantized .tflite as is) for a board,
    partition it, and write a bundle.

    \b
    Examples:
      edgehft compile examples/deeplob/deeplob.keras --board cpu --calib FEED.gz --out build/deeplob.cpu
      edgehft compile model.keras --board coral-usb --calib windows.npy --out build/model.coral"""
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    from edgehft.report import print_report
    if not calib and not str(model).endswith(".tflite"):
        raise click.UsageError("Missing option '--calib': calibration ticks (tick windows .npy/.npz, or raw feeds "
                               "with --features) quantize a Keras model; only a quantized .tflite is taken without")
    golden_count = _golden_count(golden_count, golden_legacy)
    _check_not_foreign(Path(out_dir))
    if not force:
        _check_replace(Path(model), board, Path(out_dir))
    if sign_key:
        from edgehft.signing import check_tool
        check_tool()                # a missing or too old ssh-keygen is said before the compile, not after
    opts = CompileOptions(board=board, quant=quant, features=features, calib_windows=calib_windows,
                          drift_windows=drift_windows, golden_count=golden_count,
                          drift_threshold=drift_threshold, strict=strict, timeout_s=timeout_s, lowering=lowering,
                          board_options=board_options_of(board_values), select=select, golden_python=golden_python)
    if as_json:
        res = compile_model(model, list(calib), out_dir, opts)
    else:
        with err.status("compiling") as status:
            res = compile_model(model, list(calib), out_dir, opts,
                                progress=lambda s: (status.update(f"compiling: {s}"), err.print(f"[dim]· {s}[/]")))
    signature = _sign_compiled(res.bundle.path, sign_key) if sign_key else None
    if as_json:
        click.echo(json.dumps({"bundle": str(res.bundle.path), "warnings": res.warnings,
                               "report": res.report.model_dump(), "signature": signature}))
        return
    print_report(res.report, out, full=full)
    for w in res.warnings:
        err.print(f"[bold yellow]warning:[/] {w}")
    m = res.bundle.manifest
    calib_text = (f"{m.quantization.calibration_windows} calibration windows "
                  f"(sha256 {m.quantization.calibration_sha256[:12]}…)" if m.quantization.calibration_sha256
                  else "taken as is (no calibration)")
    out.print(f"bundle [bold]{res.bundle.path}[/]: board {m.board}, {m.quantization.mode}, {calib_text}, "
              f"{m.golden.count if m.golden else '[bold yellow]NO[/]'} golden vectors; {files_said(m)}")
    if m.plans:
        out.print(f"plans carried: {', '.join(m.plans)} (top level {m.quantization.mode}, this host's lowest {select}; "
                  "`edgehft deploy` times them on the box and records the one it runs)", highlight=False)
    if signature:
        out.print(f"signed: {signature['signature']} ({signature['key']}, namespace {signature['namespace']})",
                  highlight=False, soft_wrap=True)


ARTIFACT_ROLES = {"edgetpu_model": "compiled for the Edge TPU: what runs",
                  "native": "the native kernels' chain over it: what runs",
                  "int8_ir": "the full-int8 graph, kept for reference: not run by this bundle"}
"""What each of a manifest's ``artifacts`` roles is, as the compile's last line says it."""


def files_said(m) -> str:
    """The model files of manifest ``m`` as compile's last line says them: the graph (``model_file``, of the
    bundle's quantization mode) and each artifact with its role (:data:`ARTIFACT_ROLES`), so a float plan's
    bundle does not read as if it ran ``model_int8.tflite``."""
    said = [f"model {m.model_file} ({m.quantization.mode})"]
    said += [f"{rel} ({ARTIFACT_ROLES.get(role, role)})" for role, rel in m.artifacts.items()]
    return ", ".join(said)


def _golden_count(count: int, legacy: int | None) -> int:
    """The golden vectors to store: ``--golden-count N``, or the deprecated ``--golden N`` (said on stderr: in
    ``run`` --golden is the flag that checks them). Both, differing: a usage error (exit 2)."""
    if legacy is None:
        return count
    given = click.get_current_context().get_parameter_source("golden_count") is not ParameterSource.DEFAULT
    if given and count != legacy:
        raise click.UsageError(f"--golden {legacy} and --golden-count {count} disagree: give --golden-count alone")
    err.print(f"[bold yellow]warning:[/] compile --golden N is deprecated: use --golden-count {legacy} "
              "(`run --golden` is the flag that checks the golden vectors)", highlight=False)
    return legacy


def _sign_compiled(bundle_path, key) -> dict:
    """``compile --sign``: sign the bundle just written; a failure says the bundle is there, unsigned."""
    from edgehft.signing import sign_bundle
    try:
        return sign_bundle(bundle_path, key)
    except EdgeHFTError as exc:
        exc.args = (f"{exc.args[0]} (the bundle {bundle_path} was written, unsigned)",)
        exc.hint = f"{exc.hint}; then: edgehft sign {bundle_path} --key KEY" if exc.hint else None
        raise


def _check_not_foreign(out_dir: Path) -> None:
    """Refuse (exit 3), before the compile rather than after it, an ``out_dir`` that holds files but no bundle:
    edgehft never replaces such a directory, ``--force`` or not."""
    from edgehft.bundle import MANIFEST
    from edgehft.errors import InputError
    from edgehft.report import printable
    if out_dir.is_dir() and not (out_dir / MANIFEST).exists() and any(out_dir.iterdir()):
        raise InputError(f"{printable(str(out_dir))} exists and is not an edgehft bundle (no {MANIFEST}): not "
                         "replaced", hint="choose an empty or new --out directory")


def _check_replace(model: Path, board: str, out_dir: Path) -> None:
    """Refuse (exit 3) to replace the bundle in ``out_dir`` when it was compiled for another board or from another
    model (its manifest's ``board`` and ``source.sha256``), or when its manifest cannot be read; nothing there is
    touched. A bundle of the same board and model is replaced as before (a new compile of it)."""
    from edgehft.bundle import MANIFEST
    from edgehft.compiler.pipeline import model_sha256
    from edgehft.errors import InputError
    path = out_dir / MANIFEST
    if not path.is_file():
        return
    hint = f"choose another --out, or pass --force to replace {out_dir}"
    try:
        m = json.loads(path.read_text())
        was_board, src = str(m["board"]), m["source"]
        was_model, was_sha = str(src["file"]), str(src["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{out_dir} holds a bundle whose manifest cannot be read ({type(exc).__name__}): not "
                         "replaced", hint=hint) from None
    if was_board != board:
        raise InputError(f"{out_dir} holds a bundle for board {was_board}, not {board}: not replaced", hint=hint)
    if was_sha != model_sha256(model):
        raise InputError(f"{out_dir} holds a bundle of another model ({was_model}, sha256 {was_sha[:12]}…) than "
                         f"{model.name}: not replaced", hint=hint)
