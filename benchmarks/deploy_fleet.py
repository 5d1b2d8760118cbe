"""Deploy time to N boxes with one SSH connection per box against one connection per step (issue 18).

A real OpenSSH server on 127.0.0.1 (tests/sshbox.py, the deploy tests' box; its Python is .venv-board) stands in
for N boxes: each "box" is an install dir of its own behind it. One bundle (the shipped DeepLOB compiled for the
cpu board ``--quant int8`` in a subprocess, or ``--bundle DIR``) is deployed to all N with
:func:`edgehft.deploy.deploy.deploy_many` (``--parallel`` at a time), ``--rounds`` times in each mode, the two
modes alternating so a drift of the machine's load falls on both: ``share_connection=True`` (the default
since issue 18: an OpenSSH ControlMaster per box, every step a session on it) and ``False`` (each step its own
ssh connection, as before). The latency gate runs with ``--gate-samples`` calls and a budget every run meets: it
times the model, not the transport.

It prints, per mode, the fleet's wall time (median and max over rounds), each step's median seconds per box,
the ssh connections the box accepted per deploy (from sshd's log), and the ratio. Loopback has no network
latency: on a real link every connection saved also saves its round trips (TCP, key exchange, authentication).

    python benchmarks/deploy_fleet.py [--boxes 4] [--rounds 3] [--parallel 8] [--bundle DIR] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODES = {"one connection per box": True, "one connection per step": False}


def fleet_round(box, cfg: Path, work: Path, bundle: Path, n: int, parallel: int, share: bool,
                gate_samples: int) -> dict:
    """One deploy of ``bundle`` to ``n`` install dirs behind ``box``: wall seconds, each result's step seconds,
    the connections sshd accepted."""
    from edgehft.deploy.deploy import deploy_many
    from edgehft.deploy.ssh import parse_target
    targets = [parse_target("box", python=box.python, install_dir=str(work / f"box{i}"), ssh_config=str(cfg))
               for i in range(n)]
    log = box.work / "sshd.log"
    before = log.read_text(errors="replace").count("Accepted publickey")
    t0 = time.perf_counter()
    results = deploy_many(targets, bundle, [None] * n, parallel=parallel, share_connection=share,
                          budget_p99_us=1e9, budget_p999_us=1e9, gate_samples=gate_samples, gate_warmup=20)
    wall = time.perf_counter() - t0
    bad = [r for r in results if not r.ok]
    if bad:
        raise SystemExit(f"deploy failed on {bad[0].install_dir}: {bad[0].error} ({bad[0].hint})")
    accepted = log.read_text(errors="replace").count("Accepted publickey") - before
    return {"wall_s": wall, "steps": [r.seconds for r in results], "connections": accepted}


def summary(rounds: list[dict], n: int) -> dict:
    steps = {}
    for r in rounds:
        for per_box in r["steps"]:
            for name, s in per_box.items():
                steps.setdefault(name, []).append(s)
    walls = [r["wall_s"] for r in rounds]
    return {"wall_s_median": statistics.median(walls), "wall_s_max": max(walls),
            "step_s_median": {k: statistics.median(v) for k, v in steps.items()},
            "connections_per_deploy": statistics.median(r["connections"] for r in rounds) / n}


def print_report(rep: dict) -> None:
    print(f"deploy to {rep['boxes']} loopback boxes, {rep['parallel']} at a time, {rep['rounds']} rounds per mode "
          f"(bundle {rep['bundle']}; latency gate {rep['gate_samples']} calls)")
    modes = list(rep["modes"])
    names = list(rep["modes"][modes[0]]["step_s_median"])
    print(f"{'':<24}" + "".join(f"{m:>26}" for m in modes))
    print(f"{'fleet wall, median s':<24}" + "".join(f"{rep['modes'][m]['wall_s_median']:>26.2f}" for m in modes))
    print(f"{'fleet wall, max s':<24}" + "".join(f"{rep['modes'][m]['wall_s_max']:>26.2f}" for m in modes))
    print(f"{'connections per box':<24}" + "".join(f"{rep['modes'][m]['connections_per_deploy']:>26.1f}"
                                                    for m in modes))
    for name in names:
        print(f"{'  ' + name + ', median s':<24}" + "".join(f"{rep['modes'][m]['step_s_median'][name]:>26.3f}"
                                                              for m in modes))
    print(f"fleet wall per step / per box: {rep['ratio']:.2f}x (median; loopback: no network round trips)")
    m = rep["machine"]
    print(f"machine: {m['cpu']} ({m['cpus']} CPUs), ISA {', '.join(m['isa']) or 'none of avx2/avx512f/amx_tile'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--boxes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--gate-samples", type=int, default=200)
    ap.add_argument("--bundle", type=Path, default=None, help="a cpu bundle (default: compile DeepLOB --quant int8)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sys.path[:0] = [str(HERE), str(ROOT / "tests")]
    from serve_swap import compile_deeplob, machine   # the swap benchmark's DeepLOB int8 bundle, machine line
    from sshbox import LoopbackBox
    with tempfile.TemporaryDirectory(prefix="edgehft-fleet-") as tmp:
        work = Path(tmp)
        bundle = a.bundle or compile_deeplob(work)
        (work / "box").mkdir()
        box = LoopbackBox(work / "box").start()
        try:
            cfg = box.config()
            rounds = {m: [] for m in MODES}
            for i in range(a.rounds):
                for mode, share in MODES.items():
                    rounds[mode].append(fleet_round(box, cfg, work, bundle, a.boxes, a.parallel, share,
                                                    a.gate_samples))
        finally:
            box.stop()
    modes = {m: summary(r, a.boxes) for m, r in rounds.items()}
    per_box, per_step = (modes[m]["wall_s_median"] for m in MODES)
    rep = {"boxes": a.boxes, "parallel": a.parallel, "rounds": a.rounds, "gate_samples": a.gate_samples,
           "bundle": str(a.bundle or "DeepLOB int8"), "machine": machine(), "modes": modes, "ratio": per_step / per_box}
    if a.json:
        print(json.dumps(rep))
    else:
        print_report(rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
