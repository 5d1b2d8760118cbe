"""Load a Keras model as a tf-keras model, so the TFLite converter lowers LSTM to the fused
``UNIDIRECTIONAL_SEQUENCE_LSTM`` op. Runs inside the converter worker only (needs TensorFlow, tf-keras
and, for Keras 3 files, Keras 3; ``TF_USE_LEGACY_KERAS=1`` is set by the parent).

Keras 3's LSTM converts to a TFLite ``WHILE`` loop (and its full-int8 conversion crashes the converter),
while tf-keras's LSTM carries the annotation the converter fuses. A Keras 3 model is therefore rebuilt
layer by layer in tf-keras from its layer configs and weights, and the rebuild is checked against the
original on real windows before it is used.
"""
from __future__ import annotations

import inspect
import json
import zipfile
from pathlib import Path

import numpy as np

from edgehft.errors import InputError, LoweringError

# Keras 3 config keys that tf-keras spells differently, per layer class.
_RENAMED = {"LeakyReLU": {"negative_slope": "alpha"}, "InputLayer": {"batch_shape": "batch_input_shape"}}
# Keys every tf-keras layer takes through **kwargs (tf_keras Layer.__init__).
_BASE_KEYS = {"name", "trainable", "dtype", "input_shape", "batch_input_shape", "batch_size",
              "input_dim", "dynamic", "autocast"}
# Keras 3 keys with no tf-keras counterpart that do not change inference when dropped.
_INFERENCE_NEUTRAL = {"seed", "use_cudnn", "optional", "synchronized", "sparse", "ragged"}


def detect_flavour(path: Path) -> str:
    """``keras3``, ``tf-keras`` or ``saved-model`` for a ``.keras``/``.h5`` file or SavedModel directory.

    Raises:
        InputError: missing path, unknown extension, or a file that is not a Keras model.
    """
    if not path.exists():
        raise InputError(f"no such model: {path}")
    if path.is_dir():
        if not (path / "saved_model.pb").exists():
            raise InputError(f"{path} is a directory but not a SavedModel (no saved_model.pb)")
        return "tf-keras" if (path / "keras_metadata.pb").exists() else "saved-model"
    suffix = path.suffix.lower()
    if suffix == ".keras":
        try:
            with zipfile.ZipFile(path) as z:
                meta = json.loads(z.read("metadata.json"))
        except (zipfile.BadZipFile, KeyError, ValueError) as exc:
            raise InputError(f"{path} is not a valid .keras archive: {exc}",
                             hint="save it with model.save('model.keras')") from exc
        return "keras3" if str(meta.get("keras_version", "")).startswith("3.") else "tf-keras"
    if suffix in (".h5", ".hdf5"):
        import h5py
        try:
            with h5py.File(path, "r") as f:
                ver = f.attrs.get("keras_version", b"")
        except OSError as exc:
            raise InputError(f"{path} is not a valid HDF5 Keras model: {exc}") from exc
        ver = ver.decode() if isinstance(ver, bytes) else str(ver)
        return "keras3" if ver.startswith("3.") else "tf-keras"
    raise InputError(f"{path}: unsupported model format {suffix!r}",
                     hint="pass a .keras or .h5 file or a SavedModel directory")


def load_keras3(path: Path):
    import keras
    try:
        return keras.saving.load_model(path, compile=False)
    except Exception as exc:
        raise InputError(f"Keras 3 cannot load {path}: {exc}") from exc


def load_tf_keras(path: Path):
    import tf_keras
    try:
        return tf_keras.models.load_model(path, compile=False)
    except Exception as exc:
        raise InputError(f"tf-keras cannot load {path}: {exc}") from exc


def _translate_config(layer, tfk_cls) -> dict:
    cls_name = type(layer).__name__
    cfg = dict(layer.get_config())
    for old, new in _RENAMED.get(cls_name, {}).items():
        if old in cfg:
            cfg[new] = cfg.pop(old)
    if isinstance(cfg.get("dtype"), dict):
        cfg["dtype"] = cfg["dtype"].get("config", {}).get("name", "float32")
    accepted = set(inspect.signature(tfk_cls.__init__).parameters) | _BASE_KEYS
    out = {}
    for key, value in cfg.items():
        if key.endswith(("_initializer", "_regularizer", "_constraint")):
            continue                                   # weights are copied; training-only settings
        if key in accepted:
            out[key] = value
        elif key in _INFERENCE_NEUTRAL or value in (None, False, 0, "", [], {}):
            continue
        else:
            raise LoweringError(
                f"layer {layer.name!r} ({cls_name}): Keras 3 option {key}={value!r} has no tf-keras "
                "equivalent, so the layer cannot be lowered to the fused TFLite ops",
                hint=f"drop {key} from the layer, or build the model with tf-keras (TF_USE_LEGACY_KERAS=1)")
    return out


