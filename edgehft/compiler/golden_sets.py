"""Golden outputs of the board's own interpreter release (issue 18), made at compile in a side Python.

Measured on DeepLOB int8 (16 golden windows): ai-edge-litert 2.3.0 (the compile host) hands 32 of its 35 ops
(every CONV_2D, LEAKY_RELU, MAX_POOL_2D, CONCATENATION, RESHAPE and the FULLY_CONNECTED) to XNNPACK;
tflite-runtime 2.14.0 (the PYNQ-Z2's interpreter: armv7l has no ai-edge-litert) hands it none, and runs them
on its builtin kernels. Each int8 CONV_2D and LEAKY_RELU of XNNPACK is up to 1 LSB from the builtin kernel
(0.002 % to 7 % of elements); through 25 layers and the LSTM that makes 11 of 16 softmax outputs differ, by up
to 11 LSB. The builtin kernels of the two releases agree bit for bit on all 35 ops. No tolerance on the output
is both safe and tight, so the bundle carries the board release's own outputs instead.

``--golden-python PY`` (or ``$EDGEHFT_GOLDEN_PYTHON``; ``none`` turns the default off): after the bundle is
assembled, a scratch copy is written and ``PY -m edgehft.golden_worker`` (box side, Python 3.8+, no TensorFlow)
runs its golden inputs through the box's runtime there, the accelerator emulated (:mod:`edgehft.golden_worker`).
Its outputs become ``golden/<release>.npz``, a :class:`~edgehft.bundle.GoldenSet` in the manifest (listed in
``files`` with its SHA-256, so verifying and signing cover it), and the report's ``golden.sets`` says who made
it and how far it is from the compile host's outputs. Default: for a board whose ``[stack]`` interpreter is not
this host's package (the PYNQ-Z2), the board venv that :mod:`edgehft.emulate.board_venv`'s recipe makes in this
checkout, where it is; else a compile warning names the option.
"""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from edgehft.bundle import GoldenSet, write_bundle
from edgehft.errors import InputError

GOLDEN_PYTHON_ENV = "EDGEHFT_GOLDEN_PYTHON"
WORKER_TIMEOUT_S = 900.0


def golden_python(board, asked: str | None) -> tuple[str | None, str | None]:
    """``(the side Python that makes board goldens, or None; a compile warning, or None)`` for ``board``:
    ``asked`` (``--golden-python``), else ``$EDGEHFT_GOLDEN_PYTHON``; ``none`` means no side Python. Without
    either, and only where the board's ``[stack]`` names interpreters that do not include this host's package:
    the checkout's board venv for the board's stack (:func:`edgehft.emulate.board_venv.stack_for`), or, without
    one, no side Python and a warning that names the option."""
    asked = asked or os.environ.get(GOLDEN_PYTHON_ENV) or None
    if asked:
        return (None, None) if asked.strip().lower() == "none" else (asked, None)
    from edgehft.emulate.board_venv import checkout_venv_python, stack_for
    from edgehft.runtime.litert import load_interpreter_module
    _, package, version = load_interpreter_module()
    if not board.stack.interpreter or package in board.stack.interpreter:
        return None, None
    stack = stack_for(board)
    py = checkout_venv_python(stack) if stack else None
    if py is not None:
        return str(py), None
    recipe = f"python -m edgehft.emulate.board_venv --stack {stack} VENV" if stack else "a venv of the board's stack"
    return None, (f"board {board.name} runs {' or '.join(board.stack.interpreter)}, this host {package} {version}: "
                  "the bundle's golden vectors are this host's only, and a box whose interpreter computes int8 "
                  "otherwise refuses them; compile with `--golden-python PY` (PY a Python with the board's "
                  f"interpreter and edgehft's box side: {recipe}, then VENV/bin/python)")


