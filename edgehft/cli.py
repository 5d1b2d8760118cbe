"""The ``edgehft`` command line: compile, run, bench, report, boards. ``--json`` on each for machines;
exit codes as in :mod:`edgehft.errors`."""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from edgehft import __version__
from edgehft.checks import bundle_windows, check_golden, golden_mismatch
from edgehft.errors import EdgeHFTError

out = Console()
err = Console(stderr=True)


def _fail(exc: EdgeHFTError, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"error": exc.args[0] if exc.args else str(exc), "type": type(exc).__name__,
                               "hint": exc.hint, "exit_code": exc.exit_code}))
    else:
        err.print(f"[bold red]error:[/] {escape(str(exc.args[0] if exc.args else exc))}", highlight=False)
        if exc.hint:
            err.print(f"  [yellow]hint:[/] {escape(exc.hint)}", highlight=False)
    sys.exit(exc.exit_code)


def handles_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except EdgeHFTError as exc:
            _fail(exc, kwargs.get("as_json", False))
    return wrapper


# Options defined once and shared.
json_opt = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")
board_opt = click.option("--board", default=None, help="Board name (see `edgehft boards`); default: the bundle's.")
threads_opt = click.option("--threads", default=1, show_default=True, type=click.IntRange(min=1),
                           help="Interpreter threads.")
affinity_opt = click.option("--affinity", default=None,
                            help="Pin to these CPUs, e.g. '1' or '0,1' (os.sched_setaffinity).")
emulate_opt = click.option("--emulate", is_flag=True,
                           help="Accelerator boards: run on an emulation here (Coral: the int8 graph on LiteRT; "
                                "PYNQ: pynq's drivers against the emulated board); outputs checkable, timing not "
                                "the device's; the output says EMULATED.")


def _check_device(ctx, param, value):
    if value is None:
        return None
    from edgehft.errors import InputError
    from edgehft.runtime.edgetpu_lib import parse_device
    try:
        parse_device(value)
    except InputError as exc:
        raise click.BadParameter(exc.args[0]) from None
    return value


device_opt = click.option("--device", default=None, callback=_check_device,
                          help="Accelerator device, e.g. usb, usb:1, pci:0 (Edge TPU).")
overlay_opt = click.option("--overlay", default=None, type=click.Path(dir_okay=False),
                           help="PYNQ boards: the overlay's .bit (its .hwh next to it); default the board "
                                "file's [runtime] overlay_dir.")


def edgetpu_flag_opts(fn):
    """``-m``, ``-a``, ``-i`` as edgetpu_compiler takes them (compile and report)."""
    for opt in reversed((
            click.option("--min-runtime", "-m", "min_runtime", type=click.IntRange(min=10), default=None,
                         help="Edge TPU boards: edgetpu_compiler -m (default: the board's runtime version)."),
            click.option("--allow-multiple-subgraphs", "-a", "multi", is_flag=True, default=None,
                         help="Edge TPU boards: edgetpu_compiler -a (more subgraphs, more host<->TPU copies)."),
            click.option("--intermediate-tensors", "-i", "cut", default=None,
                         help="Edge TPU boards: edgetpu_compiler -i t1,t2 (end the Edge TPU part at these "
                              "tensors)."))):
        fn = opt(fn)
    return fn


def edgetpu_flags(min_runtime, multi, cut):
    """The :class:`~edgehft.compiler.coral.EdgeTPUFlags` of those options (None: the board's value)."""
    from edgehft.compiler.coral import EdgeTPUFlags
    return EdgeTPUFlags(min_runtime, multi or None, tuple(c for c in cut.split(",") if c) if cut else None)


def _keep_require_signature(ctx, param, value):
    ctx.meta["edgehft.require_signature"] = value       # read by _open_runner (no parameter to thread through)


require_signature_opt = click.option(
    "--require-signature", "require_signature", type=click.Path(exists=True, dir_okay=False), default=None,
    expose_value=False, callback=_keep_require_signature, metavar="ALLOWED_SIGNERS",
    help="Open the bundle only if its manifest.json.sig verifies against this OpenSSH allowed_signers file "
         "(exit 6 if unsigned or signed by a key not listed there).")


