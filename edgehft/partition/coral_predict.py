"""Predict what ``edgetpu_compiler`` maps to the Edge TPU, op by op, for a full-integer TFLite model.

The model of the compiler (rules in :mod:`edgehft.partition.coral_rules`):

1. Each op on its own: custom ops and ops outside the supported table are refused; then the data type
   rule (every activation tensor int8/uint8), the batch rule (batch-1 models only), the rank rule (only
   the 3 innermost dimensions may exceed 1), the op's minimum runtime against ``-m``, and the op's own constraints.
2. The single-subgraph rule (default flags): the compiler emits one ``edgetpu-custom-op``. An op that
   cannot map and reads only graph inputs (or other such ops) runs on the CPU *before* the custom op
   (a float input QUANTIZE, say). Once an op that cannot map consumes an Edge TPU result, every op that
   depends on it runs on the CPU after the custom op, mappable or not ("More than one subgraph is not
   supported"); independent branches keep mapping. This is what the real compiler did to the pairs in
   ``../shared/data/edgetpu_pairs`` (e.g. movenet: the heatmap branch after the first ARG_MAX still
   maps; deeplabv3: everything downstream of the refused RESIZE_BILINEAR runs on the CPU).
3. ``-a`` (multiple subgraphs): every op that can map does; each run of mapped ops between CPU ops in
   graph order becomes its own custom op. ``-i T1,T2``: the named tensors become custom-op outputs and
   every op that depends on them runs on the CPU.

The compiled graph's predicted layout: CPU ops before the custom op (graph order), the custom op, CPU
ops after it (graph order) -- the order the compiler writes them in.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from edgehft.ir.tflite_model import OpInfo, TFLiteModel, source_layer
from edgehft.partition import coral_rules as R

_INT8 = ("int8", "uint8")


@dataclass(frozen=True)
class EdgeTPUOptions:
    """The compiler flags the prediction models: ``-m``, ``-a``, ``-i``."""

    min_runtime_version: int = 14                       # -m (board's runtime version)
    allow_multiple_subgraphs: bool = False              # -a
    intermediate_tensors: tuple[str, ...] = ()          # -i t1,t2

    def flags(self) -> list[str]:
        f = ["-m", str(self.min_runtime_version)]
        if self.allow_multiple_subgraphs:
            f.append("-a")
        if self.intermediate_tensors:
            f += ["-i", ",".join(self.intermediate_tensors)]
        return f


@dataclass
class OpVerdict:
    index: int
    op: str
    version: int
    layer: str | None
    status: str                        # compiler vocabulary (coral_rules.STATUSES)
    code: str                          # our reason code
    detail: str                        # concrete values
    fix: str | None
    stage: str                         # "pre" (CPU before), "tpu", "post" (CPU after)
    subgraph: int | None = None        # which custom op, for "tpu"
    dtype: str | None = None

    @property
    def placement(self) -> str:
        return "accelerator" if self.stage == "tpu" else "cpu"


@dataclass
class EdgeTPUPartition:
    model: str
    options: EdgeTPUOptions
    ops: list[OpVerdict]
    subgraphs: list[list[int]]                         # op indices per custom op
    layout: list[int | str]                            # predicted compiled graph: op index or "edgetpu:k"
    boundary: list[dict] = field(default_factory=list)  # per custom op: inputs/outputs with bytes
    min_runtime_needed: int = 10      # lower bound from the op table; the real pairs record 12-14
    notes: list[str] = field(default_factory=list)

    @property
    def cpu_ops(self) -> list[OpVerdict]:
        return [v for v in self.ops if v.stage != "tpu"]

    def log_rows(self) -> list[tuple[str, int, str]]:
        """Rows of the compiler's operation log: ``(op, count, status)``, one per (op, status)."""
        c = Counter((v.op, v.status) for v in self.ops)
        return [(op, n, st) for (op, st), n in sorted(c.items())]

    def compiled_op_names(self) -> list[str]:
        """The op names of the compiled model this prediction implies, in order."""
        by = {v.index: v for v in self.ops}
        return ["CUSTOM:edgetpu-custom-op" if isinstance(x, str) else by[x].op for x in self.layout]


