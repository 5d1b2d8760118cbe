"""Golden vectors: run the int8 model on the cpu runtime (the reference path) and keep raw inputs and
outputs; compare them with LiteRT's reference kernels.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from edgehft.bundle import Bundle
from edgehft.runtime import cpu as cpu_runtime


@dataclass
class GoldenRun:
    inputs: list[np.ndarray]          # raw (quantized) model inputs, (count, *shape[1:]) each
    outputs: list[np.ndarray]         # raw model outputs
    dequantized: list[np.ndarray]     # per output, (len(windows), *shape[1:]) float32 -- for drift
    path: str                         # interpreter path that produced them
    kernels: dict[int, str]           # op index -> "XNNPACK" where the delegate took it
    source: str                       # what the inputs are


def run_golden(draft: Bundle, board, windows: np.ndarray | None, count: int, seed: int = 0) -> GoldenRun:
    """Golden vectors from ``windows`` (float, quantized by the runtime) or, without windows, from seeded
    random raw inputs over each input's full integer range (a model given as .tflite without --calib).

    Returns every window's dequantized outputs too (drift needs them).
    """
    m = draft.manifest
    runner = cpu_runtime.Runner(draft, board, threads=1)
    try:
        n_out = len(m.outputs)
        if windows is not None:
            g = min(count, len(windows))
            g_in = [np.empty((g, *s.shape[1:]), np.dtype(s.dtype)) for s in m.inputs]
            g_out = [np.empty((g, *o.shape[1:]), np.dtype(o.dtype)) for o in m.outputs]
            deq = [np.empty((len(windows), *o.shape[1:]), np.float32) for o in m.outputs]
            for n in range(len(windows)):
                res = runner.predict(windows[n])
                for k, r in enumerate(res if isinstance(res, tuple) else (res,)):
                    deq[k][n] = r[0]
                if n < g:
                    g_in[0][n] = runner.inputs[0].dest[0]
                    for k, slot in enumerate(runner.outputs):
                        g_out[k][n] = slot.src[0]
            source = f"{g} held-out windows"
        else:
            rng = np.random.default_rng(seed)
            g_in = [_random_raw(rng, s, count) for s in m.inputs]
            g_out = [np.empty((count, *o.shape[1:]), np.dtype(o.dtype)) for o in m.outputs]
            for n in range(count):
                res = runner.predict_raw(*(a[n:n + 1] for a in g_in))
                for k, r in enumerate(res if isinstance(res, tuple) else (res,)):
                    g_out[k][n] = r[0]
            deq = [np.empty((0,), np.float32)] * n_out
            source = f"{count} random raw inputs (seed {seed}; no --calib windows given)"
        kernels = runner.op_kernels if runner.interp is None else cpu_runtime.delegated_ops(runner.interp)
        return GoldenRun(g_in, g_out, deq, runner.path, kernels, source)
    finally:
        runner.close()


def _random_raw(rng, spec, count: int) -> np.ndarray:
    dt = np.dtype(spec.dtype)
    shape = (count, *spec.shape[1:])
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, int(info.max) + 1, size=shape, dtype=dt)
    return rng.standard_normal(shape).astype(dt)


def golden_npz(inputs, outputs, g_in, g_out) -> bytes:
    buf = io.BytesIO()
    arrays = {f"inputs/{s.name}": a for s, a in zip(inputs, g_in)}
    arrays.update({f"outputs/{s.name}": a for s, a in zip(outputs, g_out)})
    np.savez(buf, **arrays)
    return buf.getvalue()


def reference_kernel_diff(draft: Bundle, board, g_in, g_out) -> dict:
    """How the golden outputs compare with LiteRT's reference kernels (BUILTIN_REF), in output LSBs; for a
    native plan, with its native kernels on their portable paths too (another box's CPU may run those), so
    the float tolerance derived from it covers both."""
    native = bool(draft.manifest.artifacts.get("native"))
    ref = cpu_runtime.Runner(draft, board, threads=1, op_resolver="reference", native_portable=native)
    worst, differing = 0.0, 0
    try:
        for n in range(len(g_in[0])):
            res = ref.predict_raw(*(a[n:n + 1] for a in g_in))
            diffs = [np.abs(np.asarray(r, np.float64) - o[n:n + 1].astype(np.float64)).max()
                     for r, o in zip(res if isinstance(res, tuple) else (res,), g_out)]
            d = max(diffs)
            worst = max(worst, float(d))
            differing += int(d > 0)
        path = ref.path
    finally:
        ref.close()
    return {"reference_kernels_path": path, "max_diff_vs_reference_kernels": worst,
            "windows_differing_from_reference_kernels": differing}
