"""Tiny full-integer TFLite models that each exercise one Edge TPU compiler rule (run as a subprocess:
``python tests/make_edgetpu_models.py OUTDIR``). Built with tf-keras so the converter output is the
classic TFLite op set; int8 I/O unless the name says float_io."""
import os
import sys
from pathlib import Path

os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as K  # noqa: E402

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
K.utils.set_random_seed(3)
L = K.layers


def convert(model, name, float_io=False):
    shape = (1, *model.input_shape[1:])
    rng = np.random.default_rng(0)

    def rep():
        for _ in range(16):
            yield [rng.standard_normal(shape).astype(np.float32)]
    c = tf.lite.TFLiteConverter.from_keras_model(model)
    c.optimizations = [tf.lite.Optimize.DEFAULT]
    c.representative_dataset = rep
    c.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if not float_io:
        c.inference_input_type = tf.int8
        c.inference_output_type = tf.int8
    (out / f"{name}.tflite").write_bytes(c.convert())


def conv_stack(act, batch_shape=(1, 8, 8, 4)):
    inp = L.Input(batch_shape=batch_shape, name="x")
    h = L.Conv2D(4, 3, padding="same", name="conv_a")(inp)
    h = act(h)
    h = L.Conv2D(4, 3, padding="same", name="conv_b")(h)
    return K.Model(inp, L.ReLU(name="out_relu")(h))


convert(conv_stack(L.PReLU(name="prelu")), "prelu_unshared")
convert(conv_stack(L.PReLU(shared_axes=[1, 2], name="prelu")), "prelu_shared")
convert(conv_stack(L.PReLU(shared_axes=[1, 2], name="prelu")), "prelu_shared_float_io", float_io=True)

inp = L.Input(batch_shape=(1, 4, 8), name="x")
h = L.Conv1D(8, 1, name="conv")(inp)
convert(K.Model(inp, L.Softmax(axis=-1, name="probs")(h)), "softmax_2d")

inp = L.Input(batch_shape=(1, 4, 8), name="x")
h = L.Conv1D(8, 1, name="conv")(inp)
h = L.Permute((2, 1), name="permute")(h)
convert(K.Model(inp, L.Conv1D(4, 1, name="conv_out")(h)), "transpose")

inp = L.Input(batch_shape=(1, 2, 3, 4, 5), name="x")
convert(K.Model(inp, L.Add(name="add")([inp, inp])), "rank5")

# Two branches from the input; the first has an op the Edge TPU cannot run. The second branch comes
# later in graph order but does not depend on it, so it still maps.
inp = L.Input(batch_shape=(1, 8, 8, 4), name="x")
a = L.LeakyReLU(0.1, name="leaky")(L.Conv2D(4, 3, padding="same", name="conv_a")(inp))
b = L.ReLU(name="relu_b")(L.Conv2D(4, 3, padding="same", name="conv_b")(inp))
convert(K.Model(inp, [L.Conv2D(2, 1, name="head_a")(a), L.Conv2D(2, 1, name="head_b")(b)]), "branches")
print("ok")
