"""``edgehft deploy``, ``status`` and ``rollback`` on the host: drive the box agent step by step over SSH.

Steps, each its own ``ssh`` call (so a failure names its step): ``probe`` (is the box that board; what
does it run) → ``hold`` (this deploy holds the box, see below) → ``upload`` (tar of the manifest's files into
``incoming/<vid>``) → ``verify`` (SHA-256 on the box) → ``golden`` (the bundle's golden vectors on the box's
runtime: exact for int8 backends, the stated tolerance for float ones) → ``latency`` (the gate, below) →
``switch`` (re-verify, atomic ``previous`` and ``current`` swap, older versions kept). Until ``switch``
succeeds the box serves what it served before; a staged version that fails a check is removed and the failure
is logged in the box's ``history.jsonl``.

A bundle that carries several execution plans (``compile --quant auto``: the manifest's ``plans``) is chosen
for on the box: ``golden`` runs every plan's golden vectors there (``golden --plans``; a plan the box cannot
run, or whose vectors differ, is left out with a warning; a forced plan that fails is exit 8), then
``plan`` (agent ``plans``) times the plans that passed in one process on the box, interleaved, pinned to one
core (``core``, default the board file's ``[runtime] core``, else the box's highest allowed CPU), picks the
lowest ``select`` percentile (or the forced plan) and records it in ``plan/<vid>.json`` with every plan's
figures (:mod:`edgehft.runtime.plans`) before the switch, so a serving process opening ``current`` runs it
from the first moment. A box whose edgehft predates plan choice (its probe does not say ``plan_choice``)
runs the bundle's top level, the compile host's choice, as it always did, with a warning.

The **latency gate** (step ``latency``, agent ``latency``): before the switch the box runs the HIL latency check
(:func:`edgehft.hil.checks.latency`) on the staged version in a process of its own, pinned to ``core`` (as the
``plan`` step: the board file's ``[runtime] core``, else the box's highest allowed CPU), on the plan it will
serve (the one ``plan`` recorded, else the top level): the bundle's golden inputs back to back (they carry no
tick times), ``gate_samples`` timed calls after ``gate_warmup``. p99 or p99.9 over the budget (the board file's
``[latency_budget_us]`` on the box, each replaced by ``budget_p99_us`` / ``budget_p999_us``) is exit 9: nothing
is switched, the staged copy is removed and the refusal logged in ``history.jsonl`` like any failed check. Not
judged (an emulated run without a budget given, a board without a budget) switches with a warning.
``latency_gate=False`` (``--no-latency-gate``) switches untimed, with a warning in the result and a
``latency-gate-off`` line in the box's history; a box whose agent predates the gate (its probe does not say
``latency_gate``) switches untimed with a warning. ``DeployResult.latency_gate`` holds the figures.

One deploy at a time per box (design): a deploy is several ssh calls, so no single box process spans it.
Two mechanisms, both on the box:

- the **hold**: after the probe, the deploy runs ``agent hold`` over a connection of its own for the rest of
  the deploy and feeds it a heartbeat line every quarter of the idle timeout. The agent holds ``flock`` on
  ``deploy.hold`` with the deploy's version, host, pid and start time written in it. A second deploy's hold
  is refused at once (exit 9, step ``hold``) with that description; ``upload`` and ``switch`` run with
  ``--held`` and are refused if this deploy's hold has ended. The kernel drops the lock the moment the
  holding agent exits, and it exits when the deploy says "done", when its connection closes (the deploy was
  killed: its ssh dies with it) or after the idle timeout without a heartbeat (a stalled link), removing
  the deploy's staged copy in the last two cases: a dead deploy never keeps the box;
- **compare-and-swap** at the switch: ``activate --expect-active V`` (what the probe saw active) is refused
  (exit 9) if the box was switched since, by a deploy that finished before this one took the hold or by a
  rollback (``rollback`` is never blocked by a deploy: an operator's rollback wins, and the deploy's switch
  is refused). So of concurrent deploys to one box at most one switches; each other one fails with exit 9
  and a message naming the deploy that held or switched the box; none reports success with a version that
  is not active.

Exit behaviour (``DeployResult.exit_code``): 9 refused or failed on the box (held by another deploy,
switched since the probe, the box agent killed by a signal, e.g. ``golden`` crashing the runtime: "golden
crashed on the box: ... killed by SIGSEGV (signal 11)"), 10 unreachable or the link failed (a stalled link:
"the link to the box stalled", after about half the idle timeout, see :mod:`edgehft.deploy.ssh`), 8 golden
vectors not reproduced, 6 the local bundle. A deploy whose switch succeeded but could not be logged on the
box (e.g. a full disk at ``history.jsonl``) is a success with ``warnings`` saying so; pruning was skipped.
"""
from __future__ import annotations

