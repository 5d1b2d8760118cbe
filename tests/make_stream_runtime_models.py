"""Build the models the streaming runtime's bundle tests compile (run as a subprocess:
``python tests/make_stream_runtime_models.py OUTDIR``; tests/compile/test_streaming_runtime.py). Keras 3, each
``<name>.keras`` with ``<name>.npy``, 24 seeded random windows of its input for calibration:

- ``lstm_a``: benchmarks/lstm_a.py's STAC-ML LSTM_A (LSTM(100) x 2 over 50 x 100 rows, Dense(1)).
- ``lstm_bias``: LSTM(12, return_sequences) -> LSTM(9) -> Dense(2) with a non-zero bias, 10 x 7 rows (a head
  with a bias tensor: Keras' zero bias init leaves none in the TFLite graph).
- ``lstm_softmax``: LSTM(16) -> Dense(3, softmax), 12 x 5 rows (a head the executor does not compute natively).
- ``conv_lstm``: Conv1D(4, 3, same) -> LSTM(6) -> Dense(1), 8 x 3 rows (a conv front end before the LSTM).
- ``flatten_dense``: Conv1D(4, 3) -> Flatten -> Dense(2), 8 x 3 rows (cannot stream: the Dense reads every row).
"""
import sys
from pathlib import Path

import numpy as np

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import keras  # noqa: E402  (Keras 3)
from keras import layers  # noqa: E402
from lstm_a import build_lstm_a  # noqa: E402


def save(name, model):
    model.save(out / f"{name}.keras")
    shape = tuple(model.inputs[0].shape[1:])
    np.save(out / f"{name}.npy", rng.standard_normal((24, *shape)).astype(np.float32))


def seq(name, shape, *stack):
    inp = keras.Input(shape, name="x")
    h = inp
    for layer in stack:
        h = layer(h)
    return keras.Model(inp, h, name=name)


save("lstm_a", build_lstm_a())
keras.utils.set_random_seed(5)
m = seq("lstm_bias", (10, 7), layers.LSTM(12, return_sequences=True), layers.LSTM(9), layers.Dense(2, name="head"))
w, b = m.get_layer("head").get_weights()
m.get_layer("head").set_weights([w, rng.normal(0, 0.5, b.shape).astype(np.float32)])
save("lstm_bias", m)
save("lstm_softmax", seq("lstm_softmax", (12, 5), layers.LSTM(16), layers.Dense(3, activation="softmax")))
save("conv_lstm", seq("conv_lstm", (8, 3), layers.Conv1D(4, 3, padding="same", activation="tanh"), layers.LSTM(6),
                      layers.Dense(1)))
save("flatten_dense", seq("flatten_dense", (8, 3), layers.Conv1D(4, 3, activation="tanh"), layers.Flatten(),
                          layers.Dense(2)))
print("ok")
