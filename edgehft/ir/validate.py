"""Validate a TFLite flatbuffer before any interpreter sees it: pure Python and numpy, no TensorFlow.

A model file whose hashes match its manifest can still be corrupt or hostile, and LiteRT trusts what it reads:
an offset that points outside the file, a tensor index past the end of the tensor list or a scale that is
NaN crashes it (SIGSEGV, SIGABRT) instead of raising. Two passes, both raising :class:`InvalidModelError`:

1. :func:`verify_flatbuffer`, the structure, with the rules of the FlatBuffers verifier: every table, its
   vtable, every string and vector lies inside the file and is aligned, strings end in NUL, nesting and table
   counts are bounded. Which fields of a table hold offsets (to a string, vector, table or union) and which
   hold scalars is read from the generated TFLite schema bindings (the ``tflite`` package), so the check
   follows the schema and covers every table LiteRT reads, builtin options included.
2. :func:`check_semantics`, the meaning, on the parsed model: operator code, tensor, buffer and subgraph
   indices in range (operators, subgraph inputs/outputs, signatures, control-flow options), shapes,
   constant buffers of exactly the size their shape and dtype need, quantization parameters (as many zero
   points as scales, one scale or one per channel of a valid axis, finite positive scales, zero points in
   the type's range) and buffers stored past the flatbuffer within the file.

:class:`edgehft.ir.TFLiteModel` runs both, so every reader of a ``.tflite`` gets a validated model.
"""
from __future__ import annotations

import functools
import inspect
import math
import struct

import numpy as np
import tflite

from edgehft.errors import InputError

MAX_DEPTH = 64                  # the FlatBuffers verifier's defaults
MAX_TABLES = 1_000_000
HINT = ("the file is truncated, corrupt or was altered: convert the model again (a bundle: copy it again from "
        "where it was compiled)")

# Union fields whose enum type is not named like the field (schema.fbs: ``details: QuantizationDetails``).
_UNION_ENUMS = {"Details": "QuantizationDetails", "ArraySegments": "SparseIndexVector",
                "ArrayIndices": "SparseIndexVector"}
# Fixed-size element types: bytes per element (TensorType names of schema.fbs).
_ITEMSIZE = {"FLOAT32": 4, "FLOAT16": 2, "INT32": 4, "UINT8": 1, "INT64": 8, "BOOL": 1, "INT16": 2,
             "COMPLEX64": 8, "INT8": 1, "FLOAT64": 8, "COMPLEX128": 16, "UINT64": 8, "UINT32": 4, "UINT16": 2,
             "BFLOAT16": 2}
_TYPE_NAMES = {v: k for k, v in vars(tflite.TensorType).items() if k.isupper()}
# Builtin options tables shared by several operators, or not named after theirs (schema.fbs).
_SHARED_OPTIONS = {"Pool2DOptions": ("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D"),
                   "ReducerOptions": ("MEAN", "SUM", "REDUCE_PROD", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_ANY",
                                      "REDUCE_ALL"),
                   "MaximumMinimumOptions": ("MAXIMUM", "MINIMUM"), "L2NormOptions": ("L2_NORMALIZATION",),
                   "SequenceRNNOptions": ("UNIDIRECTIONAL_SEQUENCE_RNN",),
                   "RandomOptions": ("RANDOM_STANDARD_NORMAL", "RANDOM_UNIFORM", "MULTINOMIAL")}
# Operators whose parameters have no usable default: LiteRT runs them without their options table with
# zeros (a SOFTMAX with beta 0 aborts in the reference kernels), so the table must be there.
_NEEDS_OPTIONS = ("SOFTMAX", "CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "AVERAGE_POOL_2D", "MAX_POOL_2D",
                  "L2_POOL_2D")
