"""Build the small tf-keras models of the FPGA kernels' stress tests, converted to full int8 (the
``kernel_models`` fixture of tests/kernel_io.py runs ``python tests/make_kernel_models.py OUTDIR`` in a
subprocess, so TensorFlow stays out of the pytest process): dense_pc / dense_pt (Dense relu, relu6, none;
per-channel and per-tensor), dense_lin (one linear Dense), lstm_seq (LSTM(32), sequences) and lstm_dense
(LSTM(24) -> Dense(4)), each a ``NAME.tflite``."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np


def _build_models(out: Path) -> None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf
    import tf_keras as keras

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(3)

    def convert(model, calib, name, per_tensor_dense=False):
        conv = tf.lite.TFLiteConverter.from_keras_model(model)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = lambda: ([c[None].astype(np.float32)] for c in calib)
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = conv.inference_output_type = tf.int8
        if per_tensor_dense:
            conv._experimental_disable_per_channel_quantization_for_dense_layers = True
        (out / f"{name}.tflite").write_bytes(conv.convert())

    inp = keras.Input((16,), batch_size=1)                  # Dense only: relu, relu6, none
    h = keras.layers.Dense(24, activation="relu")(inp)      # zero bias: the converter drops it
    d2, d3 = keras.layers.Dense(12, activation=tf.nn.relu6), keras.layers.Dense(5)
    mlp = keras.Model(inp, d3(d2(h)))
    for d in (d2, d3):                                      # nonzero biases for the others
        w, b = d.get_weights()
        d.set_weights([w, rng.normal(0.0, 0.3, b.shape).astype(np.float32)])
    calib = rng.uniform(-0.5, 3.0, (64, 16)).astype(np.float32)   # asymmetric: nonzero input zero point
    convert(mlp, calib, "dense_pc")
    convert(mlp, calib, "dense_pt", per_tensor_dense=True)
    inp = keras.Input((16,), batch_size=1)                  # one linear Dense: negative outputs kept
    lin = keras.layers.Dense(8)
    model = keras.Model(inp, lin(inp))
    lin.set_weights([lin.get_weights()[0], rng.normal(0.0, 0.5, 8).astype(np.float32)])
    convert(model, calib, "dense_lin")
    calib = (rng.standard_normal((64, 20, 16)) * 1.5 + 0.3).astype(np.float32)
    inp = keras.Input((20, 16), batch_size=1)
    convert(keras.Model(inp, keras.layers.LSTM(32, return_sequences=True)(inp)), calib, "lstm_seq")
    inp = keras.Input((20, 16), batch_size=1)
    convert(keras.Model(inp, keras.layers.Dense(4)(keras.layers.LSTM(24)(inp))), calib, "lstm_dense")


if __name__ == "__main__":
    _build_models(Path(sys.argv[1]))
