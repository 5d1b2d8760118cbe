"""``--quant auto`` on the cpu board: choose the execution plan by measuring the candidates on this host.

The candidates are the same Keras model converted three ways (full int8, dynamic range = int8 weights
with float activations, float32). Each is checked against the Keras float model on the held-out windows
(the drift gate) and timed through the cpu runtime's ``predict``, all candidates interleaved round by
round on one pinned core with one thread, so load from other processes hits every candidate alike. Of the
candidates that pass the drift gate, the one with the lowest ``--select`` percentile (p99 by default; p50 or
p99.9) becomes the bundle's top level (``model.tflite``): its golden vectors, drift figures and op report are
the ones recorded, and the report's ``plan`` section lists every candidate with what was measured. Every
other candidate that passes the gate is shipped too, as a complete sub-bundle in ``plans/<plan>/`` (its own
manifest, model files and golden vectors; the top manifest's ``plans`` lists them with their drift and this
host's figures): the compile host is rarely the box, so ``edgehft deploy`` times them again on the box and
records the one it runs (:mod:`edgehft.runtime.plans`). Candidates that fail the gate are only reported. The
full-int8 graph is kept in the bundle as ``model_int8.tflite`` (the IR accelerator boards read); they never
use ``auto``, so their bit-exact int8 contract is unchanged.

A fourth candidate, ``native`` (:mod:`edgehft.compiler.native`), joins when the model has LSTM ops the
native kernel takes and g++ is here: the dynamic-range graph with each UNIDIRECTIONAL_SEQUENCE_LSTM run by
:mod:`edgehft.kernels.cpu.lstm` in fp32 on the float conversion's weights, measured and gated like the
others; its golden vectors come from that chain. A fifth, ``native-bf16``, joins on hosts that run
AMX-BF16: the float graph with its CONV_2D ops and each LSTM's input projection on
:mod:`edgehft.kernels.cpu.conv` (bf16 operands, fp32 sums), the LSTM recurrences on the native fp32
kernel and the pools, concatenations, reshapes, slices, Dense layers and softmaxes between them on
:mod:`edgehft.kernels.cpu.ops`. Where onnxruntime, onnx and tf2onnx are installed, ``ort-float`` and ``ort-int8``
join (:mod:`edgehft.compiler.ort_plans`): the model's ONNX export and ONNX Runtime's own static int8 Q/DQ
quantization of it, run by ONNX Runtime with its default optimizations (the peers a user of ONNX Runtime would
run), measured and gated like the others: edgehft's own kernels are chosen only where they are faster.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CANDIDATES = ("int8", "dynamic", "float")      # converted by the worker; native and ort plans join where they apply
AUTO_PLANS = (*CANDIDATES, "native", "native-bf16", "ort-float", "ort-int8")   # every plan auto may measure


# What each native plan runs where, said in the compile report
NATIVE_PLANS = {
    "native": ("model.tflite is the dynamic-range graph; native.json runs it with each "
               "UNIDIRECTIONAL_SEQUENCE_LSTM on edgehft's native fp32 LSTM kernel (weights from the float "
               "conversion) and the other ops on LiteRT segments"),
    "native-bf16": ("model.tflite is the float graph; native.json runs it with each CONV_2D the native conv "
                    "kernel takes (and a LEAKY_RELU right after it) on edgehft's bf16 conv kernel (AMX tiles, "
                    "AVX512_BF16 or SIMD, the best the box runs; bf16 operands, fp32 sums), each UNIDIRECTIONAL_SEQUENCE_LSTM's input projection on that "
                    "kernel too and its recurrence on the native fp32 LSTM kernel, pools, concatenations, reshapes, "
                    "slices, Dense layers and softmaxes fed by those on edgehft's fp32 kernels or as views, and "
                    "any other op on LiteRT segments"),
}


@dataclass
class Candidate:
    plan: str                   # quantization mode
    bundle: object              # a draft Bundle whose model.tflite is this plan
    gold: object                # GoldenRun of the plan on the held-out windows
    drift: object               # Drift vs the Keras float model, or None
    evaluated: dict             # everything the pipeline computed for it (ir, specs, manifest, ...)


def time_plans(bundles: dict, board, windows: np.ndarray, rounds: int = 300, warmup: int = 30) -> dict:
    """p50/p99/p99.9/mean µs of ``predict`` per plan (``bundles``: plan -> draft Bundle), measured interleaved
    (one call of each plan per round) on one core of this process's affinity with one interpreter thread
    (:func:`edgehft.runtime.plans.time_runners`; ``windows`` float32 (N, *input_shape[1:]), cycled). The
    affinity is restored. Returns ``{plan: {"p50_us", "p99_us", "p99.9_us", "mean_us", "p99_over_p50"},
    "_core": cpu}``."""
    from edgehft.runtime import cpu as cpu_runtime
    from edgehft.runtime.plans import time_runners
    runners = {}
    try:
        for p, b in bundles.items():
            runners[p] = cpu_runtime.Runner(b, board, threads=1)
        return time_runners(runners, list(windows), rounds=rounds, warmup=warmup)
    finally:
        for run in runners.values():
            run.close()


def _what_runs(plan: str) -> str:
    """What the bundle's top level runs for ``plan``, for the report's plan section."""
    from edgehft.compiler.ort_plans import DESCRIPTIONS
    if plan in NATIVE_PLANS:
        return f"the {plan} plan: {NATIVE_PLANS[plan]}"
    if plan in DESCRIPTIONS:
        return f"the {plan} plan: {DESCRIPTIONS[plan]}"
    return f"model.tflite is the {plan} plan"


def _rel(c: Candidate):
    """The worst output's relative MAE of candidate ``c`` (None without drift figures)."""
    return max(o.mae_rel for o in c.drift.outputs) if c.drift else None


