"""Checks a bundle is held to wherever it runs: the golden vectors, and the windows a tick file yields.

Used by ``edgehft run --golden``, by the box agent during ``edgehft deploy`` and by the HIL pytest
plugin, so a bundle passes or fails the same test on the host, on the box and in CI. No TensorFlow, no
click: this runs on the board.
"""
from __future__ import annotations

import numpy as np

from edgehft.errors import GoldenMismatchError, InputError


def check_golden(runner) -> dict:
    """Run the bundle's golden inputs through ``runner`` (raw dtypes, one window per call) and compare
    with the golden outputs as the manifest says: ``exact`` (every element equal, int8 backends) or
    ``allclose`` (max |difference| ≤ ``atol``, float backends).

    Returns:
        ``{"count", "matched", "ok", "compare", "max_diff", "path", "expected_path"}`` — ``max_diff`` in
        the outputs' raw units (LSB for int8; inf where an output or a golden value is NaN), ``path`` the
        interpreter path that ran here.
    Raises:
        BundleError: the bundle has no golden vectors.
    """
    g = runner.bundle.manifest.golden
    ins, outs = runner.bundle.golden()
    in_names = [s.name for s in runner.bundle.manifest.inputs]
    out_names = [s.name for s in runner.bundle.manifest.outputs]
    matched, worst = 0, 0.0
    for n in range(g.count):
        res = runner.predict_raw(*(ins[k][n:n + 1] for k in in_names))
        res = res if isinstance(res, tuple) else (res,)
        diffs = [float(np.abs(r.astype(np.float64) - outs[k][n:n + 1].astype(np.float64)).max())
                 for r, k in zip(res, out_names)]
        # a NaN on either side: no match, and it shows as inf
        d = float("inf") if any(x != x for x in diffs) else max(diffs)
        worst = max(worst, d)
        matched += int(d == 0.0 if g.compare == "exact" else d <= g.atol)
    path = runner.describe().get("interpreter", runner.board)
    return {"count": g.count, "matched": matched, "ok": matched == g.count, "compare": g.compare,
            "max_diff": worst, "path": path, "expected_path": g.reference_path}


def golden_mismatch(result: dict, backend: str) -> GoldenMismatchError:
    """The error for a failed :func:`check_golden` ``result`` on a runner of ``backend``."""
    return GoldenMismatchError(
        f"{result['count'] - result['matched']} of {result['count']} golden vectors differ "
        f"(max diff {result['max_diff']})",
        hint=("the overlay's kernels or the bundle's FPGA weights do not reproduce the golden path "
              if backend == "pynq" else "the interpreter path differs from the one that made the bundle: ")
        + result["expected_path"])


def bundle_windows(bundle, ticks):
    """Windows for ``bundle`` from tick files: ``.npy``/``.npz`` windows, or raw feeds run through the
    bundle's own feature pipeline (``manifest.features``).

    Returns:
        :class:`edgehft.windows.Windows` with ``x`` (N, *input_shape[1:]) float32 and ``t_ns`` (N,) int64
        receive times, or None when the file has no timestamps.
    Raises:
        InputError: unreadable ticks, or windows whose shape is not the model's input shape.
    """
    from edgehft.windows import load_windows, parse_pipeline
    pipeline = None
    f = bundle.manifest.features
    if f is not None:
        pipeline = parse_pipeline(f"{bundle.path / f.file}:{f.callable}") if f.file else parse_pipeline(f.callable)
    w = load_windows(list(ticks), pipeline)
    want = tuple(bundle.manifest.inputs[0].shape[1:])
    if tuple(w.x.shape[1:]) != want:
        raise InputError(f"windows from {', '.join(w.source)} have shape {tuple(w.x.shape)}; the model takes "
                         f"(N, {', '.join(map(str, want))})",
                         hint="a tick file holds windows (N, *input_shape), or is a raw feed for the bundle's "
                              "feature pipeline")
    return w
