"""Fan-out: one job per box (a deploy or a rollback), run by an engine found by name.

A **job** is plain JSON (so an engine may run it in another process): ``kind`` ``"deploy"`` or ``"rollback"``,
``target`` (the :class:`~edgehft.deploy.ssh.SshTarget` fields), and for a deploy ``bundle``, ``board`` and
``options`` (:func:`~edgehft.deploy.deploy.deploy`'s keyword arguments), for a rollback ``to`` (a version, or
None: the previous one). :func:`run_job` runs one in this process and returns its **result**: a deploy's
:class:`~edgehft.deploy.deploy.DeployResult` as JSON; a rollback's ``{"host", "ok", "exit_code", "active",
"previous", "error", "hint"}``. It never raises for a per-box failure.

Engines (one file each, :data:`ENGINES`): ``ansible`` (ansible-runner: Ansible's forks run the jobs, each as
``python -m edgehft.deploy.fanout_job``; ``pip install 'edgehft[fleet]'``) and ``threads`` (a thread pool in this
process). Each has ``run(jobs, parallel, on_result) -> list[result]`` (results in the order of ``jobs``).
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Callable

from edgehft.deploy.ssh import TARGET_FIELDS
from edgehft.errors import EdgeHFTError, InputError

ENGINES = {"ansible": "edgehft.deploy.fanout_ansible", "threads": "edgehft.deploy.fanout_threads"}


def engine(name: str):
    """The fan-out engine module called ``name`` (:data:`ENGINES`).

    Raises:
        InputError: an unknown name. MissingExtraError: the engine's library is not installed."""
    if name not in ENGINES:
        raise InputError(f"no fan-out engine {name!r}", hint=f"engines: {', '.join(ENGINES)}")
    mod = importlib.import_module(ENGINES[name])
    mod.check()
    return mod


def default_engine() -> str:
    """``ansible`` where ansible-runner is installed, else ``threads``."""
    return "ansible" if importlib.util.find_spec("ansible_runner") else "threads"


def target_json(target) -> dict:
    """The JSON fields of an SshTarget (its connection multiplexer left out)."""
    return {f: getattr(target, f) for f in TARGET_FIELDS}


def deploy_job(target, bundle: str, board: str | None, options: dict) -> dict:
    """A deploy job (module docstring); ``options`` must be JSON (no callbacks)."""
    return {"kind": "deploy", "target": target_json(target), "bundle": str(bundle), "board": board,
            "options": dict(options)}


def rollback_job(target, to: str | None) -> dict:
    """A rollback job (module docstring)."""
    return {"kind": "rollback", "target": target_json(target), "to": to}


def run_job(job: dict) -> dict:
    """Run one job here (module docstring) and return its result; per-box failures are in the result."""
    from edgehft.deploy.ssh import SshTarget
    target = SshTarget(**{f: job["target"][f] for f in TARGET_FIELDS})
    if job["kind"] == "deploy":
        from edgehft.deploy.deploy import deploy
        return deploy(target, job["bundle"], job.get("board"), **job.get("options", {})).to_json()
    from edgehft.deploy.deploy import rollback
    res = {"host": target.label, "install_dir": target.install_dir, "ok": False, "exit_code": 0, "active": None,
           "previous": None, "error": None, "hint": None}
    try:
        res.update({k: v for k, v in rollback(target, job.get("to")).items() if k in ("active", "previous")}, ok=True)
    except EdgeHFTError as exc:
        res.update(error=exc.args[0], hint=exc.hint, exit_code=exc.exit_code)
    return res


def failed_result(job: dict, error: str, exit_code: int = 9) -> dict:
    """The result of a job that gave none (its process died, the engine could not start it)."""
    t = job["target"]
    label = (f"{t['user']}@" if t.get("user") else "") + t["host"] + (f":{t['port']}" if t.get("port") else "")
    return {"host": label, "board": job.get("board") or "?", "install_dir": t["install_dir"], "ok": False,
            "exit_code": exit_code, "error": error, "hint": None, "box_reached": False}


OnResult = Callable[[int, dict], None]
