"""Read a TFLite flatbuffer into plain Python objects: ops, tensors, quantization parameters.

Uses the generated TFLite schema bindings (the ``tflite`` package, flatc output of
tensorflow/lite/schema/schema.fbs) and nothing of TensorFlow, so boards can read bundles. Every model is
validated while it is read (:mod:`edgehft.ir.validate`): its structure before any field is read, its indices,
buffer sizes and quantization parameters once it is parsed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tflite

from edgehft.errors import InputError
from edgehft.ir.validate import InvalidModelError, check_semantics, verify_flatbuffer

_OP_NAMES = {v: k for k, v in vars(tflite.BuiltinOperator).items() if k.isupper()}
_TYPE_NAMES = {v: k.lower() for k, v in vars(tflite.TensorType).items() if k.isupper()}
_OPTION_CLASSES = {v: k for k, v in vars(tflite.BuiltinOptions).items() if k[:1].isupper() and k != "NONE"}
_NUMPY_DTYPES = {"float32", "float16", "float64", "int8", "uint8", "int16", "uint16", "int32",
                 "uint32", "int64", "uint64", "bool"}


@dataclass(frozen=True)
class QuantParams:
    """Affine quantization ``real = (q - zero_point) * scale`` (TFLite int8 spec).

    ``scale`` float32 and ``zero_point`` int64 arrays: one entry per tensor, or one per channel along
    ``axis`` (per-channel weights).
    """

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int = 0

    @property
    def per_channel(self) -> bool:
        return self.scale.size > 1


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: ``shape`` as stored (batch included), ``shape_signature`` with -1 for dynamic dims."""

    index: int
    name: str
    shape: tuple[int, ...]
    shape_signature: tuple[int, ...]
    dtype: str                     # numpy dtype name where one exists, else the TFLite type name
    quant: QuantParams | None
    buffer: int
    is_constant: bool
    is_variable: bool


