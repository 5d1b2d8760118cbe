"""Checks a bundle is held to wherever it runs: the golden vectors, and the windows a tick file yields.

Used by ``edgehft run --golden``, by the box agent during ``edgehft deploy`` and by the HIL pytest
plugin, so a bundle passes or fails the same test on the host, on the box and in CI. No TensorFlow, no
click: this runs on the board.
"""
from __future__ import annotations

import keyword
from pathlib import Path, PurePosixPath

import numpy as np

from edgehft.errors import BundleError, GoldenMismatchError, InputError

GOLDEN_PYTHON_OPTION = "edgehft compile --golden-python"   # how a bundle gets another release's golden outputs
RUN_FEATURES_HINT = ("pass --run-features to run it (only for a bundle you trust: it is Python code; `edgehft "
                     "sign` and an allowed_signers file say who made a bundle), or pass windows as .npy/.npz")


def other_interpreter(path: str, expected_path: str) -> bool:
    """Whether two interpreter paths (``"<package> <version> <rest>"``, e.g. ``"tflite-runtime 2.14.0
    BUILTIN+XNNPACK"``) differ only in the TFLite interpreter package or its version: the same kernel path
    built from another TensorFlow release."""
    from edgehft.runtime.litert import INTERPRETERS
    a, b = path.split(" ", 2), expected_path.split(" ", 2)
    return (len(a) == len(b) == 3 and a[2] == b[2] and a[:2] != b[:2]
            and a[0] in INTERPRETERS and b[0] in INTERPRETERS)


def releases_hint(path: str, expected_path: str) -> str | None:
    """What to do when golden vectors made on ``expected_path`` fail on ``path``, another release of the same
    interpreter path (:func:`other_interpreter`); None when the paths differ otherwise or not at all."""
    if not other_interpreter(path, expected_path):
        return None
    here, made = (" ".join(p.split(" ", 2)[:2]) for p in (path, expected_path))
    return (f"this runs {here}, the golden vectors were made with {made}: another release's int8 kernels compute "
            "differently (DeepLOB int8 measured up to 11 LSB apart, tflite-runtime 2.14.0 against ai-edge-litert "
            f"2.3.0: the former's XNNPACK takes no int8 op); install {made.replace(' ', '==')} here where it exists "
            f"for this platform, or compile with `{GOLDEN_PYTHON_OPTION} PY`, PY a Python with "
            f"{here.replace(' ', '==')} and edgehft's box side (e.g. a board venv: `python -m "
            "edgehft.emulate.board_venv`), so the bundle carries this release's golden outputs too")


def check_golden(runner) -> dict:
    """Run the bundle's golden inputs through ``runner`` (raw dtypes, one window per call) and compare
    with the golden outputs as the manifest says: ``exact`` (every element equal, int8 backends) or
    ``allclose`` (max |difference| ≤ ``atol``, float backends). The outputs compared with are the set made by
    the interpreter path this runner reports (:meth:`~edgehft.bundle.Bundle.golden_set`, a bundle compiled with
    ``--golden-python``), else the default set. Another TFLite interpreter release than the one that made the
    vectors (:func:`other_interpreter`) is not forgiven: its int8 kernels may compute differently, and the
    bundle then does not compute on this box what it was compiled to compute (:func:`golden_mismatch` says
    which releases and what to do).

    Returns:
        ``{"count", "matched", "ok", "compare", "max_diff", "atol", "path", "expected_path", "golden_file"}`` —
        ``max_diff`` in the outputs' raw units (LSB for int8; inf where an output or a golden value is NaN),
        ``path`` the interpreter path that ran here, ``expected_path`` the one that made the outputs compared
        with, ``golden_file`` the file they came from.
    Raises:
        BundleError: the bundle has no golden vectors.
    """
    g = runner.bundle.require_golden()
    path = runner.describe().get("interpreter", runner.board)
    chosen = runner.bundle.golden_set(path)
    ins, outs = runner.bundle.golden(path)
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
    return {"count": g.count, "matched": matched, "ok": matched == g.count, "compare": g.compare,
            "max_diff": worst, "atol": g.atol, "path": path,
            "expected_path": chosen.reference_path if chosen else g.reference_path,
            "golden_file": chosen.file if chosen else g.file}


def golden_compare(result: dict) -> str:
    """How a :func:`check_golden` result compared, in words: ``bit-exact`` or ``within atol A``."""
    return "bit-exact" if result["compare"] == "exact" else f"within atol {result.get('atol', 0.0):g}"


