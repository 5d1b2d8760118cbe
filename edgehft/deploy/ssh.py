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
  arguments whatever they contain (the remote shell sees them quoted).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field

from edgehft.errors import DeployError, HostKeyError, InputError, RemoteError

_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})|\[[0-9A-Fa-f:.]+\])$")
SSH_OPTIONS = ("BatchMode=yes", "StrictHostKeyChecking=yes", "ConnectTimeout=10",
               "ServerAliveInterval=5", "ServerAliveCountMax=3", "LogLevel=ERROR")


@dataclass(frozen=True)
class SshTarget:
    """A box: ``user@host[:port]`` (user and port optional: ssh config or the board's defaults fill them).

    ``python`` is the interpreter on the box that has edgehft installed; ``install_dir`` the box
    directory holding ``versions/`` and the ``current`` symlink; ``extra_env`` variables the agent runs with.
    """

    host: str
    user: str | None = None
    port: int | None = None
    python: str = "python3"
    install_dir: str = "/opt/edgehft"
    ssh_config: str | None = None
    extra_env: dict = field(default_factory=dict, compare=False)

    @property
    def label(self) -> str:
        who = f"{self.user}@" if self.user else ""
        return f"{who}{self.host}" + (f":{self.port}" if self.port else "")


def parse_target(text: str, *, board=None, python: str | None = None, install_dir: str | None = None,
                 ssh_config: str | None = None) -> SshTarget:
    """Parse ``user@host[:port]`` (IPv6 as ``[addr]:port``) and fill unset parts from ``board.ssh``.

    A user or port the text leaves out comes from the board file only when given there; otherwise the
    user's ssh config decides (``Host`` aliases work).

    Raises:
        InputError: characters that are not a user name, host name, address or port.
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
    return SshTarget(host=host, user=user or ssh.get("user"), port=port or ssh.get("port"), extra_env=env,
                     python=python or ssh.get("python", "python3"),
                     install_dir=install_dir or ssh.get("install_dir", "/opt/edgehft"), ssh_config=ssh_config)


def _ssh_g(host: str, config: str) -> dict:
    try:
        text = subprocess.run(["ssh", "-G", "-F", config, host.strip("[]")], capture_output=True, text=True,
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


def ssh_argv(target: SshTarget, remote_argv: list[str]) -> list[str]:
    """The local ``ssh`` command line that runs ``remote_argv`` on the box (each element one argument)."""
    argv = ["ssh"]
    if target.ssh_config:
        argv += ["-F", target.ssh_config]
    for opt in SSH_OPTIONS:
        argv += ["-o", opt]
    if target.user:
        argv += ["-l", target.user]
    if target.port:
        argv += ["-p", str(target.port)]
    host = target.host[1:-1] if target.host.startswith("[") else target.host
    return argv + [host, shlex.join(remote_argv)]


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


def run_agent(target: SshTarget, command: str, *args: str, stdin=None, input_bytes: bytes | None = None,
              timeout: float = 600.0) -> list[dict]:
    """Run one agent command on the box and return its JSON lines.

    Args:
        stdin: a file object streamed to the agent (e.g. the bundle tar), or None.
        input_bytes: bytes sent to the agent's stdin instead.
        timeout: seconds before the local ssh is killed (the box cleans up as on a dropped connection).
    Raises:
        RemoteError / HostKeyError: ssh itself failed (exit 255).
        DeployError: the agent reported an error (its message and hint are passed on), or it died
            without answering (e.g. killed on the box).
    """
    argv = ssh_argv(target, agent_argv(target, command, *args))
    try:
        proc = subprocess.run(argv, stdin=stdin, input=input_bytes, capture_output=True, timeout=timeout,
                              preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    except subprocess.TimeoutExpired:
        raise RemoteError(f"{target.label}: `{command}` did not finish within {timeout:.0f} s",
                          hint="the connection may have stalled; `edgehft status --host` shows what the box runs")
    except FileNotFoundError:
        raise RemoteError("no `ssh` client on this machine", hint="install OpenSSH (apt-get install openssh-client)")
    stderr = proc.stderr.decode(errors="replace")
    lines = []
    for raw in proc.stdout.decode(errors="replace").splitlines():
        raw = raw.strip()
        if raw.startswith("{"):
            try:
                lines.append(json.loads(raw))
            except json.JSONDecodeError:
                pass
    errors = [ln for ln in lines if "error" in ln]
    if errors:
        e = errors[-1]
        raise DeployError(f"{target.label}: {e['error']}", hint=e.get("hint"))
    if proc.returncode == 255 and stderr.strip():
        raise classify_ssh_failure(target, stderr)
    if proc.returncode != 0 or not lines:
        tail = stderr.strip().splitlines()[-3:] if stderr.strip() else []
        if proc.returncode == 127:
            raise DeployError(f"{target.label}: {target.python} was not found on the box",
                              hint="pass --remote-python with the path of the Python that has edgehft installed")
        if "No module named edgehft" in stderr or "No module named 'edgehft" in stderr:
            raise DeployError(f"{target.label}: edgehft is not installed for {target.python} on the box",
                              hint="pip install edgehft on the box, or pass --remote-python PATH")
        how = "was killed by a signal" if proc.returncode == 255 else f"ended with status {proc.returncode}"
        raise DeployError(f"{target.label}: the box agent `{command}` {how} "
                          f"without a result ({' | '.join(tail) or 'no output'})",
                          hint="the agent was killed or crashed on the box; `edgehft status --host` shows what "
                               "it runs now")
    return lines
