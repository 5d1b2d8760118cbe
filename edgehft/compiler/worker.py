"""The converter worker: ``python -m edgehft.compiler.worker REQUEST.json``, run by
:mod:`edgehft.compiler.isolate` in its own process so a crash or hang of TensorFlow cannot take the
CLI with it.

Request (JSON): ``model``, ``quant``, ``lowering`` (auto | tf-keras | native), ``calib_npz`` and
``eval_npz`` (arrays ``x``), ``out`` (directory). Writes into ``out``: ``stage`` (the step it is in),
``model.tflite``, with ``"plans": [...]`` also ``model_<plan>.tflite`` per other quantization mode,
``float_outputs.npz`` (Keras outputs ``out0``… on the eval windows), ``info.json``,
or ``error.json`` (type, message, hint) and exit status 3. With ``"onnx": true`` also ``model.onnx`` (the
lowered model via tf2onnx, batch 1) and ``onnx_outputs.npz``; with ``"onnx_fp16": true`` also
``model_fp16.onnx`` and ``onnx_fp16_outputs.npz``; ``info["onnx"]`` holds op types and the differences
against the Keras outputs (see :mod:`edgehft.compiler.onnx_export`); with ``"onnx_optional": true`` an
export that fails is ``info["onnx"] = {"error": why}`` instead of an error (the cpu board's ONNX Runtime plans).
"""
from __future__ import annotations

import json
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from edgehft import errors

RECURRENT = ("LSTM", "GRU", "SimpleRNN", "RNN", "Bidirectional", "ConvLSTM1D", "ConvLSTM2D")


def _stage(out: Path, name: str) -> None:
    (out / "stage").write_text(name)


