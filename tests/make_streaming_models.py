"""Build the small models the streaming-analysis tests compile (run as a subprocess:
``python tests/make_streaming_models.py OUTDIR``). Every model is Keras 3 (the compiler rebuilds it in tf-keras)
except where a file name starts with ``tfk_`` (built with tf-keras directly); each ``<name>.keras`` / ``.h5``
comes with ``<name>.npy``, 24 seeded random windows of its input shape. Time is axis 1 and T = 8 rows
everywhere, so a reader can derive every op's rows by hand (tests/compile/test_streaming_analysis.py does).
Activations are tanh / LeakyReLU (never relu), so a perturbed row shows in every row that reads it.
"""
import sys
from pathlib import Path

import numpy as np

T, F = 8, 3
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)

import keras  # noqa: E402  (Keras 3)
from keras import layers  # noqa: E402

keras.utils.set_random_seed(3)


def save(name, model):
    model.save(out / f"{name}.keras")
    shape = tuple(model.inputs[0].shape[1:])
    np.save(out / f"{name}.npy", rng.standard_normal((24, *shape)).astype(np.float32))


def seq(name, *stack, shape=(T, F)):
    """A functional model: ``x`` through the layers in ``stack``, in order."""
    inp = keras.Input(shape, name="x")
    h = inp
    for layer in stack:
        h = layer(h)
    save(name, keras.Model(inp, h, name=name))


seq("conv1d_valid", layers.Conv1D(4, 3, padding="valid", activation="tanh"),
    layers.Conv1D(2, 2, padding="valid", activation="tanh"))
seq("conv1d_same", layers.Conv1D(4, 4, padding="same", activation="tanh"),
    layers.Conv1D(4, 3, padding="same", dilation_rate=2, activation="tanh"))
seq("conv1d_causal", layers.Conv1D(4, 3, padding="causal", activation="tanh"),
    layers.Conv1D(2, 2, padding="causal", dilation_rate=2, activation="tanh"))
seq("conv2d_pool", layers.Conv2D(4, (3, 2), padding="same"), layers.LeakyReLU(0.1),
    layers.MaxPooling2D((2, 1), strides=(1, 1), padding="same"),
    layers.AveragePooling2D((3, 2), strides=(1, 2), padding="valid"), shape=(T, 6, 1))
seq("dense_steps", layers.Dense(5, activation="tanh"), layers.Dense(2))
seq("lstm_head", layers.Conv1D(4, 3, padding="same", activation="tanh"), layers.LSTM(5, return_sequences=True),
    layers.LSTM(4), layers.Dense(2, activation="softmax"))
seq("gap_head", layers.Conv1D(4, 3, activation="tanh"), layers.GlobalAveragePooling1D(), layers.Dense(2))
seq("crop", layers.Conv1D(4, 3, padding="same", activation="tanh"), layers.Cropping1D((1, 1)), layers.Dense(2))
seq("lag", layers.Conv1D(4, 3, activation="tanh"), layers.Cropping1D((0, 1)), layers.Dense(2))
seq("permute_dense", layers.Permute((2, 1)), layers.Dense(4))
seq("flatten_dense", layers.Conv1D(4, 3, activation="tanh"), layers.Flatten(), layers.Dense(2))
seq("stride2", layers.Conv1D(4, 3, strides=2, activation="tanh"), layers.Dense(2))
seq("long_kernel", layers.Conv1D(4, T, activation="tanh"), layers.Dense(2))

# Big enough (>= 1024 weights) for dynamic-range quantization to make the ops hybrid (int8 weights, float
# activations): the per-timestep Dense and the LSTM quantize their input per row / per step, the conv per window.
seq("wide_steps", layers.Dense(64, activation="tanh"), layers.LSTM(40, return_sequences=True), layers.Dense(2),
    shape=(T, 32))
seq("wide_conv", layers.Conv1D(64, 3, padding="same", activation="tanh"), layers.Dense(2), shape=(T, 32))

inp = keras.Input((T, F), name="x")        # dot-product self-attention over the window
h = layers.Dense(4)(inp)
save("attention", keras.Model(inp, layers.Attention()([h, h]), name="attention"))

import tf_keras  # noqa: E402  (Keras 2, for the layer Keras 3 cannot hand over to the tf-keras rebuild)

tf_keras.utils.set_random_seed(3)
inp = tf_keras.Input((T, F), name="x")
h = tf_keras.layers.Bidirectional(tf_keras.layers.LSTM(4))(inp)
m = tf_keras.Model(inp, tf_keras.layers.Dense(2)(h), name="tfk_bidir")
m.save(out / "tfk_bidir.h5")
np.save(out / "tfk_bidir.npy", rng.standard_normal((24, T, F)).astype(np.float32))
print("ok")
