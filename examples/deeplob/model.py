"""DeepLOB (Zhang, Zohren & Roberts 2019, IEEE TSP 67(11)) as a Keras 3 model, without dropout.

Input (N, 100, 40, 1) float32: 100 book events x 10 levels x (ask price, ask size, bid price, bid size).
Output (N, 3) softmax over (up, stationary, down). 142,435 parameters, as in the paper's TF notebook:
three conv blocks (LeakyReLU 0.01), an inception module of 3 towers x 64 channels, LSTM(64), Dense(3).
The notebook's Dropout(0.2) before the LSTM is left out: it only matters in training and the paper's
inference path does not use it.
"""
from __future__ import annotations


def build_deeplob(lstm_units: int = 64, window: int = 100, features: int = 40):
    """Return an uncompiled Keras 3 functional DeepLOB model (input name ``lob``, output ``signal``)."""
    import keras
    from keras import layers

    def conv(x, filters, kernel, strides=(1, 1), padding="valid"):
        x = layers.Conv2D(filters, kernel, strides=strides, padding=padding)(x)
        return layers.LeakyReLU(negative_slope=0.01)(x)

    inp = keras.Input((window, features, 1), name="lob")
    x = conv(inp, 32, (1, 2), strides=(1, 2))
    x = conv(x, 32, (4, 1), padding="same")
    x = conv(x, 32, (4, 1), padding="same")
    x = conv(x, 32, (1, 2), strides=(1, 2))
    x = conv(x, 32, (4, 1), padding="same")
    x = conv(x, 32, (4, 1), padding="same")
    x = conv(x, 32, (1, features // 4))
    x = conv(x, 32, (4, 1), padding="same")
    x = conv(x, 32, (4, 1), padding="same")
    t1 = conv(conv(x, 64, (1, 1), padding="same"), 64, (3, 1), padding="same")
    t2 = conv(conv(x, 64, (1, 1), padding="same"), 64, (5, 1), padding="same")
    t3 = layers.MaxPooling2D((3, 1), strides=(1, 1), padding="same")(x)
    t3 = conv(t3, 64, (1, 1), padding="same")
    x = layers.Concatenate(axis=-1)([t1, t2, t3])
    x = layers.Reshape((window, 192))(x)
    x = layers.LSTM(lstm_units)(x)
    out = layers.Dense(3, activation="softmax", name="signal")(x)
    return keras.Model(inp, out, name="deeplob")
