"""Golden vectors: run the int8 model on the cpu runtime (the reference path) and keep raw inputs and
outputs; compare them with LiteRT's reference kernels.

A model that XNNPACK refuses to prepare gets its golden vectors from LiteRT's builtin kernels (the cpu
runtime falls back the same way on the box), else from its reference kernels. A model that no LiteRT kernel
path runs (an unresolved custom op such as PosenetDecoderOp) or whose input batch is not 1 has none: on a
Coral board the bundle keeps its partition and says why (:attr:`GoldenRun.missing`); elsewhere it is refused.
"""
from __future__ import annotations

import io
import re
from dataclasses import dataclass, field

import numpy as np

from edgehft.bundle import Bundle, Golden, sha256_arrays
from edgehft.errors import EdgeHFTError, InputError
from edgehft.runtime import cpu as cpu_runtime, litert


@dataclass
class GoldenRun:
    inputs: list[np.ndarray]          # raw (quantized) model inputs, (count, *shape[1:]) each
    outputs: list[np.ndarray]         # raw model outputs
    dequantized: list[np.ndarray]     # per output, (len(windows), *shape[1:]) float32 -- for drift
    path: str                         # interpreter path that produced them
    kernels: dict[int, str]           # op index -> "XNNPACK" where the delegate took it
    source: str                       # what the inputs are
    notes: list[str] = field(default_factory=list)   # kernel paths that refused the model, and why
    missing: str | None = None        # why there are no golden vectors (inputs/outputs are then empty)


def run_golden(draft: Bundle, board, windows: np.ndarray | None, count: int, seed: int = 0, *,
               allow_missing: bool = False) -> GoldenRun:
    """Golden vectors from ``windows`` (float, quantized by the runtime) or, without windows, from seeded
    random raw inputs over each input's full integer range (a model given as .tflite without --calib).

    LiteRT's kernel paths are tried in turn: ``auto`` (XNNPACK where it takes ops; a model XNNPACK refuses to
    prepare runs on the builtin kernels, see :class:`edgehft.runtime.cpu.Runner`), ``builtin``, ``reference``.
    Returns every window's dequantized outputs too (drift needs them). With ``allow_missing`` a model that
    cannot have golden vectors returns a run with ``missing`` set (the reason) and no arrays.

    Raises:
        InputError: (without ``allow_missing``) an input's batch is not 1 (golden vectors are one window per
            call), or no LiteRT kernel path runs the model (e.g. an unresolved custom op).
    """
    batch = batch_problem(draft.manifest)
    why, tried = batch, []
    if why is None:
        for resolver in litert.OP_RESOLVERS:
            try:
                run = _golden_on(draft, board, windows, count, seed, resolver)
            except EdgeHFTError:
                raise
            except (RuntimeError, ValueError) as exc:     # LiteRT refused to prepare or invoke the model
                tried.append((resolver, _litert_message(exc)))
                continue
            run.notes[:0] = [f"LiteRT's {r} kernel path refused the model: {msg}" for r, msg in tried]
            return run
        why = "no LiteRT kernel path runs it: " + "; ".join(
            f"{', '.join(r for r, msg in tried if msg == text)}: {text}" for text in dict.fromkeys(t for _, t in tried))
    if allow_missing:
        return GoldenRun([], [], [], "none", {}, "", [], why)
    raise InputError(f"{draft.manifest.source.file}: no golden vectors can be made: {why}",
                     hint=("convert the model with a batch of 1 (keras.Input(batch_shape=(1, ...)))" if batch
                           else f"board {board.name} runs the whole model on LiteRT: replace the ops LiteRT has no "
                                "kernel for (a custom op) with builtin ops, or run them outside the model"))


def batch_problem(manifest) -> str | None:
    """Why golden vectors (one window per call, batch 1) cannot be made for the model's inputs, or None."""
    for s in manifest.inputs:
        if s.shape and s.shape[0] != 1:
            return (f"input {s.name!r} has shape {tuple(s.shape)}, batch {s.shape[0]}: golden vectors are one "
                    "window per call at batch 1")
    return None


def _litert_message(exc: BaseException) -> str:
    """LiteRT's error on one line, without its pointer to the custom-op guide."""
    return re.sub(r"See instructions: \S+\s*", "", " ".join(str(exc).split())).strip()


def _golden_on(draft: Bundle, board, windows, count: int, seed: int, resolver: str) -> GoldenRun:
    """:func:`run_golden` on one kernel path; the interpreter's RuntimeError/ValueError propagate."""
    m = draft.manifest
    runner = cpu_runtime.Runner(draft, board, threads=1, op_resolver=resolver)
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
        kernels = runner.op_kernels if runner.interp is None else litert.delegated_ops(runner.interp)
        run = GoldenRun(g_in, g_out, deq, runner.path, kernels, source)
        if getattr(runner, "xnnpack_error", None):
            run.notes.append(f"XNNPACK refused to prepare the model ({runner.xnnpack_error}): LiteRT's builtin "
                             "kernels ran it")
        return run
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
    the float tolerance derived from it covers both. Where the reference kernels refuse the model, returns
    ``{"reference_kernels_error": why}`` instead."""
    native = bool(draft.manifest.artifacts.get("native"))
    try:
        ref = cpu_runtime.Runner(draft, board, threads=1, op_resolver="reference", native_portable=native)
    except EdgeHFTError:
        raise
    except (RuntimeError, ValueError) as exc:
        return {"reference_kernels_error": _litert_message(exc)}
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


def golden_record(draft: Bundle, board, gold: GoldenRun, inputs, outputs) -> tuple[Golden | None, dict, dict]:
    """What a bundle keeps of ``gold``: the manifest's :class:`Golden` (None when ``gold.missing``), the
    report's ``golden`` section (count, path, input source, the reference-kernel comparison; or ``count`` 0
    and ``missing``, the reason) and the bundle files (``golden.npz``, or none).

    Float outputs are compared ``allclose``: another kernel path (a box whose CPU has other SIMD units) may
    differ from the golden path as much as LiteRT's own reference kernels do here; twice that, at least 1e-5,
    is the tolerance. Integer outputs are compared exactly.
    """
    if gold.missing:
        return None, {"count": 0, "missing": gold.missing, "notes": gold.notes}, {}
    ref_diff = reference_kernel_diff(draft, board, gold.inputs, gold.outputs)
    g = len(gold.inputs[0])
    integer = all(np.dtype(o.dtype).kind in "iu" for o in outputs)
    atol = 0.0 if integer else max(1e-5, 2 * float(ref_diff.get("max_diff_vs_reference_kernels") or 0.0))
    spec = Golden(count=g, reference_path=gold.path, compare="exact" if integer else "allclose", atol=atol)
    section = {"count": g, "reference_path": gold.path, "inputs": gold.source,
               "inputs_sha256": sha256_arrays(*gold.inputs), **ref_diff, "compare": spec.compare, "atol": atol}
    if gold.notes:
        section["notes"] = gold.notes
    return spec, section, {"golden.npz": golden_npz(inputs, outputs, gold.inputs, gold.outputs)}