def _own_refusal(op: OpInfo, m: TFLiteModel, opts: EdgeTPUOptions,
                 assume: frozenset[str] = frozenset()) -> R.Refusal | None:
    g = m.main
    if op.name in assume:
        return None
    if op.custom_code is not None:
        return R.Refusal(R.NOT_SUPPORTED, "CUSTOM_OP", f"custom op {op.custom_code!r} has no Edge TPU kernel",
                         "run it on the host after the Edge TPU part (it stays a CPU op)")
    rule = R.SUPPORTED.get(op.name)
    if op.name == "QUANTIZE":
        return rule.check(op, g, m)
    for i in [*op.inputs, *op.outputs]:
        if i < 0:
            continue
        t = g.tensors[i]
        if t.is_constant or t.is_variable:
            continue
        if t.dtype not in _INT8:
            return R.Refusal(R.UNSUPPORTED_DTYPE, "DTYPE", f"tensor {t.name!r} is {t.dtype} {t.shape}",
                             R.FIXES.get(op.name) or "keep it in int8/uint8 (full-integer quantization), "
                             "or move it to the host")
    if rule is None:
        return R.Refusal(R.NOT_SUPPORTED, "UNSUPPORTED_OP", f"{op.name} is not in the Edge TPU op set",
                         R.FIXES.get(op.name) or f"replace {op.name} with supported ops or run it on the host "
                         "after the last Edge TPU op")
    batch = R.model_batch(g)
    for i in [*op.inputs, *op.outputs]:
        if i < 0 or g.tensors[i].is_constant:
            continue
        shape = g.tensors[i].shape
        refusal = R.batch_refusal(g.tensors[i], batch)
        if refusal is not None:
            return refusal
        if len(shape) > 3 and any(d != 1 for d in shape[:-3]):
            return R.Refusal(R.UNSUPPORTED_RANK, "RANK", f"tensor {g.tensors[i].name!r} shape {shape}: "
                             "more than the 3 innermost dimensions exceed 1",
                             "reshape so only the 3 innermost dimensions exceed 1 (fold the extra one into "
                             "height or channels)")
        if -1 in g.tensors[i].shape_signature[1:]:
            return R.Refusal(R.UNSPECIFIED_LIMITATION, "DYNAMIC_SHAPE",
                             f"tensor {g.tensors[i].name!r} has a dynamic shape {g.tensors[i].shape_signature}",
                             "give the model input a static shape (batch 1)")
    if rule.min_runtime > opts.min_runtime_version:
        return R.Refusal(R.NOT_SUPPORTED, "NEEDS_NEWER_RUNTIME",
                         f"{op.name} maps from Edge TPU runtime {rule.min_runtime}; -m {opts.min_runtime_version}",
                         f"target runtime >= {rule.min_runtime} (-m {rule.min_runtime}) if every box has it")
    return rule.check(op, g, m) if rule.check else None


def predict(model: TFLiteModel, opts: EdgeTPUOptions | None = None, *,
            assume_mappable: frozenset[str] = frozenset()) -> EdgeTPUPartition:
    """Predict the compiler's placement of every op of ``model`` (subgraph 0).

    Args:
        model: a full-integer TFLite model (the CPU model, before ``edgetpu_compiler``).
        opts: the flags to model; default ``-m 14``, one subgraph, no ``-i``.
        assume_mappable: op names to treat as mappable (a what-if: "if these were replaced").
    Returns:
        an :class:`EdgeTPUPartition` with one :class:`OpVerdict` per op, the custom-op groups, the
        predicted compiled layout and the boundary tensors (bytes crossing host <-> Edge TPU).
    Raises:
        InputError: an ``-i`` tensor name that is not in the model.
    """
    from edgehft.errors import InputError
    opts = opts or EdgeTPUOptions()
    g = model.main
    names = {t.name: t.index for t in g.tensors}
    missing = [n for n in opts.intermediate_tensors if n not in names]
    if missing:
        raise InputError(f"-i tensor(s) not in the model: {', '.join(missing)}",
                         hint="use tensor names from `edgehft report --tensors MODEL`")
    cut = {names[n] for n in opts.intermediate_tensors}
    state: dict[int, str] = {}                   # tensor -> "pre" | "tpu" | "post" | "cut"
    cause: dict[int, OpVerdict] = {}             # post tensor -> the CPU op that put it after the custom op
    verdicts: list[OpVerdict] = []
    for op in g.ops:
        out = g.tensors[op.outputs[0]] if op.outputs else None
        layer = source_layer(out.name) if out else None
        refusal = _own_refusal(op, model, opts, assume_mappable)
        ins = {state.get(i, "source") for i in op.inputs if i >= 0}
        root = next((cause[i] for i in op.inputs if i in cause), None)
        if refusal is None and "cut" in ins:
            cut_names = [g.tensors[i].name for i in op.inputs if state.get(i) == "cut"]
            refusal = R.Refusal(R.MORE_THAN_ONE_SUBGRAPH, "AFTER_INTERMEDIATE_TENSOR",
                                f"reads {', '.join(cut_names)}, cut with -i", "drop it from -i to map this op")
            stage = "post"
        elif refusal is None and "post" in ins and not opts.allow_multiple_subgraphs:
            refusal = R.Refusal(R.MORE_THAN_ONE_SUBGRAPH, "AFTER_CPU_OP",
                                f"depends on CPU op #{root.index} {root.op}" if root else "depends on a CPU op",
                                f"see #{root.index}, or compile with -a" if root else "compile with -a")
            stage = "post"
        elif refusal is None:
            stage = "tpu"
        else:
            stage = "post" if ins & {"tpu", "post", "cut"} else "pre"
        if opts.allow_multiple_subgraphs and stage == "post" and refusal.code != "AFTER_INTERMEDIATE_TENSOR":
            stage = "cpu"                         # with -a there is no before/after: graph order decides
        v = OpVerdict(op.index, op.name, op.version, layer, R.MAPPED if refusal is None else refusal.status,
                      "MAPPED" if refusal is None else refusal.code, "" if refusal is None else refusal.detail,
                      None if refusal is None else refusal.fix, stage, dtype=out.dtype if out else None)
        for o in op.outputs:
            state[o] = "cut" if (stage == "tpu" and o in cut) else ("post" if stage == "cpu" else stage)
            if stage == "post":
                cause[o] = root if refusal.code in ("AFTER_CPU_OP",) and root else v
        verdicts.append(v)
    subgraphs, layout = _group(verdicts, opts)
    part = EdgeTPUPartition(model=model.source, options=opts, ops=verdicts, subgraphs=subgraphs, layout=layout)
    part.boundary = [_boundary(model, set(s)) for s in subgraphs]
    batch = R.model_batch(g)
    if batch > 1:
        part.notes.append(f"the model's input has batch {batch}: the Edge TPU compiler takes batch-1 models only, "
                          f"so no op on a batch-{batch} tensor maps (BATCH_NOT_1); convert it with batch 1")
    mapped = [R.SUPPORTED[v.op].min_runtime for v in verdicts if v.stage == "tpu" and v.op in R.SUPPORTED]
    part.min_runtime_needed = max(mapped, default=10)
    for v in verdicts:
        rule = R.SUPPORTED.get(v.op)
        if v.stage == "tpu" and rule and rule.note.startswith("very large"):
            n = int(np.prod(model.main.tensors[model.main.ops[v.index].outputs[0]].shape))
            if n > 1 << 20:
                part.notes.append(f"#{v.index} RESHAPE of {n} elements may not map ({rule.note})")
    return part