def runner_opts(fn):
    """What ``run`` and ``bench`` need to open a bundle: board, threads, affinity, emulate, device, overlay,
    --require-signature."""
    for opt in reversed((board_opt, threads_opt, affinity_opt, emulate_opt, device_opt, overlay_opt,
                         require_signature_opt)):
        fn = opt(fn)
    return fn


def _open_runner(bundle, board, threads, affinity, emulate, device, overlay, as_json):
    """``runtime.open`` with the runner options; says EMULATED on stderr for people."""
    from edgehft import runtime
    opts = {k: v for k, v in (("overlay", overlay), ("emulate", emulate or None), ("device", device)) if v}
    ctx = click.get_current_context(silent=True)
    signers = ctx.meta.get("edgehft.require_signature") if ctx else None
    r = runtime.open(bundle, board, threads=threads, affinity=_affinity(affinity), require_signature=signers,
                     **opts)
    _say_emulated(r, as_json)
    return r


ticks_opt = click.option("--ticks", "ticks", multiple=True, type=click.Path(exists=True, dir_okay=False),
                         help="Windows (.npy/.npz) or raw feed files for the bundle's feature pipeline "
                              "(with --run-features); repeat for several files, read as one stream.")
run_features_opt = click.option("--run-features", is_flag=True,
                                help="Make windows from raw feed files with the bundle's feature pipeline: Python "
                                     "code shipped in the bundle (hash-checked). Only for bundles you trust.")


