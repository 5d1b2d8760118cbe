"""The host side of the SSH transport: plain OpenSSH (``ssh``), the user's own config and keys.

Every remote call is one ``ssh`` process running ``<python> -m edgehft.deploy.agent <command> ...`` on the
box; the agent answers with JSON lines on stdout. Safety rules kept here, in one place:

- host keys are checked strictly: ``-o StrictHostKeyChecking=yes`` is given on the command line, which
  wins over any config file, so an unknown or changed key is refused (:class:`HostKeyError`), never
  accepted;
- ``BatchMode=yes``: never a password or passphrase prompt on a deploy;
- the target is validated (user, host and port characters) and passed as ``-l user -p port host``; a
  host cannot start with ``-`` and so never becomes an ssh option;
- the remote command line is built with :func:`shlex.join`, so paths and names reach the agent as single
  arguments whatever they contain (the remote shell sees them quoted);
- keepalives: ``ServerAliveInterval`` (a sixth of the target's idle timeout, at least 1 s) and
  ``ServerAliveCountMax=3``, so a stalled link (connection open, no bytes) ends the call within about half
  the idle timeout (default 30 s: 15-20 s) as exit 10, instead of the step's whole time limit; the box
  agent gives up on its side after the idle timeout (``--idle-timeout``, see :mod:`edgehft.deploy.agent`).
  ``$EDGEHFT_IDLE_TIMEOUT`` sets the default for both;
- ssh's own messages go to a log file of their own (``-E``, ``LogLevel=DEBUG1``), apart from the remote
  program's stderr, so what the box agent or its runtime print can never be mistaken for ssh failing;
- one connection per box for a whole deploy (:func:`one_connection`): an OpenSSH ControlMaster this process
  owns (a child of it, killed with it), on a control socket in a private directory (mode 0700) that lives
  as long as the deploy; every call of the deploy is a session on it (``ControlMaster=no``), so the box
  sees one TCP connection, one authentication and one set of keepalives. What the master alone knows (a
  remote command killed by a signal, a stalled or dropped link) is read from the master's own log.

Exit status of ``ssh`` and what it becomes (OpenSSH 9.2, checked against a real sshd): a remote command
killed by a signal makes ssh exit 255, the same status as its own failures, and ssh prints nothing; only
its debug log says ``rtype exit-signal`` (the signal's name is not reported). So: 255 with that line, or a
status 129-254 (a shell on the box that reports a signal as 128+N), is the agent dying on the box:
:class:`DeployError`, exit 9, naming the command and the signal where known (from the status, or from the
"Fatal Python error: Segmentation fault" line the agent's faulthandler prints; a SIGKILL leaves neither);
255 without it is ssh's own failure (connection, authentication, host key, stall):
:class:`RemoteError`/:class:`HostKeyError`, exit 10. Steps that run the bundle's model (golden, HIL checks)
run in a child process on the box, so there the agent itself reports the crash with the signal's name.
"""
from __future__ import annotations

import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Iterator

from edgehft.errors import DeployError, HostKeyError, InputError, RemoteError

_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})|\[[0-9A-Fa-f:.]+\])$")
SSH_OPTIONS = ("BatchMode=yes", "StrictHostKeyChecking=yes", "ConnectTimeout=10")
IDLE_TIMEOUT_ENV = "EDGEHFT_IDLE_TIMEOUT"
DEFAULT_IDLE_TIMEOUT_S = 30.0
_FATAL = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Floating point exception": "SIGFPE",
          "Bus error": "SIGBUS", "Illegal instruction": "SIGILL"}    # the agent's faulthandler names these
_BENIGN_LOG = ("Authenticated to ", "Transferred: ", "Bytes per second: ")     # ssh's INFO lines on success


@dataclass(frozen=True)
class Multiplex:
    """A connection shared by several ssh calls (:func:`one_connection`): the master's control ``socket``
    and its ``-E`` ``log``; ``error``: the master could not connect (its classified failure): every call
    made with it raises that instead of trying again."""

    socket: str
    log: str
    error: RemoteError | None = None


