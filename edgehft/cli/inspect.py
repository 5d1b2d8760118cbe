"""``edgehft report`` and ``edgehft boards``: look at bundles, models and the board catalog."""
from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from edgehft import backends
from edgehft.cli.common import board_flags_given, board_options_of, board_opts, handles_errors, json_opt, main, out
from edgehft.errors import InputError
from edgehft.report import fill_table, printable


def _bundle_report(bundle, report_type):
    """The bundle's ``report.json`` as ``report_type``.

    Raises:
        BundleError: the file is not a report of this edgehft's schema (exit 6).
    """
    from pydantic import ValidationError
    from edgehft.bundle import REPORT
    from edgehft.errors import BundleError
    path = Path(bundle.path)
    if not (path / REPORT).is_file():
        top = path.parent.parent
        if path.parent.name == "plans" and (top / REPORT).is_file():
            raise BundleError(f"{path} is plan {path.name!r} of the bundle {top}: a plan has no report of its own",
                              hint=f"edgehft report {top} (its plan section lists every plan measured); "
                                   f"edgehft report {top} --streaming --plan {path.name}")
        raise BundleError(f"{path} has no {REPORT}",
                          hint="compile the bundle again (the report is written by `edgehft compile`)")
    try:
        return report_type(**bundle.report())
    except (ValidationError, TypeError) as exc:
        first = str(exc).splitlines()
        raise BundleError(f"{bundle.path}/report.json is not an edgehft report: {' '.join(first[:3])}",
                          hint="compile the bundle again (the report is written by `edgehft compile`)") from None


@main.command("report")
@click.argument("path", type=click.Path(exists=True))
@click.option("--board", default=None,
              help="For a .tflite: the board to predict the partition for (default coral-usb).")
@click.option("--cpu-model", type=click.Path(exists=True, dir_okay=False), default=None,
              help="For a compiled *_edgetpu.tflite: the CPU model it was compiled from "
                   "(default: the sibling file without _edgetpu, when it exists).")
@board_opts("report")
@click.option("--tensors", "list_tensors", is_flag=True,
              help="For a .tflite: list its activation tensors (names for -i) with shape, dtype and producer.")
@click.option("--engine-record", "engine_records", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="For a Jetson bundle: a placement record (<key>.json) that build-engine wrote on the board, "
                   "copied here (default: the records in this machine's engine cache for the bundle's model).")
@click.option("--streaming", is_flag=True,
              help="The streaming analysis instead: per op, which rows along time a new tick leaves cached, which "
                   "are prepared before it and which are on its critical path, with MACs per tick.")
@click.option("--plan", "plan", default=None,
              help="With --streaming, for a bundle of several plans: analyse this plan (default: its top level).")
@click.option("--reasons", is_flag=True, help="With --streaming: a column with each op's reason.")
@click.option("--ops", "full", is_flag=True,
              help="The op-by-op table however many ops; a report of more than 60 ops shows one row per Keras "
                   "layer (its ops, where they run, dtype) without it.")
