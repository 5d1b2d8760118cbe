"""Build tf-keras LSTM models for tests/test_native_lstm.py: ``python make_native_lstm_models.py OUT``.

For each model: ``NAME.npz`` (per-layer Keras weights W{l}, U{l}, b{l}; X (8, T, in) float32 windows;
Y the Keras outputs, batch 1 each) and ``NAME.tflite`` (the float TFLite conversion: each LSTM becomes
one UNIDIRECTIONAL_SEQUENCE_LSTM op). Random seeded weights, non-zero biases."""
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
SHAPES = {  # name: (T, in, hidden per layer, last layer's return_sequences)
    "stack": (20, 13, [7, 100], True),
    "deeplob_lstm": (100, 192, [64], False),
}
for name, (T, IN, hs, last_seq) in SHAPES.items():
    rng = np.random.default_rng(3)
    keras.utils.set_random_seed(1)
    inp = keras.Input((T, IN), batch_size=1)
    y = inp
    for li, h in enumerate(hs):
        y = keras.layers.LSTM(h, return_sequences=(li < len(hs) - 1) or last_seq)(y)
    m = keras.Model(inp, y)
    wts, li = {}, 0
    for layer in m.layers:
        if isinstance(layer, keras.layers.LSTM):
            W, U, b = layer.get_weights()
            b = rng.normal(0, 0.3, b.shape).astype(np.float32)
            layer.set_weights([W, U, b])
            wts[f"W{li}"], wts[f"U{li}"], wts[f"b{li}"] = W, U, b
            li += 1
    X = rng.normal(0, 1, (8, T, IN)).astype(np.float32)
    Y = np.stack([m(X[i:i + 1], training=False).numpy()[0] for i in range(len(X))])
    np.savez(os.path.join(OUT, f"{name}.npz"), X=X, Y=Y, **wts)
    with open(os.path.join(OUT, f"{name}.tflite"), "wb") as f:
        f.write(tf.lite.TFLiteConverter.from_keras_model(m).convert())
