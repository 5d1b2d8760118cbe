"""Drift check: the quantized model against the float Keras model on held-out windows."""
from __future__ import annotations

import numpy as np

from edgehft.report import Drift, DriftOutput


def measure_drift(float_outs: list[np.ndarray], quant_outs: list[np.ndarray], names: list[str],
                  classifier: list[bool], threshold_rel_mae: float, reference: str, candidate: str) -> Drift:
    """Per output: MAE, MAE relative to the float output's range over the windows, max |error|,
    and for classifier outputs the share of windows whose argmax agrees.

    Args:
        float_outs / quant_outs: per output, float arrays (N, ...) of the same shape (quantized
            outputs already dequantized).
        threshold_rel_mae: the gate, e.g. 0.01 for 1 %; ``passed`` is False if any output exceeds it.
    """
    outs = []
    for name, f, q, cls in zip(names, float_outs, quant_outs, classifier):
        f = np.asarray(f, dtype=np.float64).reshape(len(f), -1)
        q = np.asarray(q, dtype=np.float64).reshape(len(q), -1)
        if f.shape != q.shape:
            raise ValueError(f"output {name}: float {f.shape} vs quantized {q.shape}")
        err = np.abs(q - f)
        rng = float(f.max() - f.min()) if f.size else 0.0
        mae = float(err.mean()) if err.size else 0.0
        agree = float((f.argmax(axis=1) == q.argmax(axis=1)).mean()) if cls and f.shape[1] > 1 else None
        outs.append(DriftOutput(name=name, mae=mae, mae_rel=mae / rng if rng > 0 else 0.0,
                                max_abs=float(err.max()) if err.size else 0.0, float_range=rng,
                                argmax_agreement=agree))
    passed = all(o.mae_rel <= threshold_rel_mae for o in outs)
    return Drift(windows=int(len(float_outs[0])) if float_outs else 0, threshold_rel_mae=threshold_rel_mae,
                 passed=passed, reference=reference, candidate=candidate, outputs=outs)