@json_opt
@handles_errors
def report_cmd(path, board, cpu_model, list_tensors, engine_records, streaming, plan, reasons, full, as_json,
               **board_values):
    """Show the op placement report of PATH: a bundle directory, a quantized .tflite (predicted
    partition for --board), a compiled *_edgetpu.tflite (what is inside the edgetpu-custom-op), or an
    .onnx model (predicted TensorRT parser support and DLA/GPU placement for a Jetson --board). For a Jetson
    bundle on which build-engine ran, each ONNX node shows the engine inspector's confirmed device next to
    the prediction, with the disagreements. With --streaming: the streaming analysis of the bundle's (or the
    .tflite's) graph.

    \b
    Examples:
      edgehft report build/deeplob.cpu
      edgehft report build/gru.cpu --ops
      edgehft report model.tflite --board coral-usb -m 13
      edgehft report build/lstm_a.cpu --streaming --plan native"""
    from edgehft.report import print_report
    p = Path(path)
    if streaming or plan or reasons:
        _streaming_report(p, streaming, plan, reasons, as_json)
        return
    model_flags = [f for f, v in (("--board", board), ("--cpu-model", cpu_model)) if v]
    model_flags += board_flags_given(board_values) + (["--tensors"] if list_tensors else [])
    if p.is_dir() and model_flags:
        raise click.UsageError(f"{', '.join(model_flags)} apply to a .tflite file; a bundle's report was fixed "
                               "when it was compiled (compile it again with other flags)")
    if engine_records and not p.is_dir():
        raise click.UsageError("--engine-record applies to a Jetson bundle directory")
    if p.is_dir():
        _show_bundle(p, engine_records, as_json, full)
        return
    suffix = ".onnx" if p.suffix == ".onnx" else ".tflite"       # any other file is read as a TFLite model
    if suffix == ".tflite":
        from edgehft.ir import TFLiteModel
        model = TFLiteModel.from_file(p)
        if list_tensors:
            _print_tensors(model, as_json)
            return
        if _shown_as_compiled(model, p, cpu_model, as_json):
            return
    spec, part = _predicting_board(board, suffix)
    given = board_options_of(board_values)
    backends.refuse_foreign_options(spec, given)          # as compile does: another board kind's flags are exit 3
    rep = part.predict(p, spec, **given)
    if as_json:
        click.echo(json.dumps({"model": str(p), "report": rep.model_dump()}))
        return
    print_report(rep, out, part.table or None, full)


def _show_bundle(path: Path, engine_records, as_json: bool, full: bool = False) -> None:
    """``report BUNDLE``: its report.json, with what its backend's partitioner confirmed since (Jetson: the
    engine inspector's placement, once build-engine ran)."""
    from edgehft.bundle import load_bundle
    from edgehft.report import Report, print_report
    b = load_bundle(path)
    rep = _bundle_report(b, Report)
    part = backends.partitioner(b.manifest.backend, required=False)   # a bundle of an uninstalled backend: as is
    if engine_records and not part.takes_engine_records:
        raise click.UsageError(f"--engine-record applies to a Jetson bundle; {b.path} is for {b.manifest.board}")
    rep = part.confirm(b, rep, engine_records)
    if b.manifest.golden and "reference_kernels_path" in rep.golden:     # a report written before it kept them
        rep.golden.setdefault("compare", b.manifest.golden.compare)
        rep.golden.setdefault("atol", b.manifest.golden.atol)
    if as_json:
        click.echo(json.dumps({"manifest": b.manifest.model_dump(), "report": rep.model_dump()}))
        return
    print_report(rep, out, part.table or None, full)


def _streaming_report(path: Path, streaming: bool, plan: str | None, reasons: bool, as_json: bool) -> None:
    """``report PATH --streaming``: :func:`edgehft.streaming.analysis.analyze_path` as a table and lines, or JSON;
    for a bundle directory, then per board and plan whether it streams and what streaming would move
    (:mod:`edgehft.streaming.boards`; JSON ``boards``). A bundle without a TFLite graph (Jetson: ONNX) has no
    analysis (JSON ``streaming`` null), only its board's verdict.

    Raises:
        click.UsageError: --plan or --reasons without --streaming (exit 2).
    """
    if not streaming:
        raise click.UsageError("--plan and --reasons apply with --streaming")
    from edgehft.streaming.analysis import analyze_path, summary, table
    from edgehft.streaming import boards
    view = boards.bundle_streaming(path, plan) if path.is_dir() else None
    a = view.analysis if view is not None else analyze_path(path, plan=plan)
    if as_json:
        click.echo(json.dumps({"model": str(path), "plan": plan, "streaming": a.to_dict() if a is not None else None,
                               "boards": [r.to_dict() for r in view.boards] if view else []}))
        return
    if a is not None:
        out.print(table(a, reasons))
        for line in summary(a):
            out.print(line, highlight=False)
    else:
        out.print(f"no streaming analysis: plan {printable(view.plan)}'s model is {printable(view.model_file)} "
                  "(the analysis reads TFLite graphs)", highlight=False)
    if view is not None:
        out.print(boards.table(view))
        for line in boards.lines(view):
            out.print(line, highlight=False)


