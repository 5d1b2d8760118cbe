"""Small full-integer TFLite models that are odd but valid Edge TPU compiler inputs (run as a subprocess:
``python tests/make_odd_edgetpu_models.py OUTDIR``). Built with tf-keras (the classic TFLite op set), int8 I/O.

- ``resize_xnnpack_refuses``: a 1x1 conv, then a bilinear resize to a width of 2**24, which LiteRT's XNNPACK
  delegate refuses to prepare (its resize takes outputs below 2**24 per side); LiteRT's builtin kernel runs it.
- ``batch4``: a conv stack with a static batch of 4.
- ``tcn_dilated``: a temporal conv stack over (1, T, 1, C): 3x1 kernels with dilation (2, 1) and (4, 1).
- ``dilated_3x3_unequal``: a 3x3 kernel with dilation (2, 1), where the unequal dilation does matter.
"""
import os
import sys
from pathlib import Path

os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as K  # noqa: E402

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
K.utils.set_random_seed(5)
L = K.layers


def convert(model, name):
    shape = tuple(model.input_shape)
    rng = np.random.default_rng(0)

    def rep():
        for _ in range(4):
            yield [rng.standard_normal(shape).astype(np.float32)]
    c = tf.lite.TFLiteConverter.from_keras_model(model)
    c.optimizations = [tf.lite.Optimize.DEFAULT]
    c.representative_dataset = rep
    c.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    c.inference_input_type = tf.int8
    c.inference_output_type = tf.int8
    (out / f"{name}.tflite").write_bytes(c.convert())


inp = L.Input(batch_shape=(1, 1, 2, 2), name="x")
h = L.Conv2D(1, 1, name="conv")(inp)
convert(K.Model(inp, L.UpSampling2D(size=(1, 1 << 23), interpolation="bilinear", name="up")(h)),
        "resize_xnnpack_refuses")

inp = L.Input(batch_shape=(4, 16, 16, 3), name="x")
h = L.ReLU(name="relu")(L.Conv2D(4, 3, padding="same", name="conv_a")(inp))
convert(K.Model(inp, L.Conv2D(2, 1, name="conv_b")(h)), "batch4")

inp = L.Input(batch_shape=(1, 32, 1, 4), name="x")
h = L.ReLU(name="relu_a")(L.Conv2D(8, (3, 1), dilation_rate=(2, 1), padding="same", name="tcn_a")(inp))
h = L.ReLU(name="relu_b")(L.Conv2D(8, (3, 1), dilation_rate=(4, 1), padding="same", name="tcn_b")(h))
convert(K.Model(inp, L.Conv2D(2, 1, name="head")(h)), "tcn_dilated")

inp = L.Input(batch_shape=(1, 16, 16, 4), name="x")
h = L.ReLU(name="relu")(L.Conv2D(4, 3, dilation_rate=(2, 1), padding="same", name="conv_d")(inp))
convert(K.Model(inp, L.Conv2D(2, 1, name="head")(h)), "dilated_3x3_unequal")
print("ok")
