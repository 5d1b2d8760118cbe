"""Build tf-keras LSTM models for tests/compile/test_native_lstm_keras.py: ``python make_native_lstm_models.py OUT``.

For each model: ``NAME.npz`` (per-layer Keras weights W{l}, U{l}, b{l}; X (8, T, in) float32 windows;
Y the Keras outputs, batch 1 each) and ``NAME.tflite`` (the float TFLite conversion: each LSTM becomes
one UNIDIRECTIONAL_SEQUENCE_LSTM op). Random seeded weights, non-zero biases. Importing this module
does not import TensorFlow (the tests use :func:`saturating`)."""
import os
import sys

import numpy as np

SHAPES = {  # name: (T, in, hidden per layer, last layer's return_sequences)
    "stack": (20, 13, [7, 100], True),
    "deeplob_lstm": (100, 192, [64], False),
    "saturating": (30, 5, [9], True),       # c climbs past the converter's cell_clip of 10, then falls
}


def saturating(W, U, b, X):
    """In place: i, f ~ 1 (biases 6); g = tanh(3 * x[0]) ~ +-1 with x[0] = +1 for the first half of the
    steps, then -1: c climbs ~1 per step to ~15 (or to a clip of 10) and falls back, so a clip shows in
    h at the end. W (in, 4H), U (H, 4H), b (4H,), X (N, T, in)."""
    H = U.shape[0]
    W[:] = 0
    W[0, 2 * H:3 * H] = 3.0
    U *= 0.05
    b[:] = np.concatenate([np.full(H, 6.0), np.full(H, 6.0), np.zeros(2 * H)])
    X[:, :, 0] = np.where(np.arange(X.shape[1]) < X.shape[1] // 2, 1.0, -1.0)


def main(out: str) -> None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    import tf_keras as keras
    os.makedirs(out, exist_ok=True)
    for name, (T, IN, hs, last_seq) in SHAPES.items():
        rng = np.random.default_rng(3)
        keras.utils.set_random_seed(1)
        inp = keras.Input((T, IN), batch_size=1)
        y = inp
        for li, h in enumerate(hs):
            y = keras.layers.LSTM(h, return_sequences=(li < len(hs) - 1) or last_seq)(y)
        m = keras.Model(inp, y)
        lstms = [layer for layer in m.layers if isinstance(layer, keras.layers.LSTM)]
        X = rng.normal(0, 1, (8, T, IN)).astype(np.float32)
        wts = {}
        for li, layer in enumerate(lstms):
            W, U, b = layer.get_weights()
            b = rng.normal(0, 0.3, b.shape).astype(np.float32)
            if name == "saturating":
                saturating(W, U, b, X)
            layer.set_weights([W, U, b])
            wts[f"W{li}"], wts[f"U{li}"], wts[f"b{li}"] = W, U, b
        Y = np.stack([m(X[i:i + 1], training=False).numpy()[0] for i in range(len(X))])
        np.savez(os.path.join(out, f"{name}.npz"), X=X, Y=Y, **wts)
        with open(os.path.join(out, f"{name}.tflite"), "wb") as f:
            f.write(tf.lite.TFLiteConverter.from_keras_model(m).convert())


if __name__ == "__main__":
    main(sys.argv[1])
