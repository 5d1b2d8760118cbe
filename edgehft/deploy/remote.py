"""The HIL plugin's remote target: the checks of :mod:`edgehft.hil.checks` run ON the box, over SSH.

Each check is one ``python -m edgehft.deploy.agent hil CHECK`` call: the box opens its active bundle (or
``bundle_dir_on_box``) with its own runtime, runs the check in its own process — so latency is the box's,
not the network's — and sends the result dict back. Tick files for ``latency``/``streaming``/``soak`` are
paths on the box; without them the check uses what the bundle carries (see
:func:`edgehft.hil.checks.replay_source`).
"""
from __future__ import annotations

import json

from edgehft.boards import load_board
from edgehft.deploy.ssh import parse_target, run_agent


class RemoteTarget:
    """A box reached as ``host`` (``user@host[:port]`` or an ssh alias) that is ``board``.

    Raises (from each check):
        RemoteError: the box cannot be reached (connection, authentication, host key).
        DeployError: the check could not run on the box (no active bundle, runtime missing); its message
            and hint come from the box.
    """

    kind = "remote"

    def __init__(self, host: str, board: str, bundle_dir_on_box: str | None = None, ssh_config: str | None = None,
                 remote_python: str | None = None, install_dir: str | None = None, emulate: bool = False):
        self.board, self.bundle_dir_on_box, self.emulate = board, bundle_dir_on_box, emulate
        self.target = parse_target(host, board=load_board(board), python=remote_python, install_dir=install_dir,
                                   ssh_config=ssh_config)

    def _run(self, check: str, timeout: float = 600.0, **options) -> dict:
        args = ["--board", self.board, "--options", json.dumps(options)]
        if self.bundle_dir_on_box:
            args += ["--bundle", self.bundle_dir_on_box]
        if self.emulate:
            args.append("--emulate")
        res = run_agent(self.target, "hil", check, *args, timeout=timeout)[-1]["result"]
        res["host"] = self.target.label
        return res

    def golden(self) -> dict:
        """:func:`edgehft.hil.checks.golden` on the box."""
        return self._run("golden")

    def latency(self, **options) -> dict:
        """:func:`edgehft.hil.checks.latency` on the box (``ticks``: paths on the box)."""
        return self._run("latency", **options)

    def streaming(self, **options) -> dict:
        """:func:`edgehft.hil.checks.streaming` on the box: ticks pushed through the box's own
        ``runner.stream()`` in its process (``ticks``: paths on the box); a bundle that does not stream comes
        back as the check's ``skipped`` result."""
        return self._run("streaming", **options)

    def soak(self, **options) -> dict:
        """:func:`edgehft.hil.checks.soak` on the box for ``options["minutes"]``; with ``swap_every_s`` the soak
        across swaps (:func:`edgehft.serving.soak.soak_check`: the bundle served by the box's own ``edgehft.serve``
        in a temporary install directory there and installed again every ``swap_every_s`` seconds)."""
        return self._run("soak", timeout=float(options.get("minutes") or 0) * 60 + 600, **options)

    def describe(self) -> dict:
        return {"kind": self.kind, "board": self.board, "host": self.target.label, "emulated": self.emulate,
                "bundle": self.bundle_dir_on_box or f"{self.target.install_dir}/current"}

    def close(self) -> None:
        pass
