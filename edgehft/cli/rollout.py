"""``edgehft deploy --hosts INV`` as a rollout (waves, canary, --max-fail, resume) and ``edgehft rollback --rollout``
(issue 18): the options, the wave table and the per-box results (:mod:`edgehft.deploy.rollout`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.table import Table

from edgehft.cli.common import err, out
from edgehft.compat import removeprefix
from edgehft.report import printable, printable_name

WAVE_HELP = ("--hosts: a rollout in waves of N boxes or P% of the fleet (rounded up); the next wave starts when "
             "one is over. Default: one wave.")
ROLLOUT_OPTIONS = (
    click.option("--canary", default=0, show_default=True, type=click.IntRange(min=0),
                 help="--hosts: deploy to the first N boxes first; any failure there stops the rollout."),
    click.option("--wave", default=None, metavar="N|P%", help=WAVE_HELP),
    click.option("--max-fail", "max_fail", default=None, metavar="N|P%",
                 help="--hosts: the failed boxes a rollout allows, N or P% of the fleet (rounded down); after a "
                      "wave in which more have failed it stops (exit 11), and the boxes not reached keep their "
                      "version. 0: stop at the first failure. Default: never stop."),
    click.option("--engine", "engine_name", type=click.Choice(["ansible", "threads"]), default=None,
                 help="--hosts: what fans out to the boxes (default: ansible where ansible-runner is installed)."),
    click.option("--rollout-state", "state_path", type=click.Path(dir_okay=False), default=None,
                 help="--hosts: write the rollout's state here (default with --canary/--wave/--max-fail: "
                      ".edgehft/rollouts/<id>.json)."),
    click.option("--resume", "resume", type=click.Path(exists=True, dir_okay=False), default=None,
                 help="Continue the stopped rollout of this state file (same bundle; no --hosts)."),
    click.option("--probe", is_flag=True,
                 help="--hosts --dry-run: also probe every box (its checks, the version it serves), as --host "
                      "--dry-run does; without it a dry run contacts no box."),
)


def rollout_opts(fn):
    """Add the rollout options (:data:`ROLLOUT_OPTIONS`) to ``deploy``."""
    for opt in reversed(ROLLOUT_OPTIONS):
        fn = opt(fn)
    return fn


def waved(canary, wave, max_fail, state_path) -> bool:
    """Whether the options ask for a rollout with a state file (else --hosts is one wave, nothing kept)."""
    return bool(canary or wave or max_fail or state_path)


def start_rollout(bundle, pairs, default_board, canary, wave, max_fail, state_path):
    """A new :class:`~edgehft.deploy.rollout.Rollout` over the inventory's ``(entry, target)`` pairs. Raises
    InputError when ``state_path`` exists (a new rollout never overwrites another's state)."""
    if state_path and Path(state_path).exists():
        from edgehft.errors import InputError
        raise InputError(f"--rollout-state {printable(str(state_path))} exists: it may hold another rollout's state "
                         "(the versions its boxes go back to)",
                         hint=f"continue that rollout with --resume {printable(str(state_path))}, or name a new file")
    from edgehft.bundle import MANIFEST, sha256_file
    from edgehft.deploy import rollout
    from edgehft.deploy.fanout import target_json
    names = [e.get("name", e["host"]) for e, _ in pairs]
    r = rollout.plan(names, [target_json(t) for _, t in pairs], [e.get("board", default_board) for e, _ in pairs],
                     str(Path(bundle).resolve()), sha256_file(Path(bundle) / MANIFEST), canary=canary, wave=wave,
                     max_fail=max_fail, state_dir=".edgehft/rollouts" if waved(canary, wave, max_fail, state_path)
                     else None)
    if state_path:
        r.path = state_path
    return r


def check_ssh_config(r, state_path, ssh_config):
    """Refuse a rollout whose boxes were not reached with ``ssh_config`` (this command's --ssh-config): an ssh
    config (which can hold a ProxyCommand) is never taken from the state file, whose boxes must name the same one
    or none. Raises InputError."""
    from edgehft.errors import InputError
    want = None if ssh_config is None else str(ssh_config)
    for b in r.boxes:
        got = b.target.get("ssh_config")
        if got != want:
            raise InputError(f"{state_path}: box {printable_name(b.name)!r} was reached with ssh config {got!r}, this "
                             f"command gives {want!r}",
                             hint=f"pass --ssh-config {got} if you trust that file" if got else
                             "leave --ssh-config out, as the rollout did")


def resume_rollout(bundle, state_path, ssh_config=None):
    """The rollout of ``state_path`` (:func:`load_state`), checked to be of ``bundle``. Raises InputError
    otherwise."""
    from edgehft.bundle import MANIFEST, sha256_file
    from edgehft.deploy import rollout
    from edgehft.errors import InputError
    r = rollout.load(state_path)
    if sha256_file(Path(bundle) / MANIFEST) != r.bundle_sha256:
        raise InputError(f"{state_path} is the rollout of another bundle ({r.bundle}, manifest "
                         f"{r.bundle_sha256[:12]})", hint="resume with the bundle the rollout started with")
    if r.status == "complete" and all(b.status == "ok" for b in r.boxes):
        raise InputError(f"the rollout {r.id} is complete: every box has its version", hint="nothing to resume")
    check_ssh_config(r, state_path, ssh_config)
    return r


def run_deploy(r, bundle, opts: dict, engine_name, parallel: int, as_json: bool, dry_run: bool,
               print_results, probe: bool = False) -> None:
    """Run the rollout and print the waves and the results (``print_results(DeployResults, dry_run)`` for
    --hosts without waves); ``dry_run``: show the waves and contact no box (:func:`show_waves`), or with
    ``probe`` probe every box as ``deploy --host --dry-run`` does. Exits 11 (:data:`ROLLOUT_STOPPED`) when the
    rollout stopped, else 9 when a box failed (a rollout of one box: that box's exit code)."""
    from edgehft.deploy import rollout
    from edgehft.deploy.deploy import DeployResult
    from edgehft.deploy.fanout import default_engine, deploy_job, engine
    if dry_run and not probe:
        show_waves(r, as_json)
        return
    fanout = engine(engine_name or default_engine())
    bundle = str(Path(bundle).resolve())          # an engine's job may run in another directory (Ansible's)

    def jobs(boxes):
        return [deploy_job(_target(b), bundle, b.board, {**opts, "dry_run": dry_run}) for b in boxes]

    ran = _probe(r, jobs, fanout, parallel) if dry_run else rollout.run(r, jobs, fanout, parallel,
                                                                       None if as_json else _wave_printer(r))
    results = [res for _, res in ran]
    objs = [DeployResult(**{k: v for k, v in res.items() if k in DeployResult.__dataclass_fields__})
            for res in results]
    if as_json:
        click.echo(json.dumps({"results": results, "failed": sum(not o.ok for o in objs),
                               "outcomes": outcomes(r, dry_run), "rollout": {**r.to_json(), "state_file": r.path}}))
    elif len(r.waves) == 1 and not r.path:
        print_results(objs, dry_run)               # --hosts without waves: the deploy table
    else:
        print_rollout(r, dry_run)
        for b in r.boxes:
            if b.status == "failed":
                err.print(f"[red]{printable_name(b.name)}[/]: failed at {b.step or '?'}, exit {b.exit_code}: "
                          f"{printable(removeprefix(b.error or '', _target(b).label + ': '))}", highlight=False)
    if not dry_run and r.status == "stopped" and len(r.boxes) > 1:
        sys.exit(rollout.ROLLOUT_STOPPED)
    if any(not o.ok for o in objs):
        sys.exit(objs[0].exit_code if len(r.boxes) == 1 else 9)


def _probe(r, jobs, fanout, parallel: int) -> list:
    """``--dry-run --probe``: every box's deploy dry run (nothing deployed: a box stays pending unless its checks
    failed); ``(box, result)`` in box order."""
    ran = list(zip(r.boxes, fanout.run(jobs(r.boxes), parallel)))
    for b, res in ran:
        b.version_before = res.get("active_before")
        if not res.get("ok"):
            b.status, b.step, b.exit_code, b.error = "failed", res.get("step"), res.get("exit_code"), res.get("error")
    return ran


def _wave_printer(r):
    """The on_wave hook of :func:`edgehft.deploy.rollout.run`: a line on stderr as each wave starts and ends."""
    def on_wave(w, boxes, when):
        if len(r.waves) == 1:
            return
        if when == "start":
            err.print(f"wave {w} of {len(r.waves)}: {len(boxes)} box{'es' if len(boxes) != 1 else ''} …",
                      highlight=False)
        else:
            bad = sum(b.status == "failed" for b in boxes)
            err.print(f"wave {w}: {len(boxes) - bad} done, {bad} failed", highlight=False)
    return on_wave


def rollout_targets(r) -> list:
    """``(inventory entry, SshTarget)`` pairs of the rollout's boxes (the entry: its name and host), as
    :func:`edgehft.cli.fleet.fleet_status` takes them."""
    return [({"name": b.name, "host": b.target.get("host", b.name)}, _target(b)) for b in r.boxes]


def _target(b):
    from edgehft.deploy.ssh import SshTarget
    return SshTarget(**b.target)


def outcome(r, b, dry_run: bool = False) -> str:
    """A box's outcome in this rollout, as the report says it: ``done``, ``failed``, ``not reached`` (a rollout
    that ran: the box was never contacted and keeps its version), ``pending`` (a dry run) or ``rolled back``."""
    if b.status == "ok":
        return "done"
    if b.status == "pending":
        return "pending" if dry_run or r.status == "planned" else "not reached"
    return b.status


def outcomes(r, dry_run: bool = False) -> dict:
    """The boxes' names by :func:`outcome` (``not reached`` as ``not_reached``), in box order."""
    out_: dict = {}
    for b in r.boxes:
        out_.setdefault(outcome(r, b, dry_run).replace(" ", "_"), []).append(b.name)
    return out_


def stop_rule(r) -> str:
    """The rollout's stop rule in words (its canary and --max-fail)."""
    from edgehft.deploy import rollout
    allowed = rollout.allowed_failures(r.max_fail, len(r.boxes))
    rule = [f"the canary (wave 1, {r.canary} box{'es' if r.canary != 1 else ''}) must pass"] if r.canary else []
    if allowed is None:
        rule.append("no --max-fail: the waves go on whatever fails")
    else:
        rule.append(f"after a wave in which more than {allowed} box{'es' if allowed != 1 else ''} "
                    f"(--max-fail {r.max_fail}) have failed the rollout stops; later waves are not contacted")
    return "; ".join(rule)


def show_waves(r, as_json: bool) -> None:
    """``--hosts --dry-run``: the waves in order (per box its wave, name, SSH target and board) and the stop
    rule; no box is contacted and no state file is written. With ``--resume`` the boxes already done are marked
    (``to_run`` in the JSON: the boxes the resume would deploy, by wave)."""
    if as_json:
        click.echo(json.dumps({"dry_run": True, "contacted": 0, "waves": [[b.name for b in w] for w in r.waves],
                               "to_run": [[b.name for b in w if b.status != "ok"] for w in r.waves],
                               "stop_rule": stop_rule(r), "rollout": r.to_json()}))
        return
    n, w = len(r.boxes), len(r.waves)
    done = sum(b.status == "ok" for b in r.boxes)
    t = Table(title=f"dry run: {n} box{'es' if n != 1 else ''} in {w} wave{'s' if w != 1 else ''}"
                    + (f" ({done} done: --resume skips them)" if done else "") + ", no box contacted",
              title_justify="left")
    for col in ("wave", "box", "ssh target", "board"):
        t.add_column(col, no_wrap=col == "wave", overflow="fold")
    for b in r.boxes:
        t.add_row(f"{b.wave}{' canary' if r.canary and b.wave == 1 else ''}",
                  printable_name(b.name) + (" (done)" if b.status == "ok" else ""), printable(_target(b).label),
                  printable(b.board or "?"))
    out.print(t)
    out.print(f"stops: {stop_rule(r)}", highlight=False)


def print_rollout(r, dry_run: bool = False) -> None:
    """The waves: per box its wave, outcome (:func:`outcome`; a failure with its step and exit code), the
    version before and now (80 columns: versions folded), then the counts, the stop reason and the state file."""
    t = Table(title=f"rollout {r.id}: {'would run' if dry_run else r.status}", title_justify="left")
    for col in ("wave", "box", "result", "before", "now"):
        t.add_column(col, no_wrap=col in ("wave", "result"), overflow="fold")
    for b in r.boxes:
        style = {"ok": "green", "failed": "red", "rolled back": "yellow"}.get(b.status, "dim")
        said = outcome(r, b, dry_run)
        if b.status == "failed":
            said = f"failed at {printable(str(b.step or '?'))}, exit {b.exit_code}"
        t.add_row(f"{b.wave}{' canary' if r.canary and b.wave == 1 else ''}", printable_name(b.name),
                  f"[{style}]{said}[/]", printable(b.version_before or ""), printable(b.version or ""))
    out.print(t)
    c = r.counts()
    line = (f"{c['ok']} done, {c['failed']} failed, {c['pending']} "
            f"{'pending' if dry_run else 'not reached (they keep their version)'}")
    if c["rolled back"]:
        line += f", {c['rolled back']} rolled back"
    out.print(line + (f"; stopped: {printable(r.stop_reason)}" if r.stop_reason else ""), highlight=False)
    if dry_run or not r.path:
        return
    if r.status in ("stopped", "running", "complete") and c["ok"] < len(r.boxes):
        out.print(printable(f"state: {r.path}") + "\n" + printable(
            f"  resume:    edgehft deploy {r.bundle} --resume {r.path}") + "\n" + printable(
            f"  roll back: edgehft rollback --rollout {r.path}"), highlight=False)
    else:
        out.print(printable(f"state: {r.path}"), highlight=False)


def run_rollback(state_path, engine_name, parallel: int, as_json: bool, ssh_config=None) -> None:
    """``edgehft rollback --rollout STATE``: every box the rollout switched back to its previous version (the
    boxes reached with ``ssh_config``, :func:`check_ssh_config`)."""
    from edgehft.deploy import rollout
    from edgehft.deploy.fanout import default_engine, engine, rollback_job
    r = rollout.load(state_path)
    check_ssh_config(r, state_path, ssh_config)
    fanout = engine(engine_name or default_engine())
    results = rollout.rollback(r, lambda boxes: [rollback_job(_target(b), b.version_before) for b in boxes], fanout,
                               parallel)
    bad = [x for x in results if not x.get("ok")]
    if as_json:
        click.echo(json.dumps({"results": results, "failed": len(bad), "rollout": r.to_json()}))
    else:
        print_rollout(r)
        for x in bad:
            err.print(f"[red]{printable(x['host'])}[/]: {printable(removeprefix(x.get('error') or '', x['host'] + ': '))}",
                      highlight=False)
        if not results:
            out.print("no box of this rollout was switched: nothing to roll back")
    if bad:
        sys.exit(9)
