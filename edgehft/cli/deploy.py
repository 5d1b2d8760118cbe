"""``edgehft deploy``, ``edgehft status`` and ``edgehft rollback``: bundles on boxes over SSH."""
from __future__ import annotations

import json
import sys

import click
from rich.table import Table

from edgehft import backends
from edgehft.cli import rollout as rollout_cli
from edgehft.cli.common import err, handles_errors, json_opt, main, out, select_opt
from edgehft.compat import removeprefix
from edgehft.report import printable

ssh_config_opt = click.option("--ssh-config", type=click.Path(exists=True, dir_okay=False, resolve_path=True),
                              default=None,
                              help="OpenSSH config file (ssh -F); default: your ~/.ssh/config.")
python_opt = click.option("--remote-python", default=None,
                          help="Python on the box that has edgehft installed (default: the board file's "
                               "[ssh] python, else python3).")
install_dir_opt = click.option("--install-dir", default=None,
                               help="Install directory on the box (default: the board file's [ssh] install_dir).")


def box_opts(fn):
    """What ``status`` and ``rollback`` need to reach a box: --host, --board, ssh config, python, dir, --json."""
    for opt in reversed((click.option("--host", "host", required=True,
                                      help="The box: user@host[:port] or an ssh alias."),
                         click.option("--board", default=None,
                                      help="Board file for SSH defaults (user, port, install dir, python)."),
                         ssh_config_opt, python_opt, install_dir_opt, json_opt)):
        fn = opt(fn)
    return fn


def _target(host, board_name, python, install_dir, ssh_config):
    from edgehft.boards import load_board
    from edgehft.deploy.ssh import parse_target
    board = load_board(board_name) if board_name else None
    return parse_target(host, board=board, python=python, install_dir=install_dir, ssh_config=ssh_config)


def _inventory_targets(hosts_file, limit, board, python, install_dir, ssh_config) -> list:
    """``(entry, SshTarget)`` for every host of the inventory (``limit`` applied); an entry's own board,
    python and install dir win over the options."""
    from edgehft.deploy.fanout import target_json
    from edgehft.deploy.inventory import read_inventory
    from edgehft.deploy.ssh import check_target_fields
    pairs = [(e, _target(e["host"], e.get("board", board), e.get("python", python), e.get("install_dir", install_dir),
                         ssh_config)) for e in read_inventory(hosts_file, limit)]
    for e, t in pairs:           # the rule a rollout's state file is held to, before anything is deployed
        check_target_fields(target_json(t), f"inventory {hosts_file} (host {e.get('name', e['host'])!r})")
    return pairs


def _bundle_board(bundle) -> str:
    from edgehft.bundle import load_bundle
    return load_bundle(bundle, verify=False).manifest.board


def _step_printer(quiet: bool):
    def on_step(step, target, ctx):
        if not quiet:
            err.print(f"[dim]{target.label}[/] {step} …", highlight=False)
    return on_step


