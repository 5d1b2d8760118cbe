"""The box agent: ``python -m edgehft.deploy.agent COMMAND --root INSTALL_DIR ...``, run over SSH by
``edgehft deploy``/``status``/``rollback`` and by the HIL plugin's remote target.

It answers with one JSON object per line on stdout; a failure is ``{"error", "hint", "type", "exit_code"}``
and exit status 1 (2: bad arguments). Commands:

    probe                        facts about the box (edgehft.deploy.probe) and the install dir's status
    hold --version V [--meta JSON] [--idle-timeout S]
                                 hold the box for the deploy of V (deploy.hold): answers {"held": ...}, then
                                 reads heartbeat lines on stdin until "done"; see "Holding the box" below
    receive --version V --bytes N --meta JSON [--held] [--idle-timeout S]
                                 bundle tar on stdin -> incoming/V
    verify --version V           SHA-256 of every staged file against the staged manifest
    golden --version V --board B [--emulate] [--plans P1,P2]
                                 the bundle's golden vectors on the box's own runtime (--plans: those of each
                                 named plan of the bundle, {"plans": {plan: result}}; a plan this box cannot run
                                 is {"skipped": why})
    plans --version V --board B --plans P1,P2 [--select S] [--forced P] [--core N] [--rounds R] [--held]
          [--meta JSON]          time the named plans on this box (one process, interleaved, pinned to core N),
                                 choose one (--forced, else the lowest --select percentile) and record it in
                                 plan/V.json (edgehft.runtime.plans); --meta {"excluded": {plan: why}} is kept
                                 in the record
    latency --version V --board B [--plan P] [--core N] [--options JSON] [--emulate]
                                 the deploy's latency gate: edgehft.hil.checks.latency on the staged V (plan P,
                                 else its top level), this process pinned to core N (default: the highest
                                 allowed one); --options: the check's keyword arguments (budget_p99, samples...)
    latency --version V --skip WHY
                                 the gate is off for V (--no-latency-gate): log WHY in history.jsonl, time nothing
    activate --version V [--keep K] [--held] [--expect-active V|none]
                                 re-verify, move to versions/, atomic switch of previous and current
    rollback [--to V]            switch back (to the previous version by default)
    discard --version V --reason TEXT           drop a staged version that failed a check
    status                       what the box runs and keeps
    hil CHECK --board B [--options JSON] [--bundle DIR] [--emulate]
                                 a HIL check (edgehft.hil.checks: golden, latency, streaming, soak) on the
                                 box's active bundle (or DIR), in the box's own process; --options: the
                                 check's keyword arguments as a JSON object (unknown keys are refused)

Holding the box: a deploy runs ``hold`` over its own SSH connection for its whole length. ``receive
--held`` and ``activate --held`` are refused unless that hold is still on for their version, and every
changing step is refused while another deploy holds the box; the refusal names the holder (version, the
host and pid it deploys from, since when, the agent's pid). The hold ends when the deploy writes "done", and
at once when its connection closes without it (the deploy was killed) or nothing arrives for the idle
timeout (a stalled link); then the agent removes that deploy's staged copy itself.

Idle timeout: ``receive`` and ``hold`` give up when no byte arrives on stdin for ``--idle-timeout`` seconds
(default ``$EDGEHFT_IDLE_TIMEOUT``, else 30): over a stalled link the agent removes its partial transfer,
exits and frees the box, instead of blocking until TCP gives up.

Crash isolation: ``golden``, ``plans``, ``latency`` and ``hil`` open the bundle's model with the board's runtime,
which can crash the interpreter (e.g. SIGSEGV in native code). They run in a child process (the same command with
``--in-child``, core dumps off); the agent survives the child's death and answers with a DeployError (exit
9) that names the step and the signal, e.g. "golden crashed on the box: ... killed by SIGSEGV (signal 11)".

A hang-up (the SSH connection dropped) or SIGTERM raises inside the agent, so a transfer in progress is
removed before it exits; a SIGKILL leaves at most an ``incoming/*.partial`` directory, removed by the next
deploy. Nothing here imports TensorFlow; the golden and HIL commands import the board's runtime.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from edgehft.errors import DeployError, EdgeHFTError

ISOLATED = ("golden", "plans", "latency", "hil")        # commands that run the bundle's model: in a child process
PLAN_CHOICE = 1         # the plan-choice protocol this agent speaks (golden --plans, plans), said in the probe
LATENCY_GATE = 1        # the latency-gate protocol this agent speaks (latency, latency --skip), said in the probe


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
    from edgehft.bundle_checks import check_golden
    from edgehft.errors import BoardUnavailableError
    path = store.staged(args.version)
    opts = {"emulate": True} if args.emulate else {}
    if not args.plans:
        with runtime.open(path, args.board, **opts) as r:
            res = check_golden(r)
            res.update(board=r.board, emulated=r.emulated, version=args.version)
        failpoint("golden:before-result")
        return res
    per = {}
    for name in args.plans.split(","):
        try:
            with runtime.open(path, args.board, plan=name, **opts) as r:
                per[name] = {**check_golden(r), "board": r.board, "emulated": r.emulated}
        except BoardUnavailableError as exc:        # this box cannot run that plan (a library, a CPU feature)
            per[name] = {"ok": False, "skipped": exc.args[0]}
    failpoint("golden:before-result")
    return {"plans": per, "version": args.version}


def _time_plans(store, args) -> dict:
    """The plans named in ``args.plans`` opened on this box and timed interleaved in this process
    (:func:`edgehft.runtime.plans.time_runners` on the golden inputs). Returns ``{"measured", "pinned_cpu",
    "rounds", "windows"}``; the choice and its record are the parent agent's (:meth:`Store.record_plan`)."""
    from edgehft import runtime
    from edgehft.deploy.store import failpoint
    from edgehft.runtime.plans import time_runners, timing_windows
    path = store.staged(args.version)
    if not 1 <= args.rounds <= 100_000 or not args.plans:
        raise DeployError(f"plans: --rounds {args.rounds} (1 to 100000) and --plans are needed",
                          hint="a bug in the deploy that called the agent")
    runners = {}
    try:
        for name in args.plans.split(","):
            runners[name] = runtime.open(path, args.board, plan=name)
        windows = timing_windows([r.bundle for r in runners.values()])
        figures = time_runners(runners, windows, rounds=args.rounds, core=args.core)
    finally:
        for r in runners.values():
            r.close()
    failpoint("plans:before-result")
    return {"measured": figures, "pinned_cpu": figures.pop("_core"), "rounds": args.rounds, "windows": len(windows)}