def _versions() -> dict[str, str]:
    v = {}
    for pkg in ("tensorflow", "tensorflow-cpu", "keras", "tf-keras", "numpy"):
        try:
            v[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return v


def _check_calib_shape(model, calib: np.ndarray) -> None:
    shape = tuple(model.inputs[0].shape[1:]) if len(model.inputs) == 1 else None
    if shape is not None and tuple(calib.shape[1:]) != shape:
        raise errors.InputError(f"calibration windows have shape {calib.shape[1:]}, the model takes {shape}",
                                hint="check the feature pipeline or the .npy given to --calib")


def _load(req: dict, out: Path, calib: np.ndarray):
    """Return (callable model, keras model or None, flavour, lowering, layer list)."""
    from edgehft.compiler import lowering as low
    path = Path(req["model"])
    flavour = low.detect_flavour(path)
    _stage(out, f"load {flavour} model")
    if flavour == "saved-model":
        import tensorflow as tf
        loaded = tf.saved_model.load(str(path))
        if "serving_default" not in loaded.signatures:
            raise errors.InputError(f"SavedModel {path} has no 'serving_default' signature")
        return None, loaded, flavour, "saved-model signature", []
    if flavour == "tf-keras":
        model = low.load_tf_keras(path)
        _check_calib_shape(model, calib)
        if req.get("lowering") != "native":
            low.check_recurrent_layers(model, req.get("backend"))
        return model, model, flavour, "tf-keras (as saved)", [(l.name, type(l).__name__) for l in model.layers]
    k3 = low.load_keras3(path)
    layers = [(l.name, type(l).__name__) for l in k3.layers]
    _check_calib_shape(k3, calib)
    if req.get("lowering") == "native":                 # as is: no rebuild, no checks (diagnosis)
        return k3, k3, flavour, "keras3 native (no rebuild)", layers
    low.check_recurrent_layers(k3, req.get("backend"))
    _stage(out, "rebuild Keras 3 model in tf-keras")
    tfk = low.keras3_to_tf_keras(k3)
    diff = low.check_rebuild(k3, tfk, calib[:8])
    return tfk, tfk, flavour, f"keras3 -> tf-keras rebuild (max diff {diff:.2g})", layers


def _input_spec(model, path: Path):
    ins = model.inputs
    if len(ins) != 1:
        raise errors.InputError(f"{path}: the model has {len(ins)} inputs; edgehft compiles single-input models",
                                hint="concatenate the inputs into one window tensor")
    shape = tuple(ins[0].shape)
    if any(d is None for d in shape[1:]):
        raise errors.InputError(f"{path}: input shape {shape} is not static",
                                hint="give keras.Input a full shape, e.g. keras.Input((100, 40, 1))")
    return shape[1:], ins[0].name.split(":")[0]


def _float_outputs(fn, x: np.ndarray) -> list[np.ndarray]:
    outs = []
    for lo in range(0, len(x), 256):
        y = fn(x[lo:lo + 256], training=False)
        y = list(y.values()) if isinstance(y, dict) else (list(y) if isinstance(y, (list, tuple)) else [y])
        outs.append([np.asarray(t, dtype=np.float32) for t in y])
    return [np.concatenate([o[i] for o in outs]) for i in range(len(outs[0]))]


def convert(req: dict, out: Path) -> None:
    with np.load(req["calib_npz"]) as z:
        calib = z["x"].astype(np.float32)
    with np.load(req["eval_npz"]) as z:
        held = z["x"].astype(np.float32)
    _stage(out, "import tensorflow")
    import tensorflow as tf

    model, convertible, flavour, lowering, layers = _load(req, out, calib)
    if model is None:                                   # plain SavedModel
        fn = convertible.signatures["serving_default"]
        (in_name, in_spec), = fn.structured_input_signature[1].items()
        in_shape = tuple(in_spec.shape[1:])
        out_names = sorted(fn.structured_outputs)
        _stage(out, "float reference outputs")
        ys = [fn(**{in_name: tf.constant(held[i:i + 1])}) for i in range(len(held))]
        float_outs = [np.concatenate([np.asarray(y[k]) for y in ys]) for k in out_names]
        concrete = fn
        converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], convertible)
    else:
        in_shape, in_name = _input_spec(model, Path(req["model"]))
        out_names = [t.name.split(":")[0].split("/")[0] for t in model.outputs]
        _stage(out, "float reference outputs")
        float_outs = _float_outputs(model, held)
        run = tf.function(lambda x: model(x, training=False))
        concrete = run.get_concrete_function(tf.TensorSpec((1, *in_shape), tf.float32, name=in_name))
        converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], convertible)
    if tuple(calib.shape[1:]) != tuple(in_shape):
        raise errors.InputError(f"calibration windows have shape {calib.shape[1:]}, the model takes {in_shape}",
                                hint="check the feature pipeline or the .npy given to --calib")
    quant = req["quant"]
    keys = out_names if model is None else None           # a SavedModel's signature keys; Keras: output_0, 1, ...
    flat = outputs_in_order(_convert(converter, quant, calib, req, out), keys)
    for plan in req.get("plans", []):                    # cpu board --quant auto: the candidate plans
        if plan != quant:
            again = tf.lite.TFLiteConverter.from_concrete_functions([concrete], convertible)
            (out / f"model_{plan}.tflite").write_bytes(outputs_in_order(_convert(again, plan, calib, req, out), keys))
    (out / "model.tflite").write_bytes(flat)
    np.savez(out / "float_outputs.npz", **{f"out{i}": y for i, y in enumerate(float_outs)})
    info = {"flavour": flavour, "lowering": lowering, "input_names": [in_name], "input_shape": list(in_shape),
            "output_names": out_names, "layers": layers, "versions": _versions()}
    if req.get("onnx") or req.get("onnx_fp16"):           # Jetson, cpu ort plans: the same lowered model as ONNX
        src = model if model is not None else (lambda x: [concrete(**{in_name: x})[k] for k in out_names])
        info["onnx"] = _onnx(req, out, src, in_shape, in_name, held, float_outs)
    (out / "info.json").write_text(json.dumps(info, indent=1))
    _stage(out, "done")


