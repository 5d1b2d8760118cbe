"""Cut a TFLite model into segment models: the ops of one segment, in order, as a model of their own.

A board that runs some ops on an accelerator and the rest on its CPU executes the CPU segments as
separate LiteRT models and hands tensors across. A segment model's inputs are the activation tensors
its ops read but do not produce; its outputs are the tensors its ops produce that later ops (or the
model's outputs) read. Tensors keep their names, shapes and quantization; variable tensors (an LSTM's
state) stay variables inside the segment. Uses the TFLite schema's object API as shipped with LiteRT
(``ai_edge_litert.schema_py_generated``), so it runs wherever the runtime does.
"""
from __future__ import annotations

from dataclasses import dataclass

import flatbuffers


@dataclass
class SegmentModel:
    ops: list[int]                  # op indices of the source model
    data: bytes                     # the segment's .tflite
    inputs: list[str]               # tensor names, in the segment model's input order
    outputs: list[str]


def _schema():
    from ai_edge_litert import schema_py_generated as s
    return s


def split(model_bytes: bytes, segments: list[list[int]]) -> list[SegmentModel]:
    """One :class:`SegmentModel` per list of op indices (each in execution order; together they may
    cover all ops or only some). Raises ValueError for an op index that is not in the model."""
    s = _schema()
    src = s.ModelT.InitFromPackedBuf(model_bytes, 0)
    g = src.subgraphs[0]
    n_ops = len(g.operators)
    consumers: dict[int, set[int]] = {}
    for k, op in enumerate(g.operators):
        for t in list(op.inputs if op.inputs is not None else []):
            if t >= 0:
                consumers.setdefault(int(t), set()).add(k)
    graph_outputs = {int(t) for t in g.outputs}
    out = []
    for ops in segments:
        if any(k < 0 or k >= n_ops for k in ops):
            raise ValueError(f"op indices {ops} outside 0..{n_ops - 1}")
        out.append(_one(s, model_bytes, ops, consumers, graph_outputs))
    return out


def _one(s, model_bytes: bytes, ops: list[int], consumers, graph_outputs) -> SegmentModel:
    m = s.ModelT.InitFromPackedBuf(model_bytes, 0)          # a fresh copy to edit
    g = m.subgraphs[0]
    chosen = [g.operators[k] for k in ops]
    produced = {int(t) for op in chosen for t in op.outputs}
    used: list[int] = []
    for op in chosen:
        for t in [*op.inputs, *op.outputs, *(op.intermediates if op.intermediates is not None else [])]:
            if t >= 0 and int(t) not in used:
                used.append(int(t))

    def constant(t: int) -> bool:
        b = g.tensors[t].buffer
        return b > 0 and m.buffers[b].data is not None and len(m.buffers[b].data) > 0

    inputs = [t for op in chosen for t in op.inputs if t >= 0 and int(t) not in produced
              and not constant(int(t)) and not g.tensors[t].isVariable]
    inputs = list(dict.fromkeys(int(t) for t in inputs))
    inside = set(ops)
    outputs = [t for t in dict.fromkeys(int(t) for op in chosen for t in op.outputs)
               if t in graph_outputs or consumers.get(t, set()) - inside]
    remap = {old: new for new, old in enumerate(used)}
    buffers = [s.BufferT()]
    for old in used:
        t = g.tensors[old]
        if t.buffer > 0:
            buffers.append(m.buffers[t.buffer])
            t.buffer = len(buffers) - 1
    for op in chosen:
        op.inputs = [remap[int(t)] if t >= 0 else -1 for t in op.inputs]
        op.outputs = [remap[int(t)] for t in op.outputs]
        if op.intermediates is not None:
            op.intermediates = [remap[int(t)] for t in op.intermediates]
    names = [g.tensors[t].name.decode() if isinstance(g.tensors[t].name, bytes) else g.tensors[t].name
             for t in used]
    g.tensors = [g.tensors[t] for t in used]
    g.operators = chosen
    g.inputs = [remap[t] for t in inputs]
    g.outputs = [remap[t] for t in outputs]
    m.subgraphs = [g]
    m.buffers = buffers
    m.signatureDefs = None
    m.metadata = None
    m.metadataBuffer = None
    b = flatbuffers.Builder(1 << 16)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return SegmentModel(list(ops), bytes(b.Output()), [names[remap[t]] for t in inputs],
                        [names[remap[t]] for t in outputs])