@dataclass(frozen=True)
class SshTarget:
    """A box: ``user@host[:port]`` (user and port optional: ssh config or the board's defaults fill them).

    ``python`` is the interpreter on the box that has edgehft installed; ``install_dir`` the box
    directory holding ``versions/`` and the ``current`` symlink; ``extra_env`` variables the agent runs with;
    ``idle_timeout`` the seconds without a byte after which either end gives up on a connection (ssh's
    keepalives on this side, the agent's ``--idle-timeout`` on the box).
    """

    host: str
    user: str | None = None
    port: int | None = None
    python: str = "python3"
    install_dir: str = "/opt/edgehft"
    ssh_config: str | None = None
    extra_env: dict = field(default_factory=dict, compare=False)
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S
    mux: Multiplex | None = field(default=None, compare=False)

    @property
    def label(self) -> str:
        who = f"{self.user}@" if self.user else ""
        return f"{who}{self.host}" + (f":{self.port}" if self.port else "")


# SshTarget's fields that a rollout state or a fan-out job stores (its connection multiplexer left out).
TARGET_FIELDS = ("host", "user", "port", "python", "install_dir", "ssh_config", "extra_env", "idle_timeout")


def check_target_fields(d: dict, where: str) -> dict:
    """``d`` (the JSON fields of an SshTarget, as a rollout state or a fan-out job stores them) when every field is
    what :func:`parse_target` would have made: the same host, user and port rules, a port in range, an
    interpreter and an install dir that are plain paths, environment names that are variable names and values
    without control characters, an idle timeout in (0, 86400) s. Such a file is input, not trusted: this is what
    keeps a host like ``-oProxyCommand=...`` or a ``ProxyCommand`` from reaching ssh.

    Raises:
        InputError: another key, a missing one, or a field that breaks a rule (``where`` names the file).
    """
    keys = set(TARGET_FIELDS)
    bad = None
    if not isinstance(d, dict) or set(d) != keys:
        bad = f"fields {sorted(d) if isinstance(d, dict) else type(d).__name__}, not {sorted(keys)}"
    elif not isinstance(d["host"], str) or not _HOST.match(d["host"]):
        bad = f"host {d['host']!r} is not a host name or address"
    elif d["user"] is not None and not (isinstance(d["user"], str) and _USER.match(d["user"])):
        bad = f"user {d['user']!r} is not a user name"
    elif d["port"] is not None and not (type(d["port"]) is int and 0 < d["port"] < 65536):
        bad = f"port {d['port']!r} is not a port"
    elif not (isinstance(d["python"], str) and re.match(r"^[A-Za-z0-9_./+][A-Za-z0-9_./+-]*$", d["python"])):
        bad = f"python {d['python']!r} is not an interpreter path"
    elif not (isinstance(d["install_dir"], str) and re.match(r"^/[^\x00-\x1f]*$", d["install_dir"])):
        bad = f"install_dir {d['install_dir']!r} is not an absolute path"
    elif d["ssh_config"] is not None and not isinstance(d["ssh_config"], str):
        bad = f"ssh_config {d['ssh_config']!r} is not a path"
    elif not isinstance(d["extra_env"], dict) or any(
            not (isinstance(k, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)) or not isinstance(v, str)
            or re.search(r"[\x00-\x1f]", v) for k, v in d["extra_env"].items()):
        bad = f"extra_env {d['extra_env']!r} is not variable names with plain values"
    elif set(d["extra_env"]) - board_env_names():
        bad = (f"extra_env sets {sorted(set(d['extra_env']) - board_env_names())}, which no board file's [ssh] env "
               "sets (a target's environment comes from its board file only: PYTHONPATH or LD_PRELOAD from a file "
               "would run code on the box)")
    elif type(d["idle_timeout"]) not in (int, float) or not 0 < d["idle_timeout"] < 86400:
        bad = f"idle_timeout {d['idle_timeout']!r} is not a number of seconds in (0, 86400)"
    if bad:
        raise InputError(f"{where}: a box's target: {bad}",
                         hint="an absolute install dir and an interpreter path without spaces; a rollout state is "
                              "the file edgehft wrote, checked as the inventory was")
    return d