def _worker_env() -> dict:
    """The side Python's environment: this one without VIRTUAL_ENV, and this checkout first on PYTHONPATH when
    edgehft runs from one (so the worker runs the same edgehft as the compile)."""
    from edgehft.emulate.board_venv import checkout_root
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    root = checkout_root()
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run_worker(python: str, bundle_dir: Path, out: Path) -> dict:
    """``python -m edgehft.golden_worker bundle_dir out``; returns its JSON record.

    Raises:
        InputError: ``python`` does not run, the worker failed or timed out (its error, or its stderr's end).
    """
    where = f"--golden-python {python}"
    try:
        got = subprocess.run([python, "-m", "edgehft.golden_worker", str(bundle_dir), str(out)], capture_output=True,
                             text=True, timeout=WORKER_TIMEOUT_S, env=_worker_env(), cwd=str(out.parent))
    except (OSError, ValueError) as exc:
        raise InputError(f"{where}: cannot run it ({exc})", hint="name a Python (a board venv's bin/python), or "
                         f"`--golden-python none`") from None
    except subprocess.TimeoutExpired:
        raise InputError(f"{where}: the golden worker ran over {WORKER_TIMEOUT_S:g} s") from None
    lines = [ln for ln in got.stdout.splitlines() if ln.startswith("{")]
    try:
        record = json.loads(lines[-1]) if lines else {}
    except ValueError:
        record = {}
    if not isinstance(record, dict):
        record = {}
    if got.returncode != 0 or "path" not in record:
        said = record.get("error") or " ".join(got.stderr.split())[-600:] or f"exit {got.returncode}"
        raise InputError(f"{where}: the golden worker failed: {said}",
                         hint=record.get("hint") or "it needs edgehft's box side and a TFLite interpreter (and "
                                                    "pynq for a PYNQ board): make it with `python -m "
                                                    "edgehft.emulate.board_venv`")
    return record


def read_outputs(path: Path, manifest) -> dict[str, np.ndarray]:
    """The worker's ``outputs/<name>`` arrays from ``path``: no pickles, exactly the manifest's outputs, each
    ``(count, *shape[1:])`` of its dtype and finite.

    Raises:
        InputError: anything else.
    """
    want = {f"outputs/{s.name}": ((manifest.golden.count, *s.shape[1:]), np.dtype(s.dtype)) for s in manifest.outputs}
    try:
        with np.load(path, allow_pickle=False) as z:
            if sorted(z.files) != sorted(want):
                raise InputError(f"the golden worker wrote {sorted(z.files)}, not {sorted(want)}")
            arrays = {k: z[k] for k in want}
    except InputError:
        raise
    except Exception as exc:           # missing, not an npz, a pickle, a truncated zip: the worker's fault
        raise InputError(f"the golden worker's outputs {path.name} cannot be read: {exc}",
                         hint="the worker must write an .npz of the bundle's outputs (edgehft.golden_worker)") from None
    for k, (shape, dtype) in want.items():
        a = arrays[k]
        if a.shape != shape or a.dtype != dtype or (a.dtype.kind == "f" and not np.isfinite(a).all()):
            raise InputError(f"the golden worker's {k} is {a.dtype} {a.shape}, not finite {dtype} {shape}")
    return {k[len("outputs/"):]: a for k, a in arrays.items()}


def set_file(path: str) -> str:
    """The bundle file of the set made by the interpreter path ``path``: ``golden/<path, lowercase, runs of
    other characters as ->.npz`` (``golden/tflite-runtime-2.14.0-builtin-xnnpack.npz``)."""
    return "golden/" + (re.sub(r"[^a-z0-9.]+", "-", path.lower()).strip("-.") or "set") + ".npz"


def _difference(outs: dict, default: dict) -> dict:
    """How the set ``outs`` compares with the default set's outputs ``default``: windows differing, max |diff|."""
    per_window = np.zeros(len(next(iter(outs.values()))))
    for k, a in outs.items():
        d = np.abs(a.astype(np.float64) - default[k].astype(np.float64)).reshape(len(a), -1).max(axis=1)
        per_window = np.maximum(per_window, d)
    return {"windows_differing_from_default": int((per_window > 0).sum()),
            "max_diff_vs_default": float(per_window.max()) if per_window.size else 0.0}