def _affinity(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise click.BadParameter(f"--affinity {text!r}: expected CPU ids like '1' or '0,1'")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgehft")
def main() -> None:
    """Put trained Keras models on low-latency trading boards."""


@main.command("compile")
@click.argument("model", type=click.Path(exists=True))
@click.option("--board", default="cpu", show_default=True, help="Target board (see `edgehft boards`).")
@click.option("--calib", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Calibration ticks: windows (.npy/.npz) or raw feed files; repeat for several. Required "
                   "for Keras models; for a quantized .tflite only used for golden vectors.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Bundle directory.")
@click.option("--quant", type=click.Choice(["int8", "dynamic", "fp16", "float", "auto", "native", "native-bf16"]),
              default=None,
              help="Quantization (default: the board file's: auto for cpu, int8 for Coral and PYNQ, fp16 for Jetson). "
                   "cpu board: auto measures the int8, dynamic and float plans (and the native plans that apply "
                   "here) and keeps the fastest that passes the drift gate; native / native-bf16 take that plan "
                   "alone (native-bf16: CONV_2D and LSTM input projections on edgehft's bf16 AMX kernel, for a "
                   "box with AMX-BF16).")
@click.option("--features", default=None, help="Feature pipeline 'file.py:function' (default: the model's sidecar).")
@click.option("--calib-windows", default=300, show_default=True, help="Windows used for calibration.")
@click.option("--drift-windows", default=500, show_default=True, help="Held-out windows for the drift check.")
@click.option("--golden", "golden_count", default=16, show_default=True, help="Golden vectors to store.")
@click.option("--drift-threshold", default=0.01, show_default=True, help="Gate on relative MAE (0.01 = 1 %).")
@click.option("--strict", is_flag=True, help="Drift over the threshold is an error (exit 5), not a warning.")
@click.option("--timeout", "timeout_s", default=1800.0, show_default=True, help="Converter time limit, s.")
@click.option("--lowering", type=click.Choice(["auto", "native"]), default="auto", show_default=True,
              help="native: no tf-keras rebuild and no pre-conversion checks; the graph goes to the "
                   "converter as is (diagnosis only).")
@edgetpu_flag_opts
@click.option("--edgetpu-model", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Edge TPU boards: MODEL's *_edgetpu.tflite, compiled on another machine; checked against "
                   "MODEL and put in the bundle (verdict confirmed).")
@click.option("--sign", "sign_key", type=click.Path(exists=True, dir_okay=False), default=None, metavar="KEY",
              help="Sign the bundle's manifest with this SSH key (ssh-keygen -Y sign, namespace edgehft-bundle) "
                   "into manifest.json.sig; boxes with an allowed_signers file take only signed bundles.")
@json_opt
@handles_errors
def compile_cmd(model, board, calib, out_dir, quant, features, calib_windows, drift_windows, golden_count,
                drift_threshold, strict, timeout_s, lowering, min_runtime, multi, cut, edgetpu_model, sign_key,
                as_json):
    """Quantize MODEL (.keras, .h5 or SavedModel dir; or take a quantized .tflite as is) for a board,
    partition it, and write a bundle."""
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    from edgehft.report import print_report
    if sign_key:
        from edgehft.signing import check_tool
        check_tool()                # a missing or too old ssh-keygen is said before the compile, not after
    edgetpu = edgetpu_flags(min_runtime, multi, cut)
    opts = CompileOptions(board=board, quant=quant, features=features, calib_windows=calib_windows,
                          drift_windows=drift_windows, golden_count=golden_count,
                          drift_threshold=drift_threshold, strict=strict, timeout_s=timeout_s, lowering=lowering,
                          edgetpu=edgetpu, edgetpu_model=edgetpu_model)
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
    print_report(res.report, out)
    for w in res.warnings:
        err.print(f"[bold yellow]warning:[/] {w}")
    m = res.bundle.manifest
    calib_text = (f"{m.quantization.calibration_windows} calibration windows "
                  f"(sha256 {m.quantization.calibration_sha256[:12]}…)" if m.quantization.calibration_sha256
                  else "taken as is (no calibration)")
    extra = f", compiled: {', '.join(m.artifacts.values())}" if m.artifacts else ""
    out.print(f"bundle [bold]{res.bundle.path}[/]: board {m.board}, {m.quantization.mode}, {calib_text}, "
              f"{m.golden.count if m.golden else '[bold yellow]NO[/]'} golden vectors{extra}")
    if signature:
        out.print(f"signed: {signature['signature']} ({signature['key']}, namespace {signature['namespace']})",
                  highlight=False, soft_wrap=True)


def _sign_compiled(bundle_path, key) -> dict:
    """``compile --sign``: sign the bundle just written; a failure says the bundle is there, unsigned."""
    from edgehft.signing import sign_bundle
    try:
        return sign_bundle(bundle_path, key)
    except EdgeHFTError as exc:
        exc.args = (f"{exc.args[0]} (the bundle {bundle_path} was written, unsigned)",)
        exc.hint = f"{exc.hint}; then: edgehft sign {bundle_path} --key KEY" if exc.hint else None
        raise


@main.command("run")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@ticks_opt
@run_features_opt
@click.option("--golden", is_flag=True, help="Run the bundle's golden vectors and compare (exit 8 on mismatch).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=0),
              help="Predictions to print (0: all).")
@runner_opts
@json_opt
@handles_errors
def run_cmd(bundle, ticks, run_features, golden, limit, board, threads, affinity, emulate, device, overlay,
            as_json):
    """Print predictions for TICKS, or check the golden vectors with --golden."""
    if not ticks and not golden:
        raise click.UsageError("give --ticks FILE or --golden")
    if golden:                       # a bundle without golden vectors says so before any runtime opens it
        from edgehft.bundle import load_bundle
        load_bundle(bundle, verify=False).require_golden()
    with _open_runner(bundle, board, threads, affinity, emulate, device, overlay, as_json) as r:
        if golden:
            result = check_golden(r)
            result.update(board=r.board, emulated=r.emulated)
            if as_json:
                click.echo(json.dumps(result))
            else:
                out.print(("[bold magenta]EMULATED[/] " if r.emulated else "") +
                          f"golden vectors: {result['matched']}/{result['count']} reproduced "
                          f"({result['compare']}) on {result['path']}"
                          + (" [green]OK[/]" if result["ok"] else " [red]MISMATCH[/]"))
            if not result["ok"]:
                raise golden_mismatch(result, r.describe().get("backend", ""))
            return
        w = bundle_windows(r.bundle, ticks, run_features=run_features)
        n = len(w) if limit == 0 else min(limit, len(w))
        names = [o.name for o in r.bundle.manifest.outputs]
        rows = []
        for i in range(n):
            y = r.predict(w.x[i])
            ys = y if isinstance(y, tuple) else (y,)
            rows.append({"window": i, "t_ns": int(w.t_ns[i]) if w.t_ns is not None else None,
                         **{nm: v[0].tolist() for nm, v in zip(names, ys)}})
        if as_json:
            click.echo(json.dumps({"board": r.board, "emulated": r.emulated, "windows": len(w),
                                   "predictions": rows}))
            return
        t = Table(title=f"{r.bundle.path.name} on {r.board}: {n} of {len(w)} windows", title_justify="left")
        t.add_column("window", justify="right")
        t.add_column("tick time (ns)", justify="right")
        for nm in names:
            t.add_column(nm)
        for row in rows:
            t.add_row(str(row["window"]), "" if row["t_ns"] is None else str(row["t_ns"]),
                      *(np.array2string(np.asarray(row[nm]), precision=4, separator=" ") for nm in names))
        out.print(t)


def _say_emulated(runner, as_json: bool) -> None:
    if runner.emulated and not as_json:
        note = runner.describe().get("note") or "an emulated board"
        err.print(f"[bold magenta]EMULATED[/] {runner.board}: {note}", highlight=False)


@main.command("bench")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@ticks_opt
@run_features_opt
@click.option("--replay", "mode", type=click.Choice(["max", "recorded", "burst"]), default="max",
              show_default=True, help="Back to back, at the recorded inter-arrival times, or in bursts.")
@click.option("--warmup", default=200, show_default=True, type=click.IntRange(min=0),
              help="Calls before timing starts.")
@click.option("--samples", default=0, type=click.IntRange(min=0),
              help="Timed calls (default: one per window, cycling if needed).")
@click.option("--speed", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="recorded: replay this many times faster.")
@click.option("--burst-size", default=32, show_default=True, type=click.IntRange(min=1),
              help="burst: calls per burst.")
@click.option("--burst-gap-us", default=1000.0, show_default=True, type=click.FloatRange(min=0),
              help="burst: idle time between bursts.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write a latency histogram PNG.")
@click.option("--profile", is_flag=True,
              help="Time per op (per step for partitioned boards) instead of replaying: each op alone and the "
                   "whole model, interleaved; --samples rounds (default 200); without --ticks, the golden inputs.")
@click.option("--top", default=0, type=click.IntRange(min=0), help="--profile: show only the N slowest ops.")
@runner_opts
@json_opt
@handles_errors
def bench_cmd(bundle, ticks, run_features, mode, warmup, samples, speed, burst_size, burst_gap_us, plot, profile, top,
              board, threads, affinity, emulate, device, overlay, as_json):
    """Replay real ticks through BUNDLE and print latency percentiles in µs (or, with --profile, time per op)."""
    from edgehft.bench.fingerprint import machine_fingerprint
    from edgehft.bench.replay import check_plot_target, histogram_png, replay
    if plot:
        check_plot_target(plot)
    if profile:
        return _profile(bundle, ticks, run_features, warmup, samples, top, board, threads, affinity, emulate,
                        device, overlay, as_json)
    if not ticks:
        raise click.UsageError("give --ticks FILE")
    with _open_runner(bundle, board, threads, affinity, emulate, device, overlay, as_json) as r:
        w = bundle_windows(r.bundle, ticks, run_features=run_features)
        x = np.ascontiguousarray(w.x, dtype=np.float32)
        res = replay(r.predict, x, w.t_ns, mode=mode, warmup=warmup, samples=samples or None, speed=speed,
                     burst_size=burst_size, burst_gap_us=burst_gap_us)
        report = {"bundle": str(r.bundle.path), "runner": r.describe(), **res.summary(),
                  "budget_us": dict(r.board_spec.latency_budget_us),
                  "speed": speed if mode == "recorded" else None, "fingerprint": machine_fingerprint()}
    if plot:
        histogram_png(res, plot, f"{Path(bundle).name} on {report['runner']['board']}, replay {mode}, "
                                 f"{len(res.latency_ns)} calls")
        report["plot"] = plot
    if as_json:
        click.echo(json.dumps(report))
        return
    print_bench(report)


def _profile(bundle, ticks, run_features, warmup, samples, top, board, threads, affinity, emulate, device, overlay,
             as_json):
    from edgehft.bench.fingerprint import machine_fingerprint
    from edgehft.bench.profile import print_profile, profile_runner
    with _open_runner(bundle, board, threads, affinity, emulate, device, overlay, as_json) as r:
        x = (np.ascontiguousarray(bundle_windows(r.bundle, ticks, run_features=run_features).x, dtype=np.float32)
             if ticks else None)
        res = profile_runner(r, x, rounds=samples or 200, warmup=min(warmup, 50))
        res.update(bundle=str(r.bundle.path), runner=r.describe(), fingerprint=machine_fingerprint())
    if as_json:
        click.echo(json.dumps(res))
        return
    print_profile(res, out, top)


def print_bench(report: dict) -> None:
    lat = report["latency_us"]
    t = Table(title=f"latency of predict, µs — {report['samples']} samples after {report['warmup']} warm-up, "
                    f"replay {report['mode']}" + (" [bold](EMULATED board)[/]" if report["runner"]["emulated"] else ""),
              title_justify="left")
    for c in ("p50", "p90", "p99", "p99.9", "max", "mean", "std"):
        t.add_column(c, justify="right")
    t.add_row(*(f"{lat[k]:.1f}" for k in ("p50", "p90", "p99", "p99.9", "max", "mean", "std")))
    out.print(t)
    budget = report.get("budget_us") or {}
    if budget and report["runner"]["emulated"]:
        out.print(f"board budget ({report['runner']['board']}): n/a — emulated, the device's timing is not measured")
    elif budget:
        verdicts = []
        for key, got in (("p99", lat["p99"]), ("p999", lat["p99.9"])):
            if key in budget:
                ok = got <= budget[key]
                verdicts.append(f"{key} {got:.0f} vs {budget[key]:.0f} µs " + ("[green]within[/]" if ok else "[red]OVER[/]"))
        out.print(f"board budget ({report['runner']['board']}): " + "; ".join(verdicts))
    if report.get("gaps_capped"):
        g = report["gaps_capped"]
        out.print(f"note: {g['count']} recorded gap(s) longer than {g['cap_s']:g} s (the longest {g['largest_s']:,.3g} s) "
                  f"were replayed as {g['cap_s']:g} s")
    if report.get("start_delay_us"):
        d = report["start_delay_us"]
        out.print(f"start delay behind the recorded tick time: p50 {d['p50']:.1f} µs, p99 {d['p99']:.1f} µs")
        if d["p50"] > lat["p50"]:
            err.print(f"[bold yellow]warning:[/] the replay fell behind the recorded tick rate (x{report['speed']:g}): "
                      "calls ran back to back; lower --speed to replay the capture's real gaps")
    fp = report["fingerprint"]
    r = report["runner"]
    out.print(f"machine: {fp['cpu_model']} ({fp['logical_cpus']} CPUs, governor {fp['governor']}, "
              f"affinity {fp['affinity']}{', virtualized' if fp['virtualized'] else ''}); "
              f"{r.get('interpreter', r['board'])}, threads {r['threads']}; libraries "
              + ", ".join(f"{k} {v}" for k, v in fp["libraries"].items()))
    if report.get("plot"):
        out.print(f"histogram: {report['plot']}")


import edgehft.cli_inspect  # noqa: E402,F401  (registers the report and boards commands)
import edgehft.cli_deploy  # noqa: E402,F401  (registers deploy, status and rollback)
import edgehft.cli_sign  # noqa: E402,F401  (registers sign)


if __name__ == "__main__":           # python -m edgehft.cli: run the module the commands registered on
    from edgehft.cli import main as _registered_main
    _registered_main()