def board_env_names() -> set:
    """The environment variable names board files' ``[ssh] env`` tables set (every board edgehft knows, plug-ins'
    too): the only names a target read from a file (a rollout state, a fan-out job) may carry."""
    from edgehft.boards import list_boards
    return {str(k) for b in list_boards() for k in (b.ssh.get("env") or {})}


def idle_timeout_default() -> float:
    """``$EDGEHFT_IDLE_TIMEOUT`` seconds, else 30.

    Raises:
        InputError: the variable is not a positive number of seconds.
    """
    raw = os.environ.get(IDLE_TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_IDLE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 86400:
        raise InputError(f"{IDLE_TIMEOUT_ENV}={raw!r} is not a number of seconds", hint="e.g. 30 (the default)")
    return value


def parse_target(text: str, *, board=None, python: str | None = None, install_dir: str | None = None,
                 ssh_config: str | None = None, idle_timeout: float | None = None) -> SshTarget:
    """Parse ``user@host[:port]`` (IPv6 as ``[addr]:port``) and fill unset parts from ``board.ssh``.

    A user or port the text leaves out comes from the board file only when given there; otherwise the
    user's ssh config decides (``Host`` aliases work). ``idle_timeout`` (seconds) defaults to
    :func:`idle_timeout_default`.

    Raises:
        InputError: characters that are not a user name, host name, address or port; a bad idle timeout.
    """
    raw = text.strip()
    user = None
    if "@" in raw:
        user, raw = raw.rsplit("@", 1)
    port = None
    m = re.match(r"^(\[[^\]]*\]|[^:]*)(?::(\d+))?$", raw)
    if not m:
        raise InputError(f"--host {text!r} is not user@host[:port]", hint="e.g. xilinx@10.0.0.7:22 or an ssh alias")
    host, port_text = m.group(1), m.group(2)
    if not host or not _HOST.match(host):
        raise InputError(f"--host {text!r}: {host!r} is not a host name or address",
                         hint="letters, digits, '.', '-' and '_' only (IPv6 in [brackets]); it cannot start with '-'")
    if user is not None and not _USER.match(user):
        raise InputError(f"--host {text!r}: {user!r} is not a user name", hint="letters, digits, '.', '-', '_'")
    if port_text is not None:
        port = int(port_text)
        if not 0 < port < 65536:
            raise InputError(f"--host {text!r}: port {port} is out of range")
    ssh = dict(board.ssh) if board is not None else {}
    if ssh and (user is None or port is None):
        configured = _config_sets(host, ssh_config)        # the user's ssh config beats the board file
        ssh = {k: v for k, v in ssh.items() if k not in configured}
    env = dict(ssh.get("env") or {})
    env = {str(k): str(v) for k, v in env.items()}
    bad = [k for k in env if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)]
    if bad:
        raise InputError(f"board {board.name}: [ssh] env names {bad} are not variable names")
    if idle_timeout is not None and not 0 < idle_timeout < 86400:
        raise InputError(f"idle timeout {idle_timeout!r} s is out of range", hint="e.g. 30 (the default)")
    return SshTarget(host=host, user=user or ssh.get("user"), port=port or ssh.get("port"), extra_env=env,
                     python=python or ssh.get("python", "python3"),
                     install_dir=install_dir or ssh.get("install_dir", "/opt/edgehft"), ssh_config=ssh_config,
                     idle_timeout=idle_timeout if idle_timeout is not None else idle_timeout_default())


def _ssh_g(host: str, config: str) -> dict:
    try:
        text = subprocess.run(["ssh", "-G", "-F", config, "--", host.strip("[]")], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)


def _config_sets(host: str, ssh_config: str | None) -> set[str]:
    """``{"user", "port"}`` when the ssh config has an entry for ``host`` (``ssh -G`` with and without the
    config differ in host name, user, port, identity or proxy), else empty: the config then decides both,
    and the board file's defaults apply only to hosts the config does not know."""
    cfg = ssh_config or os.path.expanduser("~/.ssh/config")
    if not os.path.exists(cfg):
        return set()
    with_cfg, bare = _ssh_g(host, cfg), _ssh_g(host, "/dev/null")
    keys = ("hostname", "user", "port", "identityfile", "proxycommand", "proxyjump")
    return {"user", "port"} if any(with_cfg.get(k) != bare.get(k) for k in keys) else set()


