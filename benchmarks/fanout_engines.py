"""The rollout fan-out engines side by side (issue 18): ``ansible`` (ansible-runner: a local play, one host per box,
each a ``python -m edgehft.deploy.fanout_job`` process) against ``threads`` (a thread pool in this process).

N loopback boxes, each a real OpenSSH server of its own on 127.0.0.1 (tests/sshbox.py; the box's Python is
.venv-board), get the same jobs from each engine, the engines alternating round by round so a drift of the
machine's load falls on both. ``--dry-run`` jobs probe each box (what a wave of a rollout costs besides the
deploy itself); without it each job deploys ``--bundle`` (the latency gate with ``--gate-samples`` calls and a
budget every run meets). Per engine: the wall time of the fan-out (median and max over rounds), the ssh
connections each box accepted per job (from its sshd log) and the jobs' exit codes.

    python benchmarks/fanout_engines.py --bundle DIR [--boxes 8] [--rounds 3] [--dry-run] [--json]
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
ENGINES = ("threads", "ansible")


def engine_round(engine: str, boxes: list, work: Path, bundle: str, opts: dict, parallel: int, tag: str) -> dict:
    """One fan-out of a job per box with ``engine``: wall seconds, connections accepted per box, exit codes."""
    from edgehft.deploy import fanout
    from edgehft.deploy.ssh import parse_target
    mod = fanout.engine(engine)
    jobs = [fanout.deploy_job(parse_target("box", python=b.python, install_dir=str(work / f"inst-{tag}-{i}"),
                                           ssh_config=str(b.config(f"cfg-{tag}"))), bundle, None, opts)
            for i, b in enumerate(boxes)]
    before = [accepted(b) for b in boxes]
    t0 = time.perf_counter()
    results = mod.run(jobs, parallel)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "connections": [accepted(b) - n for b, n in zip(boxes, before)],
            "exit_codes": [r.get("exit_code") for r in results]}


def accepted(box) -> int:
    return (box.work / "sshd.log").read_text(errors="replace").count("Accepted publickey")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, required=True, help="a bundle the loopback box runs (e.g. a cpu bundle)")
    ap.add_argument("--boxes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--gate-samples", type=int, default=200)
    ap.add_argument("--dry-run", action="store_true", help="probe the boxes only (nothing is deployed)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sys.path[:0] = [str(HERE), str(ROOT / "tests")]
    from serve_swap import machine
    from sshbox import LoopbackBox
    opts = {"dry_run": a.dry_run, "budget_p99_us": 1e9, "budget_p999_us": 1e9, "gate_samples": a.gate_samples,
            "gate_warmup": 20}
    rounds: dict = {e: [] for e in ENGINES}
    with tempfile.TemporaryDirectory(prefix="edgehft-engines-") as tmp:
        work = Path(tmp)
        boxes = []
        try:
            for i in range(a.boxes):
                (work / f"sshd{i}").mkdir()
                boxes.append(LoopbackBox(work / f"sshd{i}").start())
            for r in range(a.rounds):
                for e in ENGINES:
                    rounds[e].append(engine_round(e, boxes, work, str(a.bundle.resolve()), opts, a.parallel,
                                                  f"{e}-{r}"))
        finally:
            for b in boxes:
                b.stop()
    rep = {"boxes": a.boxes, "rounds": a.rounds, "dry_run": a.dry_run, "machine": machine(),
           "engines": {e: {"wall_s": [round(x["wall_s"], 2) for x in rs],
                           "wall_s_median": statistics.median(x["wall_s"] for x in rs),
                           "connections_per_box": sorted({c for x in rs for c in x["connections"]}),
                           "exit_codes": sorted({c for x in rs for c in x["exit_codes"]})}
                       for e, rs in rounds.items()}}
    if a.json:
        print(json.dumps(rep))
        return 0
    print(f"{'probe' if a.dry_run else 'deploy'} to {a.boxes} loopback boxes (one sshd each), {a.rounds} rounds "
          f"per engine, alternating")
    for e, s in rep["engines"].items():
        print(f"  {e:<8} wall median {s['wall_s_median']:6.2f} s (rounds {', '.join(map(str, s['wall_s']))}); "
              f"connections per box {s['connections_per_box']}; exit codes {s['exit_codes']}")
    m = rep["machine"]
    print(f"machine: {m['cpu']} ({m['cpus']} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
