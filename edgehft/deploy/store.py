"""The box's install directory: versioned bundles, ``current`` and ``previous`` symlinks, a history log. Runs
on the box.

Layout under ``root`` (the board file's ``[ssh] install_dir``)::

    current -> versions/<vid>        the active bundle: what a serving process opens
    previous -> versions/<vid>       the version active before it: what ``rollback`` goes back to
    versions/<vid>/                  complete, verified bundles (the active one and previous ones)
    incoming/<vid>.partial/          a transfer in progress (or one killed mid-way: removed by the next deploy)
    incoming/<vid>/                  received in full, not yet active (verify and golden run here)
    meta/<vid>.json                  where a version came from (bundle and model SHA-256, board, times)
    plan/<vid>.json                  the execution plan chosen on this box for a bundle that carries several
                                     (timed at deploy, or forced; every plan's figures): what a serving process
                                     opening ``current`` runs (:mod:`edgehft.runtime.plans`)
    history.jsonl                    every switch, rollback and failed attempt, one JSON object per line
    deploy.lock                      flock held by each step that changes the directory (receive, activate,
                                     rollback, discard); while held it names the step, version, pid and time
    deploy.hold                      flock held by ``agent hold`` for one whole deploy (see
                                     :mod:`edgehft.deploy.deploy`); while held it names that deploy

Invariants: ``current`` and ``previous`` only ever change by ``rename(2)`` of a fresh symlink over them
(atomic on POSIX), ``previous`` first: a switch cut between the two renames leaves ``previous`` equal to
``current``, which reads as "not known from the links". ``current`` only ever points to a directory under
``versions/`` whose files were just checked against its manifest; nothing under ``versions/`` is modified
after it is moved there, only removed by pruning, which never removes the active or the previous version.
The active and previous versions are read from the links, never from ``history.jsonl`` alone: the log is a
record, and a line lost to a full disk or a crash cannot make pruning delete the previous version. Where
the links do not say (a box installed before the ``previous`` link existed, or a switch cut between the
renames), :meth:`Store.previous_info` falls back to the history, then to the newest other version, and
says which; pruning is skipped whenever the version active before a switch is unknown, and whenever the
switch could not be logged (the activation result then carries a warning). A version id is
``YYYYmmddTHHMMSSZ-<first 12 hex of the manifest's SHA-256>-<4 hex>``.

Locks: both are ``flock(2)`` locks, taken without waiting, so the kernel releases them the moment their
holder exits, however it exits: a lock whose holder is gone is free at once, and the holder's description
left in the file is ignored. A step that finds a lock held is refused (:class:`DeployError`, exit 9) with
the holder's own description. The agents that hold a lock for a long time read the SSH channel with an
idle timeout (:class:`IdleStream`, :data:`IDLE_TIMEOUT_ENV`, default 30 s), so an agent whose client went
away over a stalled link gives up and exits instead of holding the box.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import select
import shutil
import signal
import sys
import tarfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from edgehft.bundle import MANIFEST, load_bundle, sha256_file
from edgehft.compat import removesuffix
from edgehft.errors import BundleError, DeployError, InputError
from edgehft.runtime.plans import RECORD_DIR, make_record, pick, read_record, record_path
from edgehft.signing import SIGNATURE, check_install_dir

VID = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{12}-[0-9a-f]{4}$")
STALE_STAGED_S = 600.0
FAILPOINTS_ENV = "EDGEHFT_FAILPOINTS"


IDLE_TIMEOUT_ENV = "EDGEHFT_IDLE_TIMEOUT"
DEFAULT_IDLE_TIMEOUT_S = 30.0
ANY = object()          # activate(expect=ANY): no check of what is active


def failpoint(name: str) -> None:
    """Fault injection for the deploy tests, from the comma-separated ``EDGEHFT_FAILPOINTS`` environment
    variable. At the point ``name``: ``name`` SIGKILLs this process (a real kill, as a power cut or OOM kill
    would); ``name=pause`` sleeps 5 s (time for a test to cut the connection there); ``name=segv`` kills it
    with SIGSEGV, as a crash in native code would (core dumps off); ``name=enospc`` raises
    ``OSError(ENOSPC)``, as a write to a full disk does."""
    points = os.environ.get(FAILPOINTS_ENV, "").split(",")
    if name in points:
        os.kill(os.getpid(), signal.SIGKILL)
    if f"{name}=pause" in points:
        time.sleep(5)
    if f"{name}=segv" in points:
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        sys.stderr.write(f"edgehft failpoint {name}: SIGSEGV\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    if f"{name}=enospc" in points:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (failpoint {name})")


def idle_timeout(seconds: float | None = None) -> float:
    """Seconds without a byte after which the agent gives up on its SSH channel: ``seconds`` if given (the
    deploy passes its own), else ``$EDGEHFT_IDLE_TIMEOUT``, else 30.

    Raises:
        DeployError: not a positive number.
    """
    raw = seconds if seconds is not None else os.environ.get(IDLE_TIMEOUT_ENV, DEFAULT_IDLE_TIMEOUT_S)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not 0 < value < 86400:
        raise DeployError(f"idle timeout {raw!r} is not a number of seconds (0 < s < 86400)",
                          hint=f"set {IDLE_TIMEOUT_ENV} or --idle-timeout to e.g. 30")
    return value


class StalledLink(DeployError):
    """No byte arrived on the SSH channel for the idle timeout: the deploy at the other end is gone or cut off."""


class IdleStream:
    """A binary read stream over file descriptor ``fd`` (the agent's stdin, i.e. the SSH channel) whose
    ``read(n)`` returns up to ``n`` bytes (``b""`` at the end of the stream) and raises :class:`StalledLink`
    when no byte arrives for ``timeout`` seconds."""

    def __init__(self, fd: int, timeout: float):
        self.fd, self.timeout = fd, timeout

    def read(self, n: int = -1) -> bytes:
        ready, _, _ = select.select([self.fd], [], [], self.timeout)
        if not ready:
            raise StalledLink(f"no byte from the deploy for {self.timeout:g} s: the link stalled or the deploy "
                              "is gone", hint="check the network to the box, then deploy again")
        return os.read(self.fd, n if n and n > 0 else 1 << 16)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_info(fd: int, info: dict | None) -> None:
    """Replace a lock file's content with ``info`` (None: empty). Best effort: a full disk only loses the
    description, never the lock."""
    try:
        os.ftruncate(fd, 0)
        if info:
            os.pwrite(fd, json.dumps(info).encode(), 0)
    except OSError:
        pass


def _read_info(fd: int) -> dict:
    try:
        info = json.loads(os.pread(fd, 1 << 16, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def describe_holder(info: dict) -> str:
    """One line naming who holds a lock, from what the holder wrote into the lock file (``{}``: it did not
    say: an older edgehft, or a holder that is just starting)."""
    if not info or not _alive(info.get("pid")):
        return "a process that did not say who it is (an older edgehft agent?)"
    if info.get("deploy"):
        src = f" from {info['from_host']}" + (f" (pid {info['client_pid']} there)" if info.get("client_pid") else "") \
            if info.get("from_host") else ""
        return f"the deploy of {info['deploy']}{src}, holding the box since {info.get('since')} (agent pid {info['pid']})"
    what = info.get("step", "a step") + (f" of {info['version']}" if info.get("version") else "")
    return f"{what} (agent pid {info['pid']}, since {info.get('since')})"


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
        self.plan_dir = self.root / RECORD_DIR
        self.current = self.root / "current"
        self.previous_link = self.root / "previous"
        self.history_file = self.root / "history.jsonl"
        self.lock_file = self.root / "deploy.lock"
        self.hold_file = self.root / "deploy.hold"

    # -- state --------------------------------------------------------------------------------------
    def active(self) -> str | None:
        """The active version id, or None before the first deploy."""
        try:
            return Path(os.readlink(self.current)).name
        except OSError:
            return None

    def installed(self) -> list[str]:
        """The version ids under ``versions/``, oldest first."""
        return sorted(p.name for p in self.versions.iterdir() if p.is_dir()) if self.versions.is_dir() else []

    def history(self) -> list[dict]:
        if not self.history_file.exists():
            return []
        rows = []
        for line in self.history_file.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue                # a line cut by a crash or a full disk mid-append
            if isinstance(row, dict):
                rows.append(row)
        return rows

    def previous_info(self) -> tuple[str | None, str]:
        """The version that was active before the current one, and how that is known.

        Returns:
            ``(vid or None, source)``; source ``"link"``: the ``previous`` symlink (certain); ``"history"``:
            no usable link (a box installed before the link existed, or a switch cut between its two
            renames), so the last ``history.jsonl`` record of the active version's activation; ``"newest"``:
            no such record either (a damaged log), so the newest other installed version, a guess;
            ``"none"``: no other version is installed. A version that is no longer installed is never given.
        """
        active = self.active()
        others = [v for v in self.installed() if v != active]
        try:
            link = Path(os.readlink(self.previous_link)).name
        except OSError:
            link = None
        if link is not None and link != active and link in others:
            return link, "link"
        for row in reversed(self.history()):
            if row.get("event") in ("activate", "rollback") and row.get("version") == active:
                prev = row.get("previous")
                if prev is None or prev in others:
                    return prev, "history"
                break                   # pruned or removed by hand since
        return (others[-1], "newest") if others else (None, "none")

    def previous(self) -> str | None:
        """The version that was active before the current one (None if none): :meth:`previous_info`'s."""
        return self.previous_info()[0]

    def info(self, vid: str) -> dict:
        p = self.meta / f"{vid}.json"
        try:
            return json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            return {"version": vid}

    def plan_info(self, vid: str) -> tuple[dict | None, str | None]:
        """The execution plan installed version ``vid`` runs here and how it was chosen, or why that is not
        known: ``(info, None)`` or ``(None, problem)``. ``info``: ``plan``, ``how`` (``only``: the bundle has
        one plan; ``top level``: it carries several and no record exists, so the compile host's choice runs;
        else the record's ``timed``/``forced`` with its ``select``, ``measured`` figures, ``excluded`` plans,
        ``pinned_cpu`` ...) and ``plans`` (every plan the bundle carries). ``problem``: the bundle's manifest
        or the box's plan record is damaged."""
        path = self.versions / vid
        try:
            names = load_bundle(path, verify=False).plan_names()
            if len(names) == 1:
                return {"plan": names[0], "how": "only", "plans": names}, None
            rec = read_record(self.root, vid, sha256_file(path / MANIFEST), names)
        except (BundleError, OSError) as exc:
            return None, exc.args[0] if isinstance(exc, BundleError) else f"{path}: {exc}"
        if rec is None:
            return {"plan": names[0], "how": "top level", "plans": names}, None
        return {**rec, "plans": names}, None

    def record_plan(self, vid: str, timed: dict, select: str = "p99", forced: str | None = None,
                    excluded: dict | None = None, held: bool = False) -> dict:
        """Choose the plan of staged version ``vid`` from the figures the box just measured (``timed``:
        :func:`edgehft.runtime.plans.time_runners` as the agent's ``plans`` command returns them):
        ``forced`` if given, else the lowest ``select`` percentile; write ``plan/<vid>.json`` atomically
        (a temporary file fsynced and renamed) and return the record.

        Raises:
            DeployError: not staged, held by another deploy (or ``held`` and this deploy's hold ended), a
                forced plan that was not timed, an unknown ``select``, the record cannot be written.
        """
        with self.locked("plan", vid):
            self._check_hold(vid, held)
            path = self.staged(vid)
            measured = timed.get("measured") or {}
            try:
                plan = forced if forced else pick(measured, select)
            except (InputError, ValueError) as exc:
                raise DeployError(f"cannot choose a plan: {exc.args[0]}", hint="deploy again") from None
            if plan not in measured:
                raise DeployError(f"the forced plan {plan!r} was not timed on the box (timed: {', '.join(measured)})",
                                  hint="force a plan the bundle carries and the box runs")
            rec = make_record(vid, sha256_file(path / MANIFEST), plan, "forced" if forced else "timed", select,
                              measured, excluded or {}, timed.get("pinned_cpu", 0), timed.get("rounds", 0),
                              timed.get("windows", 0))
            self.plan_dir.mkdir(parents=True, exist_ok=True)
            dst = record_path(self.root, vid)
            tmp = dst.with_name(f".{dst.name}.{os.getpid()}")
            try:
                with open(tmp, "w") as fh:
                    json.dump(rec, fh, indent=1)
                    fh.flush()
                    os.fsync(fh.fileno())
                failpoint("plan:before-rename")
                os.replace(tmp, dst)
                _fsync_dir(self.plan_dir)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                raise DeployError(f"cannot record the plan chosen for {vid} in {self.plan_dir}: {exc.strerror or exc}; "
                                  "nothing was switched", hint="free space on the box, then deploy again") from None
        return rec

    def status(self) -> dict:
        """``{"root", "active", "active_info", "active_problems", "active_plan", "plan_problem", "previous",
        "previous_source", "held_by", "versions": [meta… with "plan"], "staged", "partial", "history"}``
        (``held_by``: the deploy that holds the box now, see :func:`describe_holder`, or None;
        ``active_plan``/``plan_problem``: :meth:`plan_info` of the active version)."""
        active = self.active()
        versions = self.installed()
        staged = sorted(p.name for p in self.incoming.iterdir()) if self.incoming.is_dir() else []
        problems = None
        if active:
            try:
                load_bundle(self.versions / active, verify=True)
                problems = []
            except BundleError as exc:
                problems = [exc.args[0]]
        prev, source = self.previous_info()
        holder = self.holder()
        plans = {v: self.plan_info(v) for v in versions}
        active_plan, plan_problem = plans.get(active, (None, None)) if active and not problems else (None, None)
        return {"root": str(self.root), "active": active, "active_info": self.info(active) if active else None,
                "active_problems": problems, "active_plan": active_plan, "plan_problem": plan_problem,
                "previous": prev, "previous_source": source,
                "held_by": describe_holder(holder) if holder is not None else None,
                "versions": [{**self.info(v), "version": v, "active": v == active,
                              "plan": (plans[v][0] or {}).get("plan")} for v in versions],
                "staged": [s for s in staged if not s.endswith(".partial")],
                "partial": [s for s in staged if s.endswith(".partial")],
                "history": self.history()[-10:]}

    def record(self, event: str, **fields) -> str | None:
        """Append one line to ``history.jsonl`` (fsynced).

        Returns:
            None when the line is on disk; else why not (e.g. the disk is full), also said on stderr. A
            failed append is cut back to the file's previous length, so no half line is left for the next
            one to be glued to. The operation the line describes is not undone (the links say what is
            active); callers that prune skip it.
        """
        line = (json.dumps({"utc": _now(), "event": event, **fields}) + "\n").encode()
        fd = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.history_file, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line                     # a line an older agent's crash cut short ends here
            try:
                try:
                    failpoint(f"history:{event}")
                except OSError:
                    os.write(fd, line[:1])              # =enospc: the disk fills after the line's first byte
                    raise
                _write_all(fd, line)
                os.fsync(fd)
            except OSError:
                try:
                    os.ftruncate(fd, size)
                except OSError:
                    pass
                raise
        except OSError as exc:
            why = f"could not log {event} {fields.get('version') or ''} to {self.history_file}: " \
                  f"{exc.strerror or exc}"
            print(f"edgehft agent: {why}", file=sys.stderr)
            return why
        finally:
            if fd is not None:
                os.close(fd)
        return None

    # -- locking and cleanup -----------------------------------------------------------------------------
    @contextmanager
    def _flock(self, path: Path, info: dict, refusal: str, hint: str, wait_s: float = 0.3):
        """Hold an exclusive ``flock`` on ``path`` with ``info`` (plus pid and time) written into it, cleared
        on release. A lock still held after ``wait_s`` (short: it rides out another agent's brief look) is
        refused.

        Raises:
            DeployError: ``"<refusal>: <who holds it>"`` with ``hint``.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise DeployError(f"{refusal}: {describe_holder(_read_info(fd))}", hint=hint) from None
                    time.sleep(0.05)
            _write_info(fd, {**info, "pid": os.getpid(), "since": _now()})
            try:
                yield
            finally:
                _write_info(fd, None)       # nobody's: before close lets the next holder in
        finally:
            os.close(fd)

    @contextmanager
    def locked(self, step: str = "a deploy step", version: str | None = None, wait_s: float = 0.3):
        """Hold ``deploy.lock`` (one changing step at a time on this box), naming ``step`` and ``version``
        in it, and remove what killed operations left.

        Raises:
            DeployError: another step holds it (which one, its pid and since when are in the message).
        """
        with self._flock(self.lock_file, {"step": step, "version": version},
                         "another deploy step is running on this box",
                         "wait for it to finish, then try again; `edgehft status --host` shows what the box serves",
                         wait_s=wait_s):
            self._clean_stale()
            yield

    @contextmanager
    def hold(self, info: dict):
        """Hold ``deploy.hold`` for one deploy: ``info`` names it (``deploy``: its version, ``from_host``,
        ``client_pid``). Released when the holder exits, however it exits.

        Raises:
            DeployError: another deploy holds the box (its version, host, pid and start time are in the
                message).
        """
        with self._flock(self.hold_file, info, "the box is held by another deploy",
                         "wait for that deploy to finish, then deploy again (a deploy whose connection died "
                         "frees the box at once, a stalled one after its idle timeout)"):
            yield

    def holder(self) -> dict | None:
        """What the holder of ``deploy.hold`` wrote (``{}`` if nothing), or None when nobody holds it."""
        try:
            fd = os.open(self.hold_file, os.O_RDONLY)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_info(fd)
            return None
        finally:
            os.close(fd)                # drops the shared lock this look took

    def _check_hold(self, vid: str, held: bool) -> None:
        """Refuse a changing step for ``vid`` while another deploy holds the box; with ``held`` (the deploy
        says it holds the box) also when nobody does any more (its hold ended: connection dropped or
        stalled).

        Raises:
            DeployError: either case.
        """
        holder = self.holder()
        if holder is None and held:
            raise DeployError(f"this deploy of {vid} no longer holds the box (its hold connection ended: dropped, "
                              "stalled past the idle timeout, or killed); nothing was switched",
                              hint="deploy again")
        if holder is not None and holder.get("deploy") != vid:
            raise DeployError(f"the box is held by another deploy: {describe_holder(holder)}",
                              hint="wait for that deploy to finish, then deploy again")

    def _clean_stale(self) -> None:
        """Remove what killed operations left: ``*.partial`` transfers (none can be live: receiving holds
        the lock), staged versions no step touched for :data:`STALE_STAGED_S` (except the one the deploy
        holding the box works on), orphan ``.current.*``/``.previous.*`` links."""
        if self.incoming.is_dir():
            busy = (self.holder() or {}).get("deploy")
            for p in self.incoming.iterdir():
                old = time.time() - p.stat().st_mtime > STALE_STAGED_S and p.name != busy
                if p.name.endswith(".partial") or old:
                    shutil.rmtree(p, ignore_errors=True)
                    self.record("cleaned", version=removesuffix(p.name, ".partial"),
                                reason="interrupted transfer" if p.name.endswith(".partial") else "staged, never activated")
        for p in [*self.root.glob(".current.*"), *self.root.glob(".previous.*")]:
            p.unlink(missing_ok=True)
        if self.plan_dir.is_dir():          # records of versions neither installed nor staged, half-written ones
            keep = set(self.installed()) | ({p.name for p in self.incoming.iterdir()} if self.incoming.is_dir() else set())
            for p in self.plan_dir.iterdir():
                if (p.is_file() or p.is_symlink()) and (p.name.startswith(".") or removesuffix(p.name, ".json") not in keep):
                    p.unlink(missing_ok=True)

    # -- steps ----------------------------------------------------------------------------------------
    def receive(self, vid: str, stream, declared_bytes: int, meta: dict, held: bool = False) -> dict:
        """Unpack the bundle tar from ``stream`` (e.g. an :class:`IdleStream`) into ``incoming/<vid>``.

        Only regular files with relative paths inside the bundle are taken. Free space is checked first
        (``declared_bytes`` plus one 4 KiB block per member and 1 MiB), and a write that fails with ENOSPC
        is reported as a full disk; either way the partial directory is removed. ``held``: the deploy holds
        the box (:meth:`hold`); refused if that hold has ended. Refused while another deploy holds the box.

        Raises:
            DeployError: disk full, a truncated or malformed stream (connection dropped), a stalled stream
                (:class:`StalledLink`), an unsafe member, the box held by another deploy.
        """
        check_vid(vid)
        with self.locked("receive", vid):
            self._check_hold(vid, held)
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
                self._receive_failed(vid, exc)
                raise
        return {"version": vid, "bytes": total}

    def _receive_failed(self, vid: str, exc: BaseException) -> None:
        """Log why a transfer into the (already removed) partial directory failed, and raise the error that
        says so; returns for errors that already say it themselves."""
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
        if isinstance(exc, StalledLink):
            self.record("failed", version=vid, step="upload", reason=exc.args[0])
            raise StalledLink(f"{exc.args[0]}; nothing was kept", hint=exc.hint) from None

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
        # anything but a directory counts: a FIFO, socket or device node the manifest does not list is refused too
        # only the top manifest is unlisted: a plans/<plan>/manifest.json is listed like any other file
        extra = sorted(rel for rel in (str(p.relative_to(path)) for p in path.rglob("*")
                                       if p.is_symlink() or not p.is_dir())
                       if rel not in b.manifest.files and rel not in (MANIFEST, SIGNATURE))
        if extra:
            raise DeployError(f"verification failed on the box: files not in the manifest: {', '.join(extra)}")
        return {"version": vid, "files": len(b.manifest.files) + 1,
                "manifest_sha256": sha256_file(path / MANIFEST), "signed_by": signed}

    def activate(self, vid: str, keep: int = 3, expect=ANY, held: bool = False) -> dict:
        """Make ``vid`` the active version: re-verify, move into ``versions/``, point ``previous`` at the
        version active so far and ``current`` at ``vid`` (two atomic renames, in that order), log it, prune
        beyond ``keep`` versions (never the active or the previous one; ``keep`` 0: none).

        Args:
            expect: the version the deploy found active when it probed the box (None: nothing active).
                Refused if another deploy or a rollback has switched the box since. Default: no check.
            held: the deploy holds the box (:meth:`hold`); refused if that hold has ended.
        Returns:
            ``{"active", "previous", "pruned": [vid…], "warnings": [text…]}``; a warning when the switch
            could not be logged (e.g. a full disk): the switch stands, pruning is skipped.
        Raises:
            DeployError: not staged, its files no longer match, the box switched since ``expect``, held by
                another deploy, or the links cannot be written (nothing switched in each case).
        """
        with self.locked("activate", vid):
            self._check_hold(vid, held)
            self.verify(vid)
            before = self.active()
            if expect is not ANY and before != expect:
                raise self._switched_since(expect, before)
            links = self._new_links(vid, before)
            failpoint("activate:before-move")
            self.versions.mkdir(parents=True, exist_ok=True)
            os.rename(self.incoming / vid, self.versions / vid)
            _fsync_dir(self.versions)
            self._switch(*links)
            unlogged = self.record("activate", version=vid, previous=before)
            warnings, pruned = [], []
            if unlogged:
                warnings.append(f"{unlogged}. {vid} is active and {before or 'nothing'} stays the previous version "
                                "(the box's `previous` link says so), but no old version was pruned: free space "
                                "on the box")
            else:
                pruned = self._prune(keep, vid, before)
        return {"active": vid, "previous": before, "pruned": pruned, "warnings": warnings}

    def _switched_since(self, expect: str | None, active: str | None) -> DeployError:
        who = self.info(active) if active else {}
        by = f", received {who.get('received_utc')} from {who.get('from_host')}" if who.get("from_host") else ""
        last = next((r for r in reversed(self.history()) if r.get("version") == active
                     and r.get("event") in ("activate", "rollback")), {})
        how = f" by {'a rollback' if last.get('event') == 'rollback' else 'another deploy'} at {last.get('utc')}" \
            if last else ""
        return DeployError(f"the box was switched from {expect or 'nothing'} to {active or 'nothing'}{how}{by} "
                           "after this deploy probed it; nothing was switched",
                           hint="another deploy or a rollback got there first: `edgehft status --host` shows what "
                                "the box serves; deploy again if this version should replace it")

    def _new_links(self, vid: str, before: str | None) -> tuple:
        """Fresh ``.previous.<pid>`` (-> ``before``, if any) and ``.current.<pid>`` (-> ``vid``) symlinks, made
        before anything visible changes, so a full disk refuses the switch instead of half doing it.

        Raises:
            DeployError: the links cannot be made (nothing switched).
        """
        made = []
        try:
            for name, target in (("previous", before), ("current", vid)):
                tmp = self.root / f".{name}.{os.getpid()}"
                tmp.unlink(missing_ok=True)
                if target is not None:
                    os.symlink(f"versions/{target}", tmp)
                    made.append(tmp)
        except OSError as exc:
            for tmp in made:
                tmp.unlink(missing_ok=True)
            raise DeployError(f"cannot prepare the switch to {vid} in {self.root}: {exc.strerror or exc}; nothing "
                              "was switched", hint="free space on the box, then try again") from None
        return (made[0] if before is not None else None), made[-1]

    def _switch(self, prev_tmp: Path | None, cur_tmp: Path) -> None:
        """Rename the links from :meth:`_new_links` over ``previous``, then ``current``: a reader sees the
        old or the new ``current``, never none; a cut between the two leaves ``previous == current``."""
        failpoint("activate:before-switch")
        if prev_tmp is not None:
            os.replace(prev_tmp, self.previous_link)
            failpoint("activate:between-links")
        os.replace(cur_tmp, self.current)           # rename(2)
        _fsync_dir(self.root)
        failpoint("activate:after-switch")

    def _prune(self, keep: int, active: str, before: str | None) -> list[str]:
        """Remove the oldest versions beyond ``keep`` (the active and previous ones count and stay); nothing
        when ``keep`` is 0 or the version active before this switch is not known to be installed (a box
        whose ``current`` was missing or dangling: unsure what must stay)."""
        names = self.installed()
        if not keep or before not in names:
            return []
        protect = {active, before}
        old = [v for v in names if v not in protect]
        drop = old[:max(0, len(old) - max(0, keep - len(protect & set(names))))]
        for v in drop:
            shutil.rmtree(self.versions / v, ignore_errors=True)
            (self.meta / f"{v}.json").unlink(missing_ok=True)
            record_path(self.root, v).unlink(missing_ok=True)
        return drop

    def rollback(self, to: str | None = None) -> dict:
        """Switch back to ``to`` (default: the version active before the current one, :meth:`previous_info`),
        after checking its files against its manifest. Not refused while a deploy holds the box: that
        deploy's switch is refused instead (it finds the box switched since it probed).

        Returns:
            ``{"active", "previous", "warnings": [text…]}``: a warning when the switch could not be logged, or
            when the target was a guess (no link, no history record).
        Raises:
            DeployError: no previous version, unknown version, or its files changed.
        """
        with self.locked("rollback", to):
            active = self.active()
            target, source = (to, "given") if to else self.previous_info()
            if target is None:
                raise DeployError("no previous version to roll back to",
                                  hint="`edgehft status --host H` lists the versions; pass --to VERSION")
            check_vid(target)
            if target == active:
                return {"active": active, "previous": self.previous(), "warnings": [f"{target} is already active; "
                                                                                     "nothing was switched"]}
            path = self.versions / target
            if not path.is_dir():
                raise DeployError(f"version {target} is not installed on the box",
                                  hint="`edgehft status --host H` lists the versions")
            check_install_dir(path, self.root, what=f"refusing to roll back to {target}")
            try:
                load_bundle(path, verify=True)
            except BundleError as exc:
                raise DeployError(f"refusing to roll back to {target}: {exc.args[0]}") from None
            self._switch(*self._new_links(target, active))
            unlogged = self.record("rollback", version=target, previous=active)
        warnings = [unlogged] if unlogged else []
        if source == "newest":
            warnings.append(f"neither the `previous` link nor the history says what was active before {active}: "
                            f"rolled back to the newest other version, {target}")
        return {"active": target, "previous": active, "warnings": warnings}

    def discard(self, vid: str, reason: str, wait_s: float = 0.3) -> dict:
        """Remove a staged version that failed a check (or whose deploy went away), and log why. Waits up to
        ``wait_s`` seconds for a step in progress to finish.

        Raises:
            DeployError: another step still holds the lock after ``wait_s``.
        """
        with self.locked("discard", vid, wait_s=wait_s):
            p = self.incoming / check_vid(vid)
            existed = p.is_dir()
            shutil.rmtree(p, ignore_errors=True)
            (self.meta / f"{vid}.json").unlink(missing_ok=True)
            record_path(self.root, vid).unlink(missing_ok=True)
            self.record("failed", version=vid, reason=reason)
        return {"discarded": vid if existed else None}
