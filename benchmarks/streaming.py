"""Tick-to-signal latency of the streaming runtime (issue 21) on the STAC-ML LSTM_A shape, beside full-window
``predict`` of the same plan, in one run on one pinned core.

LSTM_A (benchmarks/lstm_a.py: LSTM(100) x 2 over 50 x 100 rows, Dense(1), seeded random weights) is compiled for
the cpu board with ``--quant native`` (or ``--bundle`` names one). A seeded stream of rows is fed one row at a
time; on the same core:

  push        ``stream.push(row)``: from the row handed to push to the output written (the critical path: one
              step of each LSTM with its input projection, and the head; 160,100 MACs)
  prepare     ``stream.prepare()``: the next window's 49 steps of each layer (5.88 M MACs), run between ticks
  predict     ``runner.predict(window)``: the same plan on the whole 50-row window (8.0 M MACs)

Timed in alternating blocks of 500 rows (the stream, then predict on the same windows), so both see the same
machine over the run without one evicting the other's weights between two calls. An untimed pass first compares
every push's output with predict of its window (np.array_equal); the script fails (exit 1) on a mismatch.
With ``--helper-core C`` a second pass runs ``prepare="thread"`` (the helper pinned to C) with ticks
``--gap-us`` apart and reports push latency and the share of ticks found prepared.

Our figure is in process: a float32 row already in memory to the output in memory, Python's push included
(the row check, one copy, one native call). It is not STAC's harness (no network, no order path, no STAC-ML
audit); the audited STAC-ML Markets (Inference) LSTM_A p99 records are printed beside it for scale only.

    python benchmarks/streaming.py [--rows 20000] [--core N] [--bundle DIR] [--helper-core C] [--json]
    EDGEHFT_CPU_TARGET=avx2 python benchmarks/streaming.py        # the AVX2 kernels on the same machine
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
RECORDS = (("NVIDIA A100 (STAC-ML audited)", 35.2), ("Myrtle VOLLO on FPGA (STAC-ML audited)", 5.07),
           ("NVIDIA GH200 (STAC-ML audited)", 4.61))
PCT = (50, 99, 99.9)


def compile_lstm_a(work: Path) -> Path:
    """LSTM_A built (subprocess: TensorFlow) and compiled ``--quant native`` into ``work``; the bundle's path."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1"}
    subprocess.run([sys.executable, str(HERE / "lstm_a.py"), str(work / "lstm_a.keras")], check=True, env=env,
                   capture_output=True)
    np.save(work / "x.npy", np.random.default_rng(0).standard_normal((24, 50, 100)).astype(np.float32))
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    out = work / "lstm_a.native"
    compile_model(work / "lstm_a.keras", [work / "x.npy"], out,
                  CompileOptions(board="cpu", quant="native", calib_windows=12, drift_windows=8, golden_count=2))
    return out


def pct(ns) -> dict:
    us = np.asarray(ns, np.float64) / 1e3
    return {f"p{p:g}": float(np.percentile(us, p)) for p in PCT} | {"mean": float(us.mean())}


def exactness_pass(r, rows: np.ndarray) -> tuple[int, int]:
    """Untimed: every push against predict of its window; ``(outputs compared, outputs that differ)``."""
    T = r.bundle.manifest.inputs[0].shape[1]
    compared = differ = 0
    with r.stream() as s:
        for i, row in enumerate(rows):
            y = s.push(row)
            if y is not None:
                compared += 1
                differ += not np.array_equal(y, r.predict(rows[i - T + 1:i + 1]))
            s.prepare()
    return compared, differ


def inline_pass(r, rows: np.ndarray, warmup: int, block: int = 500) -> dict:
    """Timed, in alternating blocks of ``block`` rows: the stream (push, then prepare, per row) and predict on
    the same windows. Blocks, not row by row: the runner's kernels hold their own copy of the weights, and a
    predict between two pushes would evict the stream's from the core's L2 (no deployment interleaves them)."""
    perf = time.perf_counter_ns
    T = r.bundle.manifest.inputs[0].shape[1]
    push_ns, prep_ns, pred_ns = [], [], []
    with r.stream() as s:
        push, prepare, predict = s.push, s.prepare, r.predict
        gc.disable()
        try:
            for b0 in range(0, len(rows), block):
                for i in range(b0, min(b0 + block, len(rows))):
                    t0 = perf()
                    push(rows[i])
                    t1 = perf()
                    prepare()
                    t2 = perf()
                    if i >= warmup:
                        push_ns.append(t1 - t0), prep_ns.append(t2 - t1)
                for i in range(max(b0, T - 1), min(b0 + block, len(rows))):
                    w = rows[i - T + 1:i + 1]
                    t0 = perf()
                    predict(w)
                    t1 = perf()
                    if i >= warmup:
                        pred_ns.append(t1 - t0)
        finally:
            gc.enable()
        c, d = s.counters, s.describe()
    both = np.add(push_ns, prep_ns)
    return {"push_us": pct(push_ns), "prepare_us": pct(prep_ns), "push_prepare_us": pct(both),
            "predict_us": pct(pred_ns), "samples": len(push_ns),
            "prepared_ahead": c["prepared_ahead"], "prepared_late": c["prepared_late"], "isa": d["isa"],
            "head": d["head"], "macs": d["macs"]}


