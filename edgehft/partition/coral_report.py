"""Turn an Edge TPU partition (predicted, or confirmed by the real compiler) into the shared report.

Adds what a trading engineer acts on: how much maps, the op that cuts the graph and why, what the
graph would look like with that op replaced (a what-if prediction), and the bytes crossing host <->
Edge TPU per inference.
"""
from __future__ import annotations

from collections import Counter

from edgehft.ir.tflite_model import TFLiteModel
from edgehft.partition import coral_rules as R
from edgehft.partition.coral_predict import EdgeTPUOptions, EdgeTPUPartition, predict
from edgehft.partition.coral_compiled import CompiledPlacement, compare
from edgehft.report import OpPlacement, Report, Segment

# CPU ops at the model's edges that are expected (the host (de)quantizes) rather than problems.
_EDGE_CODES = {"QUANTIZE_FROM_FLOAT"}
_EDGE_OPS = {"DEQUANTIZE"}


def _placements(part: EdgeTPUPartition, actual: CompiledPlacement | None) -> list[OpPlacement]:
    real = actual.stage_of() if actual and actual.cpu_ops is not None else None
    ops = []
    for v in part.ops:
        stage = v.stage if real is None else real.get(v.index, "cpu")
        mapped = stage == "tpu"
        status, code, detail = v.status, v.code, v.detail
        if real is not None and mapped != (v.stage == "tpu"):
            status = R.MAPPED if mapped else "(not mapped by the compiler)"
            code = "COMPILER_MAPPED" if mapped else "COMPILER_LEFT_ON_CPU"
            detail = f"prediction was: {v.status}" + (f" ({v.detail})" if v.detail else "")
        ops.append(OpPlacement(index=v.index, op=v.op, version=v.version, layer=v.layer,
                               placement="accelerator" if mapped else "cpu", reason_code=code,
                               reason=detail or status, fix=v.fix if not mapped else None,
                               kernel="edgetpu" if mapped else "cpu (LiteRT)", dtype=v.dtype, status=status,
                               subgraph=v.subgraph if mapped else None))
    return ops


def _segments(part: EdgeTPUPartition, ops: list[OpPlacement]) -> list[Segment]:
    by = {o.index: o for o in ops}
    segs: list[Segment] = []
    for item in part.layout:
        if isinstance(item, str):
            k = int(item.split(":")[1])
            segs.append(Segment(index=len(segs), placement="accelerator", ops=list(part.subgraphs[k])))
        elif segs and segs[-1].placement == "cpu":
            segs[-1].ops.append(item)
        else:
            segs.append(Segment(index=len(segs), placement="cpu", ops=[item]))
    for s in segs:
        s.ops = [k for k in s.ops if k in by]
    return segs


def summarize(model: TFLiteModel, part: EdgeTPUPartition, what_if: list | None = None) -> list[str]:
    """Plain sentences: what maps, what cuts the graph and why, what to change, what it would buy.
    ``what_if`` (a list) receives the alternative predictions as data."""
    what_if = [] if what_if is None else what_if
    n = len(part.ops)
    tpu = [v for v in part.ops if v.stage == "tpu"]
    lines = [f"{len(tpu)} of {n} ops map to the Edge TPU in {len(part.subgraphs)} subgraph(s) "
             f"(flags {' '.join(part.options.flags())}); {n - len(tpu)} run on the host CPU."]
    cutters = [v for v in part.ops if v.stage != "tpu" and v.code not in ("AFTER_CPU_OP", "MAPPED")
               and v.code not in _EDGE_CODES and v.op not in _EDGE_OPS]
    edges = [v for v in part.ops if v.stage != "tpu" and (v.code in _EDGE_CODES or v.op in _EDGE_OPS)]
    followers = [v for v in part.ops if v.code == "AFTER_CPU_OP"]
    if cutters:
        first = cutters[0]
        kinds = Counter((v.op, v.status) for v in cutters)
        lines.append("cannot map: " + "; ".join(f"{c}x {op} ({st})" for (op, st), c in kinds.items())
                     + f". The first is #{first.index} {first.op}: {first.detail}.")
        if followers:
            lines.append(f"{len(followers)} mappable op(s) depend on #{first.index} {first.op} (or a later CPU op) "
                         "and fall back to the CPU: with default flags the model gets one Edge TPU subgraph.")
        fixes = {v.op: v.fix for v in cutters if v.fix}
        for op, fix in fixes.items():
            lines.append(f"fix {op}: {fix}")
        whatif_ops = frozenset(v.op for v in cutters if v.code in ("UNSUPPORTED_OP", "DTYPE"))
        if whatif_ops:
            alt = predict(model, part.options, assume_mappable=whatif_ops)
            got = sum(v.stage == "tpu" for v in alt.ops)
            what_if.append({"replace": sorted(whatif_ops), "mapped": got, "ops": n, "subgraphs": len(alt.subgraphs)})
            if got > len(tpu):
                lines.append(f"what-if: with {', '.join(sorted(whatif_ops))} replaced by supported ops, "
                             f"{got} of {n} ops would map (prediction).")
        if not part.options.allow_multiple_subgraphs and followers:
            alt = predict(model, EdgeTPUOptions(part.options.min_runtime_version, True,
                                                part.options.intermediate_tensors))
            got = sum(v.stage == "tpu" for v in alt.ops)
            copies = sum(b["bytes_in"] + b["bytes_out"] for b in alt.boundary)
            what_if.append({"flags": alt.options.flags(), "mapped": got, "ops": n, "subgraphs": len(alt.subgraphs),
                            "copy_bytes": copies})
            lines.append(f"with -a: {got} of {n} ops would map in {len(alt.subgraphs)} subgraphs, at "
                         f"{copies:,} bytes of host<->TPU "
                         "copies per inference.")
    if edges:
        lines.append("expected host work at the edges: " + ", ".join(f"#{v.index} {v.op}" for v in edges)
                     + " (the runtime (de)quantizes on the host).")
    if part.boundary:
        total = sum(b["bytes_in"] + b["bytes_out"] for b in part.boundary)
        lines.append(f"host<->Edge TPU copies per inference: {total:,} bytes over "
                     f"{sum(len(b['inputs']) + len(b['outputs']) for b in part.boundary)} tensor(s).")
    return lines