def _latency_gate(store, args) -> dict:
    """The deploy's latency gate on staged version ``args.version``: :func:`edgehft.hil.checks.latency` (the
    HIL check: the bundle's golden inputs back to back, p50/p99/p99.9 of ``predict`` in µs, held to the board
    file's ``[latency_budget_us]`` or the budgets in ``--options``) on plan ``args.plan`` (None: the top level),
    opened in this process pinned to ``args.core`` (default: the highest CPU this process may run on).

    Returns:
        the check's result dict plus ``"pinned_cpu"`` (int), ``"plan"`` (the plan timed) and ``"version"``;
        ``ok`` False: over budget, None: not judged (emulated without a given budget, or no budget).
    Raises:
        InputError: ``args.core`` is not a CPU this process may run on; an unknown or bad option.
        EdgeHFTError: the staged copy is missing; the bundle or runtime cannot be opened.
    """
    from edgehft import runtime
    from edgehft.deploy.store import failpoint
    from edgehft.errors import InputError
    from edgehft.hil import checks
    path = store.staged(args.version)
    opts = _hil_options(checks.latency, "latency", args.options)
    allowed = os.sched_getaffinity(0)
    core = max(allowed) if args.core is None else args.core
    if core not in allowed:
        raise InputError(f"latency gate: core {core} is not one this process may run on (allowed: {sorted(allowed)})",
                         hint="pin to a core the box serves on (--core, or the board file's [runtime] core)")
    emulate = {"emulate": True} if args.emulate else {}
    with runtime.open(path, args.board, plan=args.plan, affinity=[core], **emulate) as r:
        res = checks.latency(r, **opts)
        plan = r.plan
    failpoint("latency:before-result")
    return {**res, "pinned_cpu": core, "plan": plan, "version": args.version}