import io
import json
import os
import secrets
import socket
import tarfile
import threading
import time
from contextlib import ExitStack, contextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from edgehft.bench.replay import WARMUP
from edgehft.boards import load_board
from edgehft.bundle import MANIFEST, load_bundle, sha256_file
from edgehft.bundle_checks import releases_hint
from edgehft.deploy.probe import board_mismatches, stack_mismatch
from edgehft.deploy.ssh import AgentSession, SshTarget, one_connection, run_agent
from edgehft.errors import DeployError, EdgeHFTError, GoldenMismatchError, InputError, RemoteError
from edgehft.runtime.plans import DEFAULT_SELECT, check_select
from edgehft.signing import SIGNATURE

STEPS = ("probe", "hold", "upload", "verify", "golden", "plan", "latency", "switch")  # "plan": several-plan bundles
GATE_SAMPLES = 2000     # the latency gate's timed calls (edgehft.hil.checks.SAMPLES)
GATE_WARMUP = WARMUP    # and untimed calls before them (as bench and the pytest plugin)


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
    warnings: list[str] = field(default_factory=list)    # e.g. the switch could not be logged on the box
    plan_choice: dict | None = None    # the box's record of the execution plan it chose (several-plan bundles)
    latency_gate: dict | None = None   # the latency gate's verdict and figures (see _gate_summary)

    def to_json(self) -> dict:
        return asdict(self)


def tar_bundle(path: Path, files: list[str]) -> bytes:
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


class BoxHold:
    """This deploy's hold on the box (see the module docstring): ``agent hold`` over its own ssh connection,
    a heartbeat thread, and "done" on leaving the ``with`` block.

    Raises (on entering):
        DeployError: another deploy holds the box (named), or the box's agent cannot hold it.
        RemoteError: the box cannot be reached.
    """

    def __init__(self, target: SshTarget, vid: str, meta: dict):
        self.target, self.vid, self.meta = target, vid, meta
        self.session: AgentSession | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.info: dict = {}

    def __enter__(self) -> "BoxHold":
        self.session = AgentSession(self.target, "hold", "--version", self.vid, "--meta", json.dumps(self.meta),
                                    "--idle-timeout", f"{self.target.idle_timeout:g}")
        first = self.session.first_line(timeout=60 + self.target.idle_timeout)
        if not first or "held" not in first:
            try:
                self.session.finish(timeout=10)      # raises what the agent or ssh said
                raise DeployError(f"{self.target.label}: the box agent did not confirm the hold",
                                  hint="`edgehft status --host` shows what the box serves")
            finally:
                self.session.close()
        self.info = first["held"]
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)
        self._beat.start()
        return self

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.target.idle_timeout / 4):
            if not self.session.send(b"\n"):
                return

    def check(self) -> None:
        """Raises if the hold's connection has ended (RemoteError when ssh failed, DeployError else)."""
        if self.session.alive():
            return
        self.session.finish(timeout=5)
        raise DeployError(f"{self.target.label}: the box let go of this deploy's hold (its heartbeat was late)",
                          hint="deploy again")

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        try:
            self.session.send(b"done\n")
            self.session.finish(timeout=self.target.idle_timeout)
        except EdgeHFTError:
            pass                # the agent lets go on its own (end of stream, or the idle timeout)
        finally:
            self.session.close()


