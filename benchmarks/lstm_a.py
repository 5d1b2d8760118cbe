"""The STAC-ML Markets (Inference) LSTM_A shape as a Keras 3 model with seeded random weights.

Input ``x`` (N, 50, 100) float32 -> LSTM(100, return_sequences) -> LSTM(100) -> ``signal`` Dense(1). The
weights are random (the STAC models' are not public): the shape, not the numbers, is what the latency
figures depend on. Audited STAC p99 records for this shape: A100 35.2 µs, FPGA (Myrtle VOLLO) 5.07 µs,
GH200 4.6 µs.

    python benchmarks/lstm_a.py build/lstm_a.keras
"""
from __future__ import annotations

import sys

STEPS, FEATURES, UNITS = 50, 100, 100


def build_lstm_a(seed: int = 0):
    """An uncompiled Keras 3 functional model (input ``x`` (N, 50, 100), output ``signal`` (N, 1))."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(seed)
    inp = keras.Input((STEPS, FEATURES), name="x")
    h = layers.LSTM(UNITS, return_sequences=True, name="lstm_0")(inp)
    h = layers.LSTM(UNITS, name="lstm_1")(h)
    out = layers.Dense(1, name="signal")(h)
    return keras.Model(inp, out, name="lstm_a")


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].endswith(".keras"):
        print("usage: python benchmarks/lstm_a.py OUT.keras", file=sys.stderr)
        return 2
    from pathlib import Path
    out = Path(argv[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    model = build_lstm_a()
    model.save(out)
    print(f"saved {out} ({model.count_params():,} parameters)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
