"""``python -m edgehft.deploy.fanout_job DIR I``: run job I of DIR/jobs.json (:mod:`edgehft.deploy.fanout`) and
write its result to DIR/results/I.json. Exit code 0 when the job succeeded, else 1 (the result says why)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from edgehft.deploy.fanout import failed_result, run_job
    d, i = Path(argv[0]), int(argv[1])
    job = json.loads((d / "jobs.json").read_text())[i]
    try:
        res = run_job(job)
    except Exception as exc:  # noqa: BLE001 - the result must say what happened, whatever it was
        res = failed_result(job, f"{type(exc).__name__}: {exc}")
    tmp = d / "results" / f".{i}.json"
    tmp.write_text(json.dumps(res))
    os.replace(tmp, d / "results" / f"{i}.json")
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