class _Steps:
    """The agent calls of one deploy: name the step in progress, call ``on_step``, check the hold, time it."""

    def __init__(self, target: SshTarget, res: DeployResult, on_step, ctx: dict):
        self.target, self.res, self.on_step, self.ctx = target, res, on_step, ctx
        self.current = "bundle"
        self.holding: BoxHold | None = None

    def begin(self, name: str) -> float:
        self.current = name
        if self.on_step:
            self.on_step(name, self.target, self.ctx)
        return time.perf_counter()

    def run(self, name: str, command: str, *args: str, **kw) -> dict:
        t0 = self.begin(name)
        if self.holding is not None:
            self.holding.check()
        lines = run_agent(self.target, command, *args, **kw)
        self.res.seconds[name] = round(time.perf_counter() - t0, 3)
        return lines[-1]["result"]

    @contextmanager
    def hold(self, vid: str, meta: dict):
        t0 = self.begin("hold")
        with BoxHold(self.target, vid, meta) as h:
            self.res.seconds["hold"] = round(time.perf_counter() - t0, 3)
            self.holding = h
            try:
                yield h
            finally:
                self.holding = None


def deploy(target: SshTarget, bundle_dir: str | Path, board: str | None = None, *, force: bool = False,
           dry_run: bool = False, keep: int = 3, emulate: bool = False, select: str = DEFAULT_SELECT,
           plan: str | None = None, core: int | None = None, plan_rounds: int = 300, latency_gate: bool = True,
           budget_p99_us: float | None = None, budget_p999_us: float | None = None,
           gate_samples: int = GATE_SAMPLES, gate_warmup: int = GATE_WARMUP, share_connection: bool = True,
           on_step: Callable[[str, SshTarget, dict], None] | None = None) -> DeployResult:
    """Deploy the bundle at ``bundle_dir`` to ``target``; never raises for a per-host failure.

    Args:
        board: the board the box must be (default: the bundle's); another board than the bundle's, or a box
            the probe says is not that board, is refused unless ``force`` (then listed in ``forced``).
        dry_run: probe only (read-only) and return the plan.
        keep: versions kept on the box after the switch (active and previous always kept).
        emulate: run the golden vectors on the box in emulation (accelerator boards without the device).
        select: a bundle with several execution plans: the percentile (p50, p99, p99.9) the box chooses by.
        plan: force this execution plan (its golden vectors are still checked; the others still timed).
        core: the CPU the plans are timed on (default: the board file's ``[runtime] core``, else the box's
            highest allowed one); ``plan_rounds``: timed calls per plan. The latency gate runs pinned there too.
        latency_gate: hold the box's p99 / p99.9 of ``predict`` (µs) to the budget before the switch (module
            docstring); False: switch untimed, with a warning here and in the box's history.
        budget_p99_us, budget_p999_us: the gate's budget (µs, > 0), each replacing the board file's.
        gate_samples, gate_warmup: the gate's timed calls (>= 1) and untimed calls before them (>= 0).
        share_connection: every call from the probe on is a session on one SSH connection to the box
            (:func:`~edgehft.deploy.ssh.one_connection`); False: one connection per call, as before it
            (benchmarks/deploy_fleet.py compares them). A session the box's sshd refuses on the shared
            connection (``MaxSessions 1``: the hold is one) opens a connection of its own (OpenSSH does that).
        on_step: called before each step with (step, target, context) — progress display and fault tests.
    Returns:
        :class:`DeployResult`; ``exit_code`` 9 refused/failed (box unchanged; also: held by another deploy,
        switched since the probe, the agent killed by a signal), 10 unreachable or the link stalled, 8
        golden vectors not reproduced on the box (nothing switched), 6 the local bundle is broken, 3 an
        unknown ``plan`` or ``select`` or a bad gate budget or sample count; 9 also when the latency gate
        refuses (p99 or p99.9 over budget). ``warnings``: e.g. the switch happened but could not be logged on
        the box (pruning skipped), a plan left out on the box, the gate off or not judged. ``plan_choice``: the
        box's plan record; ``latency_gate``: the gate's verdict and figures.
    """
    res = DeployResult(host=target.label, board=board or "?", install_dir=target.install_dir)
    ctx: dict = {}
    steps = _Steps(target, res, on_step, ctx)
    connection = ExitStack()        # the box's one SSH connection, from the probe to the end
    try:
        check_select(select)
        ctx["gate"] = _gate_options(latency_gate, budget_p99_us, budget_p999_us, gate_samples, gate_warmup)
        b, spec = _local_bundle(bundle_dir, board, plan, force, res)
        name = res.board
        files = sorted(b.manifest.files) + [MANIFEST] + ([SIGNATURE] if (b.path / SIGNATURE).is_file() else [])
        nbytes = sum((b.path / f).stat().st_size for f in files)
        bundle_sha = sha256_file(b.path / MANIFEST)
        vid = version_id(bundle_sha)
        ctx.update(bundle=str(b.path), version=vid, files=len(files), bytes=nbytes)
        t0 = time.perf_counter()
        if share_connection:
            steps.target = connection.enter_context(one_connection(target))  # one SSH connection from here on
        connect_s = time.perf_counter() - t0
        status = _probe(steps, b, spec, force, res, plan, emulate)
        res.seconds["probe"] = round(res.seconds["probe"] + connect_s, 3)   # the probe's time includes the connect
        res.version = vid
        choosing = ctx["choosing"] = bool(ctx["choose_on_box"] and len(b.plan_names()) > 1)
        if core is None and spec.runtime.get("core") is not None:
            core = spec.runtime["core"]
        ctx["choice"] = {"select": select, "forced": plan, "core": core, "rounds": plan_rounds}
        if dry_run:
            res.ok = True
            res.plan = _dry_run_lines(b, target, vid, files, nbytes, status, keep, ctx["choice"] if choosing else None,
                                      _dry_run_gate(ctx, spec))
            return res
        meta = {"bundle_sha256": bundle_sha, "board": name, "model_file": b.manifest.model_file,
                "model_sha256": b.manifest.files.get(b.manifest.model_file), "compiled_utc": b.manifest.created_utc,
                "files": len(files), "bytes": nbytes, "from_host": socket.gethostname(), "forced": res.forced}
        with steps.hold(vid, {"from_host": meta["from_host"], "client_pid": os.getpid()}):
            _install(steps, b, files, vid, meta, status.get("active"), keep=keep, emulate=emulate)
        res.ok = True
    except EdgeHFTError as exc:
        res.step, res.error, res.hint, res.exit_code = steps.current, exc.args[0], exc.hint, exc.exit_code
        if isinstance(exc, RemoteError) and steps.current == "switch":
            res.hint = ("the connection dropped during the switch: the box is on the old or the new version, "
                        "never between; `edgehft status --host` tells which")
    finally:
        connection.close()
    return res


