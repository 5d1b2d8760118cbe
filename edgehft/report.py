"""The report schema shared by every board (ground floor) and its rendering as tables.

Per op: index, TFLite op name, source layer when known, placement (accelerator / cpu / unsupported),
reason code, human reason, suggested fix, and the kernel that runs it. Per bundle: counts, segments,
boundary copies, whether the verdict is predicted or confirmed, and the drift figures.
"""
from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field
from rich.console import Console
from rich.markup import escape
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text


class OpPlacement(BaseModel):
    """Where one TFLite op (or ONNX node, on Jetson) runs and why: ``index`` in graph order, ``op`` name and
    ``version``, the source ``layer`` when known, ``placement`` (accelerator / cpu / unsupported), a
    ``reason_code`` for machines and a ``reason`` and ``fix`` for people, the ``kernel`` that runs it
    (XNNPACK, builtin, native, edgetpu, a device), its output ``dtype``, the vendor tool's own ``status``."""

    index: int
    op: str
    version: int = 1
    layer: str | None = None
    placement: Literal["accelerator", "cpu", "unsupported"]
    reason_code: str
    reason: str
    fix: str | None = None
    kernel: str | None = None
    dtype: str | None = None          # dtype of the op's first output
    status: str | None = None         # the vendor tool's own status string (e.g. edgetpu_compiler's log)
    subgraph: int | None = None       # which accelerator subgraph (custom op / engine / overlay call)
    # Jetson: ``kernel`` is the predicted device (DLA / GPU); once an engine was built on the board,
    # ``confirmed`` is the device the engine inspector reports (DLA, GPU, or DLA+GPU when layers on both run
    # the node), ``confirmed_by`` the engine layer(s) naming the node, and ``verdict`` says per op whether
    # the row is "confirmed" or still "predicted" (no engine yet, or no engine layer names the node).
    confirmed: str | None = None
    confirmed_by: str | None = None
    verdict: Literal["predicted", "confirmed"] | None = None


class Segment(BaseModel):
    """A maximal run of consecutive ops with one placement (:func:`segments_of`): a boundary between two
    segments is a copy between the host and the accelerator."""

    index: int
    placement: Literal["accelerator", "cpu", "unsupported"]
    ops: list[int]


class DriftOutput(BaseModel):
    """Quantized vs float model for one output over the held-out windows."""

    name: str
    mae: float                        # mean |quantized - float|, output units
    mae_rel: float                    # mae / (max - min of the float output)
    max_abs: float
    float_range: float
    argmax_agreement: float | None = None   # classifiers only (softmax outputs)


class Drift(BaseModel):
    """The quantized model against the float one on ``windows`` held-out windows, per output, and whether
    every output's relative MAE is within ``threshold_rel_mae``."""

    windows: int
    threshold_rel_mae: float
    passed: bool
    reference: str                    # what the quantized model was compared with
    candidate: str                    # the interpreter path that ran the quantized model
    outputs: list[DriftOutput]


class Report(BaseModel):
    """The op report of one model on one board, the same schema for every vendor (``report.json``, `edgehft
    report`): per op an :class:`OpPlacement`; counts, :class:`Segment` s and boundary copies; whether the
    placement was ``predicted`` or ``confirmed`` by the vendor tool (``verdict_source`` names it); drift and
    golden figures, notes, disagreements with the vendor tool, vendor details and, for the cpu board's auto
    plan, the plans measured."""

    board: str
    verdict: Literal["predicted", "confirmed"]
    verdict_source: str
    ops: list[OpPlacement]
    counts: dict[str, int] = Field(default_factory=dict)
    segments: list[Segment] = Field(default_factory=list)
    boundary_copies: int = 0
    drift: Drift | None = None
    golden: dict = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    summary: list[str] = Field(default_factory=list)          # what maps, what falls back, what to change
    disagreements: list[dict] = Field(default_factory=list)   # prediction vs the vendor tool, per op
    accelerator: dict = Field(default_factory=dict)           # vendor details: flags, log rows, boundary
    plan: dict = Field(default_factory=dict)                  # cpu --quant auto: chosen plan, measured alternatives


