"""The box-side golden worker: a bundle's golden inputs through the box's own runtime in *this* Python, outputs
to an .npz. ``edgehft compile --golden-python PY`` runs it as ``PY -m edgehft.golden_worker BUNDLE OUT.npz``
(issue 18): a PYNQ-Z2 runs tflite-runtime 2.14.0, whose int8 kernels compute other results than the compile
host's ai-edge-litert, so the compile asks a Python with the board's interpreter release (a board venv,
:mod:`edgehft.emulate.board_venv`) what the bundle computes there, and the bundle carries those outputs as a
set of their own (:class:`edgehft.bundle.GoldenSet`).

It runs what the box runs: :func:`edgehft.runtime.open` on the bundle (verified against its manifest), the
accelerator emulated where the board has one (PYNQ: the kernels' C simulation behind pynq's drivers, the CPU
segments on this Python's TFLite interpreter), one golden window per call. A bundle is untrusted input: the
worker reads only arrays (``np.load`` with ``allow_pickle=False``, through :meth:`edgehft.bundle.Bundle.golden`)
and never runs code from the bundle (no feature pipeline). No TensorFlow, no click; Python 3.8+.

Output: ``OUT.npz`` with ``outputs/<name>`` (``(count, *shape[1:])``, the raw dtypes), and one JSON line on
stdout: ``{"path", "made_by", "count"}`` (``path``: the interpreter path the runner reports, which a box of
this release reports too). Exit 0; 2 usage; on an edgehft error its exit code with ``{"error", "hint"}`` on
stdout.
"""
from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import numpy as np


def golden_outputs(bundle_dir: str | Path) -> tuple[dict, dict]:
    """Run the golden inputs of the bundle at ``bundle_dir`` through the box's runtime here (emulated where the
    board has an accelerator). Returns ``(outputs by tensor name, {"path", "made_by", "count"})``.

    Raises:
        EdgeHFTError: the bundle is refused (hashes, manifest, golden arrays), or its board does not run here.
    """
    from edgehft import runtime
    from edgehft.backends import find
    from edgehft.bundle import load_bundle
    from edgehft.version import VERSION
    bundle = load_bundle(bundle_dir, verify=True)
    spec = find(bundle.manifest.backend)
    emulate = spec is not None and not spec.host_cpu
    runner = runtime.open(bundle, **({"emulate": True} if emulate else {}))
    try:
        ins, _ = bundle.golden()
        m = bundle.manifest
        outs = {s.name: np.empty((m.golden.count, *s.shape[1:]), np.dtype(s.dtype)) for s in m.outputs}
        for n in range(m.golden.count):
            res = runner.predict_raw(*(ins[s.name][n:n + 1] for s in m.inputs))
            for s, r in zip(m.outputs, res if isinstance(res, tuple) else (res,)):
                outs[s.name][n] = np.asarray(r)[0]
        path = runner.describe().get("interpreter", runner.board)
    finally:
        runner.close()
    made_by = (f"Python {platform.python_version()} {platform.machine()}, numpy {np.__version__}, edgehft {VERSION}"
               + (f", {m.board} emulated" if emulate else ""))
    return outs, {"path": path, "made_by": made_by, "count": m.golden.count}


def main(argv: list | None = None) -> int:
    """``python -m edgehft.golden_worker BUNDLE OUT.npz``: see the module docstring."""
    from edgehft.errors import EdgeHFTError
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m edgehft.golden_worker BUNDLE OUT.npz", file=sys.stderr)
        return 2
    try:
        outs, info = golden_outputs(args[0])
    except EdgeHFTError as exc:
        print(json.dumps({"error": exc.args[0] if exc.args else "", "hint": exc.hint, "type": type(exc).__name__}))
        return exc.exit_code
    np.savez(args[1], **{f"outputs/{name}": a for name, a in outs.items()})
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