def _local_bundle(bundle_dir, board: str | None, plan: str | None, force: bool, res: DeployResult):
    """The bundle, verified here, and the board file it is deployed as (``res.board``; another board than the
    bundle's only with ``force``, listed in ``res.forced``): ``(bundle, board spec)``. Refused before the box is
    touched: a damaged bundle (exit 6), one without golden vectors, an unknown ``plan`` (exit 3)."""
    b = load_bundle(bundle_dir, verify=True)
    b.require_golden()           # none (compile could not make them): refused before the box is touched
    if plan is not None:
        b.plan(plan)             # an unknown plan: exit 3, naming the bundle's plans
    res.board = name = board or b.manifest.board
    spec = load_board(name)
    if name != b.manifest.board:
        why = f"the bundle was compiled for {b.manifest.board}, not {name}"
        if not force:
            raise DeployError(why, hint=f"compile for --board {name}, or deploy with --board {b.manifest.board}")
        res.forced.append(why)
    return b, spec


def _dry_run_lines(b, target: SshTarget, vid: str, files: list, nbytes: int, status: dict, keep: int,
                   choice: dict | None, gate: str) -> list[str]:
    """What a deploy would do, one line per step (``choice``: the plan choice on the box, or None; ``gate``:
    the latency gate's line)."""
    g = b.manifest.golden
    lines = [f"upload {len(files)} files ({nbytes:,} B) to {target.install_dir}/incoming/{vid}",
             "verify SHA-256 of every file on the box",
             f"run {g.count if g else 0} golden vectors on the box ({g.compare if g else 'none'})"
             + (f" for each of its {len(b.plan_names())} plans" if choice else "")]
    if choice:
        core = choice["core"] if choice["core"] is not None else "(its highest allowed)"
        lines.append(f"time the plans {', '.join(b.plan_names())} on the box, pinned to CPU {core}, and record "
                     + (f"{choice['forced']} (forced)" if choice["forced"] else f"the lowest {choice['select']}"))
    return lines + [gate, f"switch {target.install_dir}/current from {status.get('active') or 'nothing'} to {vid}",
                    f"keep {keep} versions"]


