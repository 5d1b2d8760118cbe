"""A small MLP signal model as a Keras 3 functional model, with seeded random weights (untrained).

Input ``features`` (N, 64) float32 -> Dense 512 ReLU -> Dense 256 ReLU -> Dense 128 ReLU -> Dense 64 ReLU
-> ``signal`` Dense 1 linear: output (N, 1) float32. 205,825 parameters. It is the dense-only peer of
DeepLOB in ``benchmarks/cpu_peers.py``: latency there is mostly per-call overhead, not arithmetic.

    python examples/mlp/model.py build/mlp.keras
"""
from __future__ import annotations

import sys

INPUT_DIM = 64
HIDDEN = (512, 256, 128, 64)


def build_mlp(input_dim: int = INPUT_DIM, hidden: tuple[int, ...] = HIDDEN, seed: int = 0):
    """Return an uncompiled Keras 3 functional MLP (input ``features`` (N, 64), output ``signal`` (N, 1)).

    ``keras.utils.set_random_seed(seed)`` is called first, so the weights are the same on every build.
    """
    import keras
    from keras import layers

    keras.utils.set_random_seed(seed)
    inp = keras.Input((input_dim,), name="features")
    x = inp
    for k, units in enumerate(hidden):
        x = layers.Dense(units, activation="relu", name=f"dense_{k}")(x)
    out = layers.Dense(1, name="signal")(x)
    return keras.Model(inp, out, name="mlp")


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].endswith(".keras"):
        print("usage: python examples/mlp/model.py OUT.keras", file=sys.stderr)
        return 2
    from pathlib import Path
    out = Path(argv[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    model = build_mlp()
    model.save(out)
    print(f"saved {out} ({model.count_params():,} parameters)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
