"""Build the models the chain streaming tests compile (run as a subprocess:
``python tests/make_stream_chain_models.py OUTDIR``; tests/compile/test_streaming_chain.py). Keras 3, each
``<name>.keras`` with ``<name>.npy``, 24 seeded random windows of its input for calibration:

- ``conv1d_family``: Conv1D(8, 3, same, relu) -> Conv1D(8, 3, valid, tanh) -> MaxPool1D(2, stride 1, same) ->
  Conv1D(6, 3, causal) -> Dense(7, relu) per timestep -> LSTM(10) -> Dense(1), 16 x 5 rows (time shrinks to 14:
  the valid conv; the causal conv is a PAD before a valid conv; Conv1D runs time along the conv's W axis).
- ``conv1d_sigmoid``: Conv1D(4, 5, same, sigmoid) -> LSTM(6) -> Dense(2, softmax), 12 x 3 rows.
- ``strided``: Conv1D(4, 3, strides=2) -> LSTM(4) -> Dense(1), 12 x 3 rows (a stride along time: refused).
"""
import sys
from pathlib import Path

import numpy as np

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)

import keras  # noqa: E402  (Keras 3)
from keras import layers  # noqa: E402


def save(name, shape, *stack):
    inp = keras.Input(shape, name="x")
    h = inp
    for layer in stack:
        h = layer(h)
    keras.Model(inp, h, name=name).save(out / f"{name}.keras")
    np.save(out / f"{name}.npy", rng.standard_normal((24, *shape)).astype(np.float32))


keras.utils.set_random_seed(7)
save("conv1d_family", (16, 5), layers.Conv1D(8, 3, padding="same", activation="relu"),
     layers.Conv1D(8, 3, padding="valid", activation="tanh"), layers.MaxPool1D(2, strides=1, padding="same"),
     layers.Conv1D(6, 3, padding="causal"), layers.Dense(7, activation="relu"), layers.LSTM(10), layers.Dense(1))
save("conv1d_sigmoid", (12, 3), layers.Conv1D(4, 5, padding="same", activation="sigmoid"), layers.LSTM(6),
     layers.Dense(2, activation="softmax"))
save("strided", (12, 3), layers.Conv1D(4, 3, strides=2), layers.LSTM(4), layers.Dense(1))