def _gate_options(on: bool, p99: float | None, p999: float | None, samples: int, warmup: int) -> dict:
    """The latency gate's settings for ``ctx["gate"]``: ``{"on", "options"}`` (``options``: the keyword
    arguments of :func:`edgehft.hil.checks.latency` sent to the box; budgets in µs).

    Raises:
        InputError: a budget that is not > 0, ``samples`` < 1 or ``warmup`` < 0.
    """
    bad = [f"{k} {v!r}" for k, v in (("budget p99", p99), ("budget p99.9", p999)) if v is not None and not v > 0]
    bad += [f"gate samples {samples}"] if samples < 1 else []
    bad += [f"gate warmup {warmup}"] if warmup < 0 else []
    if bad:
        raise InputError(f"latency gate: {', '.join(bad)}",
                         hint="budgets are µs > 0 (--budget-p99-us, --budget-p999-us), samples >= 1, warmup >= 0")
    opts = {"samples": samples, "warmup": warmup}
    opts.update({k: float(v) for k, v in (("budget_p99", p99), ("budget_p999", p999)) if v is not None})
    return {"on": bool(on), "options": opts}


def _dry_run_gate(ctx: dict, spec) -> str:
    """The dry run's line for the latency gate (the budget as this host's board file and the options say)."""
    gate, facts = ctx["gate"], ctx["facts"]
    if not gate["on"]:
        return "switch WITHOUT the latency gate (--no-latency-gate)"
    if not facts.get("latency_gate"):
        return "switch without the latency gate: the box's edgehft predates it"
    o, board = gate["options"], spec.latency_budget_us
    budget = {k: o.get(f"budget_{k}", board.get(k)) for k in ("p99", "p999")}
    said = ", ".join(f"{'p99.9' if k == 'p999' else k} {v:g} µs" for k, v in budget.items() if v is not None)
    core = ctx["choice"]["core"] if ctx["choice"]["core"] is not None else "(its highest allowed)"
    return (f"time {o['samples']} calls on the golden inputs on the box, pinned to CPU {core}, and refuse the switch "
            f"if over {said or 'the budget (none: not judged)'}")


def _probe(steps: _Steps, b, spec, force: bool, res: DeployResult, plan: str | None = None,
           emulate: bool = False) -> dict:
    """Run the probe, check the box is ``spec``'s board (or record what ``force`` overrode); returns the
    box's install-dir status and sets ``steps.ctx["choose_on_box"]`` (the box's agent chooses plans). A
    bundle with several plans needs native kernels (AMX) on the box only when every plan it may run there does.
    With ``emulate`` the box is not expected to run the board's software stack: a difference is a warning.

    Raises:
        DeployError: a mismatch without ``force``; a forced ``plan`` other than the top level on a box whose
            edgehft cannot choose plans.
    """
    probed = steps.run("probe", "probe")
    facts, status = probed["facts"], probed["status"]
    res.active_before = res.active_after = status.get("active")
    res.box_reached = True
    top = b.manifest.quantization.mode
    steps.ctx.update(facts=facts, status=status, choose_on_box=bool(facts.get("plan_choice")))
    if len(b.plan_names()) > 1 and not facts.get("plan_choice"):
        version = facts.get("packages", {}).get("edgehft", "?")
        if plan not in (None, top):
            raise DeployError(f"the box's edgehft {version} cannot run a plan other than the bundle's top level "
                              f"({top}); --plan {plan} needs a newer one", hint="upgrade edgehft on the box")
        res.warnings.append(f"the box's edgehft {version} does not choose among the bundle's {len(b.plan_names())} "
                            f"plans: it runs the top level, {top} (the compile host's choice); upgrade edgehft on "
                            "the box to time them there")
    modes = ([plan] if plan else b.plan_names()) if steps.ctx["choose_on_box"] else [top]
    # the box verifies every plan's manifest (Bundle.verify), so it must read the highest format among them
    needs_format = max(b.plan(name).manifest.format_version for name in b.plan_names())
    if emulate and (differs := stack_mismatch(spec, facts)):
        res.warnings.append(f"emulated: {differs}")
    for why in board_mismatches(spec, facts, needs_format, stack=not emulate,
                                needs_kernels=all(m.startswith("native") for m in modes),
                                needs_bf16=all(m == "native-bf16" for m in modes)):
        if not force:
            raise DeployError(f"the box is not a {res.board}: {why}",
                              hint="deploy to the right box, or pass --force if you know better")
        res.forced.append(f"box: {why}")
    return status