def segments_of(ops: list[OpPlacement]) -> list[Segment]:
    """Maximal runs of consecutive ops with the same placement, in execution order."""
    segs: list[Segment] = []
    for op in ops:
        if segs and segs[-1].placement == op.placement:
            segs[-1].ops.append(op.index)
        else:
            segs.append(Segment(index=len(segs), placement=op.placement, ops=[op.index]))
    return segs


def table_layout(report: Report) -> str:
    """The :data:`TABLES` key for ``report`` when its backend is not known: the layout of the installed backend
    whose partitioner declares the report's ``accelerator["vendor"]`` tag, else "vendor" when ops carry the
    vendor tool's status, else "kernels"."""
    from edgehft import backends
    declared = backends.table_for_vendor(str(report.accelerator.get("vendor") or ""))
    if declared in TABLES:
        return declared
    return "vendor" if any(op.status for op in report.ops) else "kernels"


SUMMARY_OVER = 60
"""A report of more than this many ops is shown per Keras layer (:func:`layer_table`) unless asked op by op
(``--ops``): an unrolled GRU is ~1000 ops of a few kinds."""


def ops_table(report: Report, layout: str | None = None, full: bool = False) -> Table:
    """The per-op table of ``report`` laid out as ``layout`` (a :data:`TABLES` key: the backend partitioner's
    ``table``); None or an unknown key: :func:`table_layout`. Over :data:`SUMMARY_OVER` ops and without
    ``full``: the per-layer summary (:func:`layer_table`) instead."""
    layout = layout if layout in TABLES else table_layout(report)
    if len(report.ops) > SUMMARY_OVER and not full:
        return layer_table(report, layout)
    t = Table(title=f"{report.board}: {len(report.ops)} ops, placement {report.verdict} "
                    f"({report.verdict_source})", title_justify="left")
    return TABLES[layout](report, t)


def _where(op: OpPlacement, layout: str) -> str:
    """Where ``op`` runs as a layer's row counts it: the kernel (cpu reports), the predicted device (Jetson), the
    placement (accelerator reports)."""
    if layout == "kernels":
        return op.kernel or op.placement
    if layout == "engine":
        return op.confirmed or op.kernel or "unsupported"
    return "accel" if op.placement == "accelerator" else op.placement


def _counted(values: list[str]) -> str:
    """``values`` as "A 12, B 3" by count (most first), or the one value alone."""
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def index_ranges(ix, mark: str = "#") -> str:
    """Ascending indexes as runs: ``[0, 1, 2, 5]`` -> ``"#0-2, #5"`` (``mark`` before each run's start: ``""``
    gives ``"0-2, 5"``)."""
    parts, start = [], None
    for k, v in enumerate(ix):
        start = v if start is None else start
        if k + 1 == len(ix) or ix[k + 1] != v + 1:
            parts.append(f"{mark}{start}" if start == v else f"{mark}{start}-{v}")
            start = None
    return ", ".join(parts)


def layer_table(report: Report, layout: str) -> Table:
    """``report`` per source layer, in the order of each layer's first op: its ops (count, indexes, kinds),
    where they run (counted per :func:`_where`) and their dtypes; ops without a known layer are one row, "(no
    layer)". The title says how to get the op-by-op table."""
    groups: dict[str, list[OpPlacement]] = {}
    for op in report.ops:
        groups.setdefault(op.layer or "(no layer)", []).append(op)
    rows = [[name, str(len(ops)), index_ranges([o.index for o in ops]), _counted([o.op for o in ops]),
             _counted([_where(o, layout) for o in ops]), _counted([o.dtype or "" for o in ops])]
            for name, ops in groups.items()]
    t = Table(title=f"{report.board}: {len(report.ops)} ops in {len(groups)} layers, placement {report.verdict} "
                    f"({report.verdict_source}), per layer (op by op: --ops)", title_justify="left")
    columns = [("layer", {}), ("ops", {"justify": "right"}), ("op #", {}), ("op kinds", {"ratio": 3}),
               ("runs on", {"ratio": 2}), ("dtype", {})]
    return fill_table(t, columns, rows, whole=("layer",), constant=("runs on", "dtype"), what="op")