HIL_CHECKS = ("golden", "latency", "streaming", "soak")


def _hil_options(fn, check: str, text: str | None) -> dict:
    """The keyword arguments of HIL check ``fn`` from ``--options`` (a JSON object; empty: the defaults).

    Raises:
        InputError: not a JSON object, or a key that is not one of ``fn``'s options (named, with the ones it takes).
    """
    import inspect
    from edgehft.errors import InputError
    try:
        opts = json.loads(text or "{}")
    except ValueError as exc:
        raise InputError(f"hil {check}: --options is not JSON ({exc})",
                         hint="a bug in the client that called the agent: it sends the options as a JSON object")
    if not isinstance(opts, dict):
        raise InputError(f"hil {check}: --options is a JSON {type(opts).__name__}, not an object",
                         hint="a bug in the client that called the agent: it sends the options as a JSON object")
    known = [p for p in inspect.signature(fn).parameters if p != "runner"]
    unknown = sorted(k for k in opts if k not in known)
    if unknown:
        raise InputError(f"hil {check}: unknown option(s) {', '.join(unknown)}",
                         hint=f"{check} takes {', '.join(known) or 'no options'}; a client newer than the box's "
                              "edgehft may send more: upgrade edgehft on the box")
    return opts


def _hil(store, args) -> dict:
    """One HIL check (:mod:`edgehft.hil.checks`: golden, latency, streaming, soak) on the box's active bundle
    (or ``--bundle``) opened with the board's runtime in this process, with ``--options`` as its keyword
    arguments. Returns the check's result dict (a bundle that does not stream: streaming's ``skipped`` result).
    ``soak`` with ``swap_every_s``: the soak across swaps (:func:`edgehft.serving.soak.soak_check`), the bundle
    served and installed again in a temporary install directory; the box's own one is not touched.

    Raises:
        InputError: an unknown check or option, or bad option values (the check's own).
        EdgeHFTError: no active bundle; the bundle or runtime cannot be opened (BundleError, ...).
    """
    from edgehft import runtime
    from edgehft.errors import InputError
    from edgehft.hil import checks
    if args.check not in HIL_CHECKS:
        raise InputError(f"unknown HIL check {args.check!r}", hint="golden, latency, streaming or soak")
    fn = getattr(checks, args.check)
    opts = _hil_options(fn, args.check, args.options)
    path = args.bundle or str(store.current.resolve())
    if not args.bundle and store.active() is None:
        raise EdgeHFTError(f"no active bundle in {store.root}", hint="edgehft deploy one first, or pass a bundle")
    emulate = {"emulate": True} if args.emulate else {}
    with runtime.open(path, args.board, **emulate) as r:
        if args.check == "soak" and opts.get("swap_every_s") is not None:
            from edgehft.serving.soak import soak_check       # in a temporary install dir, not the box's own
            return soak_check(r, opts.pop("minutes", 0.0), opts.pop("swap_every_s"), **opts)
        return fn(r, **opts)


def _gate_off(store, args) -> dict:
    """``latency --skip WHY``: the deploy of staged ``args.version`` switches without the latency gate; log
    it in ``history.jsonl`` (event ``latency-gate-off``). Returns ``{"version", "logged", "warnings"}``.

    Raises:
        DeployError: ``args.version`` is not staged.
    """
    vid = store.staged(args.version).name
    why = store.record("latency-gate-off", version=vid, reason=args.skip)
    return {"version": vid, "logged": why is None, "warnings": [why] if why else []}