def _tf_keras_layer(layer):
    import tf_keras
    cls_name = type(layer).__name__
    tfk_cls = getattr(tf_keras.layers, cls_name, None)
    if tfk_cls is None:
        raise LoweringError(f"layer {layer.name!r} ({cls_name}) has no tf-keras counterpart",
                            hint="use built-in Keras layers, or build the model with tf-keras")
    try:
        return tfk_cls.from_config(_translate_config(layer, tfk_cls))
    except LoweringError:
        raise
    except Exception as exc:
        raise LoweringError(f"layer {layer.name!r} ({cls_name}) could not be rebuilt in tf-keras: {exc}",
                            hint="build the model with tf-keras (TF_USE_LEGACY_KERAS=1) and save it as .h5") from exc


def keras3_to_tf_keras(model):
    """Rebuild a Keras 3 functional or Sequential model as a tf-keras functional model with the same
    weights. Raises LoweringError naming the first layer (or non-layer op) that cannot be rebuilt."""
    import keras
    import tf_keras

    if not model.inputs:
        raise LoweringError(f"model {model.name!r} has no defined inputs",
                            hint="build the model with keras.Input(...) so its graph is known")
    mapping: dict[int, object] = {}
    rebuilt: dict[int, object] = {}
    for k3_in in model.inputs:
        mapping[id(k3_in)] = tf_keras.Input(batch_shape=tuple(k3_in.shape), dtype=k3_in.dtype,
                                            name=k3_in.name.split(":")[0])
    nodes = []
    func = getattr(model, "_functional", None) or model
    by_depth = getattr(func, "_nodes_by_depth", None)
    if by_depth is None:
        raise LoweringError(f"model {model.name!r} ({type(model).__name__}) is not a functional graph",
                            hint="subclassed models cannot be lowered; use the functional or Sequential API")
    for depth in sorted(by_depth, reverse=True):
        nodes.extend(by_depth[depth])
    for node in nodes:
        op = node.operation
        if isinstance(op, keras.layers.InputLayer):
            continue
        if not isinstance(op, keras.layers.Layer):
            raise LoweringError(f"operation {op.name!r} ({type(op).__name__}) is a raw keras.ops call, not a layer",
                                hint="replace it with the equivalent layer (e.g. keras.layers.Add instead of +)")
        if id(op) not in rebuilt:
            rebuilt[id(op)] = (_tf_keras_layer(op), op)
        tfk_layer = rebuilt[id(op)][0]
        args, kwargs = keras.tree.map_structure(
            lambda t: mapping[id(t)] if isinstance(t, keras.KerasTensor) else t,
            (node.arguments.args, node.arguments.kwargs))
        result = tfk_layer(*args, **kwargs)
        for k3_out, tfk_out in zip(keras.tree.flatten(node.outputs), keras.tree.flatten(result)):
            mapping[id(k3_out)] = tfk_out
    for tfk_layer, k3_layer in rebuilt.values():
        w = k3_layer.get_weights()
        if len(w) != len(tfk_layer.get_weights()):
            raise LoweringError(f"layer {k3_layer.name!r}: {len(w)} weights in Keras 3, "
                                f"{len(tfk_layer.get_weights())} in the tf-keras rebuild")
        tfk_layer.set_weights(w)
    outs = [mapping[id(t)] for t in model.outputs]
    ins = [mapping[id(t)] for t in model.inputs]
    return tf_keras.Model(ins if len(ins) > 1 else ins[0], outs if len(outs) > 1 else outs[0], name=model.name)


