"""Build the small .tflite models the model-validation fuzz mutates (run as a subprocess:
``python tests/make_fuzz_models.py OUTDIR``): a Keras 3 MLP (16 -> 32 ReLU -> 3 softmax) converted by the
TFLite converter to full int8 (``mlp_int8.tflite``, int8 I/O) and to float32 (``mlp_float.tflite``), and
``calib.npy``, 32 float32 windows (16,)."""
import sys
from pathlib import Path

import numpy as np

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
calib = rng.standard_normal((32, 16)).astype(np.float32)
np.save(out / "calib.npy", calib)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

keras.utils.set_random_seed(3)
inp = keras.Input((16,), name="features", batch_size=1)
h = keras.layers.Dense(32, activation="relu", name="hidden")(inp)
model = keras.Model(inp, keras.layers.Dense(3, activation="softmax", name="probs")(h))

conv = tf.lite.TFLiteConverter.from_keras_model(model)
(out / "mlp_float.tflite").write_bytes(conv.convert())

conv = tf.lite.TFLiteConverter.from_keras_model(model)
conv.optimizations = [tf.lite.Optimize.DEFAULT]
conv.representative_dataset = lambda: ([calib[i:i + 1]] for i in range(len(calib)))
conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
conv.inference_input_type = tf.int8
conv.inference_output_type = tf.int8
(out / "mlp_int8.tflite").write_bytes(conv.convert())
print("ok")