def _install(steps: _Steps, b, files: list[str], vid: str, meta: dict, expect: str | None, *, keep: int,
             emulate: bool) -> None:
    """Upload, verify, golden and switch, holding the box; a failure removes the staged copy and raises."""
    res, target = steps.res, steps.target
    steps.run("upload", "receive", "--version", vid, "--bytes", str(meta["bytes"]), "--meta", json.dumps(meta),
              "--held", "--idle-timeout", f"{target.idle_timeout:g}", input_bytes=tar_bundle(b.path, files))
    try:
        steps.run("verify", "verify", "--version", vid)
        golden_args = ["--emulate"] if emulate else []
        if steps.ctx.get("choosing"):
            _choose_plan(steps, b, vid, golden_args)
            g = res.golden
        else:
            # the golden vectors run as the bundle's own board (with --force the box may be labelled otherwise)
            res.golden = g = steps.run("golden", "golden", "--version", vid, "--board", b.manifest.board, *golden_args)
        if not g["ok"]:
            releases = releases_hint(g["path"], g["expected_path"])
            raise GoldenMismatchError(f"golden vectors differ on the box: {g['count'] - g['matched']} of "
                                      f"{g['count']} (max diff {g['max_diff']}, {g['compare']}, ran on "
                                      f"{g['path']}; expected {g['expected_path']})",
                                      hint=(f"{releases}; " if releases else "") + "the box's runtime does not "
                                           "compute what the bundle was compiled to compute; nothing was switched")
        _latency_step(steps, b, vid, emulate)
        switched = steps.run("switch", "activate", "--version", vid, "--keep", str(keep), "--held",
                             "--expect-active", expect or "none")
    except EdgeHFTError as exc:
        _discard(target, vid, f"{steps.current}: {exc.args[0]}")
        raise
    res.active_after = switched["active"]
    res.warnings += switched.get("warnings") or []


def _choose_plan(steps: _Steps, b, vid: str, golden_args: list[str]) -> None:
    """The ``golden`` step for every plan of ``b`` and the ``plan`` step (time, choose, record) on the box;
    sets ``res.golden`` (the chosen plan's result, with every plan's under ``plans``) and ``res.plan_choice``.

    Raises:
        GoldenMismatchError: the forced plan's golden vectors differ (or it cannot run there), or no plan's
            reproduce on the box.
    """
    res, names, c = steps.res, b.plan_names(), steps.ctx["choice"]
    per = steps.run("golden", "golden", "--version", vid, "--board", b.manifest.board, "--plans", ",".join(names),
                    *golden_args)["plans"]
    excluded = {n: (per[n].get("skipped") or f"golden vectors differ: {per[n]['count'] - per[n]['matched']} of "
                    f"{per[n]['count']} (max diff {per[n]['max_diff']}, ran on {per[n]['path']})")
                for n in names if not per[n].get("ok")}
    passed = [n for n in names if n not in excluded]
    forced = c["forced"]
    if (forced and forced in excluded) or not passed:
        which = [forced] if forced else names
        raise GoldenMismatchError("golden vectors not reproduced on the box for " + "; ".join(
            f"plan {n}: {excluded[n]}" for n in which), hint="the box's runtime does not compute what the bundle "
                                                                 "was compiled to compute; nothing was switched" + (
                                                                 f"; plans that pass there: {', '.join(passed)}"
                                                                 if passed else ""))
    res.warnings += [f"plan {n} left out on the box: {why}" for n, why in excluded.items()]
    args = ["--version", vid, "--board", b.manifest.board, "--plans", ",".join(passed), "--select", c["select"],
            "--rounds", str(c["rounds"]), "--held", "--meta", json.dumps({"excluded": excluded})]
    args += (["--forced", forced] if forced else []) + (["--core", str(c["core"])] if c["core"] is not None else [])
    res.plan_choice = rec = steps.run("plan", "plans", *args, timeout=600 + 2 * c["rounds"])
    res.golden = {**per[rec["plan"]], "plan": rec["plan"], "plans": per}