def fill_table(t: Table, columns: list[tuple[str, dict]], rows: list[list[str]], *, whole: tuple = (),
               constant: tuple = (), what: str = "row") -> Table:
    """``t`` with ``columns`` (name, ``add_column`` keywords) and ``rows``, laid out to read at 80 columns.

    A column named in ``whole`` (what a user must type or read: board and op names) is never cut or wrapped:
    it is as wide as its longest line. A column named in ``constant`` that holds one value on every row (of two
    rows or more) is left out and said once in the table's caption ("every op: dtype float32, placement cpu");
    one empty on every row is left out. Every other column folds its text rather than cutting it."""
    keep, said = [], []
    for k, (name, _) in enumerate(columns):
        values = {r[k] for r in rows}
        if name in constant and len(rows) > 1 and len(values) == 1:
            if values != {""}:
                said.append(f"{name} {next(iter(values))}")
            continue
        keep.append(k)
    for k in keep:
        name, kw = columns[k]
        kw = dict(kw)
        if name in whole:
            widest = max((cell_len(line) for r in rows for line in Text.from_markup(r[k]).plain.splitlines()),
                         default=0)
            kw.update(no_wrap=True, min_width=max(widest, cell_len(name)))
        else:
            kw.setdefault("overflow", "fold")
        t.add_column(name, **kw)
    for r in rows:
        t.add_row(*(r[k] for k in keep))
    if said:
        t.caption, t.caption_justify = f"every {what}: {', '.join(said)}", "left"
    return t


def _kernels_table(report: Report, t: Table) -> Table:
    """Host-CPU reports: per op its dtype, placement and the kernel that runs it, with the reason and fix; a
    reason given already is "as #N"."""
    rows, first = [], {}
    for op in report.ops:
        reason = op.reason + (f" — fix: {op.fix}" if op.fix else "")
        if reason in first:
            reason = f"as #{first[reason]}"
        else:
            first[reason] = op.index
        rows.append([str(op.index), op.op, op.layer or "", op.dtype or "", op.placement, op.kernel or "", reason])
    columns = [("#", {"justify": "right"}), ("op", {}), ("layer", {}), ("dtype", {}), ("placement", {}),
               ("kernel", {}), ("reason", {"ratio": 1})]
    return fill_table(t, columns, rows, whole=("op",), constant=("layer", "dtype", "placement", "kernel"),
                      what="op")


def _vendor_table(report: Report, t: Table) -> Table:
    """Accelerator reports: the vendor tool's status per op; a fix is printed once per distinct fix."""
    rows = []
    shown: dict[str, int] = {}
    shown_why: dict[str, int] = {}
    for op in report.ops:
        where = "accel" + (f" #{op.subgraph}" if op.subgraph is not None else "") \
            if op.placement == "accelerator" else op.placement
        if op.placement == "accelerator":
            why = op.reason if op.reason != op.status else ""
        else:
            why = f"{op.reason_code}: {op.reason}"
            if why in shown_why:
                why = f"as #{shown_why[why]}"
            else:
                shown_why[why] = op.index
        if op.fix and op.reason_code not in ("AFTER_CPU_OP",):
            if op.fix in shown:
                why += f" (fix: as #{shown[op.fix]})"
            else:
                shown[op.fix] = op.index
                why += f" — fix: {op.fix}"
        name = op.op + (f"\n[dim]{op.layer}[/]" if op.layer else "")
        rows.append([str(op.index), name, where, op.status or "", why])
    columns = [("#", {"justify": "right"}), ("op / layer", {}), ("placement", {}), ("status", {"ratio": 2}),
               ("why, fix", {"ratio": 3})]
    return fill_table(t, columns, rows, whole=("op / layer",), constant=("placement", "status", "why, fix"),
                      what="op")


