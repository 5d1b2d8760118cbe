"""Train DeepLOB on the shipped Binance COIN-M BTCUSD_PERP depth capture (2 cores: ~10 minutes).

    python examples/deeplob/train.py [--epochs 8] [--out examples/deeplob/deeplob.keras]

Train on 2024-08-08 23:54-24:00 UTC (last 15 % of it for validation / early stopping), test on the
following, unseen 2024-08-09 00:00-00:05 UTC capture. Prints test accuracy, the majority-class baseline
and the confusion matrix, and writes them to ``training.json`` beside the model.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TRAIN_FEED = HERE / "data" / "btcusd_perp_20240808_depth.gz"
TEST_FEED = HERE / "data" / "btcusd_perp_20240809_depth.gz"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=HERE / "deeplob.keras")
    args = ap.parse_args()

    import keras
    import features
    from model import build_deeplob

    keras.utils.set_random_seed(args.seed)
    # the test day continues the training day: one stream, so the book carries over
    allw = features.windows_from_feed([TRAIN_FEED, TEST_FEED], labels=True)
    day1_end = features.read_book_events([TRAIN_FEED])[1][-1]
    is_train = allw["t_ns"] <= day1_end
    x, y = allw["x"][is_train], allw["y"][is_train]
    # drop the last HORIZON training windows: their labels look into the test period
    x, y = x[: -features.HORIZON], y[: -features.HORIZON]
    xt, yt = allw["x"][~is_train], allw["y"][~is_train]
    n_val = int(0.15 * len(x))
    xtr, ytr, xva, yva = x[:-n_val], y[:-n_val], x[-n_val:], y[-n_val:]
    counts = np.bincount(ytr, minlength=3)
    weights = {k: float(len(ytr) / (3 * max(c, 1))) for k, c in enumerate(counts)}
    print(f"train {len(xtr)} val {len(xva)} test {len(xt)} windows; train classes {counts.tolist()}")

    model = build_deeplob()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    t0 = time.time()
    model.fit(xtr, ytr, validation_data=(xva, yva), epochs=args.epochs, batch_size=args.batch,
              class_weight=weights, verbose=2,
              callbacks=[keras.callbacks.EarlyStopping(patience=3, restore_best_weights=True)])
    pred = model.predict(xt, batch_size=256, verbose=0).argmax(axis=1)
    acc = float((pred == yt).mean())
    baseline = float(np.bincount(yt, minlength=3).max() / len(yt))
    cm = np.zeros((3, 3), dtype=int)
    np.add.at(cm, (yt, pred), 1)
    recall = (np.diag(cm) / np.maximum(cm.sum(1), 1))
    result = {"test_windows": int(len(yt)), "test_accuracy": round(acc, 4),
              "majority_baseline": round(baseline, 4),
              "balanced_accuracy": round(float(recall.mean()), 4),
              "confusion_rows_true_cols_pred": cm.tolist(), "epochs_run": len(model.history.epoch),
              "train_seconds": round(time.time() - t0, 1), "labels": ["up", "stationary", "down"],
              "horizon_events": features.HORIZON, "alpha": features.ALPHA}
    print(json.dumps(result, indent=1))
    model.save(args.out)
    (args.out.parent / "training.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
