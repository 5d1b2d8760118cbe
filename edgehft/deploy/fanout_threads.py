"""The ``threads`` fan-out engine: the jobs (:mod:`edgehft.deploy.fanout`) on a thread pool in this process."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from edgehft.deploy.fanout import OnResult, run_job


def check() -> None:
    """Nothing to install."""


def run(jobs: list[dict], parallel: int, on_result: OnResult | None = None) -> list[dict]:
    """Every job, ``parallel`` at a time; results in the order of ``jobs`` (``on_result(i, result)`` as each ends)."""
    def one(i: int) -> dict:
        res = run_job(jobs[i])
        if on_result:
            on_result(i, res)
        return res
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return list(pool.map(one, range(len(jobs))))