def keepalive_options(idle_timeout: float) -> list[str]:
    """``ServerAliveInterval`` (a sixth of ``idle_timeout`` seconds, at least 1) and ``ServerAliveCountMax=3``:
    ssh gives up on a silent server within about half the idle timeout."""
    return [f"ServerAliveInterval={max(1, int(idle_timeout // 6))}", "ServerAliveCountMax=3"]


def ssh_argv(target: SshTarget, remote_argv: list[str] | None, log_file: str | None = None) -> list[str]:
    """The local ``ssh`` command line that runs ``remote_argv`` on the box (each element one argument) as a
    session on ``target.mux`` when it has one; ``remote_argv`` None: the master of a :class:`Multiplex`
    (``ControlMaster=yes``, ``-N``; not ``-M`` as well: with it ssh is in "ask" mode, which refuses every
    session). With ``log_file``, ssh's own messages go there (``-E``, debug level 1), not to its stderr."""
    argv = ["ssh"]
    if target.ssh_config:
        argv += ["-F", target.ssh_config]
    mux = [f"ControlPath={target.mux.socket}", "ControlMaster=no" if remote_argv is not None else "ControlMaster=yes",
           "ControlPersist=no"] if target.mux else []
    for opt in (*SSH_OPTIONS, *keepalive_options(target.idle_timeout), *mux,
                "LogLevel=DEBUG1" if log_file else "LogLevel=ERROR"):
        argv += ["-o", opt]
    if log_file:
        argv += ["-E", log_file]
    if target.user:
        argv += ["-l", target.user]
    if target.port:
        argv += ["-p", str(target.port)]
    host = target.host[1:-1] if target.host.startswith("[") else target.host
    # "--": whatever the host is, ssh reads it as the destination, never as an option (-oProxyCommand=...)
    return argv + (["--", host, shlex.join(remote_argv)] if remote_argv is not None else ["-N", "--", host])


def agent_argv(target: SshTarget, command: str, *args: str) -> list[str]:
    """``[env K=V ...] <python> -m edgehft.deploy.agent <command> <args> --root <install_dir>`` for the box
    (``env`` from the board file's ``[ssh] env``, e.g. XILINX_XRT on PYNQ images)."""
    env = ["env", *(f"{k}={v}" for k, v in target.extra_env.items())] if target.extra_env else []
    return [*env, target.python, "-m", "edgehft.deploy.agent", command, *args, "--root", target.install_dir]


def _keyscan_hint(target: SshTarget) -> str:
    """``ssh-keyscan -p PORT HOSTNAME >> KNOWN_HOSTS`` with the values ssh itself would use."""
    cfg = _ssh_g(target.host, target.ssh_config or os.path.expanduser("~/.ssh/config")) or {}
    host = cfg.get("hostname", target.host.strip("[]"))
    port = target.port or cfg.get("port", "22")
    known = (cfg.get("userknownhostsfile") or "~/.ssh/known_hosts").split()[0]
    return f"ssh-keyscan -p {port} {host} >> {known}"


def classify_ssh_failure(target: SshTarget, stderr: str) -> RemoteError:
    """The error for an ``ssh`` exit status 255 (ssh's own failure, not the remote command's)."""
    text = stderr.strip()
    last = text.splitlines()[-1] if text else "no message"
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text or "Host key verification failed" in text \
            or "host key is known" in text or "No ED25519 host key" in text or "No RSA host key" in text \
            or "No ECDSA host key" in text:
        changed = "HAS CHANGED" in text
        return HostKeyError(
            f"{target.label}: host key {'changed' if changed else 'unknown'}; refusing to connect ({last})",
            hint=("the box's key differs from the one in your known_hosts: find out why (a reinstalled box, or "
                  "someone in between) before removing the old entry with ssh-keygen -R" if changed else
                  "check the box's key fingerprint out of band, then add it: " + _keyscan_hint(target)
                  + " (edgehft never accepts keys itself)"))
    if "not responding" in text:
        return RemoteError(f"{target.label}: the link to the box stalled: no answer to keepalives ({last})",
                           hint=f"the box agent gives up on its side after its idle timeout "
                                f"({target.idle_timeout:g} s) and frees the box; check the network, then "
                                "`edgehft status --host` shows what the box serves")
    if "Permission denied" in text:
        return RemoteError(f"{target.label}: authentication failed ({last})",
                           hint="edgehft runs ssh in BatchMode: load the key into ssh-agent or name it in "
                                "~/.ssh/config (IdentityFile)")
    return RemoteError(f"{target.label}: SSH connection failed or dropped ({last})",
                       hint="check the address, that sshd runs on the box, and the network")


