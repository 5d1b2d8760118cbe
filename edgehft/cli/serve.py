"""``edgehft serve``: the in-process server (:func:`edgehft.serve`) as a sidecar process answering over a Unix
datagram socket (:mod:`edgehft.serving.sidecar`; the client: :mod:`edgehft.serving.client`)."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import click

from edgehft.cli.common import handles_errors, json_opt, main, require_signature_opt, threads_opt
from edgehft.errors import InputError

_positive = click.FloatRange(min=0, min_open=True)


def _event_printer(as_json: bool, events_path):
    """on_event: one line per event on stdout (JSON lines with --json), from any thread; the sidecar's own events
    (``listening``, ``stopped``) are appended to ``events_path`` too (the server appends its own)."""
    lock = threading.Lock()

    def text(e: dict) -> str:
        rest = " ".join(f"{k}={v if isinstance(v, (int, float, str)) or v is None else json.dumps(v, default=str)}"
                        for k, v in e.items() if k not in ("event", "version", "time_utc"))
        return f"{e.get('time_utc', '-')} {e['event']} {e.get('version') or '-'} {rest}".rstrip()

    def emit(e: dict, own: bool = False) -> None:
        line = json.dumps(e, default=str) if as_json else text(e)
        with lock:
            _write_stdout(line)
            if own and events_path:
                try:
                    with open(events_path, "a") as f:
                        f.write(json.dumps(e, default=str) + "\n")
                except OSError:
                    pass
    return emit


def _write_stdout(line: str) -> None:
    """One line on stdout; when the reader has gone (a closed pipe: ``| head``), stdout becomes /dev/null, said once
    on stderr, and the sidecar goes on serving (its events still go to --events)."""
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())      # also for the interpreter's own flush at exit
        except (OSError, ValueError):
            pass
        finally:
            os.close(devnull)
        try:
            sys.stderr.write("edgehft serve: stdout was closed; events go on to --events only\n")
            sys.stderr.flush()
        except (OSError, ValueError):                   # stderr went with it (2>&1 | head)
            pass


def _check_core(core, what: str) -> None:
    if core is not None and core not in os.sched_getaffinity(0):
        raise InputError(f"{what} {core}: not a CPU this process may run on",
                         hint=f"allowed CPUs here: {sorted(os.sched_getaffinity(0))}")


def _utc() -> str:
    from datetime import datetime, timezone
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@main.command("serve", epilog="Example:\n\n\b\n  edgehft serve /opt/edgehft --core 3 --shadow-core 2 --events "
                              "/var/log/edgehft-serve.jsonl\n  # a strategy: edgehft.serving.client.SidecarClient("
                              "'/opt/edgehft/serve.sock').predict(window)")
@click.argument("install_dir", type=click.Path(file_okay=False))
@click.option("--socket", "socket_path", default=None, metavar="PATH",
              help="Unix datagram socket to answer on (default: INSTALL_DIR/serve.sock); removed on exit.")
@click.option("--group", default=None, help="Give the socket to this group, mode 0660 (default: yours only, 0600).")
@click.option("--shadow-calls", default=300, show_default=True, type=click.IntRange(min=1),
              help="Live calls a new version is shadow-run on before it may serve.")
@click.option("--shadow-seconds", default=20.0, show_default=True, type=_positive,
              help="At most this long per shadow run (fewer live calls: golden inputs fill up).")
@click.option("--max-rel-mae", default=0.01, show_default=True, type=click.FloatRange(min=0),
              help="Shadow run's drift gate: the new version's outputs within this relative MAE of the active one's.")
@click.option("--budget-p99-us", default=None, type=_positive, metavar="US",
              help="Shadow run's latency gate and the breach watch after a swap: p99 in µs (default: the board "
                   "file's [latency_budget_us]).")
@click.option("--budget-p999-us", default=None, type=_positive, metavar="US", help="The same for p99.9.")
@click.option("--core", default=None, type=click.IntRange(min=0), help="Pin the serving thread to this CPU.")
@click.option("--spin", is_flag=True,
              help="Busy-poll the socket instead of sleeping until a request comes: takes the serving thread's "
                   "wake-up off each round trip and uses its core at 100 % (give --core a core of its own; the "
                   "client's side: SidecarClient(path, spin=True)).")
@click.option("--shadow-core", default=None, type=click.IntRange(min=0),
              help="Pin the manager thread (loads, shadow runs) to this CPU: not the serving one.")
@click.option("--events", "events_path", default=None, type=click.Path(dir_okay=False),
              help="Append every event to this file as JSON lines.")
@threads_opt
@require_signature_opt
@json_opt
@handles_errors
def serve_cmd(install_dir, socket_path, group, shadow_calls, shadow_seconds, max_rel_mae, budget_p99_us,
              budget_p999_us, core, spin, shadow_core, events_path, threads, as_json):
    """Serve INSTALL_DIR's active version (what `current` points to, as `edgehft deploy` leaves it) as a sidecar:
    predict requests over a Unix datagram socket, one datagram each way (protocol: edgehft.serving.sidecar; the
    client: edgehft.serving.client.SidecarClient). A new version deployed there is loaded, shadow-run on the live
    requests and swapped in between two requests, or refused (edgehft.serve). One line per event on stdout (JSON
    lines with --json). SIGTERM or SIGINT: stop, remove the socket, exit 0.

    Exit codes at start: 2 usage, 3 nothing deployed in INSTALL_DIR, a --core/--shadow-core not allowed here, a
    --socket path that cannot be bound or is not a socket, an unknown --group, 6 the active version does not match
    its manifest (or --require-signature refuses it), 7 the board's runtime unavailable, another sidecar serves on
    --socket, or the model's request or reply is over the largest datagram here; 0 after SIGTERM/SIGINT."""
    import edgehft
    from edgehft.serving import ShadowPolicy
    from edgehft.serving.sidecar import Sidecar, release_socket
    _check_core(core, "--core")
    _check_core(shadow_core, "--shadow-core")
    emit = _event_printer(as_json, events_path)
    policy = ShadowPolicy(calls=shadow_calls, seconds=shadow_seconds,
                          min_calls=min(ShadowPolicy.min_calls, shadow_calls),
                          max_rel_mae=max_rel_mae, budget_p99_us=budget_p99_us, budget_p999_us=budget_p999_us)
    signers = click.get_current_context().meta.get("edgehft.require_signature")
    path = socket_path or os.path.join(install_dir, "serve.sock")
    sock = _claim_socket(install_dir, path, group)
    state = _catch_signals()                     # before anything can be asked to stop: exit 0 from here on
    try:
        try:
            srv = edgehft.serve(install_dir, policy=policy, on_event=emit, events_path=events_path, threads=threads,
                                require_signature=signers, shadow_core=shadow_core)
        except BaseException:
            if sock is not None:
                release_socket(*sock)
            raise
        try:
            car = Sidecar(srv, path, group=group, spin=spin, sock=None if sock is None else sock[0],
                          on_event=lambda e: emit({"time_utc": _utc(), **e, "core": core}, True))
        except BaseException:
            srv.close()
            if sock is not None:
                release_socket(*sock)
            raise
        _serve(srv, car, state, core)
    finally:
        for sig, old in state["old"].items():
            signal.signal(sig, old)
    emit({"event": "stopped", "version": srv.active, "time_utc": _utc(), "why": state["signal"] or "stopped",
          "counters": car.counters}, True)


