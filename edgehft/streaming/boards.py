"""Streaming per board (issue 21 item 5): for a bundle of any board, what streaming would move and whether that
board's runtime streams it today.

- cpu: each plan the bundle carries. The native plans stream when the stream executors take them
  (:func:`edgehft.streaming.stream.read_plan`: an LSTM stack, or a conv front end on the native-bf16 plan through
  :func:`edgehft.streaming.chain.build_plan`); a LiteRT or ONNX Runtime plan (int8, dynamic, fp16, float, ort-*)
  is "not streaming": its whole graph is one invoke per window. The reason says what the critical path would be
  if it were cut into per-row segments (the analysis' MACs) and names the bundle's plan that streams, if any.
- pynq, coral, jetson: "not supported on this board yet", with what streaming would move: per side of the
  bundle's partition report (the FPGA overlay / Edge TPU vs the CPU) the MACs per tick on the critical path,
  in prepare (before the tick) and over the whole window, and per op along time the rows (or, for a
  recurrence, the steps) a tick would still compute. Jetson bundles hold ONNX only: no analysis (it reads
  TFLite graphs), the nodes along time are named from the report.

MACs are the streaming analysis' (:func:`edgehft.streaming.analysis.analyze`) of the bundle's TFLite graph
(the int8 IR the PYNQ and Coral partitions index), never recomputed here.

    from edgehft.streaming.boards import bundle_streaming
    view = bundle_streaming("build/deeplob.kv260")
    for row in view.boards:
        print(row.board, row.plan, row.verdict, row.reason)

``edgehft report BUNDLE --streaming`` prints :func:`table` and :func:`lines` under the analysis (``--json``:
``boards``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from edgehft.errors import BoardUnavailableError, BundleError, InputError

VERDICT_STREAMS = "streams"
VERDICT_NOT = "not streaming"
VERDICT_UNSUPPORTED = "not supported on this board yet"
VERDICT_UNCHECKED = "not checked here"
_SHORT = {VERDICT_STREAMS: "streams", VERDICT_NOT: "not streaming", VERDICT_UNSUPPORTED: "unsupported",
          VERDICT_UNCHECKED: "not checked"}

# Per accelerator backend: where each placement runs, why its runtime does not stream, what streaming would need.
ACCELERATORS = {
    "pynq": ({"accelerator": "FPGA overlay", "cpu": "ARM cores"},
             "the PYNQ runtime runs each overlay call of steps.json on a whole window (the LSTM from the zero "
             "state, all its steps): the overlay has no streaming mode",
             "an overlay that takes the LSTM input projection row by row as ticks arrive and runs only the "
             "steps after the tick from a prepared state, and the ARM side's convs along time row by row"),
    "coral": ({"accelerator": "Edge TPU", "cpu": "host CPU"},
              "the Edge TPU runs its whole compiled subgraph per invoke, with the fixed shapes it was compiled "
              "for",
              "per-row compiled subgraphs for the ops along time, the recurrence split at the tick"),
    "jetson": ({"accelerator": "GPU/DLA", "cpu": "host CPU"},
               "TensorRT runs one engine per window, with the fixed shapes it was built for",
               "per-row engines (or a stateful one) for the nodes along time, the recurrence split at the tick"),
}
ONNX_ALONG_TIME = ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LSTM", "GRU", "RNN")
HINT_NATIVE = ("the cpu board streams native plans: compile --quant native (LSTM stacks) or --quant native-bf16 "
               "(conv front ends), or --quant auto, which ships them beside the LiteRT plans")


@dataclass
class Side:
    """One side of an accelerator board's partition: ``placement`` (accelerator / cpu), ``where`` it runs (FPGA
    overlay, ARM cores, Edge TPU, host CPU), its ``ops`` (graph indices) and their MACs per tick on the critical
    path, in prepare and over the whole window (the analysis'; None on a bundle without a TFLite graph)."""

    placement: str
    where: str
    ops: list
    macs_critical: int | None = None
    macs_prepare: int | None = None
    macs_window: int | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class BoardStreaming:
    """The verdict of one (board, plan) of a bundle: ``verdict`` (:data:`VERDICT_STREAMS`, :data:`VERDICT_NOT`,
    :data:`VERDICT_UNSUPPORTED`, :data:`VERDICT_UNCHECKED`), ``streams`` (this board's runtime streams the
    plan today), ``reason``; ``executor`` (cpu: ``"lstm-stack"`` or ``"chain"``), the analysis' ``streamable``
    and ``blocking`` op (None: no TFLite graph to analyse), MACs per tick ``macs`` (``critical``, ``prepare``,
    ``window``; None without an analysis); accelerator boards: the report's ``placement`` verdict (predicted /
    confirmed), per :class:`Side` its MACs, and ``moves``: per op along time what a tick would still compute."""

    board: str
    backend: str
    plan: str
    verdict: str
    streams: bool
    reason: str
    executor: str | None = None
    streamable: bool | None = None
    blocking: dict | None = None
    macs: dict | None = None
    placement: str | None = None
    sides: list = field(default_factory=list)
    moves: list = field(default_factory=list)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["sides"] = [s.to_dict() for s in self.sides]
        return d


@dataclass
class BundleStreaming:
    """:func:`bundle_streaming`'s answer: the bundle's ``board`` and ``backend``, the ``plan`` analysed, its
    ``analysis`` (:class:`~edgehft.streaming.analysis.StreamingAnalysis`, None when that plan's model is not a
    TFLite graph, e.g. a Jetson bundle's ONNX), ``model_file`` of that plan, and a :class:`BoardStreaming` per
    plan (cpu) or for the bundle's board."""

    board: str
    backend: str
    plan: str
    model_file: str
    analysis: object
    boards: list


def _analysis_of(bundle):
    """The streaming analysis of ``bundle``'s model, or None when it is not a TFLite graph (ONNX)."""
    from edgehft.ir import TFLiteModel
    from edgehft.streaming.analysis import analyze
    if Path(bundle.manifest.model_file).suffix != ".tflite":
        return None
    return analyze(TFLiteModel.from_file(bundle.model_path))


def _macs(a) -> dict | None:
    return None if a is None else {"critical": a.macs_critical, "prepare": a.macs_prepare, "window": a.macs_full}


def _share(a) -> str:
    """``"3,149,248 of 39,040,192 MACs (8.1%)"``: the critical path per tick of the whole window."""
    pct = f" ({a.macs_critical / a.macs_full:.1%})" if a.macs_full else ""
    return f"{a.macs_critical:,} of {a.macs_full:,} MACs{pct}"


def _blocked(a) -> str:
    """The analysis' blocking op in words (``op #3 CONV_2D: ...``)."""
    b = a.blocking
    where = "its input" if b["index"] is None else f"op #{b['index']} {b['op']}"
    return f"{where}: {b['reason']}"


def bundle_streaming(path, plan: str | None = None) -> BundleStreaming:
    """What streaming would move on the board of the bundle at ``path`` (a directory), plan ``plan`` analysed
    (None: its top level); every plan of a cpu bundle gets its verdict whatever ``plan`` is.

    Raises:
        InputError: no such plan, a model the analysis refuses; BundleError: a bundle that does not match its
        manifest, or a report.json that is not an edgehft report."""
    from edgehft.bundle import load_bundle
    bundle = load_bundle(path)
    m = bundle.manifest
    chosen = bundle.plan(plan) if plan is not None else bundle
    name = plan or m.quantization.mode
    analyses = {name: _analysis_of(chosen)}
    if m.backend == "cpu":
        rows = _cpu_rows(bundle, analyses)
    else:
        rows = [_accelerator_row(bundle, analyses[name])]       # one plan: bundle.plan refused any other
    return BundleStreaming(m.board, m.backend, name, chosen.manifest.model_file, analyses[name], rows)


def _cpu_rows(bundle, analyses: dict) -> list:
    """A :class:`BoardStreaming` per plan of a cpu bundle (top level first); the ones that do not stream name a
    plan of the bundle that does, or how to compile one. ``analyses``: by plan, those already made (filled)."""
    rows = []
    for name in bundle.plan_names():
        sub = bundle.plan(name)
        if name not in analyses:
            analyses[name] = _analysis_of(sub)
        rows.append(_cpu_row(bundle.manifest.board, name, sub, analyses[name]))
    streaming = [r.plan for r in rows if r.streams]
    for r in rows:
        if r.streams or r.verdict == VERDICT_UNCHECKED:
            continue
        if streaming:
            r.reason += (f"; plan {streaming[0]!r} of this bundle streams (runtime.open(bundle, "
                         f"plan={streaming[0]!r}))")
        elif r.streamable:
            r.reason += f"; {HINT_NATIVE}"
    return rows


def _cpu_row(board: str, name: str, sub, a) -> BoardStreaming:
    """One cpu plan: a LiteRT / ONNX Runtime plan is not streaming; a native plan streams when
    :func:`~edgehft.streaming.stream.read_plan` takes it (else its refusal is the reason)."""
    from edgehft.streaming.stream import read_plan
    row = BoardStreaming(board, "cpu", name, VERDICT_NOT, False, "", streamable=None if a is None else a.streamable,
                         blocking=None if a is None else a.blocking, macs=_macs(a))
    if not sub.manifest.artifacts.get("native"):
        row.reason = _whole_invoke(name, a)
        return row
    try:
        p = read_plan(SimpleNamespace(bundle=sub, plan=name, native_portable=False))
    except InputError as exc:
        row.reason = str(exc.args[0])
        return row
    except BoardUnavailableError as exc:
        row.verdict, row.reason = VERDICT_UNCHECKED, f"the native kernels do not load on this machine: {exc.args[0]}"
        return row
    if p.chain is not None:
        for k in p.chain.kernels:
            k.close()
    row.verdict, row.streams = VERDICT_STREAMS, True
    row.executor = "chain" if p.chain is not None else "lstm-stack"
    what = ("the chain executor (the conv front end's rows on the plan's own kernels)" if p.chain is not None
            else "the LSTM-stack executor (one native call per push)")
    row.reason = f"runner.stream() runs it on {what}; per tick the critical path is {_share(a)}"
    return row


def _whole_invoke(name: str, a) -> str:
    """Why a LiteRT / ONNX Runtime plan does not stream, with what cutting it into per-row segments would give."""
    engine = "ONNX Runtime" if name.startswith("ort") else "LiteRT"
    why = f"plan {name!r} runs the whole graph as one {engine} invoke per window (no per-row segments)"
    if a is None:
        return why
    if not a.streamable:
        return f"{why}; the graph cannot stream either: {_blocked(a)}"
    return (f"{why}; cut into per-row segments its critical path would be {_share(a)}, but the cpu runtime "
            f"does not cut {engine} plans")


def _report(bundle):
    """The bundle's report.json as a :class:`~edgehft.report.Report`.

    Raises:
        BundleError: it is not an edgehft report."""
    from pydantic import ValidationError
    from edgehft.report import Report
    try:
        return Report(**bundle.report())
    except (ValidationError, TypeError) as exc:
        raise BundleError(f"{bundle.path}/report.json is not an edgehft report: {str(exc).splitlines()[0]}",
                          hint="compile the bundle again (the report is written by `edgehft compile`)") from None


def _accelerator_row(bundle, a) -> BoardStreaming:
    """The verdict on an accelerator board (pynq, coral, jetson; another backend: its runtime declares no
    streaming): not supported, with what streaming would move per side of the partition report."""
    m = bundle.manifest
    rep = _report(bundle)
    where, why, needs = ACCELERATORS.get(m.backend, ({"accelerator": "accelerator", "cpu": "host CPU"},
                                                      f"the {m.backend} runtime has no streaming mode", ""))
    row = BoardStreaming(m.board, m.backend, m.quantization.mode, VERDICT_UNSUPPORTED, False, why,
                         streamable=None if a is None else a.streamable, blocking=None if a is None else a.blocking,
                         macs=_macs(a), placement=rep.verdict)
    if needs:
        row.reason += f"; streaming would need {needs}"
    if a is None:
        row.reason += (f"; no MACs: the bundle's model is {m.model_file}, the streaming analysis reads TFLite "
                       "graphs (report the model's cpu bundle with --streaming for them)")
        row.sides, row.moves = _onnx_sides(rep, where)
        return row
    if not a.streamable:
        row.reason += f"; the graph cannot stream either: {_blocked(a)}"
    if [o.op for o in rep.ops] != [o.op for o in a.ops]:
        row.moves = [f"the report's {len(rep.ops)} ops are not the analysed graph's {len(a.ops)}: no split by side"]
        return row
    row.sides = _sides(rep, a, where)
    kernel = {o.index: o.kernel or o.placement for o in rep.ops}
    row.moves = [line for o in a.ops if (line := _op_move(o, kernel[o.index]))]
    return row


def _sides(rep, a, where: dict) -> list:
    """A :class:`Side` per placement in the report (accelerator first), with the analysis' MACs of its ops."""
    out = []
    for placement in ("accelerator", "cpu", "unsupported"):
        ops = [o.index for o in rep.ops if o.placement == placement]
        if ops:
            rows = [a.op(i) for i in ops]
            out.append(Side(placement, where.get(placement, placement), ops, sum(o.macs_critical for o in rows),
                            sum(o.macs_prepare for o in rows), sum(o.macs_full for o in rows)))
    return out


def _op_move(o, kernel: str) -> str | None:
    """What a tick would still compute of analysed op ``o`` (an :class:`~edgehft.streaming.analysis.OpRow`)
    running on ``kernel``: its rows (or steps) and MACs; None for an op without a time axis or without MACs."""
    if o.macs_full == 0 or (o.rows is None and o.verdict != "whole window each tick"):
        return None
    head = f"#{o.index} {o.op} ({kernel}): "
    if o.verdict == "whole window each tick":
        return f"{head}whole window each tick, {o.macs_full:,} MACs ({o.reason})"
    crit = f"{o.macs_critical:,} of {o.macs_full:,} MACs per tick on the critical path, {o.macs_prepare:,} before it"
    if o.steps_prepared is not None:
        return f"{head}{o.reason}; {crit}"
    kept = len(o.rows_cached) + len(o.rows_constant)
    return (f"{head}{len(o.rows_critical)} of {o.rows} rows per tick ({kept} cached, {len(o.rows_prepared)} "
            f"prepared); {crit}")


def _onnx_sides(rep, where: dict) -> tuple:
    """Jetson (no TFLite graph): the report's nodes by placement and device (confirmed, else predicted), without
    MACs, and the nodes along time a streaming engine would split by row."""
    by = {}
    for o in rep.ops:
        by.setdefault((o.placement, o.confirmed or o.kernel or where.get(o.placement, o.placement)), []).append(o.index)
    sides = [Side(placement, device, ops) for (placement, device), ops in by.items()]
    along = [f"#{o.index} {o.op} ({o.confirmed or o.kernel or o.placement})" for o in rep.ops
             if o.op in ONNX_ALONG_TIME]
    moves = [f"nodes along time a streaming engine would split by row: {', '.join(along)}"] if along else []
    return sides, moves


def table(view: BundleStreaming):
    """A rich Table of ``view``'s verdicts, per (board, plan): the verdict (short: unsupported = not supported
    on this board yet) and MACs per tick on the critical path, in prepare and over the whole window; readable at
    80 columns. Strings from the bundle are made printable (:func:`edgehft.report.printable`)."""
    from rich import box
    from rich.table import Table
    from edgehft.report import printable
    from edgehft.streaming.analysis import si_count
    t = Table(title=f"streaming on {printable(view.board)}, per plan: MACs per tick", title_justify="left",
              box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("board", "plan", "verdict", "MACs\ncrit", "MACs\nprep", "MACs\nwindow"):
        t.add_column(col, justify="left" if col in ("board", "plan", "verdict") else "right", no_wrap=True,
                     overflow="ellipsis")
    for r in view.boards:
        macs = [si_count(r.macs[k]) for k in ("critical", "prepare", "window")] if r.macs else ["-"] * 3
        t.add_row(printable(r.board), printable(r.plan), _SHORT[r.verdict], *macs)
    return t


def lines(view: BundleStreaming) -> list:
    """Lines under :func:`table`: per (board, plan) the verdict and its reason; on an accelerator board, per side
    the ops and their MACs, and per op along time what a tick would still compute. Printable strings."""
    from edgehft.report import index_ranges, printable
    out = []
    for r in view.boards:
        out.append(printable(f"{r.board} {r.plan}: {r.verdict}: {r.reason}"))
        for s in r.sides:
            macs = ("" if s.macs_window is None else f": {s.macs_critical:,} MACs per tick on the critical path, "
                    f"{s.macs_prepare:,} in prepare, of {s.macs_window:,} per window")
            out.append(printable(f"  {s.where} (ops {index_ranges(s.ops)}){macs}"))
        out += [printable(f"  {m}") for m in r.moves]
        if r.placement:
            out.append(f"  (placement {r.placement} by the bundle's report)")
    return out