def copy_estimate(boundary: list, link: dict | None) -> dict | None:
    """An ESTIMATE of the host<->Edge TPU copies of one inference, from the board file's ``[edgetpu]``
    ``link_bytes_per_s`` and ``transfer_overhead_us``: per tensor crossing the link, the fixed cost plus its bytes
    at the link's rate. ``{"bytes", "transfers", "us"}``, or None when the board file gives no rate (not
    estimated)."""
    if not link or not link.get("link_bytes_per_s"):
        return None
    sizes = [x["bytes"] for b in boundary for x in (*b["inputs"], *b["outputs"])]
    us = sum(float(link.get("transfer_overhead_us", 0.0)) + n / float(link["link_bytes_per_s"]) * 1e6 for n in sizes)
    return {"bytes": sum(sizes), "transfers": len(sizes), "us": round(us, 1)}


def edgetpu_report(model: TFLiteModel, board: str, opts: EdgeTPUOptions, *,
                   actual: CompiledPlacement | None = None, compiler: dict | None = None,
                   link: dict | None = None) -> Report:
    """The shared :class:`Report` for ``model`` on an Edge TPU board.

    ``actual`` (the compiled model read against ``model``) makes the verdict "confirmed" and fills
    ``disagreements``; ``compiler`` is what the compiler run printed (version, flags, log rows); ``link`` (the
    board file's ``[edgetpu]`` table) gives the host<->TPU copies an estimated cost (:func:`copy_estimate`).
    """
    part = predict(model, opts)
    ops = _placements(part, actual)
    counts = Counter(o.placement for o in ops)
    confirmed = actual is not None and actual.cpu_ops is not None
    source = (f"edgetpu_compiler {compiler.get('version') or ''}".strip() if compiler else
              f"compiled model {actual.compiled}") if confirmed else "edgehft's Edge TPU rules; compiler not run"
    rep = Report(board=board, verdict="confirmed" if confirmed else "predicted", verdict_source=source, ops=ops,
                 counts=dict(counts), segments=_segments(part, ops),
                 boundary_copies=sum(len(b["inputs"]) + len(b["outputs"]) for b in part.boundary),
                 notes=list(part.notes))
    what_if: list[dict] = []
    rep.summary = summarize(model, part, what_if)
    rep.accelerator = {"vendor": "coral-edgetpu", "flags": opts.flags(), "predicted_log": part.log_rows(),
                       "boundary": part.boundary, "predicted_layout": part.compiled_op_names(),
                       "mapped": sum(v.stage == "tpu" for v in part.ops), "what_if": what_if}
    est = copy_estimate(part.boundary, link)
    rep.accelerator["copy_us_estimate"] = None if est is None else est["us"]
    if part.boundary:
        rep.summary.append(
            f"host<->Edge TPU copy time: ~{est['us']:,.0f} µs per inference (estimate: {est['transfers']} "
            f"transfer(s) at {float(link['link_bytes_per_s']) / 1e6:,.0f} MB/s + {float(link.get('transfer_overhead_us', 0)):g}"
            f" µs each, the board file's {link.get('link', 'link')}; not measured)" if est else
            "host<->Edge TPU copy time: not estimated (no link_bytes_per_s in the board file's [edgetpu] table)")
    if compiler:
        rep.accelerator["compiler"] = compiler
    if confirmed:
        ag = compare(part, actual)
        rep.disagreements = ag.disagreements
        rep.accelerator.update(agreement=f"{ag.agree}/{ag.ops}", layout_equal=ag.layout_equal,
                               min_runtime_version=actual.min_runtime_version)
        if not ag.disagreements:
            rep.summary.insert(0, f"the compiler confirms the prediction on all {ag.ops} ops.")
    return rep