def _claim_socket(install_dir, path: str, group):
    """The socket bound before the model is opened, so a busy socket, a path that is not one or an unknown group is
    said before the server starts (no ``serving`` event from a process that never serves): ``(sock, path, inode)``;
    None when nothing is deployed in ``install_dir`` (edgehft.serve then says so)."""
    from edgehft.serving.sidecar import bind_socket
    from edgehft.serving.watch import current_version
    if current_version(Path(install_dir)) is None:
        return None
    sock = bind_socket(path, group)
    return sock, path, os.stat(path).st_ino


def _catch_signals() -> dict:
    """SIGTERM and SIGINT stop the sidecar (``state["car"]`` once it exists) instead of killing the process;
    ``state["signal"]`` names the first one, ``state["old"]`` the handlers they had."""
    state = {"car": None, "signal": None, "old": {}}

    def on_signal(signum, frame):
        state["signal"] = state["signal"] or signal.Signals(signum).name
        if state["car"] is not None:
            state["car"].stop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        state["old"][sig] = signal.signal(sig, on_signal)
    return state


def _serve(srv, car, state: dict, core) -> None:
    """Pin this thread (the serving one; the manager thread already runs, not pinned by this) and run the loop
    until a signal; then close the socket and the server."""
    state["car"] = car
    if state["signal"]:                          # it came while starting
        car.stop()
    try:
        if core is not None:
            os.sched_setaffinity(0, {core})      # this thread only (Linux)
        car.serve_forever()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)   # the cleanup is not cut short by a second signal
        car.close()
        srv.close()