MAX_LSB_FROM_DEFAULT = 32          # integer outputs: another release's kernels moved DeepLOB's by up to 11 LSB
MAX_SHARE_FROM_DEFAULT = 0.1       # float outputs: of the default set's output range


def _check_distance(section: dict, default: dict, python: str) -> None:
    """Refuse a set much farther from the host's than another interpreter release's rounding goes (a broken
    interpreter, or the wrong side Python, would otherwise make the outputs boxes of that release are held to).

    Raises:
        InputError: integer outputs more than :data:`MAX_LSB_FROM_DEFAULT` apart, float ones more than
            :data:`MAX_SHARE_FROM_DEFAULT` of the default outputs' range."""
    integer = all(a.dtype.kind in "iu" for a in default.values())
    span = max((float(a.max()) - float(a.min()) for a in default.values() if a.size), default=0.0)
    bound = MAX_LSB_FROM_DEFAULT if integer else MAX_SHARE_FROM_DEFAULT * max(span, 1e-12)
    if section["max_diff_vs_default"] > bound:
        raise InputError(f"--golden-python {python}: its outputs are up to {section['max_diff_vs_default']:g} from "
                         f"this host's ({section['windows_differing_from_default']} windows differ), more than "
                         + (f"{MAX_LSB_FROM_DEFAULT} LSB" if integer else f"{MAX_SHARE_FROM_DEFAULT:.0%} of the "
                                                                         "outputs' range")
                         + ": not another release's rounding", hint="check that Python's interpreter (its golden "
                         "worker ran the bundle there), or compile with --golden-python none")


def add_golden_set(python: str, manifest, files: dict, report, work: Path, say) -> GoldenSet | None:
    """Make the golden set of ``python``'s interpreter for the bundle about to be written (``manifest``,
    ``files``), and add it: ``files[golden/<release>.npz]``, ``manifest.golden.sets`` and the report's
    ``golden["sets"]``. None (and a report note) where ``python`` runs the interpreter path that made the
    default set, or one the bundle already carries a set of.

    Raises:
        InputError: the side Python or its worker failed (:func:`run_worker`, :func:`read_outputs`).
    """
    from edgehft.bundle import load_bundle
    say(f"golden vectors of the board's interpreter: {python} -m edgehft.golden_worker")
    draft = Path(tempfile.mkdtemp(prefix="golden-draft-", dir=work))
    write_bundle(draft / "bundle", manifest.model_copy(deep=True), dict(files), report=None)
    record = run_worker(python, draft / "bundle", draft / "outputs.npz")
    outs = read_outputs(draft / "outputs.npz", manifest)
    path, g = str(record["path"]), manifest.golden
    if path == g.reference_path or any(gs.reference_path == path for gs in g.sets):
        report.notes.append(f"--golden-python {python} runs {path}, which made this bundle's golden outputs "
                            "already: no other set was added")
        return None
    default = load_bundle(draft / "bundle", verify=False).golden()[1]
    gs = GoldenSet(file=set_file(path), reference_path=path, made_by=str(record.get("made_by", ""))[:300])
    buf = io.BytesIO()
    np.savez(buf, **{f"outputs/{name}": a for name, a in outs.items()})
    files[gs.file] = buf.getvalue()
    g.sets.append(gs)
    section = {"file": gs.file, "reference_path": path, "made_by": gs.made_by, **_difference(outs, default)}
    _check_distance(section, default, python)
    if isinstance(report.golden, dict):
        report.golden.setdefault("sets", []).append(section)
    report.notes.append(f"golden outputs of {path} ({gs.made_by}) in {gs.file}: a box running it is checked "
                        f"against them; {section['windows_differing_from_default']} of {g.count} windows differ from "
                        f"{g.reference_path}'s, by up to {section['max_diff_vs_default']:g}")
    return gs