@dataclass(frozen=True)
class OpInfo:
    """One operator in execution order. ``name`` is the builtin name (``FULLY_CONNECTED``) or
    ``CUSTOM:<custom_code>`` (``CUSTOM:edgetpu-custom-op``)."""

    index: int
    name: str
    version: int
    inputs: tuple[int, ...]        # tensor indices, -1 for an omitted optional input
    outputs: tuple[int, ...]
    custom_code: str | None
    custom_options: bytes
    options: dict = field(default_factory=dict, compare=False)  # builtin options, schema field names
    # Tensor indices of the op's ``intermediates`` (e.g. the 5 of an int8 LSTM: gate and hidden
    # quantization parameters); empty when the op has none.
    intermediates: tuple[int, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class SubgraphInfo:
    name: str
    tensors: tuple[TensorInfo, ...]
    ops: tuple[OpInfo, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    def producer(self, tensor_index: int) -> OpInfo | None:
        """The op that writes ``tensor_index``, or None for graph inputs and constants."""
        for op in self.ops:
            if tensor_index in op.outputs:
                return op
        return None


class TFLiteModel:
    """A parsed and validated ``.tflite`` model.

    Raises:
        InputError: the bytes are not a TFLite flatbuffer (no ``TFL3`` identifier);
            :class:`~edgehft.ir.validate.InvalidModelError` (an InputError) where the structure is broken
            (truncated, offsets outside the file) or the model is inconsistent (an index out of range, a
            constant buffer of the wrong size, bad quantization parameters, no subgraph).
    """

    def __init__(self, data: bytes, source: str = "<bytes>"):
        if len(data) < 8 or data[4:8] != b"TFL3":
            raise InputError(f"{source} is not a TFLite model (no 'TFL3' identifier)",
                             hint="pass the .tflite file that the TFLite converter wrote")
        self.data = data
        self.source = source
        verify_flatbuffer(data, source)
        try:
            self._m = tflite.Model.GetRootAsModel(data, 0)
            self.version = self._m.Version()
            self.description = (self._m.Description() or b"").decode("utf-8", "replace")
            self.subgraphs = tuple(self._read_subgraph(i) for i in range(self._m.SubgraphsLength()))
        except InputError:
            raise
        except Exception as exc:  # e.g. a name that is not UTF-8
            raise InvalidModelError(source, f"it cannot be read ({type(exc).__name__}: {exc})") from None
        check_semantics(self._m, self.subgraphs, len(data), source)

    @classmethod
    def from_file(cls, path: str | Path) -> "TFLiteModel":
        path = Path(path)
        try:
            return cls(path.read_bytes(), str(path))
        except FileNotFoundError as exc:
            raise InputError(f"no such model file: {path}") from exc

    @property
    def main(self) -> SubgraphInfo:
        """Subgraph 0, the one the interpreter runs."""
        return self.subgraphs[0]

    def op_names(self, subgraph: int = 0) -> list[str]:
        return [op.name for op in self.subgraphs[subgraph].ops]

    def buffer(self, tensor: TensorInfo) -> np.ndarray | None:
        """A constant tensor's data as a numpy array of its dtype and shape, or None."""
        if not tensor.is_constant:
            return None
        raw = self._m.Buffers(tensor.buffer).DataAsNumpy()
        return np.frombuffer(raw.tobytes(), dtype=tensor.dtype).reshape(tensor.shape)

    def _read_subgraph(self, i: int) -> SubgraphInfo:
        g = self._m.Subgraphs(i)
        tensors = tuple(self._read_tensor(g.Tensors(t), t) for t in range(g.TensorsLength()))
        ops = []
        n_codes = self._m.OperatorCodesLength()
        for k in range(g.OperatorsLength()):
            op = g.Operators(k)
            if op.OpcodeIndex() >= n_codes:
                raise InvalidModelError(self.source, f"subgraph {i} operator {k} names operator code "
                                                     f"{op.OpcodeIndex()}, and the model has {n_codes}")
            code = self._m.OperatorCodes(op.OpcodeIndex())
            builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
            name = _OP_NAMES.get(builtin, f"BUILTIN_{builtin}")
            custom = code.CustomCode().decode() if code.CustomCode() else None
            if name == "CUSTOM":
                name = f"CUSTOM:{custom}"
            opts = op.CustomOptionsAsNumpy() if op.CustomOptionsLength() else None
            ops.append(OpInfo(k, name, code.Version(), tuple(op.InputsAsNumpy().tolist()) if op.InputsLength() else (),
                              tuple(op.OutputsAsNumpy().tolist()) if op.OutputsLength() else (),
                              custom, bytes(opts.tobytes()) if opts is not None else b"",
                              _builtin_options(op),
                              tuple(op.IntermediatesAsNumpy().tolist()) if op.IntermediatesLength() else ()))
        name = (g.Name() or b"").decode()
        ins = tuple(g.InputsAsNumpy().tolist()) if g.InputsLength() else ()
        outs = tuple(g.OutputsAsNumpy().tolist()) if g.OutputsLength() else ()
        return SubgraphInfo(name, tensors, tuple(ops), ins, outs)

    def _read_tensor(self, t, index: int) -> TensorInfo:
        tname = _TYPE_NAMES.get(t.Type(), f"type{t.Type()}")
        dtype = tname if tname in _NUMPY_DTYPES else tname
        shape = tuple(t.ShapeAsNumpy().tolist()) if t.ShapeLength() else ()
        sig = tuple(t.ShapeSignatureAsNumpy().tolist()) if t.ShapeSignatureLength() else shape
        quant = None
        q = t.Quantization()
        if q is not None and q.ScaleLength():
            zp = q.ZeroPointAsNumpy() if q.ZeroPointLength() else np.zeros(q.ScaleLength())
            quant = QuantParams(np.asarray(q.ScaleAsNumpy(), dtype=np.float32),
                                np.asarray(zp, dtype=np.int64), int(q.QuantizedDimension()))
        buf = t.Buffer()
        has_data = buf > 0 and buf < self._m.BuffersLength() and self._m.Buffers(buf).DataLength() > 0
        return TensorInfo(index, (t.Name() or b"").decode(), shape, sig, dtype, quant, buf,
                          bool(has_data), bool(t.IsVariable()))


def _builtin_options(op) -> dict:
    """An operator's builtin options as ``{"StrideH": 2, "FusedActivationFunction": 0, ...}``.

    Field names are the schema's (CamelCase accessors of the generated bindings); vector fields are
    returned as lists. Unknown option tables give an empty dict.
    """
    cls_name = _OPTION_CLASSES.get(op.BuiltinOptionsType())
    table = op.BuiltinOptions()
    cls = getattr(tflite, cls_name, None) if cls_name else None
    if cls is None or table is None:
        return {}
    obj = cls()
    obj.Init(table.Bytes, table.Pos)
    out = {}
    for attr in dir(cls):
        if (not attr[:1].isupper() or attr.startswith("GetRootAs") or attr == "Init"
                or attr.endswith(("BufferHasIdentifier", "IsNone", "Length", "AsNumpy"))):
            continue
        if hasattr(cls, attr + "Length"):
            n = getattr(obj, attr + "Length")()
            out[attr] = [getattr(obj, attr)(j) for j in range(n)]
            continue
        try:
            out[attr] = getattr(obj, attr)()
        except TypeError:      # accessor that needs an argument we do not know
            continue
    return out


def source_layer(tensor_name: str) -> str | None:
    """Best-effort Keras layer name from a converter tensor name (``model/lstm/…;…`` -> ``lstm``)."""
    first = tensor_name.split(";")[0]
    parts = [p for p in first.split("/") if p]
    if len(parts) >= 2:
        return parts[1]
    return None
