"""``edgehft status --hosts``: the fleet table, one row per box of an inventory (issue 18)."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import click
from rich.table import Table

from edgehft.cli.common import err, out
from edgehft.compat import removeprefix
from edgehft.report import printable, printable_name

SWITCHES = ("activate", "rollback")      # the history events that change what a box serves


def box_row(entry: dict, target, expected_sha: str | None) -> dict:
    """One box's row: what :func:`edgehft.deploy.deploy.box_status` says it serves, or why it was not reached.

    Returns:
        ``{"host", "name", "install_dir", "reached", "exit_code", "error", "active", "board", "plan",
        "model_sha256", "bundle_sha256", "last_switch" ({"event", "utc"} or None), "damaged", "matches"}``;
        ``matches`` None without an expected bundle (its manifest's SHA-256 ``expected_sha``).
    """
    from edgehft.deploy.deploy import box_status
    from edgehft.errors import EdgeHFTError
    row = {"host": target.label, "name": entry.get("name", entry["host"]), "install_dir": target.install_dir,
           "reached": False, "exit_code": 0, "error": None, "active": None, "board": None, "plan": None,
           "model_sha256": None, "bundle_sha256": None, "last_switch": None, "damaged": False, "matches": None}
    try:
        s = box_status(target)["status"]
    except EdgeHFTError as exc:
        row.update(exit_code=exc.exit_code, error=str(exc.args[0]))
        return row
    a = s.get("active_info") or {}
    switches = [h for h in s.get("history") or [] if h.get("event") in SWITCHES]
    row.update(reached=True, active=s.get("active"), board=a.get("board"), model_sha256=a.get("model_sha256"),
               bundle_sha256=a.get("bundle_sha256"), plan=(s.get("active_plan") or {}).get("plan"),
               last_switch={"event": switches[-1]["event"], "utc": switches[-1].get("utc")} if switches else None,
               damaged=bool(s.get("active_problems") or s.get("plan_problem")))
    if expected_sha is not None:
        row["matches"] = row["bundle_sha256"] == expected_sha
    return row


def fleet_exit_code(rows: list[dict]) -> int:
    """The highest that applies: 10 a box not reached (or its agent's own error code), 9 a box that does not
    serve the expected bundle, 6 a box whose active version is damaged, else 0."""
    codes = [r["exit_code"] for r in rows if not r["reached"]]
    codes += [9 for r in rows if r["matches"] is False] + [6 for r in rows if r["damaged"]]
    return max(codes, default=0)


def fleet_status(boxes: list[tuple[dict, object]], expected_dir: str | None, parallel: int, as_json: bool,
                 rollout=None) -> int:
    """Ask every box of ``boxes`` (``(inventory entry, SshTarget)`` pairs), ``parallel`` at a time, print the
    table (or ``--json``: ``{"boxes": [row...], "expected_bundle_sha256"}``), return the exit code. ``rollout`` (a
    :class:`~edgehft.deploy.rollout.Rollout`): the version it asked for is the expected one, and each row gets the
    box's outcome in it (``rollout``: done / failed / not reached / rolled back)."""
    expected_sha = None
    if rollout is not None:
        expected_sha = rollout.bundle_sha256
    elif expected_dir:
        from edgehft.bundle import MANIFEST, load_bundle, sha256_file
        expected_sha = sha256_file(load_bundle(expected_dir, verify=False).path / MANIFEST)
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        rows = list(pool.map(lambda et: box_row(et[0], et[1], expected_sha), boxes))
    if rollout is not None:
        from edgehft.cli.rollout import outcome
        said = {b.name: outcome(rollout, b) for b in rollout.boxes}
        for r in rows:
            r["rollout"] = said.get(r["name"])
    if as_json:
        click.echo(json.dumps({"boxes": rows, "expected_bundle_sha256": expected_sha,
                               "rollout": None if rollout is None else rollout.id}))
    else:
        print_fleet(rows, expected_dir if rollout is None else f"the bundle rollout {rollout.id} asked for "
                    f"({rollout.bundle})")
    return fleet_exit_code(rows)


def print_fleet(rows: list[dict], expected_dir: str | None) -> None:
    """The fleet table; a column whose value is the same on every reached box becomes a line under it (with
    ``rollout`` in the rows: each box's outcome in that rollout)."""
    reached = [r for r in rows if r["reached"]]
    same = {c: reached[0][c] for c in ("board", "plan") if reached and len({r[c] for r in reached}) == 1}
    by_rollout = bool(rows) and "rollout" in rows[0]       # the box's outcome there instead of its last switch
    cols = ["box", "active version", "model", *(c for c in ("board", "plan") if c not in same),
            "rollout" if by_rollout else "switched"]
    cols += ["matches"] if expected_dir else []
    t = Table(title=f"fleet: {len(reached)} of {len(rows)} boxes answered", title_justify="left")
    for c in cols:
        t.add_column(c, no_wrap=c in ("box", "active version", "model", "switched", "matches", "rollout"),
                     overflow="fold")
    for r in rows:
        if not r["reached"]:
            row = {"box": printable_name(r["name"]), "active version": "[red]not reached[/]",
                   "rollout": printable(str(r.get("rollout") or ""))}
            t.add_row(*(row.get(c, "") for c in cols))
            continue
        sw = r["last_switch"]
        cells = {"box": printable_name(r["name"]), "active version": printable(str(r["active"] or "nothing")),
                 "model": str(r["model_sha256"] or "")[:8], "board": printable(str(r["board"] or "")),
                 "plan": printable(str(r["plan"] or "")),
                 "switched": _short_utc(sw["utc"]) + (" rollback" if sw["event"] == "rollback" else "")
                 if sw else "",
                 "matches": "[green]yes[/]" if r["matches"] else "[red]NO[/]",
                 "rollout": printable(str(r.get("rollout") or ""))}
        t.add_row(*(cells[c] for c in cols))
    out.print(t)
    said = "rollout: the box's outcome in it" if by_rollout else "switched: the last activate or rollback, UTC"
    if expected_dir:
        said += f"; matches: the box serves {printable(str(expected_dir))}"
    out.print(said, highlight=False)
    for c, v in same.items():
        out.print(f"{c} on every box that answered: {printable(str(v))}", highlight=False)
    for r in rows:
        if not r["reached"]:
            said = removeprefix(r["error"] or "", r["host"] + ": ")
            err.print(f"[red]{printable_name(r['name'])}[/] ({printable_name(r['host'])}): {printable(said)}", highlight=False)
        elif r["damaged"]:
            err.print(f"[red]{printable_name(r['name'])}[/]: the active version does not match its manifest "
                      "(`edgehft status --host` says what)", highlight=False)


def _short_utc(utc) -> str:
    """``2026-12-04T03:14:42Z`` as ``12-04 03:14`` (UTC)."""
    text = str(utc or "")
    return f"{text[5:10]} {text[11:16]}" if len(text) >= 16 else text