@main.command("deploy")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--board", default=None, help="The board the box is (default: the bundle's).")
@click.option("--host", "host", default=None, help="The box: user@host[:port] or an ssh alias.")
@click.option("--hosts", "hosts_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Inventory of boxes, deployed in parallel: an Ansible inventory (INI or YAML; "
                   "pip install 'edgehft[fleet]'), TOML [[hosts]], or one user@host[:port] per line.")
@click.option("--limit", default=None, metavar="PATTERN",
              help="--hosts: only these hosts, as `ansible --limit` takes them (a group, host1:host2, "
                   "fleet:!canary).")
@click.option("--parallel", default=8, show_default=True, type=click.IntRange(min=1), help="--hosts: boxes at once.")
@rollout_cli.rollout_opts
@click.option("--keep", default=3, show_default=True, type=click.IntRange(min=0),
              help="Versions kept on the box (the active and the previous one always).")
@click.option("--dry-run", is_flag=True, help="Change nothing: --host probes the box and prints what would happen; "
                                              "--hosts prints the rollout's waves and contacts no box (--probe: "
                                              "probe each box too).")
@click.option("--force", is_flag=True, help="Deploy even when the bundle or the box is not the board (loud).")
@click.option("--emulate", is_flag=True, help="Run the golden vectors on the box in emulation (no device there).")
@select_opt("a bundle that carries several plans (compile --quant auto) is timed on the box, which records "
            "the one it runs")
@click.option("--plan", "plan", default=None, metavar="NAME",
              help="Run this plan of the bundle on the box (its golden vectors are still checked there; the "
                   "others are still timed and listed). Unknown: exit 3.")
@click.option("--core", default=None, type=click.IntRange(min=0),
              help="CPU the plans are timed on, the one the box serves on (default: the board file's [runtime] "
                   "core, else the box's highest allowed CPU); the latency gate runs pinned there too.")
@click.option("--budget-p99-us", type=click.FloatRange(min=0, min_open=True), default=None, metavar="US",
              help="Latency gate: refuse the switch when p99 on the box is over US µs (default: the board file's "
                   "[latency_budget_us] p99).")
@click.option("--budget-p999-us", type=click.FloatRange(min=0, min_open=True), default=None, metavar="US",
              help="Latency gate: the same for p99.9 (default: the board file's [latency_budget_us] p999).")
@click.option("--no-latency-gate", "no_gate", is_flag=True,
              help="Switch without timing the bundle on the box first (loud: a warning here and in the box's "
                   "history).")
@ssh_config_opt
@python_opt
@install_dir_opt
@json_opt
@handles_errors
def deploy_cmd(bundle, board, host, hosts_file, limit, parallel, canary, wave, max_fail, engine_name, state_path,
               resume, probe, keep, dry_run, force, emulate, select, plan, core, budget_p99_us, budget_p999_us, no_gate,
               ssh_config, remote_python, install_dir, as_json):
    """Install BUNDLE on a box: upload to a new version directory, verify SHA-256 and the golden vectors
    on the box, then switch atomically (the previous version stays for `edgehft rollback`). A bundle that
    carries several execution plans has each plan's golden vectors checked and the plans timed on the box,
    which records the one it runs (`edgehft status` shows it and the alternatives' figures). Before the
    switch, the latency gate times the plan the box will serve there (golden inputs back to back, pinned as
    --core says) and refuses the switch when p99 or p99.9 is over the budget.

    With --hosts INVENTORY the boxes are a rollout: --canary N boxes first, then --wave N|P% at a time; after a
    wave in which more boxes have failed than --max-fail allows (or the canary failed) it stops, and the boxes
    not reached keep their version (never contacted). Its state file (--rollout-state) lets --resume continue it
    and `edgehft rollback --rollout` take every box it switched back. --dry-run with --hosts prints the waves
    and contacts no box (--probe: probe every box too).

    Exit codes: 0 deployed, 2 usage, 3 bad --host, inventory, --plan or rollout option, 6 the local bundle does
    not match its manifest, 8 golden vectors differ on the box, 9 refused or failed (the box keeps its previous
    version; also: the latency gate's p99 or p99.9 over budget; with --hosts: a host failed), 10 unreachable
    (connection, authentication, unknown or changed host key), 11 the rollout stopped (--max-fail or the
    canary): the boxes not reached keep their version; --resume or rollback --rollout.

    \b
    Examples:
      edgehft deploy build/deeplob.cpu --host trader@ny4-box1
      edgehft deploy build/deeplob.cpu --hosts inventory.ini --limit ny4 --canary 1 --wave 25% --max-fail 0
      edgehft deploy build/deeplob.cpu --hosts inventory.ini --canary 1 --wave 25% --dry-run"""
    if sum(map(bool, (host, hosts_file, resume))) != 1:
        raise click.UsageError("give one of --host user@box, --hosts FILE or --resume STATE")
    if limit is not None and not hosts_file:
        raise click.UsageError("--limit selects hosts of --hosts FILE")
    if host and (rollout_cli.waved(canary, wave, max_fail, state_path) or engine_name):
        raise click.UsageError("--canary, --wave, --max-fail, --engine and --rollout-state are for --hosts FILE")
    if probe and (host or not dry_run):
        raise click.UsageError("--probe goes with --hosts FILE --dry-run (--host --dry-run always probes)")
    if force and not as_json:
        err.print("[bold red]--force:[/] board checks become warnings; a wrong board can serve wrong numbers")
    default_board = board or _bundle_board(bundle)
    opts = dict(force=force, keep=keep, emulate=emulate, select=select, plan=plan, core=core,
                latency_gate=not no_gate, budget_p99_us=budget_p99_us, budget_p999_us=budget_p999_us)
    if hosts_file or resume:
        r = (rollout_cli.resume_rollout(bundle, resume, ssh_config) if resume else
             rollout_cli.start_rollout(bundle, _inventory_targets(hosts_file, limit, default_board, remote_python,
                                                                  install_dir, ssh_config),
                                       default_board, canary, wave, max_fail, state_path))
        rollout_cli.run_deploy(r, bundle, opts, engine_name, parallel, as_json, dry_run, _print_results, probe)
        return
    from edgehft.deploy.deploy import deploy
    results = [deploy(_target(host, default_board, remote_python, install_dir, ssh_config), bundle, default_board,
                      dry_run=dry_run, on_step=_step_printer(as_json), **opts)]
    failed = [r for r in results if not r.ok]
    if as_json:
        click.echo(json.dumps({"results": [r.to_json() for r in results], "failed": len(failed)}))
    else:
        _print_results(results, dry_run)
    if failed:
        sys.exit(failed[0].exit_code)


def _print_results(results, dry_run: bool) -> None:
    for r in results:
        for why in r.forced:
            err.print(f"[bold red]FORCED[/] {r.host}: {why}", highlight=False)
        for w in r.warnings:
            err.print(f"[bold yellow]warning:[/] {printable(r.host)}: {printable(w)}", highlight=False)
    if len(results) == 1 and results[0].plan:
        r = results[0]
        out.print(f"[bold]dry run[/] {r.host} ({r.board}), active now: {r.active_before or 'nothing'}")
        for line in r.plan:
            out.print(f"  would {line}")
        return
    if len(results) == 1 and not results[0].ok:
        r = results[0]
        err.print(f"[bold red]deploy failed[/] at {r.step} on {printable(r.host)}: {printable(r.error or '')}",
                  highlight=False)
        if r.hint:
            err.print(f"  [yellow]hint:[/] {printable(r.hint)}", highlight=False)
        serves = (r.active_after or "nothing (no version was active)") if r.box_reached else \
            "unknown (the box was not reached; `edgehft status --host` tells)"
        err.print(f"  the box serves: {printable(serves)}", highlight=False)
        if gate_line(r.latency_gate):
            err.print(f"  {gate_line(r.latency_gate)}", highlight=False)
        return
    dirs = len({r.install_dir for r in results}) > 1
    plans = any(r.plan_choice for r in results)
    boards = sorted({r.board for r in results})
    t = Table(title=f"{'dry run' if dry_run else 'deploy'} (board {', '.join(boards)})", title_justify="left")
    for col in ("host", *(("install dir",) if dirs else ()), "result", "version", "golden", *(("plan",) if plans else ()),
                "s"):
        t.add_column(col, no_wrap=col in ("host", "result", "version"), overflow="fold")
    for r in results:
        g, c = r.golden, r.plan_choice
        t.add_row(printable(r.host), *((printable(r.install_dir),) if dirs else ()),
                  "[green]ok[/]" if r.ok else f"[red]failed at {r.step}[/]",
                  r.active_after if r.ok and not dry_run else (r.version or ""),
                  f"{g['matched']}/{g['count']}" if g else "",
                  *((f"{c['plan']} ({'forced' if c['how'] == 'forced' else 'lowest ' + c['select']})" if c else "",)
                    if plans else ()),
                  f"{sum(r.seconds.values()):.1f}")
    out.print(t)
    for r in results:
        if gate_line(r.latency_gate):
            out.print(f"{printable(r.host)}: {gate_line(r.latency_gate)}", highlight=False)
    for r in results:
        if r.plan_choice and len(results) == 1:
            out.print(plan_choice_table(r.plan_choice, f"plans timed on {printable(r.host)}"))
    for r in results:
        if not r.ok:
            err.print(f"[red]{printable(r.host)}[/] ({r.step}): {printable(removeprefix(r.error or '', r.host + ': '))}",
                      highlight=False)


def gate_line(g: dict | None) -> str | None:
    """The latency gate's verdict and figures on one line (``DeployResult.latency_gate``), or None when it did
    not time anything (off, or a box without the gate: the warnings say so)."""
    if not g or "p99_us" not in g:
        return None
    budget = g["budget_us"]
    said = {"pass": "pass", "refused": "REFUSED", "not judged": "not judged"}[g["verdict"]]
    parts = [f"p50 {g['p50_us']:.1f} µs"] + [
        f"{pct} {g[pct + '_us']:.1f} µs" + (f" (budget {budget[key]:g})" if key in budget else "")
        for pct, key in (("p99", "p99"), ("p99.9", "p999"))]
    src = g["source"]
    return (f"latency gate {said}: {', '.join(parts)}; {g['samples']} calls of plan {printable(str(g['plan']))} on "
            f"{src['windows']} {src['kind']} inputs {src['timing']}, pinned to CPU {g['core']} (budget from "
            f"{printable(g['budget_from'])})")


def plan_choice_table(rec: dict, title: str) -> Table:
    """The box's plan record (:mod:`edgehft.runtime.plans`) as a table: each plan's figures, the one chosen,
    those left out and why."""
    how = "forced at deploy" if rec["how"] == "forced" else f"the lowest {rec['select']}"
    t = Table(title=f"{title}: {rec['plan']} ({how}; CPU {rec['pinned_cpu']}, {rec['rounds']} calls each on "
                    f"{rec['windows']} golden inputs, interleaved)", title_justify="left")
    for col in ("plan", "p50 µs", "p99 µs", "p99.9 µs", "p99/p50", ""):
        t.add_column(col, justify="left" if col in ("plan", "") else "right")
    for name, f in rec["measured"].items():
        t.add_row(printable(name), f"{f['p50_us']:.1f}", f"{f['p99_us']:.1f}", f"{f['p99.9_us']:.1f}",
                  f"{f['p99_over_p50']:.2f}", "runs" if name == rec["plan"] else "")
    for name, why in rec.get("excluded", {}).items():
        t.add_row(printable(name), "", "", "", "", f"left out: {printable(why)}")
    return t


def _print_plan(s: dict) -> None:
    """``status``: the active version's execution plan and how it was chosen (or why that is not known)."""
    if s.get("plan_problem"):
        err.print(f"  [bold red]the box's plan record is damaged:[/] {printable(s['plan_problem'])}", highlight=False)
        return
    p = s.get("active_plan")
    if not p:
        return
    how = {"only": "the bundle's only plan", "top level": "the bundle's top level, the compile host's choice (no "
           "plan record on the box)", "forced": "forced at deploy",
           "timed": f"timed on the box at deploy, the lowest {p.get('select')}"}.get(p["how"], p["how"])
    out.print(f"  plan: [bold]{printable(p['plan'])}[/] — {how}"
              + (f"; the bundle carries {', '.join(p['plans'])}" if len(p.get("plans", [])) > 1 else ""),
              highlight=False)
    if p.get("measured"):
        out.print(plan_choice_table(p, "plans measured on the box"))


@main.command("status")
@click.option("--host", "host", default=None, help="The box: user@host[:port] or an ssh alias.")
@click.option("--hosts", "hosts_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The fleet table of an inventory (as deploy --hosts takes it): one row per box.")
@click.option("--limit", default=None, metavar="PATTERN", help="--hosts: only these hosts (as `ansible --limit`).")
@click.option("--bundle", "expected", type=click.Path(exists=True, file_okay=False), default=None,
              help="--hosts: say per box whether it serves this bundle (the one a rollout asked for).")
@click.option("--rollout", "rollout_state", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The fleet table of a rollout's boxes (its state file, as deploy wrote it): per box whether it "
                   "serves the bundle the rollout asked for, and its outcome in the rollout.")
@click.option("--parallel", default=8, show_default=True, type=click.IntRange(min=1), help="--hosts: boxes at once.")
@click.option("--board", default=None, help="Board file for SSH defaults (user, port, install dir, python).")
@ssh_config_opt
@python_opt
@install_dir_opt
@json_opt
@handles_errors
def status_cmd(host, hosts_file, limit, expected, rollout_state, parallel, board, ssh_config, remote_python,
               install_dir, as_json):
    """Show what a box runs: active bundle, model hash, board, the execution plan it runs and how it was chosen
    (with every plan's figures measured on the box), runtime versions, previous versions. Exit 6 when the active
    version no longer matches its manifest or the box's plan record for it is damaged.

    With --hosts, the fleet table: per box its active version, model hash, plan, board, last switch and (with
    --bundle) whether it serves that bundle; exit 10 when a box was not reached, else 9 when a box does not
    serve --bundle, else 6 when a box's active version is damaged. With --rollout STATE, the same table of that
    rollout's boxes, matched against the bundle it asked for, with each box's outcome in it.

    \b
    Examples:
      edgehft status --host box
      edgehft status --hosts inventory.ini --limit ny4 --bundle build/deeplob.cpu
      edgehft status --rollout .edgehft/rollouts/<id>.json"""
    if sum(map(bool, (host, hosts_file, rollout_state))) != 1:
        raise click.UsageError("give one of --host user@box, --hosts FILE or --rollout STATE")
    if (limit or expected) and not hosts_file:
        raise click.UsageError("--limit and --bundle go with --hosts FILE")
    if rollout_state:
        from edgehft.cli.fleet import fleet_status
        from edgehft.cli.rollout import check_ssh_config, rollout_targets
        from edgehft.deploy import rollout
        r = rollout.load(rollout_state)
        check_ssh_config(r, rollout_state, ssh_config)
        sys.exit(fleet_status(rollout_targets(r), None, parallel, as_json, rollout=r))
    if hosts_file:
        from edgehft.cli.fleet import fleet_status
        sys.exit(fleet_status(_inventory_targets(hosts_file, limit, board, remote_python, install_dir, ssh_config),
                              expected, parallel, as_json))
    from edgehft.deploy.deploy import box_status
    res = box_status(_target(host, board, remote_python, install_dir, ssh_config))
    bad = bool(res["status"].get("active_problems") or res["status"].get("plan_problem"))
    if as_json:
        click.echo(json.dumps(res))
        sys.exit(6 if bad else 0)
    f, s = res["facts"], res["status"]
    a = s.get("active_info") or {}
    out.print(f"[bold]{host}[/] ({f['hostname']}, {f['arch']}, Python {f['python']}): install dir {s['root']}")
    out.print(f"  active: [bold]{s['active'] or 'nothing'}[/]" + (
        f" — board {a.get('board')}, model {a.get('model_file')} sha256 {str(a.get('model_sha256'))[:16]}…, "
        f"bundle sha256 {str(a.get('bundle_sha256'))[:16]}…, deployed {a.get('received_utc')}" if a else ""))
    if s.get("active_problems"):
        err.print(f"  [bold red]the active version does not match its manifest:[/] {printable(s['active_problems'][0])}",
                  highlight=False)
    _print_plan(s)
    out.print(f"  previous: {s['previous'] or 'none'}")
    out.print("  runtime: " + ", ".join(f"{k} {v}" for k, v in f["packages"].items()))
    ident = [line for _, identity in backends.stage_of_each("identity") for line in identity(f)]
    out.print("  identity: " + printable(", ".join(ident) or "plain host (no accelerator board found)"), highlight=False)
    t = Table(title="versions on the box", title_justify="left")
    for col in ("version", "board", "plan", "model sha256", "deployed", ""):
        t.add_column(col, no_wrap=col == "version")
    for v in s["versions"]:
        t.add_row(v["version"], str(v.get("board", "")), printable(str(v.get("plan") or "")),
                  str(v.get("model_sha256", ""))[:16],
                  str(v.get("received_utc", "")), "active" if v["active"] else
                  ("previous" if v["version"] == s["previous"] else ""))
    out.print(t)
    if s["staged"] or s["partial"]:
        out.print(f"  not active: staged {s['staged']}, interrupted {s['partial']} (a deploy in progress, or left "
                  "by a killed one: removed by the next deploy once untouched for 10 minutes)")
    if bad:
        sys.exit(6)


@main.command("rollback")
@click.option("--to", "to", default=None, help="Version to switch to (default: the previous one).")
@click.option("--host", "host", default=None, help="The box: user@host[:port] or an ssh alias.")
@click.option("--rollout", "rollout_state", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Every box this rollout state file says was switched, back to the version it served before.")
@click.option("--engine", "engine_name", type=click.Choice(["ansible", "threads"]), default=None,
              help="--rollout: what fans out to the boxes (default: ansible where ansible-runner is installed).")
@click.option("--parallel", default=8, show_default=True, type=click.IntRange(min=1), help="--rollout: boxes at once.")
@click.option("--board", default=None, help="Board file for SSH defaults (user, port, install dir, python).")
@ssh_config_opt
@python_opt
@install_dir_opt
@json_opt
@handles_errors
def rollback_cmd(to, host, rollout_state, engine_name, parallel, board, ssh_config, remote_python, install_dir,
                 as_json):
    """Switch a box back to its previous version (or --to VERSION), after re-checking that version's files; with
    --rollout STATE, every box that rollout switched (exit 9 when one could not be).

    \b
    Examples:
      edgehft rollback --host trader@ny4-box1
      edgehft rollback --rollout rollout-state.json"""
    if bool(host) == bool(rollout_state):
        raise click.UsageError("give one of --host user@box or --rollout STATE")
    if rollout_state:
        if to:
            raise click.UsageError("--to is for one --host (a rollout goes back to each box's own previous version)")
        rollout_cli.run_rollback(rollout_state, engine_name, parallel, as_json, ssh_config)
        return
    from edgehft.deploy.deploy import rollback
    res = rollback(_target(host, board, remote_python, install_dir, ssh_config), to)
    if as_json:
        click.echo(json.dumps(res))
    else:
        out.print(f"{host}: active [bold]{res['active']}[/] (was {res['previous']})")
        for w in res.get("warnings") or []:
            err.print(f"[bold yellow]warning:[/] {printable(w)}", highlight=False)
