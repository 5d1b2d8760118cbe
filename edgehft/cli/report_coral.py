"""``edgehft report X_edgetpu.tflite``: what the Edge TPU compiler put inside each ``edgetpu-custom-op`` of a
compiled model, with edgehft's prediction for its CPU model beside it (the coral backend's
``compiled_report``, :mod:`edgehft.backends`)."""
from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from edgehft.cli.common import out


def show_compiled(model, path: Path, cpu_model: str | None, as_json: bool) -> bool:
    """Show ``model`` (a :class:`~edgehft.ir.TFLiteModel` read from ``path``) when it is compiled for the Edge
    TPU: its custom ops, the compiled graph in execution order, and, given the CPU model it was compiled from
    (``cpu_model``, default the sibling without ``_edgetpu``), each op's predicted placement against the
    compiler's. Returns False, showing nothing, for any other model.

    Raises:
        InputError: ``cpu_model`` is not a valid .tflite (exit 3).
    """
    from edgehft.ir.edgetpu_package import is_compiled
    if not is_compiled(model):
        return False
    _compiled_report(model, path, cpu_model, as_json)
    return True


def _compiled_report(model, path: Path, cpu_model: str | None, as_json: bool) -> None:
    from edgehft.compiler.coral import recorded_version
    from edgehft.ir import TFLiteModel
    from edgehft.partition.coral_predict import predict
    from edgehft.partition.coral_compiled import compare, read_compiled
    sibling = path.with_name(path.name.replace("_edgetpu.tflite", ".tflite"))
    src = Path(cpu_model) if cpu_model else (sibling if sibling != path and sibling.is_file() else None)
    cpu = TFLiteModel.from_file(src) if src else None
    placed = read_compiled(model, cpu)
    result = {"model": str(path), "cpu_model": str(src) if src else None,
              "min_runtime_version": placed.min_runtime_version,
              "custom_ops": [{**vars(c), "compiler_version": recorded_version(c.compiler_version)}
                             for c in placed.custom_ops], "layout": placed.layout}
    agreement, why = None, {}
    if cpu is not None:
        part = predict(cpu)
        why = {v.index: f"predicted: {v.status}" + (f" ({v.detail})" if v.detail else "") for v in part.ops}
        agreement = compare(part, placed)
        names = {op.index: op.name for op in cpu.main.ops}
        result.update(cpu_ops=[{"index": k, "op": names[k]} for k in placed.cpu_ops],
                      agreement={"ops": agreement.ops, "agree": agreement.agree,
                                 "disagreements": agreement.disagreements,
                                 "layout_equal": agreement.layout_equal})
    if as_json:
        click.echo(json.dumps(result))
        return
    out.print(f"[bold]{path.name}[/]: {len(placed.custom_ops)} edgetpu-custom-op(s), needs Edge TPU runtime "
              f">= {placed.min_runtime_version}")
    t = Table(title="compiled graph, in execution order", title_justify="left")
    for c in ("#", "op", "runs on", "what"):
        t.add_column(c)
    for pos, item in enumerate(placed.layout):
        if isinstance(item, str) and item.startswith("edgetpu:"):
            c = placed.custom_ops[int(item.split(":")[1])]
            inside = (f"{len(c.ops)} ops of the CPU model: " + _ranges(c.ops)) if cpu else "ops unknown " \
                "(pass --cpu-model to list them)"
            io = f"in {', '.join(str(tuple(i['shape'])) + ' ' + i['dtype'] for i in c.inputs)}; " \
                 f"out {', '.join(str(tuple(o['shape'])) + ' ' + o['dtype'] for o in c.outputs)}"
            t.add_row(str(pos), "edgetpu-custom-op", "Edge TPU",
                      f"{inside}; {io}; compiler {_version(c.compiler_version)}, runtime >= {c.min_runtime_version}")
        else:
            label = f"#{item} {cpu.main.ops[item].name}" if isinstance(item, int) and cpu else str(item)
            t.add_row(str(pos), label, "CPU", why.get(item, "") if isinstance(item, int) else "")
    out.print(t)
    if agreement is not None:
        out.print(f"edgehft's prediction for {src.name}: {agreement.agree}/{agreement.ops} ops placed as the "
                  f"compiler did; compiled layout {'identical' if agreement.layout_equal else 'differs'}")
        for d in agreement.disagreements:
            out.print(f"  [yellow]#{d['index']} {d['op']}[/]: predicted {d['predicted']}, compiled {d['actual']} "
                      f"({d['status']} {d['detail']})")


def _version(v: str | None) -> str:
    return v if v and v.strip("cl/") else "version not recorded"


def _ranges(ix: list[int]) -> str:
    parts, start = [], None
    for k, v in enumerate(ix):
        if start is None:
            start = v
        if k + 1 == len(ix) or ix[k + 1] != v + 1:
            parts.append(f"#{start}" if start == v else f"#{start}-#{v}")
            start = None
    return ", ".join(parts)
