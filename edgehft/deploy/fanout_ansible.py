"""The ``ansible`` fan-out engine: Ansible runs the jobs (:mod:`edgehft.deploy.fanout`), through ansible-runner.

Why Ansible: the embedded teams' boxes are already in Ansible inventories, and Ansible's forks, per-host results
and event stream are what a fan-out needs; ansible-runner is its supported Python interface (pyinfra would bring
a second SSH stack beside OpenSSH, which the per-box protocol keeps). What Ansible runs here is a play on the
control host (``connection: local``): one host per job (named ``job<i>``, so nothing from the user's inventory is
templated by Ansible), whose one task is ``python -m edgehft.deploy.fanout_job DIR i`` (the per-box protocol over
OpenSSH, one connection per box). Its result is the file the job writes; a job that wrote none failed with what
Ansible says. The play runs with an ansible.cfg of its own (the working directory's is not read) and
``forks = parallel``.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from edgehft.deploy.fanout import OnResult, failed_result

PLAYBOOK = """\
- name: edgehft fan-out
  hosts: all
  gather_facts: false
  tasks:
    - name: edgehft job
      ansible.builtin.command:
        argv: ["{{ edgehft_python }}", "-m", "edgehft.deploy.fanout_job", "{{ edgehft_dir }}", "{{ edgehft_job }}"]
"""


def check() -> None:
    """Raises MissingExtraError when ansible-runner (or ansible-core) is missing."""
    from edgehft.compat import require_extra
    require_extra("ansible_runner", "fleet", "the ansible fan-out engine (--engine ansible)")
    require_extra("ansible", "fleet", "the ansible fan-out engine (--engine ansible)")


def run(jobs: list[dict], parallel: int, on_result: OnResult | None = None) -> list[dict]:
    """Every job as one Ansible host, ``parallel`` forks; results in the order of ``jobs``."""
    import ansible_runner
    results: list[dict | None] = [None] * len(jobs)
    with tempfile.TemporaryDirectory(prefix="edgehft-fanout-") as tmp:
        d = Path(tmp)
        (d / "jobs.json").write_text(json.dumps(jobs))
        (d / "results").mkdir()
        (d / "play.yml").write_text(PLAYBOOK)
        (d / "ansible.cfg").write_text(f"[defaults]\nforks = {max(1, parallel)}\nretry_files_enabled = False\n")
        inventory = {"all": {"hosts": {f"job{i}": {"ansible_connection": "local", "edgehft_job": i}
                                       for i in range(len(jobs))}}}
        (d / "inventory.json").write_text(json.dumps(inventory))
        said: dict[int, str] = {}

        def on_event(ev: dict) -> bool:
            kind, data = ev.get("event", ""), ev.get("event_data", {})
            host = str(data.get("host", ""))
            if kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable") and host.startswith("job"):
                i = int(host[3:])
                res = data.get("res") or {}
                said[i] = str(res.get("stderr") or res.get("msg") or "")[-500:]
                results[i] = _read_result(d, i, jobs[i], said[i])
                if on_result:
                    on_result(i, results[i])
            return True

        bindir = str(Path(sys.executable).parent)
        env = {"PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "ANSIBLE_CONFIG": str(d / "ansible.cfg"),
               "ANSIBLE_PYTHON_INTERPRETER": sys.executable, "ANSIBLE_NOCOLOR": "1"}
        ansible_runner.run(private_data_dir=str(d), playbook=str(d / "play.yml"), inventory=str(d / "inventory.json"),
                           extravars={"edgehft_python": sys.executable, "edgehft_dir": str(d)}, forks=max(1, parallel),
                           envvars=env, quiet=True, event_handler=on_event)
        for i, job in enumerate(jobs):
            if results[i] is None:
                results[i] = _read_result(d, i, job, said.get(i, "Ansible did not run the job"))
    return results  # type: ignore[return-value]


def _read_result(d: Path, i: int, job: dict, said: str) -> dict:
    try:
        return json.loads((d / "results" / f"{i}.json").read_text())
    except (OSError, ValueError):
        return failed_result(job, f"the fan-out job gave no result: {said.strip() or 'no output'}")