def _abandon(store, args, reason: str) -> None:
    """The deploy that staged ``args.version`` is gone (killed, connection dropped) during hold, receive,
    verify or golden: it will never switch to that version, so remove it now instead of leaving it to the
    next deploy."""
    if args.command in ("hold", "receive", "verify", "golden", "plans", "latency") and args.version:
        if args.command == "hold" and not (store.incoming / args.version).is_dir():
            return                  # nothing staged yet: nothing to log either
        try:
            store.discard(args.version, reason)
        except (EdgeHFTError, OSError):
            pass


def _wait_for_done(fd: int, timeout: float) -> str:
    """Read the deploy's heartbeat lines on ``fd`` until it writes ``done``: ``"done"``; the end of the
    stream first: ``"gone"``; no byte for ``timeout`` seconds: ``"stalled"``."""
    tail = b""
    while True:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return "stalled"
        data = os.read(fd, 4096)
        if not data:
            return "gone"
        tail = (tail + data)[-8:]
        if b"done" in tail:
            return "done"


def _hold(store, args) -> dict:
    """Hold the box for the deploy of ``args.version`` until it says "done" (see the module docstring);
    a deploy that went away or stalled loses its staged copy too. Returns ``{"released", "ended"}``."""
    from edgehft.deploy.store import check_vid, idle_timeout
    vid = check_vid(args.version)
    timeout = idle_timeout(args.idle_timeout)
    meta = json.loads(args.meta or "{}")
    info = {"deploy": vid, "from_host": meta.get("from_host"), "client_pid": meta.get("client_pid")}
    with store.hold(info):
        ok = emit({"held": {**info, "agent_pid": os.getpid(), "active": store.active(), "idle_timeout": timeout}})
        ended = _wait_for_done(sys.stdin.fileno(), timeout) if ok else "gone"
        if ended != "done" and (store.incoming / vid).is_dir():
            why = {"gone": "the deploy went away (its connection closed before it finished)",
                   "stalled": f"the deploy's link stalled (no heartbeat for {timeout:g} s)"}[ended]
            try:
                store.discard(vid, why, wait_s=timeout + 5)
            except EdgeHFTError:
                pass                # a step still runs: the next deploy removes the copy once stale
    return {"released": vid, "ended": ended}


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _isolated(args, argv: list[str]) -> dict:
    """Run this agent command in a child process and return its last JSON object (a result or an error).

    Raises:
        DeployError: the child died without answering, e.g. killed by a signal (named, with the step).
    """
    # cwd "/" and PYTHONSAFEPATH: `-m` would put the working directory first on sys.path (see runtime.isolate)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONSAFEPATH": "1",
           "PYTHONPATH": root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
    proc = subprocess.Popen([sys.executable, "-m", "edgehft.deploy.agent", *argv, "--in-child"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, cwd="/", env=env)
    try:
        out, _ = proc.communicate()
    except BaseException:               # a hang-up or SIGTERM: the child goes with us
        proc.kill()
        proc.wait()
        raise
    lines = []
    for raw in out.decode(errors="replace").splitlines():
        try:
            lines.append(json.loads(raw))
        except ValueError:
            continue
    step = f"{args.command} {args.check}" if args.command == "hil" and args.check else args.command
    if proc.returncode < 0:
        sig = -proc.returncode
        raise DeployError(f"{step} crashed on the box: the process running the bundle's model was killed by "
                          f"{_signal_name(sig)} (signal {sig}); nothing was switched",
                          hint="the box's runtime crashes on this bundle (a damaged model, or a runtime bug); "
                               "the box keeps serving its previous version")
    if not lines or not isinstance(lines[-1], dict):
        raise DeployError(f"{step} ended with status {proc.returncode} on the box without a result",
                          hint="the box keeps serving its previous version; its stderr is in the ssh output")
    return lines[-1]


def _no_core_dumps() -> None:
    """A child that may crash in native code leaves no core file to fill the box's disk."""
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (ImportError, ValueError, OSError):
        pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m edgehft.deploy.agent")
    p.add_argument("command", choices=["probe", "hold", "receive", "verify", "golden", "plans", "latency",
                                       "activate", "rollback", "discard", "status", "hil"])
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
    p.add_argument("--held", action="store_true", help="the deploy holds the box (hold): refuse if it no longer does")
    p.add_argument("--expect-active", help="activate: refuse unless this version (or 'none') is active")
    p.add_argument("--idle-timeout", type=float, help="receive/hold: seconds without a byte before giving up")
    p.add_argument("--plans", help="golden/plans: the bundle's plans to check or time, comma-separated")
    p.add_argument("--select", default="p99", help="plans: the percentile the plan is chosen by (p50, p99, p99.9)")
    p.add_argument("--forced", help="plans: record this plan whatever the timing says")
    p.add_argument("--core", type=int, help="plans/latency: the CPU to time on (default: the highest one allowed)")
    p.add_argument("--plan", help="latency: the plan of the bundle to time (default: its top level)")
    p.add_argument("--skip", help="latency: the gate is off; log this reason in history.jsonl and time nothing")
    p.add_argument("--rounds", type=int, default=300, help="plans: timed calls per plan")
    p.add_argument("--in-child", action="store_true", help=argparse.SUPPRESS)
    return p


def _run(store, args):
    """The command's result (dict); raises EdgeHFTError/HangUp."""
    from edgehft.deploy.store import ANY, IdleStream, idle_timeout
    if args.command == "probe":
        from edgehft.deploy.probe import probe_box
        return {"facts": {**probe_box(), "plan_choice": PLAN_CHOICE, "latency_gate": LATENCY_GATE},
                "status": store.status()}
    if args.command == "hold":
        return _hold(store, args)
    if args.command == "receive":
        stream = IdleStream(sys.stdin.fileno(), idle_timeout(args.idle_timeout))
        return store.receive(args.version, stream, args.bytes, json.loads(args.meta), held=args.held)
    if args.command == "verify":
        return store.verify(args.version)
    if args.command == "golden":
        return _golden(store, args)
    if args.command == "plans":
        return _time_plans(store, args)
    if args.command == "latency":
        return _gate_off(store, args) if args.skip is not None else _latency_gate(store, args)
    if args.command == "activate":
        expect = ANY if args.expect_active is None else (None if args.expect_active == "none" else args.expect_active)
        return store.activate(args.version, keep=args.keep, expect=expect, held=args.held)
    if args.command == "rollback":
        return store.rollback(args.to)
    if args.command == "discard":
        return store.discard(args.version, args.reason)
    if args.command == "hil":
        return _hil(store, args)
    return store.status()


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGHUP, _on_signal)          # first: a hang-up during the imports below is handled too
    signal.signal(signal.SIGTERM, _on_signal)
    faulthandler.enable()       # a crash in native code says which signal on stderr ("Fatal Python error: ...")
    from edgehft.deploy.store import Store
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    store = Store(args.root)
    try:
        logs_only = args.command == "latency" and args.skip is not None       # the gate off: nothing runs the model
        if args.command in ISOLATED and not args.in_child and not logs_only:
            answer = _isolated(args, argv)
            if "error" in answer:
                emit(answer)
                return 1
            res = answer.get("result")
            if args.command == "plans":             # the child timed them; the choice is recorded here
                res = store.record_plan(args.version, res, select=args.select, forced=args.forced,
                                        excluded=json.loads(args.meta or "{}").get("excluded") or {}, held=args.held)
        else:
            if args.in_child:
                _no_core_dumps()
            res = _run(store, args)
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