def _onnx(req: dict, out: Path, src, in_shape, in_name: str, held: np.ndarray, float_outs: list) -> dict:
    """The ONNX stage (:func:`edgehft.compiler.onnx_export.onnx_stage`). With ``"onnx_optional": true`` (the cpu
    board's ONNX Runtime plans, candidates among others) a failure is recorded as ``{"error": why}`` and its
    partial files removed instead of failing the compile."""
    from edgehft.compiler.onnx_export import onnx_stage
    if not req.get("onnx_optional"):
        return onnx_stage(req, out, src, in_shape, in_name, held, float_outs, _stage)
    try:
        return onnx_stage(req, out, src, in_shape, in_name, held, float_outs, _stage)
    except Exception as exc:  # noqa: BLE001 - tf2onnx or onnxruntime refusing the model: the plans are skipped
        for name in ("model.onnx", "onnx_outputs.npz"):
            (out / name).unlink(missing_ok=True)
        return {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:600]}"}


def outputs_in_order(flat: bytes, keys: list[str] | None = None) -> bytes:
    """``flat`` (a converted .tflite) with its signature's subgraph outputs listed in the model's order: ``keys``
    (signature output names in order; None: the converter's ``output_0``, ``output_1``, ... by number, which follow
    the Keras model's outputs). The converter may list a multi-output model's graph outputs in another order
    (two Dense heads came out as (b, a)), and the bundle takes graph output k for the model's output k. Unchanged
    when there is one output, no signature, the order is already right, or the signature does not name the graph's
    outputs."""
    from ai_edge_litert import schema_py_generated as s
    head = s.Model.GetRootAs(flat, 0)                  # a look first: the object tree only for several outputs
    if head.SignatureDefsLength() == 0 or head.SignatureDefs(0).OutputsLength() < 2:
        return flat
    m = s.ModelT.InitFromPackedBuf(flat, 0)
    sig = m.signatureDefs[0]
    by_key = {(o.name.decode() if isinstance(o.name, bytes) else o.name): o.tensorIndex for o in sig.outputs}
    if keys is None:
        if not all(k.startswith("output_") and k[7:].isdigit() for k in by_key):
            return flat                     # named outputs (a dict): the keys' order is the graph's already
        keys = sorted(by_key, key=lambda k: int(k[7:]))
    g = m.subgraphs[sig.subgraphIndex]
    want = [by_key.get(k) for k in keys]
    if None in want or sorted(want) != sorted(int(t) for t in g.outputs) or [int(t) for t in g.outputs] == want:
        return flat                         # in order already, or a signature that does not name the graph's outputs
    import flatbuffers
    g.outputs = want
    b = flatbuffers.Builder(len(flat) + 4096)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _convert(converter, quant: str, calib: np.ndarray, req: dict, out: Path) -> bytes:
    """Configure ``converter`` for ``quant`` (int8 calibrated on ``calib``, dynamic, fp16, float) and run it."""
    import tensorflow as tf
    if quant == "int8":
        def representative():
            for i in range(len(calib)):
                yield [calib[i:i + 1]]
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        io = tf.uint8 if req.get("io_dtype") == "uint8" else tf.int8   # uint8 for old Edge TPU runtimes
        converter.inference_input_type = io
        converter.inference_output_type = io
    elif quant == "dynamic":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif quant == "fp16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    _stage(out, f"convert ({quant})")
    try:
        return converter.convert()
    except Exception as exc:
        msg = str(exc).strip().splitlines()
        raise errors.ConverterError(f"the TFLite converter refused the model ({quant}): "
                                    + " | ".join(msg[-6:])[:2000],
                                    hint="the message above names the op; see `edgehft boards` for what each "
                                         "quantization mode supports") from exc


def main(argv: list[str]) -> int:
    req = json.loads(Path(argv[1]).read_text())
    out = Path(req["out"])
    try:
        convert(req, out)
        return 0
    except errors.EdgeHFTError as exc:
        err = {"type": type(exc).__name__, "message": exc.args[0] if exc.args else str(exc), "hint": exc.hint}
    except Exception as exc:  # an unexpected failure inside TensorFlow/Keras
        err = {"type": "ConverterError", "message": f"{type(exc).__name__}: {exc}"[:3000],
               "hint": "this is a failure inside TensorFlow/Keras; the converter log is in the message"}
    (out / "error.json").write_text(json.dumps(err))
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv))