def _die_with_parent() -> None:
    """In the forked ssh, before exec: ask Linux to SIGTERM it when edgehft dies (killed, timed out), so the
    connection drops and the box agent cleans up, instead of an orphaned ssh finishing the step."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)        # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass                                              # not Linux: Ctrl-C still reaches the process group


def _json_lines(text: str) -> list[dict]:
    lines = []
    for raw in text.splitlines():
        raw = raw.strip()
        if raw.startswith("{"):
            try:
                row = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                lines.append(row)
    return lines


def _ssh_messages(log: str) -> str:
    """ssh's own messages from its ``-E`` log: no debug lines, no success chatter."""
    return "\n".join(ln for ln in log.splitlines() if ln.strip() and not ln.startswith("debug")
                     and not ln.startswith(_BENIGN_LOG))


def agent_outcome(target: SshTarget, command: str, returncode: int, stdout: str, stderr: str,
                  ssh_log: str) -> list[dict]:
    """The agent's JSON lines from one finished ``ssh`` call, or the error it amounts to.

    Args:
        returncode: ssh's exit status; stdout/stderr: the remote command's output; ssh_log: ssh's ``-E``
            log (debug level 1).
    Raises:
        DeployError: the agent reported an error (its message and hint are passed on), or it died on the box
            without answering (killed by a signal: named when the status says which).
        RemoteError / HostKeyError: ssh itself failed (exit 255 without a remote signal).
    """
    lines = _json_lines(stdout)
    errors = [ln for ln in lines if "error" in ln]
    if errors:
        e = errors[-1]
        raise DeployError(f"{target.label}: {e['error']}", hint=e.get("hint"))
    signalled = "rtype exit-signal" in ssh_log
    if returncode == 255 and not signalled:
        raise classify_ssh_failure(target, _ssh_messages(ssh_log) or stderr)
    if returncode == 0 and lines:
        return lines
    tail = stderr.strip().splitlines()[-3:] if stderr.strip() else []
    if returncode == 127:
        raise DeployError(f"{target.label}: {target.python} was not found on the box",
                          hint="pass --remote-python with the path of the Python that has edgehft installed")
    if "No module named edgehft" in stderr or "No module named 'edgehft" in stderr:
        raise DeployError(f"{target.label}: edgehft is not installed for {target.python} on the box",
                          hint="pip install edgehft on the box, or pass --remote-python PATH")
    if f"invalid choice: '{command}'" in stderr:
        raise DeployError(f"{target.label}: the box's edgehft agent has no `{command}` command (it is older than "
                          "this edgehft)", hint="upgrade edgehft on the box to this version")
    fatal = re.search(r"Fatal Python error: (%s)" % "|".join(_FATAL), stderr)
    if signalled or 128 < returncode < 255:
        sig = f"{_signal_name(returncode - 128)} (status {returncode})" if returncode != 255 else \
            _FATAL[fatal.group(1)] if fatal else "a signal"
        how = f"was killed by {sig} on the box"
        if fatal:
            tail = [fatal.group(0)]         # not the Python stack faulthandler prints after it
    else:
        how = f"ended with status {returncode}"
    raise DeployError(f"{target.label}: the box agent `{command}` {how} "
                      f"without a result ({' | '.join(tail) or 'no output'})",
                      hint="the agent was killed or crashed on the box; `edgehft status --host` shows what "
                           "it runs now")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def run_agent(target: SshTarget, command: str, *args: str, stdin=None, input_bytes: bytes | None = None,
              timeout: float = 600.0) -> list[dict]:
    """Run one agent command on the box and return its JSON lines.

    ssh's stderr and log go to temporary files, not pipes, so a process that outlives ssh holding them (a
    ProxyCommand) cannot keep this call waiting once ssh has exited.

    Args:
        stdin: a file object streamed to the agent (e.g. the bundle tar), or None.
        input_bytes: bytes sent to the agent's stdin instead.
        timeout: seconds before the local ssh is killed (the box cleans up as on a dropped connection).
    Raises:
        RemoteError / HostKeyError: ssh itself failed (exit 255), or ``timeout`` passed, or the target's
            shared connection (:func:`one_connection`) could not connect.
        DeployError: see :func:`agent_outcome`.
    """
    if target.mux is not None and target.mux.error is not None:
        raise target.mux.error
    tmp = tempfile.mkdtemp(prefix="edgehft-ssh-")
    try:
        log = os.path.join(tmp, "ssh.log")
        remote = agent_argv(target, command, *args)
        argv = ssh_argv(target, remote, log_file=log)
        with open(os.path.join(tmp, "stderr"), "w+b") as err:
            try:
                proc = subprocess.run(argv, stdin=stdin, input=input_bytes, stdout=subprocess.PIPE, stderr=err,
                                      timeout=timeout, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
            except subprocess.TimeoutExpired:
                raise RemoteError(f"{target.label}: `{command}` did not finish within {timeout:.0f} s",
                                  hint="the connection may have stalled; `edgehft status --host` shows what the "
                                       "box runs") from None
            except FileNotFoundError:
                raise RemoteError("no `ssh` client on this machine",
                                  hint="install OpenSSH (apt-get install openssh-client)") from None
            err.seek(0)
            stderr = err.read().decode(errors="replace")
        return agent_outcome(target, command, proc.returncode, proc.stdout.decode(errors="replace"), stderr,
                             _master_part(target, shlex.join(remote), _read_text(log)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _master_part(target: SshTarget, remote: str, ssh_log: str) -> str:
    """``ssh_log`` of a session on ``target.mux`` with what the master logged about it: the lines of the
    channel that ran ``remote`` (its ``rtype exit-signal``: the box killed it) and the master's own messages
    since (a stalled or dropped link). The log as it is for a call without a shared connection."""
    if target.mux is None:
        return ssh_log
    lines = _read_text(target.mux.log).splitlines()
    sent = [i for i, ln in enumerate(lines) if ln.endswith("Sending command: " + remote)]
    if not sent:
        return ssh_log
    start = sent[-1]
    opened = [m.group(1) for ln in lines[:start] if (m := re.search(r"channel (\d+): new session", ln))]
    chan = re.compile(rf"\bchannel {opened[-1]}\b") if opened else None      # "channel 2", not "channel 20"
    mine = []
    for ln in lines[start:]:
        if chan is not None and chan.search(ln):
            mine.append(ln)
            if ": free" in ln:
                chan = None
        elif not ln.startswith("debug"):
            mine.append(ln)
    return "\n".join([ssh_log, *mine])


@contextmanager
def one_connection(target: SshTarget, connect_timeout_s: float = 30.0) -> Iterator[SshTarget]:
    """``target`` with one SSH connection that every call made with it shares, for the ``with`` block.

    The master is ``ssh -N`` (``ControlMaster=yes``) run by this process (killed with it: the box agent then
    sees its sessions end, as on a dropped connection), its control socket in a private temporary directory,
    both gone when the block ends. Calls made with the yielded target are sessions on it (:func:`ssh_argv`);
    the box's environment is the master's (OpenSSH does not pass a session's ``SetEnv`` through the master;
    edgehft's own variables travel in the remote command line). A session the box's sshd refuses on the
    master (its ``MaxSessions``) opens a connection of its own, as OpenSSH's client does. A master that
    cannot connect (exit 255) makes every call raise its classified failure at once (no second try costing
    another connect timeout); one that does not answer within ``connect_timeout_s`` seconds, a control path
    too long for a Unix socket, or no ``ssh`` client: the calls connect one by one as without this.
    """
    if target.mux is not None:
        yield target
        return
    tmp = tempfile.mkdtemp(prefix="edgehft-ssh-")           # mode 0700: the socket is this user's alone
    mux = Multiplex(socket=os.path.join(tmp, "s"), log=os.path.join(tmp, "master.log"))
    master = None
    try:
        if len(mux.socket) < 100:                            # sun_path holds 108 bytes
            try:
                master = subprocess.Popen(ssh_argv(replace(target, mux=mux), None, log_file=mux.log),
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL,
                                          preexec_fn=_die_with_parent if sys.platform == "linux" else None)
            except FileNotFoundError:
                master = None
        yield _await_master(target, mux, master, connect_timeout_s) if master else target
    finally:
        if master is not None and master.poll() is None:
            master.terminate()
            try:
                master.wait(timeout=5)
            except subprocess.TimeoutExpired:
                master.kill()
                master.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _await_master(target: SshTarget, mux: Multiplex, master: subprocess.Popen, timeout_s: float) -> SshTarget:
    """The target for calls on ``master`` once its socket is there; with ``mux.error`` set when it failed
    with ssh's status 255; ``target`` itself (calls connect one by one) when it neither listens nor fails
    within ``timeout_s`` seconds (it is stopped) or ends otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(mux.socket):
            return replace(target, mux=mux)
        if master.poll() is not None:
            if master.returncode == 255:
                error = classify_ssh_failure(target, _ssh_messages(_read_text(mux.log)))
                return replace(target, mux=replace(mux, error=error))
            return target
        time.sleep(0.005)
    master.kill()
    master.wait()
    return target


def _read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


class AgentSession:
    """One agent command kept running over its own ssh connection (``hold``), with pipes to its stdin
    and stdout. :meth:`first_line` waits for its first JSON line, :meth:`send` writes to it, :meth:`finish`
    ends it and returns its JSON lines as :func:`run_agent` would (or raises as it would).

    Raises (constructor):
        RemoteError: no ``ssh`` client on this machine; the target's shared connection failed.
    """

    def __init__(self, target: SshTarget, command: str, *args: str):
        if target.mux is not None and target.mux.error is not None:
            raise target.mux.error
        self.target, self.command = target, command
        self.remote = agent_argv(target, command, *args)
        self.tmp = tempfile.mkdtemp(prefix="edgehft-ssh-")
        self.log = os.path.join(self.tmp, "ssh.log")
        self.err = open(os.path.join(self.tmp, "stderr"), "w+b")
        self.out = b""
        self._ended: tuple | None = None          # (returncode, stdout, stderr, ssh log) once finished
        try:
            self.proc = subprocess.Popen(ssh_argv(target, self.remote, log_file=self.log),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        except FileNotFoundError:
            self.close()
            raise RemoteError("no `ssh` client on this machine",
                              hint="install OpenSSH (apt-get install openssh-client)") from None

    def first_line(self, timeout: float) -> dict | None:
        """The agent's first JSON line, or None if it ended (or ``timeout`` seconds passed) without one."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.out:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                return None
            data = os.read(fd, 65536)
            if not data:
                return None
            self.out += data
        lines = _json_lines(self.out.split(b"\n", 1)[0].decode(errors="replace"))
        return lines[0] if lines else None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, data: bytes) -> bool:
        """Write ``data`` to the agent's stdin; False when the connection is gone."""
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def finish(self, timeout: float) -> list[dict]:
        """Close the agent's stdin, wait up to ``timeout`` s for ssh to exit (then kill it) and return the
        agent's JSON lines; errors as :func:`agent_outcome`. Calling it again gives the same answer."""
        if self._ended is None:
            try:
                rest, _ = self.proc.communicate(timeout=timeout)          # flushes and closes stdin first
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rest, _ = self.proc.communicate()
            self.err.seek(0)
            self._ended = (self.proc.returncode, (self.out + (rest or b"")).decode(errors="replace"),
                           self.err.read().decode(errors="replace"),
                           _master_part(self.target, shlex.join(self.remote), _read_text(self.log)))
        return agent_outcome(self.target, self.command, *self._ended)

    def close(self) -> None:
        """Kill ssh if it still runs, and remove the temporary files."""
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self.err.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