def _shown_as_compiled(model, path: Path, cpu_model: str | None, as_json: bool) -> bool:
    """Whether some backend's ``compiled_report`` (:mod:`edgehft.backends`) recognised ``model`` as one compiled
    for its accelerator, and showed what is inside (True), or none did (False: predict for it)."""
    return any(show(model, path, cpu_model, as_json) for _, show in backends.stage_of_each("compiled_report"))


def _predicting_board(board: str | None, suffix: str):
    """The board (``--board``, else the default some backend declares for ``suffix``) and its backend's
    partitioner, which must predict for ``suffix`` model files.

    Raises:
        InputError: the board's backend predicts nothing for such files (the hint names the boards that do).
        BoardUnavailableError: the board names a backend that is not installed.
    """
    from edgehft.boards import list_boards, load_board
    name = board or backends.default_board(suffix)
    what = "an ONNX placement" if suffix == ".onnx" else f"a {suffix} partition"
    if name is None:
        raise InputError(f"{what} prediction needs --board: no installed backend predicts for {suffix} models")
    spec = load_board(name)
    part = backends.partitioner(spec.backend, required=False)
    if suffix in part.suffixes:
        return spec, part
    kinds = backends.predicting(suffix)
    labels = [backends.partitioner(k).label or k for k in kinds]
    able = [b.name for b in list_boards() if b.backend in kinds]
    first = backends.default_board(suffix) or (able[0] if able else None)
    others = [n for n in able if n != first]
    raise InputError(f"{what} prediction is available for {' and '.join(f'{k} boards' for k in labels) or 'no boards'}"
                     f", not {spec.name}",
                     hint=f"pass --board {first}" + (f" (or {', '.join(others)})" if others else "") if first
                     else "install a backend that predicts for such models")


def _print_tensors(model, as_json: bool) -> None:
    g = model.main
    rows = []
    for op in g.ops:
        for o in op.outputs:
            t = g.tensors[o]
            rows.append({"tensor": t.name, "shape": list(t.shape), "dtype": t.dtype, "producer": op.index,
                         "op": op.name})
    if as_json:
        click.echo(json.dumps(rows))
        return
    t = Table(title=f"{Path(model.source).name}: activation tensors (use a name with -i)", title_justify="left")
    for c in ("producer", "shape", "dtype", "tensor"):
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(f"#{r['producer']} {r['op']}", str(tuple(r["shape"])), r["dtype"], r["tensor"])
    out.print(t)


@main.command("boards")
@click.option("--probe", is_flag=True, help="Also list the accelerators (e.g. Edge TPUs) attached to this machine.")
@json_opt
@handles_errors
def boards_cmd(probe, as_json):
    """List the board catalog (and, with --probe, the accelerators attached here).

    \b
    Examples:
      edgehft boards
      edgehft boards --probe --json"""
    from edgehft.boards import list_boards
    boards = list_boards()
    found, lines = {}, []
    if probe:
        for _, attached in backends.stage_of_each("attached"):
            data, text = attached()
            found.update(data)
            lines += text
    if as_json:
        click.echo(json.dumps({"boards": [b.model_dump() for b in boards], "probe": found} if probe else
                              [b.model_dump() for b in boards]))
        return
    t = Table(title="boards (p99 µs: the latency budget at the 99th percentile)", title_justify="left")
    rows = [[b.name, b.backend, ", ".join(b.quantization), _budget(b.latency_budget_us.get("p99")), b.description]
            for b in boards]
    columns = [("name", {}), ("backend", {}), ("quantization", {"max_width": 14}), ("p99 µs", {"justify": "right"}),
               ("description", {})]
    fill_table(t, columns, rows, whole=("name", "backend"), what="board")
    out.print(t)
    for line in lines:
        out.print(printable(line), highlight=False)


def _budget(us) -> str:
    """A p99 budget in µs as the board file gives it, without a trailing ``.0``; empty when there is none."""
    if us is None:
        return ""
    return f"{us:g}" if isinstance(us, (int, float)) else str(us)