def thread_pass(r, rows: np.ndarray, core: int, gap_us: float, warmup: int) -> dict:
    """prepare="thread" on ``core``, ticks ``gap_us`` apart (spin-waited): push latency, share prepared ahead."""
    perf = time.perf_counter_ns
    lat = []
    with r.stream(prepare="thread", core=core) as s:
        push = s.push
        due = perf()
        gc.disable()
        try:
            for i, row in enumerate(rows):
                due += int(gap_us * 1e3)
                while perf() < due:
                    pass
                t0 = perf()
                push(row)
                t1 = perf()
                if i >= warmup:
                    lat.append(t1 - t0)
        finally:
            gc.enable()
        c = s.counters
    return {"push_us": pct(lat), "core": core, "gap_us": gap_us, "outputs": c["outputs"],
            "prepared_ahead": c["prepared_ahead"], "prepared_late": c["prepared_late"],
            "late_waited": c["late_waited"], "prepare_us_mean": c["prepare_us_mean"]}


def print_report(rep: dict) -> None:
    a = rep["inline"]
    print(f"LSTM_A (2 x LSTM(100) over 50 x 100, Dense(1)), plan native, kernels {a['isa']} "
          f"(CPU targets {', '.join(rep['targets'])}), {rep['cpu']}, core {rep['core']}, {a['samples']} rows timed")
    print(f"{'':44}{'p50':>9}{'p99':>9}{'p99.9':>9}{'mean':>9}   µs")
    rows = (("full-window predict (same plan, 8.0 M MACs)", a["predict_us"]),
            ("stream push: tick to signal (0.16 M MACs)", a["push_us"]),
            ("stream prepare per tick, between ticks (5.9 M)", a["prepare_us"]),
            ("push + prepare per tick (back to back)", a["push_prepare_us"]))
    for name, v in rows:
        print(f"{name:44}" + "".join(f"{v[k]:9.2f}" for k in ("p50", "p99", "p99.9", "mean")))
    print(f"push vs predict: p50 {a['predict_us']['p50'] / a['push_us']['p50']:.1f}x faster; push equal to predict "
          f"bit for bit: {rep['compared'] - rep['differ']} of {rep['compared']} outputs (untimed pass); head "
          f"{a['head']}; timed pass: {a['prepared_ahead']} windows prepared ahead, {a['prepared_late']} late")
    if rep.get("thread"):
        t = rep["thread"]
        share = t["prepared_ahead"] / max(1, t["outputs"])
        print(f"prepare on a helper thread (core {t['core']}), ticks {t['gap_us']:g} µs apart: push p50 "
              f"{t['push_us']['p50']:.2f}, p99 {t['push_us']['p99']:.2f}, p99.9 {t['push_us']['p99.9']:.2f} µs; "
              f"{share:.1%} of ticks found their window prepared ({t['prepared_late']} late, {t['late_waited']} "
              f"waited on the helper); prepare {t['prepare_us_mean']:.0f} µs each")
    print("audited STAC-ML Markets (Inference) LSTM_A tick-to-signal p99, for scale (their harness, not ours):")
    for name, us in RECORDS:
        print(f"  {name:44}{us:9.2f}")
    print(f"  {'edgehft stream push, this run':44}{a['push_us']['p99']:9.2f}   (in process: row in memory to output "
          "in memory, Python's push included; one core; no network or order path)")
    print(f"load average {rep['load']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--check-rows", type=int, default=5000, help="rows whose push is compared with predict")
    ap.add_argument("--core", type=int, default=None, help="CPU to pin to (default: the last this process may use)")
    ap.add_argument("--bundle", type=Path, default=None, help="an LSTM_A --quant native bundle (default: build one)")
    ap.add_argument("--helper-core", type=int, default=None, help="also run prepare='thread' on this CPU")
    ap.add_argument("--gap-us", type=float, default=1000.0, help="thread pass: µs between ticks")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    core = args.core if args.core is not None else sorted(os.sched_getaffinity(0))[-1]
    from edgehft import runtime
    from edgehft.bench.fingerprint import machine_fingerprint
    from edgehft.kernels.cpu import build
    with tempfile.TemporaryDirectory(prefix="edgehft-streaming-") as tmp:
        bundle = args.bundle or compile_lstm_a(Path(tmp))
        os.sched_setaffinity(0, {core})
        rows = np.random.default_rng(21).standard_normal((args.rows, 100)).astype(np.float32)
        with runtime.open(bundle) as r:
            compared, differ = exactness_pass(r, rows[:args.check_rows])
            rep = {"core": core, "targets": build.targets(), "cpu": machine_fingerprint()["cpu_model"],
                   "machine": platform.machine(), "inline": inline_pass(r, rows, args.warmup),
                   "compared": compared, "differ": differ}
            if args.helper_core is not None:
                rep["thread"] = thread_pass(r, rows[:max(2000, args.rows // 4)], args.helper_core, args.gap_us,
                                            min(args.warmup, 200))
        rep["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        print_report(rep)
    return 1 if rep["differ"] else 0


if __name__ == "__main__":
    sys.exit(main())