def _group(verdicts: list[OpVerdict], opts: EdgeTPUOptions) -> tuple[list[list[int]], list[int | str]]:
    if opts.allow_multiple_subgraphs:
        subgraphs: list[list[int]] = []
        layout: list[int | str] = []
        for v in verdicts:
            if v.stage == "tpu":
                if not layout or not isinstance(layout[-1], str):
                    subgraphs.append([])
                    layout.append(f"edgetpu:{len(subgraphs) - 1}")
                subgraphs[-1].append(v.index)
                v.subgraph = len(subgraphs) - 1
            else:
                layout.append(v.index)
        return subgraphs, layout
    tpu = [v.index for v in verdicts if v.stage == "tpu"]
    for v in verdicts:
        if v.stage == "tpu":
            v.subgraph = 0
    layout = [v.index for v in verdicts if v.stage == "pre"] + (["edgetpu:0"] if tpu else []) + \
             [v.index for v in verdicts if v.stage == "post"]
    return ([tpu] if tpu else []), layout


def _boundary(model: TFLiteModel, ops: set[int]) -> dict:
    """Tensors entering / leaving a custom op, with their sizes in bytes."""
    g = model.main
    produced = {o for k in ops for o in g.ops[k].outputs}
    consumed_outside = {i for op in g.ops if op.index not in ops for i in op.inputs}
    ins, outs = [], []
    for k in sorted(ops):
        for i in g.ops[k].inputs:
            if i >= 0 and i not in produced and not g.tensors[i].is_constant and i not in [x["index"] for x in ins]:
                ins.append(_tensor_entry(g.tensors[i]))
    for k in sorted(ops):
        for o in g.ops[k].outputs:
            if o in consumed_outside or o in g.outputs:
                outs.append(_tensor_entry(g.tensors[o]))
    return {"inputs": ins, "outputs": outs, "bytes_in": sum(x["bytes"] for x in ins),
            "bytes_out": sum(x["bytes"] for x in outs)}


def _tensor_entry(t) -> dict:
    size = int(np.prod(t.shape)) if t.shape else 1
    itemsize = np.dtype(t.dtype).itemsize if t.dtype in ("int8", "uint8", "int16", "int32", "float32") else 1
    return {"index": t.index, "name": t.name, "shape": list(t.shape), "dtype": t.dtype, "bytes": size * itemsize}
