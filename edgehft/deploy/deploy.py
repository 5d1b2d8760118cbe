"""``edgehft deploy``, ``status`` and ``rollback`` on the host: drive the box agent step by step over SSH.

Steps, each its own ``ssh`` call (so a failure names its step): ``probe`` (is the box that board; what
does it run) → ``upload`` (tar of the manifest's files into ``incoming/<vid>``) → ``verify`` (SHA-256 on the
box) → ``golden`` (the bundle's golden vectors on the box's runtime: exact for int8 backends, the stated
tolerance for float ones) → ``switch`` (re-verify, atomic ``current`` swap, older versions kept). Until
``switch`` succeeds the box serves what it served before; a staged version that fails a check is removed
and the failure is logged in the box's ``history.jsonl``.
"""
from __future__ import annotations

import io
import json
import secrets
import socket
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from edgehft.boards import load_board
from edgehft.bundle import MANIFEST, load_bundle, sha256_file
from edgehft.deploy.probe import board_mismatches
from edgehft.deploy.ssh import SshTarget, run_agent
from edgehft.errors import DeployError, EdgeHFTError, GoldenMismatchError, RemoteError
from edgehft.signing import SIGNATURE

STEPS = ("probe", "upload", "verify", "golden", "switch")


@dataclass
class DeployResult:
    """One host's outcome. ``exit_code`` 0 when the new version is active (or already was)."""

    host: str
    board: str
    install_dir: str = ""
    ok: bool = False
    box_reached: bool = False          # the probe answered: active_before/after say what the box serves
    exit_code: int = 0
    version: str | None = None
    active_before: str | None = None
    active_after: str | None = None
    step: str | None = None            # the step that failed
    error: str | None = None
    hint: str | None = None
    forced: list[str] = field(default_factory=list)
    golden: dict | None = None
    seconds: dict = field(default_factory=dict)
    plan: list[str] | None = None      # --dry-run: what would happen

    def to_json(self) -> dict:
        return asdict(self)


