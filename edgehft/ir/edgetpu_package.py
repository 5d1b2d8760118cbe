"""Read what the Edge TPU compiler put into a compiled model (``X_edgetpu.tflite``); ground floor.

The compiler replaces the ops it maps with one ``edgetpu-custom-op`` per segment. That op's
``custom_options`` are a FlexBuffer map; key ``"4"`` holds a string whose bytes are a FlatBuffer with the
file identifier ``DWN1``: libedgetpu's ``Package`` table. Its fields, by slot::

    0 min_runtime_version: int32        (the oldest libedgetpu runtime that can run it)
    1 serialized_multi_executable: [ubyte]
    2 signature: [ubyte]
    3 keypair_version: int32
    4 compiler_version: string          (often just "cl/" in released compilers)
    5 virtual_chip_id: int32

Only numpy-free flatbuffers readers are used (``flatbuffers.flexbuffers`` and ``flatbuffers.table``), so
this runs on boards without the vendor runtime.
"""
from __future__ import annotations

from dataclasses import dataclass

from flatbuffers import encode, flexbuffers, number_types, packer, table

from edgehft.errors import InputError
from edgehft.ir.tflite_model import OpInfo, TFLiteModel

CUSTOM_CODE = "edgetpu-custom-op"
PACKAGE_KEY = "4"
IDENTIFIER = b"DWN1"

_SLOT_MIN_RUNTIME, _SLOT_EXECUTABLE, _SLOT_KEYPAIR, _SLOT_COMPILER, _SLOT_CHIP = 0, 1, 3, 4, 5


@dataclass(frozen=True)
class EdgeTPUPackage:
    """One compiled Edge TPU segment (the ``DWN1`` package of an ``edgetpu-custom-op``).

    Attributes:
        min_runtime_version: oldest libedgetpu runtime version that accepts the package (0 if unset).
        compiler_version: the compiler's version string as recorded (``"cl/"`` or ``"cl/343520747"``).
        executable_bytes: size of the serialized executable(s) in bytes.
        keypair_version: signing keypair version (0 if unset).
        virtual_chip_id: the chip the package targets (0 if unset).
    """

    min_runtime_version: int
    compiler_version: str
    executable_bytes: int
    keypair_version: int = 0
    virtual_chip_id: int = 0


def package_bytes(op: OpInfo, source: str = "<model>") -> bytes:
    """The ``DWN1`` FlatBuffer bytes stored in an ``edgetpu-custom-op``'s custom options.

    Raises:
        InputError: the op is not an Edge TPU op, its options are not a FlexBuffer map, the map has no
            key ``"4"``, or the value is not a string/blob.
    """
    where = f"{source}: op {op.index} ({op.name})"
    if op.custom_code != CUSTOM_CODE:
        raise InputError(f"{where} is not an {CUSTOM_CODE}")
    if not op.custom_options:
        raise InputError(f"{where} has no custom options (no Edge TPU package)",
                         hint="the file is not an edgetpu_compiler output; compile the model again")
    try:
        root = flexbuffers.GetRoot(op.custom_options)
        if not root.IsMap:
            raise InputError(f"{where}: custom options are not a FlexBuffer map")
        m = root.AsMap
        values = dict(zip((k.AsKey for k in m.Keys), m.Values))
        if PACKAGE_KEY not in values:
            raise InputError(f"{where}: custom options have no package (key {PACKAGE_KEY!r}); keys: "
                             f"{sorted(values)}", hint="the file is not an edgetpu_compiler output")
        v = values[PACKAGE_KEY]
        if v.IsString:
            data = bytes(v.AsStringBytes)
        elif v.IsBlob:
            data = bytes(v.AsBlob)
        else:
            raise InputError(f"{where}: package (key {PACKAGE_KEY!r}) is not a string or blob")
    except InputError:
        raise
    except Exception as exc:  # flexbuffers raises IndexError/struct.error/ValueError on bad bytes
        raise InputError(f"{where}: custom options are not a valid FlexBuffer: {exc!r}",
                         hint="the compiled model is truncated or corrupted; compile it again") from exc
    return data


def parse_package(data: bytes, source: str = "<package>") -> EdgeTPUPackage:
    """Parse ``DWN1`` package bytes into an :class:`EdgeTPUPackage`.

    Raises:
        InputError: too short, wrong file identifier, or offsets pointing outside the bytes.
    """
    if len(data) < 8 or data[4:8] != IDENTIFIER:
        raise InputError(f"{source}: Edge TPU package has no {IDENTIFIER.decode()!r} identifier "
                         f"(got {bytes(data[4:8])!r})", hint="the file is not an edgetpu_compiler output")
    try:
        root = encode.Get(packer.uoffset, data, 0)
        if not 8 <= root < len(data) - 4:
            raise InputError(f"{source}: Edge TPU package root offset {root} is outside its "
                             f"{len(data)} bytes")
        t = table.Table(data, root)
        vtable = root - encode.Get(packer.soffset, data, root)
        if not 0 <= vtable < len(data) - 4:
            raise InputError(f"{source}: Edge TPU package vtable offset {vtable} is outside its bytes")

        def field(slot: int) -> int:
            return t.Offset(4 + 2 * slot)

        def int32(slot: int) -> int:
            o = field(slot)
            return int(t.Get(number_types.Int32Flags, t.Pos + o)) if o else 0

        o = field(_SLOT_EXECUTABLE)
        exe = t.VectorLen(o) if o else 0
        o = field(_SLOT_COMPILER)
        compiler = t.String(t.Pos + o).decode("utf-8", "replace") if o else ""
        pkg = EdgeTPUPackage(int32(_SLOT_MIN_RUNTIME), compiler, int(exe), int32(_SLOT_KEYPAIR),
                             int32(_SLOT_CHIP))
    except InputError:
        raise
    except Exception as exc:  # struct.error / IndexError on truncated tables
        raise InputError(f"{source}: malformed Edge TPU package: {exc!r}",
                         hint="the compiled model is truncated or corrupted; compile it again") from exc
    if exe == 0:
        raise InputError(f"{source}: Edge TPU package holds no executable",
                         hint="the compiled model is truncated or corrupted; compile it again")
    if exe > len(data):
        raise InputError(f"{source}: Edge TPU package claims a {exe}-byte executable in {len(data)} bytes",
                         hint="the compiled model is truncated or corrupted; compile it again")
    return pkg


def read_packages(model: TFLiteModel) -> list[tuple[OpInfo, EdgeTPUPackage]]:
    """Every ``edgetpu-custom-op`` of ``model`` (all subgraphs, graph order) with its parsed package.

    Returns an empty list for a model without Edge TPU ops (e.g. the int8 CPU model).

    Raises:
        InputError: an Edge TPU op whose package is missing or malformed.
    """
    found = []
    for g in model.subgraphs:
        for op in g.ops:
            if op.custom_code == CUSTOM_CODE:
                where = f"{model.source}: op {op.index}"
                found.append((op, parse_package(package_bytes(op, model.source), where)))
    return found


def min_runtime_version(model: TFLiteModel) -> int | None:
    """The libedgetpu runtime version ``model`` needs: the largest ``min_runtime_version`` over its
    Edge TPU ops, or None when it has none.

    Raises:
        InputError: a malformed package.
    """
    versions = [p.min_runtime_version for _, p in read_packages(model)]
    return max(versions) if versions else None


def is_compiled(model: TFLiteModel) -> bool:
    """Whether ``model`` holds at least one ``edgetpu-custom-op`` (an edgetpu_compiler output)."""
    return any(op.custom_code == CUSTOM_CODE for g in model.subgraphs for op in g.ops)
