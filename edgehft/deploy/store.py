"""The box's install directory: versioned bundles, one ``current`` symlink, a history log. Runs on the box.

Layout under ``root`` (the board file's ``[ssh] install_dir``)::

    current -> versions/<vid>        the active bundle: what a serving process opens
    versions/<vid>/                  complete, verified bundles (the active one and previous ones)
    incoming/<vid>.partial/          a transfer in progress (or one killed mid-way: removed by the next deploy)
    incoming/<vid>/                  received in full, not yet active (verify and golden run here)
    meta/<vid>.json                  where a version came from (bundle and model SHA-256, board, times)
    history.jsonl                    every switch, rollback and failed attempt, one JSON object per line
    deploy.lock                      flock held by receive, activate, rollback and discard

Invariants: ``current`` only ever changes by ``rename(2)`` of a fresh symlink over it (atomic on POSIX), and
only to a directory under ``versions/`` whose files were just checked against its manifest; nothing under
``versions/`` is modified after it is moved there, only removed by pruning (never the active or the previous
version). A version id is ``YYYYmmddTHHMMSSZ-<first 12 hex of the manifest's SHA-256>``.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import signal
import sys
import tarfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from edgehft.bundle import MANIFEST, load_bundle, sha256_file
from edgehft.errors import BundleError, DeployError
from edgehft.signing import SIGNATURE, check_install_dir

VID = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{12}-[0-9a-f]{4}$")
STALE_STAGED_S = 600.0
FAILPOINTS_ENV = "EDGEHFT_FAILPOINTS"


def failpoint(name: str) -> None:
    """Fault injection for the deploy tests, from the comma-separated ``EDGEHFT_FAILPOINTS`` environment
    variable: ``name`` SIGKILLs this process there (a real kill, as a power cut or OOM kill would);
    ``name=pause`` sleeps 5 s there (time for a test to cut the connection at that point)."""
    points = os.environ.get(FAILPOINTS_ENV, "").split(",")
    if name in points:
        os.kill(os.getpid(), signal.SIGKILL)
    if f"{name}=pause" in points:
        time.sleep(5)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_vid(vid: str) -> str:
    """``vid`` if it is a version id (the agent never builds a path from anything else).

    Raises:
        DeployError: anything else (e.g. ``../x``).
    """
    if not VID.match(vid or ""):
        raise DeployError(f"{vid!r} is not a version id (YYYYmmddTHHMMSSZ-<12 hex>-<4 hex>)",
                          hint="`edgehft status --host H` lists the versions on the box")
    return vid


class Store:
    """The install directory ``root`` on the box (created on first use)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.versions = self.root / "versions"
        self.incoming = self.root / "incoming"
        self.meta = self.root / "meta"
        self.current = self.root / "current"
        self.history_file = self.root / "history.jsonl"

    # -- state --------------------------------------------------------------------------------------
    def active(self) -> str | None:
        """The active version id, or None before the first deploy."""
        try:
            return Path(os.readlink(self.current)).name
        except OSError:
            return None

    def history(self) -> list[dict]:
        if not self.history_file.exists():
            return []
        rows = []
        for line in self.history_file.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue                # a line cut by a crash mid-append
        return rows

    def previous(self) -> str | None:
        """The version that was active before the current one (None if none, or it was pruned)."""
        active = self.active()
        for row in reversed(self.history()):
            if row.get("event") in ("activate", "rollback") and row.get("version") == active:
                prev = row.get("previous")
                return prev if prev and (self.versions / prev).is_dir() else None
        return None

    def info(self, vid: str) -> dict:
        p = self.meta / f"{vid}.json"
        try:
            return json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            return {"version": vid}

    def status(self) -> dict:
        """``{"root", "active", "previous", "versions": [meta…], "staged", "partial", "history"}``."""
        active = self.active()
        versions = sorted(p.name for p in self.versions.iterdir() if p.is_dir()) if self.versions.is_dir() else []
        staged = sorted(p.name for p in self.incoming.iterdir()) if self.incoming.is_dir() else []
        problems = None
        if active:
            try:
                load_bundle(self.versions / active, verify=True)
                problems = []
            except BundleError as exc:
                problems = [exc.args[0]]
        return {"root": str(self.root), "active": active, "active_info": self.info(active) if active else None,
                "active_problems": problems,
                "previous": self.previous(),
                "versions": [{**self.info(v), "version": v, "active": v == active} for v in versions],
                "staged": [s for s in staged if not s.endswith(".partial")],
                "partial": [s for s in staged if s.endswith(".partial")],
                "history": self.history()[-10:]}

    def record(self, event: str, **fields) -> None:
        """Append one line to ``history.jsonl`` (fsynced). Best effort: on a full disk the line is lost
        (and said so on stderr), the operation it describes is not undone."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.history_file, "a") as fh:
                fh.write(json.dumps({"utc": _now(), "event": event, **fields}) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            print(f"edgehft agent: could not log {event} {fields} to {self.history_file}: {exc}", file=sys.stderr)

    # -- locking and cleanup -----------------------------------------------------------------------------
    @contextmanager
    def locked(self):
        """Hold ``deploy.lock`` (one deploy step at a time on this box).

        Raises:
            DeployError: another deploy holds it.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / "deploy.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DeployError(f"another deploy is running on this box ({self.root}/deploy.lock is held)",
                                  hint="wait for it to finish, then deploy again") from None
            self._clean_stale()
            yield
        finally:
            os.close(fd)

    def _clean_stale(self) -> None:
        """Remove what killed operations left: ``*.partial`` transfers (none can be live: receiving holds
        the lock), staged versions no step touched for :data:`STALE_STAGED_S`, orphan ``.current.*`` links."""
        if self.incoming.is_dir():
            for p in self.incoming.iterdir():
                old = time.time() - p.stat().st_mtime > STALE_STAGED_S
                if p.name.endswith(".partial") or old:
                    shutil.rmtree(p, ignore_errors=True)
                    self.record("cleaned", version=p.name.removesuffix(".partial"),
                                reason="interrupted transfer" if p.name.endswith(".partial") else "staged, never activated")
        for p in self.root.glob(".current.*"):
            p.unlink(missing_ok=True)

    # -- steps ----------------------------------------------------------------------------------------
    def receive(self, vid: str, stream, declared_bytes: int, meta: dict) -> dict:
        """Unpack the bundle tar from ``stream`` into ``incoming/<vid>``.

        Only regular files with relative paths inside the bundle are taken. Free space is checked first
        (``declared_bytes`` plus one 4 KiB block per member and 1 MiB), and a write that fails with ENOSPC
        is reported as a full disk; either way the partial directory is removed.

        Raises:
            DeployError: disk full, a truncated or malformed stream (connection dropped), an unsafe member.
        """
        check_vid(vid)
        with self.locked():
            self.incoming.mkdir(parents=True, exist_ok=True)
            st = os.statvfs(self.root)
            free = st.f_bavail * st.f_frsize
            need = declared_bytes + (int(meta.get("files", 0)) + 2) * 4096 + (1 << 20)
            if free < need:
                raise DeployError(f"disk full: the bundle needs {need:,} bytes in {self.root}, {free:,} are free",
                                  hint="free space on the box (old versions: edgehft deploy --keep N)")
            part = self.incoming / f"{vid}.partial"
            part.mkdir()
            try:
                total = self._unpack(stream, part, declared_bytes)
                if not (part / MANIFEST).is_file():
                    raise DeployError("the transfer has no manifest.json", hint="deploy a bundle directory")
                failpoint("receive:before-rename")
                os.rename(part, self.incoming / vid)
                self.meta.mkdir(exist_ok=True)
                (self.meta / f"{vid}.json").write_text(json.dumps({**meta, "version": vid, "received_utc": _now()}))
                _fsync_dir(self.incoming)
            except BaseException as exc:
                shutil.rmtree(part, ignore_errors=True)
                if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                    self.record("failed", version=vid, step="upload", reason="disk full")
                    raise DeployError(f"disk full on the box while receiving into {self.root}; nothing was "
                                      "kept", hint="free space on the box, then deploy again") from None
                if isinstance(exc, FileExistsError) or (isinstance(exc, OSError) and exc.errno == errno.ENOTEMPTY):
                    raise DeployError(f"version {vid} is already staged on the box", hint="deploy again (a new "
                                      "version id is drawn each time)") from None
                if isinstance(exc, (tarfile.TarError, EOFError)):
                    self.record("failed", version=vid, step="upload", reason=f"incomplete transfer: {exc}")
                    raise DeployError(f"the transfer ended early or is malformed ({exc}); nothing was kept",
                                      hint="the connection probably dropped: deploy again") from None
                raise
        return {"version": vid, "bytes": total}

    def _unpack(self, stream, dest: Path, declared_bytes: int) -> int:
        total = 0
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                name = PurePosixPath(member.name)
                if member.isdir():
                    continue
                if not member.isfile() or name.is_absolute() or ".." in name.parts or not name.parts:
                    raise DeployError(f"refusing tar member {member.name!r} (only plain relative files)")
                total += member.size
                if total > declared_bytes:
                    raise DeployError(f"the transfer is larger than announced ({total:,} > {declared_bytes:,} B)")
                out = dest.joinpath(*name.parts)
                out.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                with open(out, "wb") as fh:
                    shutil.copyfileobj(src, fh, 1 << 20)
                    fh.flush()
                    os.fsync(fh.fileno())
                if out.stat().st_size != member.size:
                    raise tarfile.ReadError(f"{member.name}: {out.stat().st_size} of {member.size} bytes")
        return total

    def staged(self, vid: str) -> Path:
        """``incoming/<vid>`` (a complete transfer). Raises DeployError if absent."""
        p = self.incoming / check_vid(vid)
        if not p.is_dir():
            raise DeployError(f"version {vid} is not staged on the box (interrupted, cleaned, or already active)",
                              hint="deploy again")
        os.utime(p)                     # a step is working on it: not stale
        return p

    def verify(self, vid: str) -> dict:
        """Check every staged file's SHA-256 against the staged manifest; first, when the box has an
        ``allowed_signers`` file, the manifest's signature (:func:`edgehft.signing.check_install_dir`).

        Raises:
            DeployError: naming the files that differ or are missing; an unsigned or untrusted bundle.
        """
        path = self.staged(vid)
        signed = check_install_dir(path, self.root)     # before anything parses the manifest; None: not required
        try:
            b = load_bundle(path, verify=True)
        except BundleError as exc:
            raise DeployError(f"verification failed on the box: {exc.args[0]}",
                              hint="the transfer or the box's storage corrupted the bundle; deploy again "
                                   "(nothing was switched)") from None
        extra = sorted(str(p.relative_to(path)) for p in path.rglob("*")
                       if p.is_file() and p.name != MANIFEST and str(p.relative_to(path)) not in b.manifest.files
                       and str(p.relative_to(path)) != SIGNATURE)
        if extra:
            raise DeployError(f"verification failed on the box: files not in the manifest: {', '.join(extra)}")
        return {"version": vid, "files": len(b.manifest.files) + 1,
                "manifest_sha256": sha256_file(path / MANIFEST), "signed_by": signed}

    def activate(self, vid: str, keep: int = 3) -> dict:
        """Make ``vid`` the active version: re-verify, move into ``versions/``, swap ``current`` atomically,
        log it, prune beyond ``keep`` inactive versions (never the previous one).

        Raises:
            DeployError: not staged, or its files no longer match (nothing switched).
        """
        with self.locked():
            self.verify(vid)
            before = self.active()
            failpoint("activate:before-move")
            self.versions.mkdir(parents=True, exist_ok=True)
            os.rename(self.incoming / vid, self.versions / vid)
            _fsync_dir(self.versions)
            self._switch(vid)
            self.record("activate", version=vid, previous=before)
            pruned = self._prune(keep)
        return {"active": vid, "previous": before, "pruned": pruned}

    def _switch(self, vid: str) -> None:
        tmp = self.root / f".current.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        os.symlink(f"versions/{vid}", tmp)
        failpoint("activate:before-switch")
        os.replace(tmp, self.current)           # rename(2): readers see the old or the new link, never none
        _fsync_dir(self.root)
        failpoint("activate:after-switch")

    def _prune(self, keep: int) -> list[str]:
        active, prev = self.active(), self.previous()
        old = [v for v in sorted(p.name for p in self.versions.iterdir() if p.is_dir()) if v not in (active, prev)]
        drop = old[:max(0, len(old) - max(0, keep - 1 - (prev is not None)))] if keep else []
        for v in drop:
            shutil.rmtree(self.versions / v, ignore_errors=True)
            (self.meta / f"{v}.json").unlink(missing_ok=True)
        return drop

    def rollback(self, to: str | None = None) -> dict:
        """Switch back to ``to`` (default: the version active before the current one), after checking its
        files against its manifest.

        Raises:
            DeployError: no previous version, unknown version, or its files changed.
        """
        with self.locked():
            active = self.active()
            target = to or self.previous()
            if target is None:
                raise DeployError("no previous version to roll back to",
                                  hint="`edgehft status --host H` lists the versions; pass --to VERSION")
            check_vid(target)
            path = self.versions / target
            if not path.is_dir():
                raise DeployError(f"version {target} is not installed on the box",
                                  hint="`edgehft status --host H` lists the versions")
            check_install_dir(path, self.root, what=f"refusing to roll back to {target}")
            try:
                load_bundle(path, verify=True)
            except BundleError as exc:
                raise DeployError(f"refusing to roll back to {target}: {exc.args[0]}") from None
            self._switch(target)
            self.record("rollback", version=target, previous=active)
        return {"active": target, "previous": active}

    def discard(self, vid: str, reason: str) -> dict:
        """Remove a staged version that failed a check, and log why."""
        with self.locked():
            p = self.incoming / check_vid(vid)
            existed = p.is_dir()
            shutil.rmtree(p, ignore_errors=True)
            (self.meta / f"{vid}.json").unlink(missing_ok=True)
            self.record("failed", version=vid, reason=reason)
        return {"discarded": vid if existed else None}
