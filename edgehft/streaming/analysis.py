"""The streaming analysis of a TFLite graph (issue 21 items 2 and 6): along the input's time axis, op by op,
which output rows are cached (the previous window's, one row up), prepared (recomputed, but before the
tick: they do not read the newest row), or on the critical path (they read it); for each recurrence
(UNIDIRECTIONAL_SEQUENCE_LSTM / _RNN, from the zero state every window) how many steps run before the
tick and how many after; MACs per tick on the critical path, in prepare and over the whole window; and
for a model that cannot stream, the op that stops it and why ("whole window each tick").

Box side: it reads the IR (:class:`~edgehft.ir.TFLiteModel`, the float / dynamic / int8 graph a cpu bundle
holds) with numpy, no TensorFlow. The per-op rules are :mod:`edgehft.streaming.ops`, the row bookkeeping
:mod:`edgehft.streaming.rows`.

Window t+1 is window t with its oldest row dropped and the tick's row appended; the input's rows
0..T-2 are cached and row T-1 is critical. A model is streamable when no op is "whole window each
tick": the only whole-window work is after the time axis is gone (a recurrence's last step, a reduction
over time, the head).

    python -m edgehft.streaming.analysis BUNDLE_OR_TFLITE [--json] [--time-axis N] [--plan NAME] [--reasons]

exits 0 once the model is analysed (streamable or not: the last line, and ``streamable`` in the JSON, say
which), 3 (bad input: no such file, not a TFLite model, a time axis the input lacks) or 6 (a bundle that does
not match its manifest), the codes of :mod:`edgehft.errors`.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from edgehft.errors import InputError
from edgehft.streaming.ops import Outcome, analyze_op
from edgehft.streaming.rows import (CACHED, CONSTANT, CRITICAL, PREPARED, Env, Rows, Whole, window_input)

VERDICT_CACHED, VERDICT_PREPARED = "cached", "prepared"
VERDICT_CRITICAL, VERDICT_WHOLE = "on the critical path", "whole window each tick"
_SHORT = {VERDICT_CACHED: "cached", VERDICT_PREPARED: "prepared", VERDICT_CRITICAL: "critical",
          VERDICT_WHOLE: "whole window"}


@dataclass
class OpRow:
    """One op of the graph: ``index`` (graph order), ``op`` (TFLite name), ``layer`` (the Keras layer when the
    converter's tensor name says), ``time_axis`` of its first output (None where it has none), ``rows`` (its
    length along time), the row indices ``rows_cached`` (taken from the previous window, one row up),
    ``rows_constant`` (the same in every window: padding, constants), ``rows_prepared`` (recomputed before
    the tick), ``rows_critical`` (after it); for a recurrence ``steps_prepared`` / ``steps_critical`` (its
    rows are its steps); MACs per tick on the critical path, in prepare, and over the whole window (multiply-
    accumulates, :func:`edgehft.streaming.ops.op_macs`); ``verdict`` (cached / prepared / on the critical
    path / whole window each tick) and ``reason``."""

    index: int
    op: str
    layer: str | None
    time_axis: int | None
    rows: int | None
    rows_cached: tuple = ()
    rows_constant: tuple = ()
    rows_prepared: tuple = ()
    rows_critical: tuple = ()
    steps_prepared: int | None = None
    steps_critical: int | None = None
    macs_critical: int = 0
    macs_prepare: int = 0
    macs_full: int = 0
    verdict: str = VERDICT_CACHED
    reason: str = ""

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        for k in ("rows_cached", "rows_constant", "rows_prepared", "rows_critical"):
            d[k] = list(d[k])
        return d


@dataclass
class TensorRows:
    """One computed tensor: ``time_axis`` and ``sub`` (indices of that axis per time row; 1 unless a reshape
    folded time into features) with its rows by status, or ``time_axis`` None and ``status`` for the whole
    tensor (constant / prepared / critical). ``exact``: the statuses say what the tensor depends on; False
    for the outputs of an op that is "whole window each tick" and everything computed from them, which are
    critical because such a plan recomputes them at each tick (they may not read the newest row). What the
    streaming runtime keeps per tensor."""

    index: int
    name: str
    time_axis: int | None
    sub: int | None
    rows: int | None
    status: str | None = None
    cached: tuple = ()
    constant: tuple = ()
    prepared: tuple = ()
    critical: tuple = ()
    exact: bool = True

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        for k in ("cached", "constant", "prepared", "critical"):
            d[k] = list(d[k])
        return d


@dataclass
class StreamingAnalysis:
    """The analysis of one graph: ``source`` (file), ``input`` (the windowed input's name), ``time_axis`` and
    ``window`` (T rows) of that input, per op an :class:`OpRow`, per computed tensor a :class:`TensorRows`,
    total MACs per tick on the critical path / in prepare / over the whole window, ``streamable`` and the
    first ``blocking`` op (``{"index", "op", "reason"}``; index None when the input itself cannot slide)."""

    source: str
    input: str
    time_axis: int | None
    window: int | None
    ops: list = field(default_factory=list)
    tensors: list = field(default_factory=list)
    macs_critical: int = 0
    macs_prepare: int = 0
    macs_full: int = 0
    streamable: bool = False
    blocking: dict | None = None

    def op(self, index: int) -> OpRow:
        """The :class:`OpRow` of op ``index``."""
        return self.ops[index]

    def to_dict(self) -> dict:
        """JSON-ready: plain dicts, lists, ints and strings."""
        d = {k: v for k, v in self.__dict__.items() if k not in ("ops", "tensors")}
        d["ops"] = [o.to_dict() for o in self.ops]
        d["tensors"] = [t.to_dict() for t in self.tensors]
        return d


def _input_axis(model, input_index: int, time_axis: int | None) -> tuple:
    """``(tensor index, axis)`` of the windowed input; axis None when its shape has no axis to slide along.

    Raises:
        InputError: ``input_index`` or ``time_axis`` outside the model's inputs / the input's axes."""
    g = model.main
    if not 0 <= input_index < len(g.inputs):
        raise InputError(f"{model.source} has {len(g.inputs)} input(s); there is no input {input_index}",
                         hint="name the windowed input by its position, from 0")
    t = g.inputs[input_index]
    shape = g.tensors[t].shape
    if time_axis is None:
        return t, 1 if len(shape) >= 2 else None
    if not 0 < time_axis < len(shape):
        raise InputError(f"time axis {time_axis}: input {g.tensors[t].name!r} has shape {list(shape)} (axis 0 is "
                         "the batch)", hint=f"give an axis from 1 to {len(shape) - 1}")
    return t, time_axis


def analyze(model, time_axis: int | None = None, input_index: int = 0) -> StreamingAnalysis:
    """Analyse ``model`` (a :class:`~edgehft.ir.TFLiteModel`) for streaming along ``time_axis`` of its input
    ``input_index`` (default axis 1: DeepLOB (1, 100, 40, 1) and LSTM_A (1, 50, 100) slide along it). Other
    graph inputs count as new each tick.

    Raises:
        InputError: no such input or axis."""
    from edgehft.ir.tflite_model import source_layer
    g = model.main
    t_in, axis = _input_axis(model, input_index, time_axis)
    env = Env(model)
    for t in g.inputs:
        env.state[t] = Whole(CRITICAL)
    window = g.tensors[t_in].shape[axis] if axis is not None else None
    blocking = None
    if window is None or window < 2:
        blocking = {"index": None, "op": "input",
                    "reason": f"input {g.tensors[t_in].name!r} {list(g.tensors[t_in].shape)} has "
                              + ("no axis after the batch axis to slide along" if window is None else
                                 "a window of one row: nothing to reuse")}
    else:
        env.state[t_in] = window_input(axis, window)
    result = StreamingAnalysis(str(model.source), g.tensors[t_in].name, axis, window)
    inexact = set() if blocking is None else set(g.inputs)
    for op in g.ops:
        outcome = analyze_op(env, op)
        env.state.update(outcome.outputs)
        row = _op_row(env, op, outcome, source_layer(g.tensors[op.outputs[0]].name) if op.outputs else None)
        result.ops.append(row)
        if row.verdict == VERDICT_WHOLE or inexact.intersection(op.inputs):
            inexact.update(op.outputs)
        if row.verdict == VERDICT_WHOLE and blocking is None:
            blocking = {"index": op.index, "op": op.name, "reason": row.reason}
    result.tensors = [_tensor_rows(g, t, s, t not in inexact) for t, s in sorted(env.state.items())]
    result.macs_critical = sum(o.macs_critical for o in result.ops)
    result.macs_prepare = sum(o.macs_prepare for o in result.ops)
    result.macs_full = sum(o.macs_full for o in result.ops)
    result.streamable, result.blocking = blocking is None, blocking
    return result


def _tensor_rows(g, t: int, s, exact: bool) -> TensorRows:
    name = g.tensors[t].name
    if isinstance(s, Whole):
        return TensorRows(t, name, None, None, None, s.status, exact=exact)
    return TensorRows(t, name, s.axis, s.sub, s.length, None, s.which(CACHED), s.which(CONSTANT),
                      s.which(PREPARED), s.which(CRITICAL), exact)


def _op_row(env, op, outcome: Outcome, layer: str | None) -> OpRow:
    """The :class:`OpRow` of ``op`` from its :class:`Outcome`: rows of its first output, MACs, verdict."""
    first = outcome.outputs.get(op.outputs[0]) if op.outputs else None
    row = OpRow(op.index, op.name, layer, None, None, macs_full=outcome.macs_full)
    if isinstance(first, Rows):
        row.time_axis, row.rows = first.axis, first.length
        row.rows_cached, row.rows_constant = first.which(CACHED), first.which(CONSTANT)
        row.rows_prepared, row.rows_critical = first.which(PREPARED), first.which(CRITICAL)
    if outcome.recurrence is not None:
        row.steps_prepared, row.steps_critical = len(row.rows_prepared), len(row.rows_critical)
    row.macs_critical, row.macs_prepare = _split_macs(outcome, first)
    statuses = {s for o in outcome.outputs.values() for s in (o.status if isinstance(o, Rows) else [o.status])}
    if len(op.outputs) > 0 and isinstance(first, Rows) and first.length > 1 and set(first.status) == {CRITICAL} \
            and not outcome.refused:
        outcome.refused = f"every one of its {first.length} rows reads the newest row: no row can be reused"
    if outcome.refused:
        row.verdict, row.reason = VERDICT_WHOLE, outcome.refused
        row.macs_critical, row.macs_prepare = outcome.macs_full, 0
    else:
        row.verdict = (VERDICT_CRITICAL if CRITICAL in statuses else VERDICT_PREPARED if PREPARED in statuses
                       else VERDICT_CACHED)
        row.reason = _reason(row, outcome, first)
    return row


def _split_macs(outcome: Outcome, first) -> tuple:
    """``(critical, prepare)`` MACs per tick: per row for time-local ops, per input row (projection) and per
    step for recurrences, the whole op for one without a time axis (none when constant)."""
    rec = outcome.recurrence
    if rec is not None:
        def count(statuses, what):
            return sum(1 for s in statuses if s == what)
        return (count(rec["inputs"], CRITICAL) * rec["proj_row"] + count(rec["steps"], CRITICAL) * rec["step"],
                count(rec["inputs"], PREPARED) * rec["proj_row"] + count(rec["steps"], PREPARED) * rec["step"])
    if isinstance(first, Rows):
        per = outcome.macs_row or 0
        return per * len(first.which(CRITICAL)), per * len(first.which(PREPARED))
    if isinstance(first, Whole):
        return ((outcome.macs_full, 0) if first.status == CRITICAL else
                (0, outcome.macs_full) if first.status == PREPARED else (0, 0))
    return 0, 0


def _span(rows: tuple) -> str:
    """``(0, 1, 2, 7)`` -> ``"0-2, 7"``."""
    from edgehft.report import index_ranges
    return index_ranges(rows, mark="")


def _rows(rows: tuple, plural: str = "read", singular: str = "reads") -> str:
    """``"rows 3-7 read"`` / ``"row 7 reads"``."""
    return f"rows {_span(rows)} {plural}" if len(rows) > 1 else f"row {rows[0]} {singular}"


def _steps(rows: tuple) -> str:
    return "none" if not rows else f"steps {_span(rows)}" if len(rows) > 1 else f"step {rows[0]}"


def _reason(row: OpRow, outcome: Outcome, first) -> str:
    """The human reason of a verdict that is not a refusal."""
    if outcome.recurrence is not None:
        rec = outcome.recurrence
        n = {s: sum(1 for x in rec["inputs"] if x == s) for s in (CACHED, CONSTANT, PREPARED, CRITICAL)}
        return (f"{row.steps_prepared} steps from the zero state before the tick, {row.steps_critical} after it "
                f"({_steps(row.rows_critical)}); input projection: {n[CACHED] + n[CONSTANT]} rows cached, "
                f"{n[PREPARED]} prepared, {n[CRITICAL]} critical")
    if isinstance(first, Whole):
        what = {CRITICAL: "no time axis: runs whole each tick", PREPARED: "no time axis, and it does not read "
                "the newest row: runs whole before the tick", CONSTANT: "constant: computed once"}[first.status]
        return f"{outcome.note}; {what}" if outcome.note else what
    if first is None:
        return "no output"
    parts = []
    if row.rows_critical:
        parts.append(f"{_rows(row.rows_critical)} the newest row")
    if row.rows_prepared:
        parts.append(f"{_rows(row.rows_prepared, 'change', 'changes')} without reading it (padding, or rows that "
                     "changed)")
    kept = len(row.rows_cached) + len(row.rows_constant)
    if kept:
        parts.append(f"{kept} of {row.rows} rows kept from the previous window")
    return "; ".join(parts)


def si_count(n: int) -> str:
    """``2166016`` -> ``"2.17M"``."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(n)


def table(analysis: StreamingAnalysis, reasons: bool = False):
    """A rich Table of ``analysis``, per op: index, op, rows along time, rows cached (incl. constant) /
    prepared / critical, MACs on the critical path and in prepare, the verdict (short: critical = on the
    critical path, whole window = whole window each tick); readable at 80 columns. ``reasons`` adds the
    reason column (wider). Strings from the model are made printable (:func:`edgehft.report.printable`)."""
    from rich.table import Table
    from rich import box
    from edgehft.report import printable
    share = f"{analysis.macs_critical / analysis.macs_full:.1%}" if analysis.macs_full else "-"
    t = Table(title=f"streaming along axis {analysis.time_axis} of {printable(analysis.input)} ({analysis.window} "
                    f"rows): critical path {si_count(analysis.macs_critical)} of {si_count(analysis.macs_full)} MACs ({share})",
              title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("#", "op", "T", "cached", "prep", "crit", "MACs\ncrit", "MACs\nprep", "verdict") + (
            ("reason",) if reasons else ()):
        left = col in ("op", "verdict", "reason")
        t.add_column(col, justify="left" if left else "right", no_wrap=col != "reason",
                     overflow="fold" if col == "reason" else "ellipsis")
    for o in analysis.ops:
        timed = o.rows is not None
        t.add_row(str(o.index), printable(o.op.replace("UNIDIRECTIONAL_SEQUENCE_", "SEQ_")),
                  str(o.rows) if timed else "-",
                  str(len(o.rows_cached) + len(o.rows_constant)) if timed else "",
                  str(len(o.rows_prepared)) if timed else "", str(len(o.rows_critical)) if timed else "",
                  si_count(o.macs_critical), si_count(o.macs_prepare), _SHORT[o.verdict],
                  *((printable(o.reason),) if reasons else ()))
    return t


def summary(analysis: StreamingAnalysis) -> list:
    """Lines under the table: the MAC totals, recurrences, and whether the model streams (the blocking op)."""
    from edgehft.report import printable
    a = analysis
    lines = [f"MACs per tick: critical path {si_count(a.macs_critical)}, prepare {si_count(a.macs_prepare)}, whole window "
             f"{si_count(a.macs_full)} ({a.macs_critical:,} / {a.macs_prepare:,} / {a.macs_full:,})"]
    for o in a.ops:
        if o.steps_prepared is not None or o.verdict == VERDICT_WHOLE:
            lines.append(f"#{o.index} {printable(o.op)}: {printable(o.reason)}")
    if a.streamable:
        lines.append("streamable: yes")
    else:
        b = a.blocking
        where = "the input" if b["index"] is None else f"op #{b['index']} {printable(b['op'])}"
        lines.append(f"streamable: no, {where}: {printable(b['reason'])}")
    return lines


def analyze_path(path, time_axis: int | None = None, plan: str | None = None) -> StreamingAnalysis:
    """Analyse a ``.tflite`` file or a bundle directory (its model file; ``plan`` a plan sub-bundle of a
    ``--quant auto`` bundle).

    Raises:
        InputError: no such file, not a TFLite model, no such axis; BundleError: a bundle that does not match
        its manifest."""
    from edgehft.ir import TFLiteModel
    p = Path(path)
    if p.is_dir():
        from edgehft.bundle import load_bundle
        bundle = load_bundle(p)
        if plan is not None:
            bundle = bundle.plan(plan)
        return analyze(TFLiteModel.from_file(bundle.model_path), time_axis)
    if plan is not None:
        raise InputError(f"--plan applies to a bundle directory, not {p.name}", hint="drop --plan")
    if not p.exists():
        raise InputError(f"no such model or bundle: {p}")
    return analyze(TFLiteModel.from_file(p), time_axis)


def main(argv: list | None = None) -> int:
    """``python -m edgehft.streaming.analysis``; returns the exit code: 0 analysed (streamable or not), else
    the error's (:mod:`edgehft.errors`: 3 bad input, 6 bundle)."""
    import argparse
    import json
    from rich.console import Console
    from edgehft.errors import EdgeHFTError
    ap = argparse.ArgumentParser(prog="python -m edgehft.streaming.analysis",
                                 description="Which rows of each op a tick changes (streaming analysis).")
    ap.add_argument("model", help="a .tflite file or a bundle directory")
    ap.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    ap.add_argument("--time-axis", type=int, default=None, help="the input's time axis (default 1)")
    ap.add_argument("--plan", default=None, help="a plan sub-bundle of a --quant auto bundle")
    ap.add_argument("--reasons", action="store_true", help="a reason column in the table")
    args = ap.parse_args(argv)
    try:
        a = analyze_path(args.model, args.time_axis, args.plan)
    except EdgeHFTError as exc:
        if args.json:
            print(json.dumps({"error": exc.args[0], "type": type(exc).__name__, "hint": exc.hint,
                              "exit_code": exc.exit_code}))
        else:
            from edgehft.report import printable
            err = Console(stderr=True)
            err.print(f"[bold red]error:[/] {printable(exc.args[0])}", highlight=False, soft_wrap=True)
            if exc.hint:
                err.print(f"  [yellow]hint:[/] {printable(exc.hint)}", highlight=False, soft_wrap=True)
        return exc.exit_code
    if args.json:
        print(json.dumps(a.to_dict(), indent=1))
    else:
        console = Console()
        console.print(table(a, args.reasons))
        for line in summary(a):
            console.print(line, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
