"""Run many ``edgehft`` command lines in one process, as the console script would, so a fuzz can afford
hundreds of them: ``python tests/tools/cli_batch.py JOBS.json RESULTS.jsonl START``.

JOBS.json is a list of argument lists. From index START on, each job runs ``edgehft.cli.main(args)``
(click's standalone mode, like the ``edgehft`` script) with stdout and stderr captured, and appends one JSON
line to RESULTS.jsonl: ``{"i", "begin": true}`` before it starts, then ``{"i", "rc", "stderr", "uncaught"}``
where ``uncaught`` names an exception that escaped the CLI (the real script would print a traceback). A
crash (a signal) kills this process: the caller sees the job that began and did not end, records it, and
starts again after it (:func:`run_batch`).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _run_one(args: list) -> dict:
    from edgehft.cli import main
    out, err = io.StringIO(), io.StringIO()
    rc, uncaught = 0, None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main.main(args=args, prog_name="edgehft", standalone_mode=True)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:  # noqa: BLE001 - the real script would die with a traceback
            rc, uncaught = 1, f"{type(exc).__name__}: {exc}"
    return {"rc": rc, "stderr": err.getvalue()[-2000:], "uncaught": uncaught}


def main(argv: list) -> int:
    jobs = json.loads(Path(argv[0]).read_text())
    with open(argv[1], "a") as results:
        for i in range(int(argv[2]), len(jobs)):
            results.write(json.dumps({"i": i, "begin": True}) + "\n")
            results.flush()
            results.write(json.dumps({"i": i, **_run_one(jobs[i])}) + "\n")
            results.flush()
    return 0


def run_batch(jobs: list, work: Path, env: dict, job_timeout_s: float = 60.0) -> list:
    """Run ``jobs`` (argument lists) through this driver in subprocesses, restarting after a crash or a hang.
    Returns one dict per job: the driver's result, or ``{"rc": -N}`` for a job whose process died of signal N,
    or ``{"timeout": True}`` for one that ran past ``job_timeout_s``."""
    work.mkdir(parents=True, exist_ok=True)
    jobs_path = work / "jobs.json"
    jobs_path.write_text(json.dumps(jobs))
    done: dict = {}
    start = 0
    while start < len(jobs):
        res_path = work / f"results-{start}.jsonl"
        with open(work / f"driver-{start}.log", "wb") as log:
            p = subprocess.Popen([sys.executable, __file__, str(jobs_path), str(res_path), str(start)], env=env,
                                 stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
            began, since = None, time.monotonic()
            while p.poll() is None:
                time.sleep(0.05)
                last = _read(res_path, done)
                if last != began:
                    began, since = last, time.monotonic()
                elif began is not None and began not in done and time.monotonic() - since > job_timeout_s:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                    done[began] = {"rc": None, "timeout": True, "stderr": "", "uncaught": None}
            began = _read(res_path, done)
        if began is not None and began not in done:          # died inside a job: a crash
            done[began] = {"rc": p.returncode, "stderr": "", "uncaught": None}
        start = max(done) + 1 if done else len(jobs)
    return [done.get(i, {"rc": None, "missing": True}) for i in range(len(jobs))]


def _read(path: Path, done: dict):
    """Record finished jobs from the results file into ``done``; return the index of the last job begun."""
    last = None
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:                        # a line being written
            continue
        last = r["i"]
        if not r.get("begin"):
            done[r["i"]] = r
    return last


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
