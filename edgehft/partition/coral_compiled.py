"""Read what ``edgetpu_compiler`` actually did: which ops of the CPU model went inside each
``edgetpu-custom-op`` of the compiled model and which stayed CPU ops, and compare with a prediction.

The compiler keeps the CPU ops of the input model with their tensor names, so CPU ops are matched by
output tensor name; ops of the CPU model that match none are inside a custom op (found by walking back
from the custom op's outputs to its inputs).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from edgehft.errors import InputError
from edgehft.ir.tflite_model import TFLiteModel

EDGETPU_OP = "edgetpu-custom-op"


@dataclass
class CustomOpInfo:
    position: int                               # op index in the compiled model
    inputs: list[dict]                          # {"name", "shape", "dtype"}
    outputs: list[dict]
    min_runtime_version: int | None = None
    compiler_version: str | None = None
    ops: list[int] = field(default_factory=list)  # CPU-model op indices inside (when the CPU model is known)


@dataclass
class CompiledPlacement:
    """The compiled model, read alone or against its CPU model."""

    compiled: str
    layout: list[int | str]                      # compiled order: CPU-model op index, "edgetpu:k" or op name
    custom_ops: list[CustomOpInfo]
    cpu_ops: list[int] | None = None             # CPU-model op indices left on the CPU (None: no CPU model)
    cpu_op_names: list[str] = field(default_factory=list)   # compiled model's non-custom op names, in order
    unmatched: list[str] = field(default_factory=list)      # compiled CPU ops not found in the CPU model

    @property
    def min_runtime_version(self) -> int | None:
        vs = [c.min_runtime_version for c in self.custom_ops if c.min_runtime_version is not None]
        return max(vs) if vs else None

    def stage_of(self) -> dict[int, str]:
        """CPU-model op index -> ``"tpu"`` or ``"cpu"``."""
        out = {k: "tpu" for c in self.custom_ops for k in c.ops}
        out.update({k: "cpu" for k in self.cpu_ops or []})
        return out


def _tensor(g, i) -> dict:
    t = g.tensors[i]
    return {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}


def read_compiled(compiled: TFLiteModel, cpu_model: TFLiteModel | None = None) -> CompiledPlacement:
    """Analyse a compiled ``*_edgetpu.tflite``, optionally against the CPU model it came from.

    Raises:
        InputError: the model holds no ``edgetpu-custom-op`` (not compiled for the Edge TPU), or a CPU
            model whose tensors do not match the compiled one (not its source).
    """
    from edgehft.ir.edgetpu_package import read_packages
    g = compiled.main
    packages = {op.index: pkg for op, pkg in read_packages(compiled)}
    customs, layout, names = [], [], []
    for op in g.ops:
        if op.custom_code == EDGETPU_OP:
            pkg = packages.get(op.index)
            customs.append(CustomOpInfo(op.index, [_tensor(g, i) for i in op.inputs if i >= 0],
                                        [_tensor(g, i) for i in op.outputs],
                                        pkg.min_runtime_version if pkg else None,
                                        pkg.compiler_version if pkg else None))
            layout.append(f"edgetpu:{len(customs) - 1}")
        else:
            layout.append(op.name)
            names.append(op.name)
    if not customs:
        raise InputError(f"{compiled.source} holds no {EDGETPU_OP}: it was not compiled for the Edge TPU",
                         hint="pass the *_edgetpu.tflite that edgetpu_compiler wrote")
    result = CompiledPlacement(compiled.source, layout, customs, cpu_op_names=names)
    if cpu_model is not None:
        _match(result, compiled, cpu_model)
    return result


def _match(result: CompiledPlacement, compiled: TFLiteModel, cpu: TFLiteModel) -> None:
    c, g = cpu.main, compiled.main
    producer = {c.tensors[o].name: op.index for op in c.ops for o in op.outputs}
    layout, cpu_ops, unmatched = [], [], []
    k = 0
    for op in g.ops:
        if op.custom_code == EDGETPU_OP:
            layout.append(f"edgetpu:{k}")
            k += 1
            continue
        hits = {producer.get(g.tensors[o].name) for o in op.outputs} - {None}
        if len(hits) != 1:
            unmatched.append(op.name)
            layout.append(op.name)
            continue
        idx = hits.pop()
        if c.ops[idx].name != op.name:
            unmatched.append(op.name)
        layout.append(idx)
        cpu_ops.append(idx)
    names = {t.name for t in c.tensors}
    lost = [t["name"] for info in result.custom_ops for t in info.outputs if t["name"] not in names]
    if lost or len(unmatched) > len(cpu_ops):
        why = (f"{len(unmatched)} compiled CPU ops match no op of it" if len(unmatched) > len(cpu_ops)
               else f"Edge TPU outputs {', '.join(lost[:3])} are not tensors of it")
        raise InputError(f"{cpu.source} does not look like the source of {compiled.source}: {why}",
                         hint="pass the CPU model that was given to edgetpu_compiler")
    outside = set(cpu_ops)
    for info in result.custom_ops:
        stop = {t["name"] for t in info.inputs}
        todo = [t["name"] for t in info.outputs]
        seen: set[int] = set()
        while todo:
            name = todo.pop()
            if name in stop or name not in producer:
                continue
            idx = producer[name]
            if idx in seen or idx in outside:
                continue
            seen.add(idx)
            todo.extend(c.tensors[i].name for i in c.ops[idx].inputs if i >= 0 and not c.tensors[i].is_constant)
        info.ops = sorted(seen)
    result.layout, result.cpu_ops, result.unmatched = layout, cpu_ops, unmatched


@dataclass
class Agreement:
    """Prediction vs the real compiler on one model."""

    ops: int
    agree: int
    disagreements: list[dict]                    # {"index", "op", "predicted", "actual", "status", "detail"}
    cpu_multiset_equal: bool
    layout_equal: bool                           # positional: compiled op sequence identical

    @property
    def ratio(self) -> float:
        return self.agree / self.ops if self.ops else 1.0


def compare(prediction, actual: CompiledPlacement) -> Agreement:
    """Compare an :class:`~edgehft.partition.coral_predict.EdgeTPUPartition` with the real compiled model
    (read with its CPU model)."""
    if actual.cpu_ops is None:
        raise ValueError("compare() needs read_compiled(compiled, cpu_model)")
    stage = actual.stage_of()
    dis = []
    for v in prediction.ops:
        real = stage.get(v.index, "cpu")
        mine = "tpu" if v.stage == "tpu" else "cpu"
        if real != mine:
            dis.append({"index": v.index, "op": v.op, "predicted": mine, "actual": real, "status": v.status,
                        "detail": v.detail})
    pred_cpu = Counter(v.op for v in prediction.ops if v.stage != "tpu")
    real_cpu = Counter(prediction.ops[k].op for k in actual.cpu_ops)
    return Agreement(len(prediction.ops), len(prediction.ops) - len(dis), dis, pred_cpu == real_cpu,
                     prediction.compiled_op_names() == _names(actual, prediction))


def _names(actual: CompiledPlacement, prediction) -> list[str]:
    by = {v.index: v.op for v in prediction.ops}
    return ["CUSTOM:" + EDGETPU_OP if isinstance(x, str) and x.startswith("edgetpu:") else
            (by[x] if isinstance(x, int) else x) for x in actual.layout]


def compiled_for(model: TFLiteModel) -> str | None:
    """``"the Edge TPU"`` when ``model`` holds an ``edgetpu-custom-op`` (an ``edgetpu_compiler`` output), else
    None (the coral backend's ``compiled_model``, :mod:`edgehft.backends`)."""
    from edgehft.ir.edgetpu_package import is_compiled
    return "the Edge TPU" if is_compiled(model) else None