def _tensorrt_table(report: Report, t: Table) -> Table:
    """Jetson reports: per ONNX node the predicted device, the engine inspector's (once an engine was built),
    and whether the row is confirmed; a disagreement shows the predicted reason next to the engine layer."""
    rows = []
    for op in report.ops:
        predicted = op.kernel or "unsupported"
        if op.verdict == "confirmed":
            differs = op.confirmed != predicted
            seen = f"[yellow]{op.confirmed}[/]" if differs else op.confirmed
            why = (op.confirmed_by or "") + (f"\n[dim]predicted: {op.reason}[/]" if differs else "")
            status = "[yellow]confirmed, differs[/]" if differs else "[green]confirmed[/]"
        else:
            seen, status, why = "—", "predicted", op.reason         # strings already printable (print_report)
        name = op.op + (f"\n[dim]{op.layer}[/]" if op.layer else "")
        rows.append([str(op.index), name, predicted, seen, status, why])
    columns = [("#", {"justify": "right"}), ("ONNX node", {"ratio": 2}), ("predicted", {}), ("confirmed", {}),
               ("status", {}), ("engine layer / why", {"ratio": 3})]
    return fill_table(t, columns, rows, constant=("predicted", "confirmed", "status"), what="node")


TABLES = {"kernels": _kernels_table, "vendor": _vendor_table, "engine": _tensorrt_table}
"""Report layouts by name (:attr:`edgehft.partition.contract.Partitioner.table`): "kernels" (the kernel per
op), "vendor" (the accelerator tool's status per op), "engine" (predicted vs engine-confirmed device)."""


def drift_table(drift: Drift) -> Table:
    """The quantized model's drift from the float one per output, with the gate's verdict in the title."""
    verdict = "[green]pass[/]" if drift.passed else "[red]FAIL[/]"
    t = Table(title=f"drift: {drift.candidate} vs {drift.reference}, {drift.windows} held-out windows, "
                    f"threshold rel. MAE {drift.threshold_rel_mae:.2%}: {verdict}", title_justify="left")
    columns = [(c, {"justify": "right" if c != "output" else "left"})
               for c in ("output", "MAE", "rel. MAE", "max |err|", "float range", "argmax agree")]
    rows = [[o.name, f"{o.mae:.3g}", f"{o.mae_rel:.3%}", f"{o.max_abs:.3g}", f"{o.float_range:.3g}",
             "" if o.argmax_agreement is None else f"{o.argmax_agreement:.2%}"] for o in drift.outputs]
    return fill_table(t, columns, rows, whole=("output",), constant=("argmax agree",), what="output")


def plan_table(plan: dict) -> Table:
    """The cpu board's measured execution plans (``--quant auto``); the chosen row says by which criterion
    (``--select``: lowest p50, p99 or p99.9 of the plans that pass the drift gate, or the lowest drift when none
    does), and the p99.9 column is shown when it was the criterion."""
    on = plan.get("measured_on", {})
    select = plan.get("select") or "p99"
    gated = not str(plan.get("why", "")).startswith("no plan passes")
    t = Table(title=f"plan: {plan['chosen']} ({plan['why']}); measured interleaved on CPU {on.get('pinned_cpu')} "
                    f"of {on.get('cpu_model', '?')}, 1 thread", title_justify="left")
    pcts = ["p50", "p99"] + (["p99.9"] if select == "p99.9" else [])
    names = ["plan", *(f"{p} µs" for p in pcts), "p99/p50", "drift rel. MAE", "argmax agree", "chosen"]
    columns = [(c, {"justify": "left" if c == "plan" else "right"}) for c in names]
    chosen = f"[green]yes[/]: lowest {select}" if gated else "[yellow]yes[/]: lowest drift"
    rows = []
    for m in plan["measured"]:
        d, a = m.get("drift_rel_mae"), m.get("argmax_agreement")
        figures = [f"{m[f'{p}_us']:.1f}" if m.get(f"{p}_us") is not None else "" for p in pcts]
        rows.append([m["plan"], *figures, f"{m['p99_over_p50']:.2f}",
                     "" if d is None else f"{d:.3%}" + ("" if m.get("drift_passed") else " [red]over[/]"),
                     "" if a is None else f"{a:.2%}", chosen if m["chosen"] else ""])
    return fill_table(t, columns, rows, whole=("plan",), constant=("argmax agree",), what="plan")