# Builtin operators that take no input tensor, or write none (every other one reads its first input and
# writes at least one output, none of them omitted).
_NO_INPUTS = ("VAR_HANDLE", "HASHTABLE", "CALL_ONCE", "STABLEHLO_IOTA")
_NO_OUTPUTS = ("CALL_ONCE", "ASSIGN_VARIABLE", "HASHTABLE_IMPORT")
_ZERO_POINT_RANGE = {"INT8": (-128, 127), "UINT8": (0, 255), "INT16": (-32768, 32767)}
_U16, _U32, _S32 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<i")


class InvalidModelError(InputError):
    """A ``.tflite`` file is not a well-formed, self-consistent TFLite model; the message says where."""

    def __init__(self, source: str, problem: str):
        super().__init__(f"{source} is not a valid TFLite model: {problem}", hint=HINT)
        self.problem = problem


# -- the schema, read from the generated bindings ---------------------------------------------------------
class _Probe:
    """Stands in for a flatbuffers ``Table`` while one accessor of the generated bindings runs: records each
    vtable slot it reads and how it reads what the slot holds (scalar, string, table, vector, union)."""

    Bytes = b""
    Pos = 0

    def __init__(self):
        self.slots = []                      # [(voffset, [(read, byte size), ...]), ...]

    def _read(self, kind: str, size: int = 0) -> None:
        if self.slots:
            self.slots[-1][1].append((kind, size))

    def Offset(self, slot):  # noqa: N802 - the flatbuffers Table API
        self.slots.append((slot, []))
        return 4

    def Get(self, flags, off):  # noqa: N802
        self._read("get", flags.bytewidth)
        return flags.py_type(0)

    def String(self, off):  # noqa: N802
        self._read("string")
        return b""

    def Indirect(self, off):  # noqa: N802
        self._read("indirect")
        return 0

    def Vector(self, off):  # noqa: N802
        self._read("vector")
        return 0

    def VectorLen(self, off):  # noqa: N802
        return 1

    def Union(self, table, off):  # noqa: N802
        self._read("union")
        return table


@functools.lru_cache(maxsize=None)
def layout(cls: type) -> tuple:
    """The fields of generated table class ``cls``: ``(voffset, kind, arg, name)`` sorted by voffset, where
    kind/arg is ``scalar``/byte size, ``string``/None, ``table``/class, ``union``/enum class,
    ``vector``/element byte size, ``tables``/element class or ``strings``/None.

    Raises:
        TypeError: an accessor the generated code does not write (a schema this edgehft cannot read).
    """
    fields = {}
    for name, fn in vars(cls).items():
        if (not name[:1].isupper() or name.startswith("GetRootAs") or name == "Init"
                or name.endswith(("BufferHasIdentifier", "IsNone", "Length", "AsNumpy"))):
            continue
        obj = cls.__new__(cls)
        obj._tab = probe = _Probe()
        args = (0,) * (len(inspect.signature(fn).parameters) - 1)
        result = fn(obj, *args)
        for slot, reads in probe.slots:      # one slot, or a deprecated field and its successor
            if len(probe.slots) == 1 or slot not in fields:
                fields[slot] = (slot, *_kind(cls, name, reads, result), name)
    return tuple(fields[k] for k in sorted(fields))


def _kind(cls, name: str, reads: list, result) -> tuple:
    kinds = [k for k, _ in reads]
    if kinds == ["get"]:
        return "scalar", reads[0][1]
    if kinds == ["string"]:
        return "string", None
    if kinds == ["indirect"] and type(result).__module__.startswith("tflite."):
        return "table", type(result)
    if kinds == ["union"]:
        return "union", getattr(tflite, _UNION_ENUMS.get(name, name))
    if kinds == ["vector", "get"]:
        return "vector", reads[1][1]
    if kinds == ["vector", "indirect"]:
        return "tables", type(result)
    if kinds == ["vector", "string"]:
        return "strings", None
    raise TypeError(f"{cls.__name__}.{name}: accessor reads {kinds}; edgehft cannot verify this field")