def _latency_step(steps: _Steps, b, vid: str, emulate: bool) -> None:
    """The ``latency`` step: the gate on the box (module docstring), or the warning why it did not run; sets
    ``res.latency_gate`` (:func:`_gate_summary`).

    Raises:
        DeployError: p99 or p99.9 over budget on the box (exit 9; the caller discards the staged copy), or the
            gate could not run there.
    """
    res, gate, facts = steps.res, steps.ctx["gate"], steps.ctx["facts"]
    if not facts.get("latency_gate"):       # read now: fault tests may edit the facts after the probe
        version = facts.get("packages", {}).get("edgehft", "?")
        res.latency_gate = {"verdict": "unsupported"}
        res.warnings.append(f"the box's edgehft {version} has no latency gate: switched without timing the bundle "
                            "there" + (" (--no-latency-gate)" if not gate["on"] else "; upgrade edgehft on the box"))
        return
    if not gate["on"]:
        why = "--no-latency-gate: switched WITHOUT the latency gate; p99 and p99.9 were not held to the budget"
        res.latency_gate = {"verdict": "off"}
        res.warnings.append(why)
        res.warnings += steps.run("latency", "latency", "--version", vid, "--skip", why).get("warnings") or []
        return
    c = steps.ctx["choice"]
    chosen = (res.plan_choice or {}).get("plan")
    args = ["--version", vid, "--board", b.manifest.board, "--options", json.dumps(gate["options"])]
    args += (["--plan", chosen] if chosen else []) + (["--core", str(c["core"])] if c["core"] is not None else [])
    r = steps.run("latency", "latency", *args, *(["--emulate"] if emulate else []))
    res.latency_gate = g = _gate_summary(r)
    if g["verdict"] == "refused":
        over = "; ".join(f"{'p99.9' if k == 'p999' else k} {v['value_us']:.1f} µs over the budget "
                         f"{v['budget_us']:g} µs" for k, v in r["verdicts"].items() if not v["ok"])
        raise DeployError(f"latency gate: {over} on the box ({_gate_said(g)}); nothing was switched",
                          hint="the box keeps serving its previous version; deploy a faster plan, give a budget "
                               "that fits (--budget-p99-us / --budget-p999-us, or the board file's "
                               "[latency_budget_us]), or switch anyway with --no-latency-gate")
    if g["verdict"] == "not judged":
        res.warnings.append(f"latency gate not judged: {r['not_judged']} ({_gate_said(g)})")


def _gate_summary(r: dict) -> dict:
    """The gate's figures from the box's latency check result ``r``: ``{"verdict" (pass | refused | not
    judged), "p50_us", "p99_us", "p99.9_us", "max_us", "samples", "warmup", "mode", "core", "plan",
    "budget_us" {p99, p999}, "budget_from", "verdicts", "not_judged", "source" (kind, windows, timing),
    "emulated"}`` (µs)."""
    lat = r["latency_us"]
    verdict = "not judged" if r["ok"] is None else "pass" if r["ok"] else "refused"
    return {"verdict": verdict, "p50_us": lat["p50"], "p99_us": lat["p99"], "p99.9_us": lat["p99.9"],
            "max_us": lat["max"], "samples": r["samples"], "warmup": r["warmup"], "mode": r["mode"],
            "core": r["pinned_cpu"], "plan": r["plan"], "budget_us": r["budget_us"], "budget_from": r["budget_from"],
            "verdicts": r["verdicts"], "not_judged": r["not_judged"],
            "source": {k: r["source"][k] for k in ("kind", "windows", "timing")}, "emulated": r["emulated"]}


def _gate_said(g: dict) -> str:
    """How the gate timed: ``"p50 … / p99 … / p99.9 … µs, 2000 calls of plan int8 on 16 golden inputs back to
    back, CPU 1"``."""
    src = g["source"]
    return (f"p50 {g['p50_us']:.1f} / p99 {g['p99_us']:.1f} / p99.9 {g['p99.9_us']:.1f} µs, {g['samples']} calls "
            f"of plan {g['plan']} on {src['windows']} {src['kind']} inputs {src['timing']}, CPU {g['core']}")


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