def golden_line(g: dict) -> str | None:
    """The report's line on the golden outputs against LiteRT's reference kernels (None when they were not
    compared): "identical" when they match, else the largest difference, on how many windows, and whether it is
    within the golden check's tolerance (``compare`` and ``atol``, as the manifest's ``golden``)."""
    if "reference_kernels_path" not in g:
        return None
    other = ("LiteRT reference kernels + native kernels' portable paths" if "(portable)" in
             str(g["reference_kernels_path"]) else "LiteRT reference kernels")
    head = f"golden outputs ({g['reference_path']}) vs {other}"
    diff, count = float(g["max_diff_vs_reference_kernels"]), g["count"]
    if diff == 0:
        return f"{head}: identical on all {count} windows"
    figures = f"{head}: max diff {diff:g} (raw output units) on {g['windows_differing_from_reference_kernels']} of " \
              f"{count} windows"
    compare, atol = g.get("compare"), g.get("atol")
    if compare == "exact":
        return f"{figures}: over the golden check's tolerance (exact): the golden vectors match only the kernels " \
               "that made them"
    if atol is None:
        return f"{figures} (no tolerance recorded with them)"
    within = "within" if diff <= float(atol) else "over"
    return f"{figures}: {within} the golden check's tolerance (allclose, atol {float(atol):g})"


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` safe to print on a terminal through rich: control characters (ANSI escapes, carriage
    returns) shown as ``\\xNN``, rich markup escaped. For strings that come from files (a bundle's
    manifest or report), which are untrusted input."""
    return escape(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text)))


def printable_name(text) -> str:
    """:func:`printable` for a name that must stay on one line (a box or a host from an inventory or a rollout
    state): newlines and tabs shown as ``\\n`` and ``\\t`` too, so a name cannot forge a line of output."""
    return printable(str(text).replace("\n", "\\n").replace("\t", "\\t"))


def _printable_tree(value):
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {k: _printable_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable_tree(v) for v in value]
    return value


def print_report(report: Report, console: Console | None = None, layout: str | None = None,
                 full: bool = False) -> None:
    """The report as tables and lines on ``console``; every string in it is printed as text, never as
    markup or terminal control codes (:func:`printable`). ``layout`` and ``full``: the per-op table's
    (:func:`ops_table`; ``full``: op by op however many ops)."""
    console = console or Console()
    report = Report.model_validate(_printable_tree(report.model_dump()))
    console.print(ops_table(report, layout, full))
    counts = ", ".join(f"{k}: {v}" for k, v in report.counts.items())
    console.print(f"ops by {'placement' if any(o.status for o in report.ops) else 'kernel'}: {counts}; "
                  f"{len(report.segments)} segment(s), {report.boundary_copies} boundary copies")
    for d in report.disagreements:
        console.print(f"[yellow]disagreement[/]: #{d['index']} {d['op']}: predicted {d['predicted']}, "
                      f"{report.verdict_source} says {d['actual']}")
    for line in report.summary:
        console.print(f"[bold]•[/] {line}", highlight=False)
    if report.plan:
        console.print(plan_table(report.plan))
    if report.drift:
        console.print(drift_table(report.drift))
    line = golden_line(report.golden)
    if line:
        console.print(line)
    if report.plan:
        console.print(f"reference plan: {report.plan['reference']}")
    for n in report.notes:
        console.print(f"note: {n}")