@functools.lru_cache(maxsize=None)
def _options_of_ops() -> dict:
    """Builtin operator code -> the ``BuiltinOptions`` type it reads (``SOFTMAX`` -> ``SoftmaxOptions``),
    for the operators whose options table is named after them or listed in ``_SHARED_OPTIONS``."""
    options = {k.lower(): v for k, v in vars(tflite.BuiltinOptions).items() if k[:1].isupper() and k != "NONE"}
    out = {}
    for op, code in vars(tflite.BuiltinOperator).items():
        if op.isupper() and op.replace("_", "").lower() + "options" in options:
            out[code] = options[op.replace("_", "").lower() + "options"]
    for name, ops in _SHARED_OPTIONS.items():
        out.update({getattr(tflite.BuiltinOperator, op): getattr(tflite.BuiltinOptions, name) for op in ops})
    return out


@functools.lru_cache(maxsize=None)
def _union_members(enum: type) -> dict:
    return {v: getattr(tflite, k, None) for k, v in vars(enum).items() if k[:1].isupper() and k != "NONE"}


# -- pass 1: structure ------------------------------------------------------------------------------------
class _Verifier:
    """The FlatBuffers verifier's rules over ``data`` (little-endian, 4-byte uoffsets, 2-byte voffsets)."""

    def __init__(self, data: bytes):
        self.data, self.n, self.tables = data, len(data), 0

    def fail(self, at: int, what: str):
        raise _Bad(f"{what} (at byte {at})")

    def need(self, pos: int, size: int, align: int, what: str) -> None:
        if pos < 0 or pos + size > self.n:
            self.fail(pos, f"{what} lies outside the file ({self.n} bytes)")
        if align > 1 and pos % align:
            self.fail(pos, f"{what} is misaligned")

    def deref(self, pos: int, what: str) -> int:
        """The position a uoffset at ``pos`` points to."""
        self.need(pos, 4, 4, f"the offset to {what}")
        offset = _U32.unpack_from(self.data, pos)[0]
        if offset == 0 or offset >= 2 ** 31:
            self.fail(pos, f"the offset to {what} is {offset}")
        target = pos + offset
        if target >= self.n:
            self.fail(pos, f"the offset to {what} points past the end of the file")
        return target

    def vector(self, pos: int, elem: int, what: str) -> int:
        """Checks a vector at ``pos`` of ``elem``-byte elements; returns its length."""
        self.need(pos, 4, 4, f"the length of {what}")
        count = _U32.unpack_from(self.data, pos)[0]
        if count * elem > 2 ** 31 or pos + 4 + count * elem > self.n:
            self.fail(pos, f"{what} claims {count} elements of {elem} B, more than the file holds")
        return count

    def string(self, pos: int, what: str) -> None:
        count = self.vector(pos, 1, what)
        end = pos + 4 + count
        if end >= self.n or self.data[end] != 0:
            self.fail(pos, f"{what} is not NUL-terminated inside the file")

    def table(self, pos: int, cls, what: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            self.fail(pos, f"{what} is nested more than {MAX_DEPTH} tables deep")
        self.tables += 1
        if self.tables > MAX_TABLES:
            self.fail(pos, f"the file holds more than {MAX_TABLES} tables")
        self.need(pos, 4, 4, what)
        vt = pos - _S32.unpack_from(self.data, pos)[0]
        self.need(vt, 4, 2, f"the vtable of {what}")
        vsize, tsize = _U16.unpack_from(self.data, vt)[0], _U16.unpack_from(self.data, vt + 2)[0]
        if vsize < 4 or vsize % 2:
            self.fail(vt, f"the vtable of {what} has a bad size {vsize}")
        self.need(vt, vsize, 2, f"the vtable of {what}")
        self.need(pos, max(tsize, 4), 1, what)
        fields = layout(cls) if cls is not None else ()
        for voff, kind, arg, name in fields:
            if voff + 2 > vsize:
                continue
            at = _U16.unpack_from(self.data, vt + voff)[0]
            if not at:
                continue
            if kind == "union":       # its type: the uint8 field ``<name>_type`` declared just before it
                type_at = _U16.unpack_from(self.data, vt + voff - 2)[0] if voff >= 6 else 0
                self.union(self.data[pos + type_at] if type_at else 0, pos + at, arg, f"{what}.{name}", depth)
            else:
                self.field(pos + at, kind, arg, f"{what}.{name}", depth)

    def field(self, pos: int, kind: str, arg, what: str, depth: int) -> None:
        if kind == "scalar":
            self.need(pos, arg, arg, what)
        elif kind == "string":
            self.string(self.deref(pos, what), what)
        elif kind == "table":
            self.table(self.deref(pos, what), arg, what, depth + 1)
        elif kind == "vector":
            self.vector(self.deref(pos, what), arg, what)
        else:                                                        # tables / strings
            start = self.deref(pos, what)
            for j in range(self.vector(start, 4, what)):
                item = start + 4 + 4 * j
                if kind == "tables":
                    self.table(self.deref(item, f"{what}[{j}]"), arg, f"{what}[{j}]", depth + 1)
                else:
                    self.string(self.deref(item, f"{what}[{j}]"), f"{what}[{j}]")

    def union(self, kind: int, pos: int, enum, what: str, depth: int) -> None:
        """A union's table, verified as the member ``kind`` of ``enum`` (an unknown member: its vtable and
        size only)."""
        cls = _union_members(enum).get(kind) if kind else None
        self.table(self.deref(pos, what), cls, f"{what} ({cls.__name__ if cls else f'type {kind}'})", depth + 1)


class _Bad(Exception):
    pass


def verify_flatbuffer(data: bytes, source: str = "<bytes>") -> None:
    """Check the structure of TFLite flatbuffer ``data`` (a ``Model`` root table, identifier ``TFL3``).

    Raises:
        InvalidModelError: a table, vtable, string or vector outside the file or misaligned, a string
            without its NUL, nesting deeper than 64 tables, more than a million tables; the message names the
            field (``Model.Subgraphs[0].Tensors[3].Quantization``) and the byte offset.
    """
    v = _Verifier(data)
    try:
        if len(data) < 8:
            v.fail(0, "the file is shorter than a flatbuffer header")
        v.table(v.deref(0, "the root table"), tflite.Model, "Model", 0)
    except _Bad as exc:
        raise InvalidModelError(source, f"its flatbuffer structure is broken: {exc}") from None


# -- pass 2: meaning --------------------------------------------------------------------------------------
def check_semantics(raw, subgraphs, size: int, source: str = "<bytes>") -> None:
    """Check the parsed model: ``raw`` the schema's ``tflite.Model`` accessor (structure already verified),
    ``subgraphs`` the :class:`~edgehft.ir.tflite_model.SubgraphInfo` list read from it, ``size`` the file's
    length in bytes.

    Raises:
        InvalidModelError: naming the subgraph, tensor or operator and what is wrong with it.
    """
    problem = _model_problem(raw, subgraphs, size)
    if problem:
        raise InvalidModelError(source, problem)


def _model_problem(raw, subgraphs, size: int) -> str | None:
    if raw.Version() != 3:
        return f"schema version {raw.Version()}; LiteRT reads version 3"
    if not subgraphs:
        return "it has no subgraph"
    n_buffers = raw.BuffersLength()
    for b in range(n_buffers):
        problem = _buffer_problem(raw.Buffers(b), size)
        if problem:
            return f"buffer {b} {problem}"
    for k in range(raw.OperatorCodesLength()):
        code = raw.OperatorCodes(k)
        if max(code.BuiltinCode(), code.DeprecatedBuiltinCode()) == tflite.BuiltinOperator.CUSTOM \
                and not code.CustomCode():
            return f"operator code {k} is a custom op without a custom_code name"
    for s, g in enumerate(subgraphs):
        problem = _subgraph_problem(raw, raw.Subgraphs(s), g, n_buffers, size)
        if problem:
            return f"subgraph {s}: {problem}"
    for k in range(raw.MetadataLength()):
        if raw.Metadata(k).Buffer() >= n_buffers:
            return f"metadata {k} names buffer {raw.Metadata(k).Buffer()} of {n_buffers}"
    return _signature_problem(raw, subgraphs)


def _buffer_problem(b, size: int) -> str | None:
    offset, length = b.Offset(), b.Size()
    if offset > 1 and offset + length > size:
        return f"is stored at bytes {offset}..{offset + length}, past the end of the file ({size} bytes)"
    return None


def _subgraph_problem(raw, g_raw, g, n_buffers: int, size: int) -> str | None:
    n = len(g.tensors)
    for role, idx in (("input", g.inputs), ("output", g.outputs)):
        bad = [i for i in idx if not 0 <= i < n]
        if bad:
            return f"its {role}s name tensor {bad[0]}, and it has {n} tensors"
    for t in g.tensors:
        problem = _tensor_problem(raw, g_raw.Tensors(t.index), t, n_buffers)
        if problem:
            return f"tensor {t.index} ({t.name[:60]!r}) {problem}"
    for op in g.ops:
        for role, idx, lowest in (("input", op.inputs, -1), ("output", op.outputs, -1),
                                  ("intermediate", op.intermediates, 0)):
            bad = [i for i in idx if not lowest <= i < n]
            if bad:
                return f"operator {op.index} ({op.name}) {role} names tensor {bad[0]}, and it has {n} tensors"
        problem = _arity_problem(op) or _options_problem(raw, g_raw.Operators(op.index), op)
        if problem:
            return f"operator {op.index} ({op.name}) {problem}"
        o = g_raw.Operators(op.index)
        offset, length = o.LargeCustomOptionsOffset(), o.LargeCustomOptionsSize()
        if offset > 1 and offset + length > size:
            return f"operator {op.index} ({op.name}) custom options lie past the end of the file"
    return _dataflow_problem(g)


def _dataflow_problem(g) -> str | None:
    """The graph's data flow, in execution order: each tensor written by one operator at most, never a
    constant or a graph input (LiteRT would write into the mapped file or the caller's input), and read
    only after it is written; graph inputs distinct and neither constant nor written by an operator."""
    inputs = set(g.inputs)
    if len(inputs) != len(g.inputs):
        return f"its inputs {list(g.inputs)} name a tensor twice"
    bad = [i for i in g.inputs if g.tensors[i].is_constant]
    if bad:
        return f"its input tensor {bad[0]} is a constant"
    writer = {}
    for op in g.ops:
        for o in op.outputs:
            if o < 0:
                continue
            if o in writer or o in inputs or g.tensors[o].is_constant:
                what = (f"operator {writer[o]}" if o in writer else "a graph input" if o in inputs
                        else "a constant")
                return f"operator {op.index} ({op.name}) writes tensor {o}, which is {what}"
            writer[o] = op.index
    for op in g.ops:
        late = [i for i in op.inputs if writer.get(i, -1) >= op.index]
        if late:
            return (f"operator {op.index} ({op.name}) reads tensor {late[0]} before operator {writer[late[0]]} "
                    "writes it")
    return None


def _arity_problem(op) -> str | None:
    if op.name.startswith(("CUSTOM", "BUILTIN_")):
        return None
    if (not op.inputs or op.inputs[0] < 0) and op.name not in _NO_INPUTS:
        return "has no first input"
    if (not op.outputs or -1 in op.outputs) and op.name not in _NO_OUTPUTS:
        return "has no output" if not op.outputs else "has an omitted (-1) output"
    return None


def _options_problem(raw, o, op) -> str | None:
    """An operator's builtin options: of its own type (or none where it has defaults), floats finite."""
    code = raw.OperatorCodes(o.OpcodeIndex())
    want = _options_of_ops().get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()))
    kind = o.BuiltinOptionsType()
    if want is not None and kind not in (0, want):
        return f"carries builtin options of type {kind}, not its own ({want}): LiteRT would run it on zeros"
    if kind == 0 and op.name in _NEEDS_OPTIONS:
        return "has no builtin options: LiteRT would run it with zero parameters"
    for key, value in op.options.items():
        if key.endswith("SubgraphIndex") and not 0 <= int(value) < raw.SubgraphsLength():
            return f"{key} is {value}, and the model has {raw.SubgraphsLength()} subgraphs"
        if isinstance(value, float) and not math.isfinite(value):
            return f"option {key} is {value}"
    if op.name == "SOFTMAX" and not op.options.get("Beta"):
        return "has beta 0 (LiteRT's reference kernels abort on it)"
    return None


