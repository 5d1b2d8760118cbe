"""Build the small models the tests compile, in both Keras flavours (run as a subprocess:
``python tests/make_models.py OUTDIR``). Shapes: input (20, 8) float32, output (3,) softmax."""
import sys
from pathlib import Path

import numpy as np

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
np.save(out / "calib.npy", rng.standard_normal((96, 20, 8)).astype(np.float32))
np.save(out / "calib_mlp.npy", rng.standard_normal((96, 16)).astype(np.float32))

import keras  # Keras 3
import tf_keras  # Keras 2 (tf-keras), side by side

keras.utils.set_random_seed(1)


def k3_seq(rnn_cls, name):
    inp = keras.Input((20, 8), name="x")
    h = keras.layers.Conv1D(8, 3, padding="same", activation="relu")(inp)
    h = rnn_cls(16, name=name)(h)
    out_ = keras.layers.Dense(3, activation="softmax", name="probs")(h)
    return keras.Model(inp, out_)


k3_seq(keras.layers.LSTM, "lstm").save(out / "k3_lstm.keras")
k3_seq(keras.layers.GRU, "gru").save(out / "k3_gru.keras")
seq = keras.Sequential([keras.Input((20, 8), name="x"), keras.layers.LSTM(12, name="lstm"),
                        keras.layers.Dense(3, activation="softmax", name="probs")])
seq.save(out / "k3_seq_lstm.keras")

inp = keras.Input((20, 8), name="x")         # LSTM and Dense are the whole graph (the FPGA takes both)
h = keras.layers.LSTM(16, return_sequences=True, name="lstm")(inp)
keras.Model(inp, keras.layers.Dense(4, name="head")(h)).save(out / "k3_lstm_dense.keras")

inp = keras.Input((20, 8), name="x")
h = keras.layers.LSTM(16)(inp)
h = h * 2.0                                  # a raw keras.ops call, not a layer
keras.Model(inp, keras.layers.Dense(3, activation="softmax")(h)).save(out / "k3_rawop.keras")

inp = keras.Input((16,), name="features")
h = keras.layers.Dense(128, activation="relu")(inp)   # > 1024 weights: dynamic range quantizes it
mlp = keras.Model(inp, keras.layers.Dense(1, name="signal")(h))
mlp.save(out / "k3_mlp.keras")
mlp.export(out / "k3_mlp_savedmodel")                  # a plain SavedModel: no Keras metadata
inp = keras.Input((16,), name="features")               # two heads of one value each: the converter lists them (b, a)
h = keras.layers.Dense(32, activation="relu")(inp)
keras.Model(inp, [keras.layers.Dense(1, name="a")(h), keras.layers.Dense(1, name="b")(h)]).save(out / "k3_two_heads.keras")
heads = [keras.layers.Dense(3, name="z_first")(h), keras.layers.Dense(1, name="a_second")(h),
         keras.layers.Reshape((2, 4), name="m_third")(keras.layers.Dense(8)(h))]   # three shapes, not sorted by name
keras.Model(inp, heads).save(out / "k3_three_heads.keras")

tf_keras.utils.set_random_seed(1)
inp = tf_keras.Input((20, 8), name="x")
h = tf_keras.layers.Conv1D(8, 3, padding="same", activation="relu")(inp)
h = tf_keras.layers.LSTM(16, name="lstm")(h)
m = tf_keras.Model(inp, tf_keras.layers.Dense(3, activation="softmax", name="probs")(h))
m.save(out / "tfk_lstm.h5")
m.save(out / "tfk_lstm_savedmodel")                    # tf-keras SavedModel (keras_metadata.pb)
inp = tf_keras.Input((20, 8), name="x")
h = tf_keras.layers.GRU(16, name="gru")(inp)
tf_keras.Model(inp, tf_keras.layers.Dense(3, activation="softmax")(h)).save(out / "tfk_gru.h5")
print("ok")

# DeepLOB's shape in small: Conv2D (width-striding and kx1 SAME) + LeakyReLU, a max pool, two branches
# concatenated, an LSTM
inp = keras.Input((20, 8), name="x")
h = keras.layers.Reshape((20, 8, 1))(inp)
h = keras.layers.LeakyReLU(0.01)(keras.layers.Conv2D(16, (1, 2), strides=(1, 2), name="conv_a")(h))
h = keras.layers.LeakyReLU(0.01)(keras.layers.Conv2D(16, (4, 1), padding="same", name="conv_b")(h))
h = keras.layers.MaxPooling2D((3, 1), strides=(1, 1), padding="same")(h)
h = keras.layers.Concatenate()([keras.layers.Conv2D(16, (1, 4), name="conv_c")(h),
                               keras.layers.Conv2D(8, (1, 4), name="conv_d")(h)])
h = keras.layers.Reshape((20, 24))(h)
h = keras.layers.LSTM(16, name="lstm")(h)
keras.Model(inp, keras.layers.Dense(3, activation="softmax", name="probs")(h)).save(out / "k3_cnn_lstm.keras")

# A concatenation with a constant operand (a SavedModel of plain TF ops): the native concat must not take it
import tensorflow as tf  # noqa: E402

_w1 = tf.constant(rng.standard_normal((3, 3, 1, 4)).astype(np.float32) * 0.3)
_w2 = tf.constant(rng.standard_normal((3, 3, 6, 4)).astype(np.float32) * 0.3)
_cst = tf.constant(rng.standard_normal((1, 20, 8, 2)).astype(np.float32))
_wd = tf.constant(rng.standard_normal((20 * 8 * 4, 3)).astype(np.float32) * 0.05)


class ConstConcat(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec((1, 20, 8), tf.float32, name="x")])
    def __call__(self, x):
        y = tf.nn.leaky_relu(tf.nn.conv2d(tf.reshape(x, (1, 20, 8, 1)), _w1, 1, "SAME"), 0.1)
        y = tf.nn.leaky_relu(tf.nn.conv2d(tf.concat([y, _cst], axis=-1), _w2, 1, "SAME"), 0.1)
        return {"probs": tf.nn.softmax(tf.matmul(tf.reshape(y, (1, -1)), _wd))}


_m = ConstConcat()
tf.saved_model.save(_m, str(out / "constcat_savedmodel"), signatures={"serving_default": _m.__call__})

# Last, so the models above keep the weights the seed gave them before it was added (their drift figures are
# asserted): ~300 ops, 20 steps unrolled (issue 19's report).
keras.utils.set_random_seed(2)
k3_seq(lambda units, name: keras.layers.GRU(units, unroll=True, name=name), "gru").save(
    out / "k3_gru_unrolled.keras")