def _tar_bundle(path: Path, files: list[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in files:
            info = tar.gettarinfo(str(path / rel), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(path / rel, "rb") as fh:
                tar.addfile(info, fh)
    return buf.getvalue()


def version_id(manifest_sha256: str, now: datetime | None = None) -> str:
    """``YYYYmmddTHHMMSSZ-<12 hex>-<4 hex>``: sorts by deploy time, names the bundle, and differs between
    two deploys of one bundle in the same second."""
    now = now or datetime.now(timezone.utc)
    return f"{now:%Y%m%dT%H%M%SZ}-{manifest_sha256[:12]}-{secrets.token_hex(2)}"


def deploy(target: SshTarget, bundle_dir: str | Path, board: str | None = None, *, force: bool = False,
           dry_run: bool = False, keep: int = 3, emulate: bool = False,
           on_step: Callable[[str, SshTarget, dict], None] | None = None) -> DeployResult:
    """Deploy the bundle at ``bundle_dir`` to ``target``; never raises for a per-host failure.

    Args:
        board: the board the box must be (default: the bundle's); another board than the bundle's, or a box
            the probe says is not that board, is refused unless ``force`` (then listed in ``forced``).
        dry_run: probe only (read-only) and return the plan.
        keep: versions kept on the box after the switch (active and previous always kept).
        emulate: run the golden vectors on the box in emulation (accelerator boards without the device).
        on_step: called before each step with (step, target, context) — progress display and fault tests.
    Returns:
        :class:`DeployResult`; ``exit_code`` 9 refused/failed (box unchanged), 10 unreachable, 8 golden
        vectors not reproduced on the box (nothing switched), 6 the local bundle is broken.
    """
    res = DeployResult(host=target.label, board=board or "?", install_dir=target.install_dir)
    step = "bundle"
    try:
        b = load_bundle(bundle_dir, verify=True)
        b.require_golden()           # none (compile could not make them): refused before the box is touched
        res.board = name = board or b.manifest.board
        spec = load_board(name)
        if name != b.manifest.board:
            why = f"the bundle was compiled for {b.manifest.board}, not {name}"
            if not force:
                raise DeployError(why, hint=f"compile for --board {name}, or deploy with --board {b.manifest.board}")
            res.forced.append(why)
        files = sorted(b.manifest.files) + [MANIFEST] + ([SIGNATURE] if (b.path / SIGNATURE).is_file() else [])
        nbytes = sum((b.path / f).stat().st_size for f in files)
        bundle_sha = sha256_file(b.path / MANIFEST)
        vid = version_id(bundle_sha)
        ctx = {"bundle": str(b.path), "version": vid, "files": len(files), "bytes": nbytes}

        def run(step_name: str, command: str, *args: str, **kw) -> dict:
            nonlocal step
            step = step_name
            if on_step:
                on_step(step_name, target, ctx)
            t0 = time.perf_counter()
            lines = run_agent(target, command, *args, **kw)
            res.seconds[step_name] = round(time.perf_counter() - t0, 3)
            return lines[-1]["result"]

        probed = run("probe", "probe")
        facts, status = probed["facts"], probed["status"]
        res.active_before = res.active_after = status.get("active")
        res.box_reached = True
        ctx.update(facts=facts, status=status)
        native = b.manifest.quantization.mode.startswith("native")
        for why in board_mismatches(spec, facts, b.manifest.format_version, needs_cxx=native,
                                    needs_amx=b.manifest.quantization.mode == "native-bf16"):
            if not force:
                raise DeployError(f"the box is not a {name}: {why}",
                                  hint="deploy to the right box, or pass --force if you know better")
            res.forced.append(f"box: {why}")
        res.version = vid
        if dry_run:
            res.ok = True
            res.plan = [f"upload {len(files)} files ({nbytes:,} B) to {target.install_dir}/incoming/{vid}",
                        "verify SHA-256 of every file on the box",
                        f"run {b.manifest.golden.count if b.manifest.golden else 0} golden vectors on the box "
                        f"({b.manifest.golden.compare if b.manifest.golden else 'none'})",
                        f"switch {target.install_dir}/current from {status.get('active') or 'nothing'} to {vid}",
                        f"keep {keep} versions"]
            return res
        meta = {"bundle_sha256": bundle_sha, "board": name, "model_file": b.manifest.model_file,
                "model_sha256": b.manifest.files.get(b.manifest.model_file), "compiled_utc": b.manifest.created_utc,
                "files": len(files), "bytes": nbytes, "from_host": socket.gethostname(), "forced": res.forced}
        run("upload", "receive", "--version", vid, "--bytes", str(nbytes), "--meta", json.dumps(meta),
            input_bytes=_tar_bundle(b.path, files))
        try:
            run("verify", "verify", "--version", vid)
            golden_args = ["--emulate"] if emulate else []
            # the golden vectors run as the bundle's own board (with --force the box may be labelled otherwise)
            res.golden = run("golden", "golden", "--version", vid, "--board", b.manifest.board, *golden_args)
            if not res.golden["ok"]:
                g = res.golden
                raise GoldenMismatchError(f"golden vectors differ on the box: {g['count'] - g['matched']} of "
                                          f"{g['count']} (max diff {g['max_diff']}, {g['compare']}, ran on "
                                          f"{g['path']}; expected {g['expected_path']})",
                                          hint="the box's runtime does not compute what the bundle was "
                                               "compiled to compute; nothing was switched")
        except EdgeHFTError as exc:
            _discard(target, vid, f"{step}: {exc.args[0]}")
            raise
        switched = run("switch", "activate", "--version", vid, "--keep", str(keep))
        res.active_after = switched["active"]
        res.ok = True
    except EdgeHFTError as exc:
        res.step, res.error, res.hint, res.exit_code = step, exc.args[0], exc.hint, exc.exit_code
        if isinstance(exc, RemoteError) and step == "switch":
            res.hint = ("the connection dropped during the switch: the box is on the old or the new version, "
                        "never between; `edgehft status --host` tells which")
    return res


def _discard(target: SshTarget, vid: str, reason: str) -> None:
    try:
        run_agent(target, "discard", "--version", vid, "--reason", reason, timeout=60)
    except EdgeHFTError:
        pass        # unreachable now: the next deploy removes the staged copy


def deploy_many(targets: list[SshTarget], bundle_dir, boards: list[str | None], parallel: int = 8,
                **kw) -> list[DeployResult]:
    """:func:`deploy` to each target as its board in ``boards`` (None: the bundle's), ``parallel`` at a
    time; results in the order of ``targets``."""
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return list(pool.map(lambda tb: deploy(tb[0], bundle_dir, tb[1], **kw), zip(targets, boards)))


def box_status(target: SshTarget) -> dict:
    """What the box runs: ``{"facts": probe, "status": Store.status()}``. Raises RemoteError/DeployError."""
    return run_agent(target, "probe")[-1]["result"]


def rollback(target: SshTarget, to: str | None = None) -> dict:
    """Switch the box back to ``to`` or its previous version. Raises DeployError/RemoteError."""
    return run_agent(target, "rollback", *(["--to", to] if to else []))[-1]["result"]