def _tensor_problem(raw, t_raw, t, n_buffers: int) -> str | None:
    if t.buffer >= n_buffers:
        return f"names buffer {t.buffer}, and the model has {n_buffers} buffers"
    if any(d < 0 for d in t.shape):
        return f"has a negative dimension in its shape {list(t.shape)}"
    if len(t.shape_signature) != len(t.shape) or any(d < -1 for d in t.shape_signature):
        return f"has a shape signature {list(t.shape_signature)} that does not fit its shape {list(t.shape)}"
    type_name = _TYPE_NAMES.get(t_raw.Type())
    if type_name is None:
        return f"has an unknown element type {t_raw.Type()}"
    if t.is_constant and type_name in _ITEMSIZE and t_raw.Sparsity() is None:
        want = math.prod(t.shape) * _ITEMSIZE[type_name]
        have = raw.Buffers(t.buffer).DataLength()
        if have != want:
            return (f"is a constant {type_name.lower()} {list(t.shape)} of {want} B, and its buffer "
                    f"{t.buffer} holds {have} B")
    return _quant_problem(t_raw.Quantization(), t, type_name)


def _quant_problem(q, t, type_name: str) -> str | None:
    if q is None or (not q.ScaleLength() and not q.ZeroPointLength()):
        return None
    n_scale, n_zero = q.ScaleLength(), q.ZeroPointLength()
    if n_scale != n_zero:
        return f"has {n_scale} quantization scales and {n_zero} zero points"
    axis = q.QuantizedDimension()
    if t.shape and not 0 <= axis < len(t.shape):
        return f"is quantized along axis {axis}, and its shape {list(t.shape)} has {len(t.shape)} axes"
    if n_scale != 1 and t.shape and n_scale != t.shape[axis]:
        return (f"has {n_scale} quantization scales for its {t.shape[axis]} channels along axis {axis} "
                "(one per channel, or one)")
    scale = q.ScaleAsNumpy()
    if not (np.isfinite(scale).all() and (scale > 0).all()):
        return f"has a quantization scale that is not a finite positive number ({_first_bad(scale)})"
    lo_hi = _ZERO_POINT_RANGE.get(type_name)
    zp = q.ZeroPointAsNumpy()
    if lo_hi and ((zp < lo_hi[0]) | (zp > lo_hi[1])).any():
        bad = zp[(zp < lo_hi[0]) | (zp > lo_hi[1])]
        return f"has a zero point {int(bad[0])} outside the {type_name.lower()} range {list(lo_hi)}"
    return None


def _first_bad(scale: np.ndarray) -> str:
    bad = scale[~(np.isfinite(scale) & (scale > 0))]
    return f"{float(bad[0]):g}" if bad.size else "?"


def _signature_problem(raw, subgraphs) -> str | None:
    for k in range(raw.SignatureDefsLength()):
        sig = raw.SignatureDefs(k)
        s = sig.SubgraphIndex()
        if not 0 <= s < len(subgraphs):
            return f"signature {k} names subgraph {s}, and the model has {len(subgraphs)}"
        n = len(subgraphs[s].tensors)
        for role, count, item in (("input", sig.InputsLength(), sig.Inputs), ("output", sig.OutputsLength(),
                                                                             sig.Outputs)):
            for j in range(count):
                if item(j).TensorIndex() >= n:
                    return f"signature {k} {role} {j} names tensor {item(j).TensorIndex()} of subgraph {s} ({n})"
    return None
