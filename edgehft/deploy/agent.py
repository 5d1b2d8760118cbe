"""The box agent: ``python -m edgehft.deploy.agent COMMAND --root INSTALL_DIR ...``, run over SSH by
``edgehft deploy``/``status``/``rollback`` and by the HIL plugin's remote target.

It answers with one JSON object per line on stdout; a failure is ``{"error", "hint", "type"}`` and exit
status 1. Commands:

    probe                        facts about the box (edgehft.deploy.probe) and the install dir's status
    receive --version V --bytes N --meta JSON   bundle tar on stdin -> incoming/V
    verify --version V           SHA-256 of every staged file against the staged manifest
    golden --version V --board B [--emulate]   the bundle's golden vectors on the box's own runtime
    activate --version V [--keep K]             re-verify, move to versions/, atomic switch of current
    rollback [--to V]            switch back (to the previous version by default)
    discard --version V --reason TEXT           drop a staged version that failed a check
    status                       what the box runs and keeps
    hil CHECK --board B [--options JSON] [--bundle DIR] [--emulate]
                                 a HIL check (edgehft.hil.checks: golden, latency, soak) on the box's
                                 active bundle (or DIR), in the agent's process

A hang-up (the SSH connection dropped) or SIGTERM raises inside the agent, so a transfer in progress is
removed before it exits; a SIGKILL leaves at most an ``incoming/*.partial`` directory, removed by the next
deploy. Nothing here imports TensorFlow; the golden and HIL commands import the board's runtime.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys

from edgehft.errors import EdgeHFTError


class HangUp(Exception):
    """SIGHUP/SIGTERM arrived: the SSH session ended or someone stopped the agent."""


def _on_signal(signum, frame):
    raise HangUp(f"signal {signal.Signals(signum).name}")


def emit(obj: dict) -> bool:
    """One JSON line on stdout; False when the connection is gone (nobody will read it)."""
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
        return True
    except (BrokenPipeError, OSError):
        return False


def _golden(store, args) -> dict:
    from edgehft.deploy.store import failpoint
    from edgehft import runtime
    from edgehft.checks import check_golden
    path = store.staged(args.version)
    opts = {"emulate": True} if args.emulate else {}
    with runtime.open(path, args.board, **opts) as r:
        res = check_golden(r)
        res.update(board=r.board, emulated=r.emulated, version=args.version)
    failpoint("golden:before-result")
    return res


def _hil(store, args) -> dict:
    from edgehft import runtime
    from edgehft.hil import checks
    fn = {"golden": checks.golden, "latency": checks.latency, "soak": checks.soak}.get(args.check)
    if fn is None:
        raise EdgeHFTError(f"unknown HIL check {args.check!r}", hint="golden, latency or soak")
    path = args.bundle or str(store.current.resolve())
    if not args.bundle and store.active() is None:
        raise EdgeHFTError(f"no active bundle in {store.root}", hint="edgehft deploy one first, or pass a bundle")
    opts = {"emulate": True} if args.emulate else {}
    with runtime.open(path, args.board, **opts) as r:
        return fn(r, **json.loads(args.options or "{}"))


def _abandon(store, args, reason: str) -> None:
    """The deploy that staged ``args.version`` is gone (killed, connection dropped) during receive, verify or
    golden: it will never switch to that version, so remove it now instead of leaving it to the next deploy."""
    if args.command in ("receive", "verify", "golden") and args.version:
        try:
            store.discard(args.version, reason)
        except (EdgeHFTError, OSError):
            pass


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGHUP, _on_signal)          # first: a hang-up during the imports below is handled too
    signal.signal(signal.SIGTERM, _on_signal)
    from edgehft.deploy.store import Store
    p = argparse.ArgumentParser(prog="python -m edgehft.deploy.agent")
    p.add_argument("command", choices=["probe", "receive", "verify", "golden", "activate", "rollback", "discard",
                                       "status", "hil"])
    p.add_argument("check", nargs="?")
    p.add_argument("--root", required=True)
    p.add_argument("--version")
    p.add_argument("--bytes", type=int, default=0)
    p.add_argument("--meta", default="{}")
    p.add_argument("--board")
    p.add_argument("--emulate", action="store_true")
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--to")
    p.add_argument("--reason", default="")
    p.add_argument("--options")
    p.add_argument("--bundle")
    args = p.parse_args(argv)
    store = Store(args.root)
    try:
        if args.command == "probe":
            from edgehft.deploy.probe import probe_box
            res = {"facts": probe_box(), "status": store.status()}
        elif args.command == "receive":
            res = store.receive(args.version, sys.stdin.buffer, args.bytes, json.loads(args.meta))
        elif args.command == "verify":
            res = store.verify(args.version)
        elif args.command == "golden":
            res = _golden(store, args)
        elif args.command == "activate":
            res = store.activate(args.version, keep=args.keep)
        elif args.command == "rollback":
            res = store.rollback(args.to)
        elif args.command == "discard":
            res = store.discard(args.version, args.reason)
        elif args.command == "hil":
            res = _hil(store, args)
        else:
            res = store.status()
    except EdgeHFTError as exc:
        emit({"error": exc.args[0] if exc.args else str(exc), "hint": exc.hint, "type": type(exc).__name__,
              "exit_code": exc.exit_code})
        return 1
    except HangUp as exc:
        _abandon(store, args, f"{args.command}: the connection dropped ({exc})")
        emit({"error": f"the agent was stopped ({exc})", "type": "HangUp"})
        return 1
    except Exception as exc:  # an unexpected failure is reported, not a traceback on a closed pipe
        emit({"error": f"{type(exc).__name__}: {exc}", "type": type(exc).__name__,
              "hint": "a bug or an unexpected box state; the box keeps serving its previous version"})
        return 1
    if not emit({"ok": True, "result": res}):
        _abandon(store, args, f"{args.command}: the deploy went away before it got the result")
    return 0


if __name__ == "__main__":
    sys.exit(main())