def check_rebuild(original, rebuilt, windows: np.ndarray, atol: float = 1e-4) -> float:
    """Max |difference| of the two models on ``windows`` over every output (outputs of different shapes are
    compared one by one); LoweringError above ``atol``."""
    def outs(model):
        y = model(windows, training=False)
        y = list(y.values()) if isinstance(y, dict) else (list(y) if isinstance(y, (list, tuple)) else [y])
        return [np.asarray(t, dtype=np.float64) for t in y]
    a, b = outs(original), outs(rebuilt)
    if [x.shape for x in a] != [x.shape for x in b]:
        raise LoweringError(f"the tf-keras rebuild of the Keras 3 model has outputs of shapes "
                            f"{[list(x.shape) for x in b]}, the model {[list(x.shape) for x in a]}",
                            hint="build the model with tf-keras")
    diff = max((float(np.max(np.abs(x - y))) for x, y in zip(a, b) if x.size), default=0.0)
    if not diff <= atol:
        raise LoweringError(f"the tf-keras rebuild of the Keras 3 model differs from it by {diff:.3g} "
                            f"(> {atol}) on calibration windows",
                            hint="a layer option was not carried over; build the model with tf-keras")
    return diff


# Recurrent layers TFLite has no fused op for: they become WHILE loops (and crash full-int8 conversion).
UNFUSABLE_RNN_FIX = {
    "GRU": "TFLite has no fused GRU: use LSTM, or pass unroll=True to the layer (static sequence length)",
    "SimpleRNN": "pass unroll=True to the layer (static sequence length)",
    "RNN": "pass unroll=True to the layer (static sequence length)",
    "ConvLSTM1D": "TFLite has no fused ConvLSTM: replace it with Conv + LSTM",
    "ConvLSTM2D": "TFLite has no fused ConvLSTM: replace it with Conv + LSTM",
}


# What to do with a GRU on each board family (issue 19), from edgehft's own placement predictions of
# tests/make_models.py's k3_gru_unrolled (a 20-step GRU(16) unrolled: 297 TFLite ops).
GRU_ON_BOARD = {
    "cpu": "pass unroll=True (it works on cpu: LiteRT runs the unrolled steps, ~15 ops each), or use LSTM, which "
           "runs on edgehft's native LSTM kernel, faster at the same size",
    "coral": "use LSTM: its UNIDIRECTIONAL_SEQUENCE_LSTM op maps to the Edge TPU, while an unrolled GRU's UNPACK and "
             "SPLIT_V ops are outside the Edge TPU op set (for a 20-step GRU(16), 294 of 297 ops fall back to the "
             "host, predicted)",
    "pynq": "use LSTM: the fabric's lstm_int8 kernel runs it, while an unrolled GRU leaves its gates on the ARM cores "
            "(the overlay runs dense and LSTM kernels: for a 20-step GRU(16), 293 of 297 ops, predicted)",
    "jetson": "pass unroll=True (it works on Jetson: TensorRT takes the unrolled graph, every node on the GPU, "
              "predicted), or use LSTM",
}


def recurrent_hint(cls: str, backend: str | None = None) -> str:
    """The fix a refusal of recurrent layer class ``cls`` names (:data:`UNFUSABLE_RNN_FIX`); for a GRU, what to do
    on the compile's board family ``backend`` (``cpu``, ``coral``, ``pynq``, ``jetson``; None or another: every
    family, :data:`GRU_ON_BOARD`)."""
    if cls != "GRU":
        return UNFUSABLE_RNN_FIX.get(cls, "unroll the loop")
    if backend in GRU_ON_BOARD:
        return f"TFLite has no fused GRU: {GRU_ON_BOARD[backend]}"
    return "TFLite has no fused GRU. " + "; ".join(f"on {k}: {v}" for k, v in GRU_ON_BOARD.items())


def check_recurrent_layers(model, backend: str | None = None) -> None:
    """Refuse, before conversion, recurrent layers that would lower to a TFLite WHILE loop; the hint says what
    works on the board family ``backend`` (:func:`recurrent_hint`).

    Raises:
        LoweringError: naming the layer and what to change.
    """
    for layer in model.layers:
        inner = getattr(layer, "forward_layer", None) or getattr(layer, "layer", None)
        for cand in (layer, inner):
            cls = type(cand).__name__ if cand is not None else ""
            if cls in UNFUSABLE_RNN_FIX and not getattr(cand, "unroll", False):
                raise LoweringError(f"layer {layer.name!r} ({cls}) cannot be lowered to a fused TFLite op: "
                                    "it would become a WHILE loop", hint=recurrent_hint(cls, backend))
