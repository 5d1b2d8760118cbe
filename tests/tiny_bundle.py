"""A tiny cpu bundle built without TensorFlow (for tests of the bundle rules and the box-side CLI): a one-op
LiteRT model (LOGISTIC, float32 (1, 4)) written with the TFLite schema's object API, golden vectors from
LiteRT, written with ``write_bundle``."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from edgehft.bundle import Golden, Manifest, Quantization, SourceModel, TensorSpec, write_bundle

COUNT = 8


def tiny_tflite() -> bytes:
    """y = sigmoid(x), x and y float32 (1, 4): tensors 0 (input) and 1 (output)."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as s
    code = s.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = s.BuiltinOperator.LOGISTIC
    code.version = 1
    tensors = []
    for k, name in enumerate(("x", "y")):
        t = s.TensorT()
        t.name, t.shape, t.type, t.buffer = name, [1, 4], s.TensorType.FLOAT32, k + 1
        tensors.append(t)
    op = s.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0], [1]
    g = s.SubGraphT()
    g.tensors, g.inputs, g.outputs, g.operators = tensors, [0], [1], [op]
    m = s.ModelT()
    m.version, m.operatorCodes, m.subgraphs, m.buffers = 3, [code], [g], [s.BufferT() for _ in range(3)]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def npz_bytes(arrays: dict) -> bytes:
    """``arrays`` as the bytes of an .npz file."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def write_tiny_bundle(work: Path, count: int = COUNT, report: dict | None = None) -> Path:
    """The tiny bundle at ``work / "b"`` (its model also as ``work / "m.tflite"``), with ``count`` golden
    vectors from LiteRT (compared allclose, atol 1e-5) and ``report`` as its report.json (default: a cpu report
    without ops). Returns the bundle's path."""
    from edgehft.runtime import cpu
    (work / "m.tflite").write_bytes(tiny_tflite())
    x = np.random.default_rng(3).standard_normal((count, 4)).astype(np.float32)
    it = cpu.make_interpreter(work / "m.tflite")
    ys = []
    for n in range(count):
        it.set_tensor(0, x[n:n + 1])
        it.invoke()
        ys.append(it.get_tensor(1)[0].copy())
    spec = {"shape": [1, 4], "dtype": "float32"}
    m = Manifest(board="cpu", backend="cpu", model_file="model.tflite",
                 source=SourceModel(file="m.tflite", sha256="0" * 64, flavour="tflite", lowering="test"),
                 quantization=Quantization(mode="float"), inputs=[TensorSpec(name="x", index=0, **spec)],
                 outputs=[TensorSpec(name="y", index=1, **spec)],
                 golden=Golden(count=count, reference_path=cpu.interpreter_path(), compare="allclose", atol=1e-5))
    files = {"model.tflite": work / "m.tflite",
             "golden.npz": npz_bytes({"inputs/x": x, "outputs/y": np.stack(ys)})}
    return write_bundle(work / "b", m, files, report=report or {"board": "cpu", "notes": []}).path