def passes(c: Candidate) -> bool:
    """``c`` passes the drift gate (or has no drift figures to judge: a model given as .tflite)."""
    return c.drift is None or c.drift.passed


def choose(cands: list[Candidate], timing: dict, select: str = "p99") -> tuple[Candidate, dict]:
    """The candidate with the lowest ``select`` percentile (``p50``, ``p99`` or ``p99.9``; ties by p50) among
    those passing the drift gate (or with no drift figures), by :func:`edgehft.runtime.plans.pick`, the same
    rule the box applies at deploy; if none passes, the one with the lowest relative MAE (the drift gate then
    warns or fails as usual). Returns the choice and the report's ``plan`` section; each ``measured`` row
    says whether the plan is ``shipped`` (passing plans go into the bundle, the others are only reported).

    Raises:
        InputError: an unknown ``select``.
    """
    from edgehft.runtime.plans import pick
    ok = [c for c in cands if passes(c)]
    if ok:
        name = pick({c.plan: timing[c.plan] for c in ok}, select)
        best = next(c for c in ok if c.plan == name)
        why = f"lowest {select} of the plans that pass the drift gate, measured on this host"
    else:
        best = min(cands, key=lambda c: _rel(c))
        why = "no plan passes the drift gate: the one with the lowest drift"
    measured = [{"plan": c.plan, **{k: round(v, 2) for k, v in timing[c.plan].items()},
                 "drift_rel_mae": _rel(c), "drift_passed": None if c.drift is None else c.drift.passed,
                 "argmax_agreement": c.drift.outputs[0].argmax_agreement if c.drift else None,
                 "chosen": c is best, "shipped": c is best or (bool(ok) and passes(c))} for c in cands]
    from edgehft.bench.fingerprint import machine_fingerprint
    fp = machine_fingerprint()
    section = {"mode": "auto", "chosen": best.plan, "why": why, "select": select, "candidates": [c.plan for c in cands],
               "shipped": [m["plan"] for m in measured if m["shipped"]],
               "measured": measured,
               "measured_on": {"cpu_model": fp["cpu_model"], "isa": fp["isa"],
                               "kernel_targets": fp["kernel_targets"], "logical_cpus": fp["logical_cpus"],
                               "pinned_cpu": timing["_core"], "threads": 1,
                               "libraries": fp["libraries"]},
               "reference": (_what_runs(best.plan)
                             + "; the golden vectors, the drift figures "
                             "and the op table are that plan's, produced by the cpu runtime that runs it"
                             + ("" if best.plan == "int8" else
                                "; model_int8.tflite is the full-int8 graph (what accelerator boards get), "
                                "kept for reference, not run by this bundle")
                             + ("; every other shipped plan is a complete bundle in plans/<plan>/ with its own golden "
                                "vectors: `edgehft deploy` times them on the box and records the one it runs"
                                if len([m for m in measured if m["shipped"]]) > 1 else ""))}
    return best, section