def golden_mismatch(result: dict, backend: str) -> GoldenMismatchError:
    """The error for a failed :func:`check_golden` ``result`` on a runner of ``backend`` (a backend name; its
    :class:`~edgehft.backends.Backend` ``golden_hint`` starts the hint, the default one for a name not installed)."""
    from edgehft.backends import Backend, find
    spec = find(backend) if backend else None
    hint = (releases_hint(result.get("path", ""), result["expected_path"])
            or (spec.golden_hint if spec is not None else Backend.golden_hint) + result["expected_path"])
    return GoldenMismatchError(
        f"{result['count'] - result['matched']} of {result['count']} golden vectors differ "
        f"(max diff {result['max_diff']})", hint=hint)


def bundle_pipeline(bundle):
    """The bundle's feature pipeline as a :class:`~edgehft.windows.PipelineRef` that runs only the verified
    bytes of a file inside the bundle, or None when the bundle has none. Nothing is imported here.

    Raises:
        BundleError: the pipeline is not a plain relative ``.py`` path inside the bundle that the manifest's
            ``files`` lists (absolute, ``..``, a symlink, a directory, unlisted), it is a module reference
            (code outside the bundle), or its callable is not a plain Python name.
    """
    from edgehft.windows import PipelineRef
    f = bundle.manifest.features
    if f is None:
        return None
    where = f"bundle {bundle.path}: feature pipeline"
    if not f.file:
        raise BundleError(f"{where} {f.callable!r} is a module reference, code outside the bundle; edgehft only "
                          "runs pipeline code that the bundle carries and its manifest hashes",
                          hint="compile again with this edgehft (it copies the pipeline's file into the bundle), "
                               "or pass windows as .npy/.npz")
    rel = PurePosixPath(f.file)
    if rel.is_absolute() or "\\" in f.file or not rel.parts or any(p in ("..", ".", "") for p in rel.parts) \
            or rel.suffix != ".py":
        raise BundleError(f"{where} file {f.file!r} is not a relative .py path inside the bundle",
                          hint="the manifest was edited; compile the bundle again")
    if f.file not in bundle.manifest.files:
        raise BundleError(f"{where} file {f.file} is not listed in the manifest's files, so nothing verifies it",
                          hint="the manifest was edited; compile the bundle again")
    path = Path(bundle.path) / f.file
    if path.is_symlink() or not path.is_file():
        raise BundleError(f"{where} file {f.file} is a symlink or not a regular file",
                          hint="copy the bundle without symlinks (cp -rL, or edgehft deploy)")
    if not f.callable.isidentifier() or keyword.iskeyword(f.callable):
        raise BundleError(f"{where} callable {f.callable!r} is not a function name",
                          hint="the manifest was edited; compile the bundle again")
    return PipelineRef(f"{f.file}:{f.callable}", path, None, f.callable, sha256=bundle.manifest.files[f.file])


def bundle_windows(bundle, ticks, run_features: bool = False):
    """Windows for ``bundle`` from tick files: ``.npy``/``.npz`` windows, or (only with ``run_features``)
    raw feeds run through the bundle's own feature pipeline (:func:`bundle_pipeline`).

    Returns:
        :class:`edgehft.windows.Windows` with ``x`` (N, *input_shape[1:]) float32 and ``t_ns`` (N,) int64
        receive times, or None when the file has no timestamps.
    Raises:
        InputError: unreadable ticks, a raw feed without ``run_features`` or without a pipeline in the
            bundle, or windows whose shape is not the model's input shape.
        BundleError: the bundle's pipeline is not a verified file inside it (see :func:`bundle_pipeline`).
    """
    from edgehft.windows import load_windows
    feeds = [str(t) for t in ticks if Path(t).suffix not in (".npy", ".npz")]
    pipeline = None
    if feeds:
        if not run_features:
            what = bundle.manifest.features
            runs = f"the bundle's feature pipeline {what.file or what.callable}" if what else "a feature pipeline"
            raise InputError(f"{feeds[0]} is a raw feed: making windows from it runs {runs} (Python code from "
                             "the bundle), which edgehft does only when asked", hint=RUN_FEATURES_HINT)
        pipeline = bundle_pipeline(bundle)
        if pipeline is None:
            raise InputError(f"{feeds[0]} is a raw feed file and the bundle carries no feature pipeline",
                             hint="pass windows as .npy/.npz, or compile the model with --features file.py:function")
    w = load_windows(list(ticks), pipeline)
    want = tuple(bundle.manifest.inputs[0].shape[1:])
    if tuple(w.x.shape[1:]) != want:
        raise InputError(f"windows from {', '.join(w.source)} have shape {tuple(w.x.shape)}; the model takes "
                         f"(N, {', '.join(map(str, want))})",
                         hint="a tick file holds windows (N, *input_shape), or is a raw feed for the bundle's "
                              "feature pipeline (with --run-features)")
    return w
