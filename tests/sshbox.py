"""A real OpenSSH server on 127.0.0.1 as "the box" for deploy and HIL tests.

Debian's ``/usr/sbin/sshd`` (openssh-server; scripts/test.sh installs it) runs in the foreground with its
own throwaway host key, a throwaway client key in ``authorized_keys``, no password logins, and accepts
``EDGEHFT_*`` environment variables (the tests' failpoints travel as ``SetEnv`` in the client config). The
box's Python is the board venv (``.venv-board``: pynq, numpy < 2, LiteRT, no TensorFlow), as on a board.
Clients connect through their own ssh config file, with the box's host key in their own known_hosts.
"""
from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
BOX_PYTHON = ROOT / ".venv-board" / "bin" / "python"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "edgehft-test", "-f", str(path)],
                   check=True)


class LoopbackBox:
    """``start()`` sshd; ``config(...)`` writes a client ssh config whose ``Host box`` reaches it."""

    alias = "box"

    def __init__(self, work: Path):
        self.work = work
        self.port = _free_port()
        self.user = getpass.getuser()
        self.proc: subprocess.Popen | None = None
        self.python = str(BOX_PYTHON)

    def start(self) -> "LoopbackBox":
        w = self.work
        _keygen(w / "host_key")
        _keygen(w / "client_key")
        shutil.copy(w / "client_key.pub", w / "authorized_keys")
        (w / "sshd_config").write_text(f"""\
Port {self.port}
ListenAddress 127.0.0.1
HostKey {w}/host_key
AuthorizedKeysFile {w}/authorized_keys
PidFile {w}/sshd.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
AcceptEnv EDGEHFT_*
MaxStartups 50:30:100
MaxSessions 50
LogLevel VERBOSE
""")
        pub = (w / "host_key.pub").read_text().split()
        (w / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n")
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(exist_ok=True)          # privilege-separation directory
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(w / "sshd_config")],
                                     stdout=open(w / "sshd.log", "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited ({self.proc.returncode}): {(w / 'sshd.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"sshd did not listen on {self.port}: {(w / 'sshd.log').read_text()[-2000:]}")

    def config(self, name: str = "ssh_config", *, known_hosts: Path | None = None, failpoints: str = "",
               drop_after: int | None = None, stall_after: int | None = None, stall_link: Path | None = None,
               env: dict | None = None) -> Path:
        """A client config file; ``failpoints`` become ``EDGEHFT_FAILPOINTS`` on the box, ``drop_after``
        routes the connection through tests/tools/drop_proxy.py, which cuts it after that many bytes,
        ``stall_after`` through tests/tools/stall_proxy.py, which stalls it (open, silent) after that many
        bytes, and with ``stall_link`` every other connection with it; ``env`` more ``EDGEHFT_*`` variables
        for the box."""
        lines = [f"Host {self.alias}", "  HostName 127.0.0.1", f"  Port {self.port}", f"  User {self.user}",
                 f"  IdentityFile {self.work}/client_key", "  IdentitiesOnly yes",
                 f"  UserKnownHostsFile {known_hosts or self.work / 'known_hosts'}",
                 "  GlobalKnownHostsFile /dev/null"]
        env = {**({"EDGEHFT_FAILPOINTS": failpoints} if failpoints else {}), **(env or {})}
        if env:
            lines.append("  SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()))
        if drop_after is not None:
            lines.append(f"  ProxyCommand {sys.executable} {ROOT}/tests/tools/drop_proxy.py %h %p {drop_after}")
        if stall_after is not None:
            lines.append(f"  ProxyCommand {sys.executable} {ROOT}/tests/tools/stall_proxy.py %h %p --after {stall_after}"
                         + (f" --link {stall_link}" if stall_link else ""))
        path = self.work / name
        path.write_text("\n".join(lines) + "\n")
        return path

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
