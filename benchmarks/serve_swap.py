"""The caller's latency across hot swaps (issue 17): DeepLOB served in process by ``edgehft.serve`` while the same
bundle is installed again N times, each install a new version that the server loads, shadow-runs on the live
calls and swaps in between two calls.

One run of :func:`edgehft.serving.soak.soak_swaps` on this machine: the shipped DeepLOB (examples/deeplob/
deeplob.keras) compiled for the cpu board ``--quant int8`` in a subprocess (calibrated on the shipped feed's first
day), or ``--bundle DIR``; ``predict`` called back to back from the main thread on the real windows of the shipped
feed (the bundle's feature pipeline, which we compiled ourselves: ``--golden`` takes the golden inputs instead);
``--swaps`` installs (default 5), the first after ``--every`` seconds and every ``--every`` seconds after that
(each after the previous verdict), then a quiet tail, so there are calls away from swaps before, between and
after them. With 2+ CPUs the caller is pinned to one and the server's manager (``shadow_core=``) and the
installer to another.

It prints the caller's p50 / p99 / p99.9 within ``--window`` seconds of each verdict (and from its install on:
the install, the server's load and the shadow run count as near) against away from swaps, per phase of a swap,
each version's shadow figures, RSS, and the machine (ISA flags, CPU, load average: a shared host's other load
is in the figures). The goal is that p99.9 near swaps is no worse than away; the script reports, it does not
fail on it (exit 0; 1 when a call failed).

    python benchmarks/serve_swap.py [--bundle DIR] [--swaps 5] [--every 3] [--window 1] [--golden] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEEPLOB = HERE.parent / "examples" / "deeplob"
FEED = DEEPLOB / "data" / "btcusd_perp_20240808_depth.gz"


def compile_deeplob(work: Path) -> Path:
    """``edgehft compile deeplob.keras --quant int8`` for the cpu board (a subprocess: TensorFlow stays out of the
    serving process); the bundle's path."""
    out = work / "deeplob.int8"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1"}
    subprocess.run([sys.executable, "-m", "edgehft", "compile", str(DEEPLOB / "deeplob.keras"), "--board", "cpu",
                    "--quant", "int8", "--calib", str(FEED), "--out", str(out)], check=True, env=env,
                   capture_output=True)
    return out


def machine() -> dict:
    """The CPU model, ISA flags of interest (avx2, avx512f, amx_tile), CPUs, load average."""
    flags, model = set(), platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags |= {f for f in line.split(":", 1)[1].split() if f in ("avx2", "avx512f", "amx_tile")}
            elif line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"cpu": model, "isa": sorted(flags), "cpus": os.cpu_count(),
            "usable_cpus": sorted(os.sched_getaffinity(0)), "loadavg": list(os.getloadavg()),
            "python": platform.python_version()}


def summary(rep: dict) -> list[str]:
    """The headline lines: near vs away, the goal, the swaps' shadow figures, the machine."""
    near, away, m = rep["near_swaps"], rep["away"], rep["machine"]
    lines = []
    for name, v in (("near swaps", near), ("away", away)):
        lines.append(f"{name:>10}: {v['calls']:>9,} calls  p50 {v['p50_us'] or 0:9,.1f}  p99 {v['p99_us'] or 0:9,.1f}"
                     f"  p99.9 {v['p99.9_us'] or 0:9,.1f} µs")
    ratio = rep["p999_near_over_away"]
    goal = "n/a" if ratio is None else ("no worse: met" if ratio <= 1.0 else f"WORSE: x{ratio:.2f}")
    lines.append(f"p99.9 near swaps vs away: {goal}; {rep['swapped']} of {rep['installs']} installs swapped in, "
                 f"{rep['refused']} refused, {rep['rolled_back']} rolled back, {rep['failed_calls']} failed calls")
    for k, t in enumerate(rep["tries"], 1):
        if t["install_s"] is None:                  # a rollback (a breach after a swap, or the box's current)
            lines.append(f"  {t['event']} at {t['at_s']} s to {t['version']}: {t['why']}")
            continue
        lines.append(f"  install {k}: {t['event']} {t['install_to_verdict_s']} s after its install (load "
                     f"{t['phases_s']['load']} s, shadow {t['phases_s']['shadow']} s), {t['live_calls']} live calls, "
                     f"rel MAE {t['rel_mae']}, candidate p99 {t['shadow_p99_us'] or 0:,.0f} / p99.9 "
                     f"{t['shadow_p999_us'] or 0:,.0f} µs")
    lines.append(f"machine: {m['cpu']}, ISA {' '.join(m['isa']) or 'none of avx2/avx512f/amx_tile'}, {m['cpus']} "
                 f"CPUs, load average {m['loadavg'][0]:.2f} (before the run); caller on CPU {rep['caller_core']}, "
                 f"manager and installer on {rep['shadow_core']}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, default=None, help="a cpu bundle (default: compile DeepLOB --quant int8)")
    ap.add_argument("--swaps", type=int, default=5, help="installs (each a new version)")
    ap.add_argument("--every", type=float, default=3.0, help="seconds between installs")
    ap.add_argument("--window", type=float, default=1.0, help="seconds either side of a verdict that count as near")
    ap.add_argument("--tail", type=float, default=None, help="quiet seconds after the last install (default 2 x every)")
    ap.add_argument("--golden", action="store_true", help="the bundle's golden inputs, not the shipped feed's windows")
    ap.add_argument("--budget-p99-us", type=float, default=None, help="shadow-run budget (default: the board's)")
    ap.add_argument("--budget-p999-us", type=float, default=None, help="shadow-run budget (default: the board's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from edgehft.serving import ShadowPolicy
    from edgehft.serving.soak import print_soak, soak_swaps
    cpus = sorted(os.sched_getaffinity(0))
    caller, shadow = (cpus[0], cpus[1]) if len(cpus) > 1 else (None, None)
    seconds = args.every * (args.swaps + 1) + (2 * args.every if args.tail is None else args.tail)
    before = machine()
    with tempfile.TemporaryDirectory(prefix="edgehft-serve-swap-") as tmp:
        bundle = args.bundle or compile_deeplob(Path(tmp))
        ticks = None if args.golden else [str(FEED)]
        rep = soak_swaps(bundle, seconds / 60.0, args.every, ticks=ticks, run_features=ticks is not None,
                         recorded=False, window_s=args.window, max_installs=args.swaps, caller_core=caller,
                         shadow_core=shadow, intervals=max(2, int(round(seconds / args.every))),
                         policy=ShadowPolicy(budget_p99_us=args.budget_p99_us, budget_p999_us=args.budget_p999_us))
    rep["machine"] = before
    if args.json:
        print(json.dumps(rep))
    else:
        from rich.console import Console
        print_soak(rep, Console(width=100, highlight=False))
        print("\n".join(summary(rep)))
        if rep["installs"] < args.swaps:
            print(f"note: {rep['installs']} of {args.swaps} installs were done in {seconds:g} s (each waits for the "
                  "previous verdict; a shadow run took longer than --every): give a longer --tail", file=sys.stderr)
    return 1 if rep["failed_calls"] else 0


if __name__ == "__main__":
    sys.exit(main())
