"""Issue 18: a fleet rollout over 8 loopback boxes (one sshd each, its own port, host key and install dir), fanned
out by Ansible (ansible-runner): a canary, waves, --max-fail stopping the rollout at a failing box, the boxes not
reached untouched, the fleet table, --resume and the fleet-wide rollback."""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from edgehft.bundle import MANIFEST, sha256_file
from edgehft.cli import main
from deploy_box import bundles  # noqa: F401,F811 (fixture)

pytest.importorskip("ansible_runner", reason="ansible-runner: pip install 'edgehft[fleet]'")
N = 8
FAILING = "b6"          # in the second wave after the canary: b1 | b2 b3 b4 | b5 b6 b7 | b8


@pytest.fixture(scope="module")
def fleet(ssh_box, tmp_path_factory):
    """8 boxes: (inventory, a function writing the client ssh config (the failing box's agent killed at its golden
    vectors when asked), the boxes' sshd, their install dirs). The conftest box is b1; b2..b8 start here."""
    from sshbox import LoopbackBox
    work = tmp_path_factory.mktemp("fleet")
    boxes = [ssh_box] + [LoopbackBox(work / f"sshd{i}") for i in range(2, N + 1)]
    for b in boxes[1:]:
        b.work.mkdir()
        b.start()
    names = [f"b{i}" for i in range(1, N + 1)]
    roots = {n: work / "install" / n for n in names}

    def config(failing: str | None, name: str = "ssh_config") -> str:
        text = ""
        for n, b in zip(names, boxes):
            p = b.config(f"ssh_config_{n}", failpoints="golden:before-result" if n == failing else "")
            text += p.read_text().replace("Host box", f"Host {n}", 1)
        path = work / name
        path.write_text(text)
        return str(path)

    inv = work / "fleet.yml"
    inv.write_text("all:\n  children:\n    ny4:\n      hosts:\n" +
                   "".join(f"        {n}:\n          edgehft_install_dir: {roots[n]}\n" for n in names) +
                   f"      vars:\n        edgehft_python: {ssh_box.python}\n")
    yield inv, config, dict(zip(names, boxes)), roots
    for b in boxes[1:]:
        b.stop()


def run(*args):
    return CliRunner().invoke(main, [*args, "--no-latency-gate"] if args[0] == "deploy" else list(args))


def serving(root) -> str | None:
    """The manifest SHA-256 of the bundle the box serves (None: nothing)."""
    cur = root / "current" / MANIFEST
    return sha256_file(cur) if cur.exists() else None


def accepted(box) -> int:
    return (box.work / "sshd.log").read_text(errors="replace").count("Accepted publickey")


def test_rollout_stops_at_max_fail_then_resumes_and_rolls_back(fleet, bundles, tmp_path):  # noqa: F811
    inv, config, boxes, roots = fleet
    v1, v2 = (sha256_file(bundles[v] / MANIFEST) for v in ("v1", "v2"))
    ok = config(None)
    first = run("deploy", str(bundles["v1"]), "--hosts", str(inv), "--ssh-config", ok, "--json")
    assert first.exit_code == 0, first.output
    assert all(serving(r) == v1 for r in roots.values())

    dry = run("deploy", str(bundles["v2"]), "--hosts", str(inv), "--ssh-config", ok, "--canary", "1", "--wave", "3",
              "--dry-run", "--probe")                                  # every box probed, nothing changed
    assert dry.exit_code == 0, dry.output
    assert "would run" in dry.output and "1 canary" in dry.output and all(serving(r) == v1 for r in roots.values())
    assert "state:" not in dry.output

    state = tmp_path / "rollout.json"
    before = {n: accepted(b) for n, b in boxes.items()}
    faulty = config(FAILING, "ssh_config_rollout")
    res = run("deploy", str(bundles["v2"]), "--hosts", str(inv), "--ssh-config", faulty, "--canary", "1",
              "--wave", "3", "--max-fail", "0", "--rollout-state", str(state), "--json")
    assert res.exit_code == 11, res.output                             # the rollout stopped
    out = json.loads(res.output)
    r = out["rollout"]
    assert r["status"] == "stopped"
    assert r["stop_reason"] == "1 box failed, more than --max-fail 0 allows, after wave 3 of 4"
    assert out["outcomes"] == {"done": ["b1", "b2", "b3", "b4", "b5", "b7"], "failed": ["b6"], "not_reached": ["b8"]}
    status = {b["name"]: (b["wave"], b["status"]) for b in r["boxes"]}
    assert status == {"b1": (1, "ok"), "b2": (2, "ok"), "b3": (2, "ok"), "b4": (2, "ok"), "b5": (3, "ok"),
                      "b6": (3, "failed"), "b7": (3, "ok"), "b8": (4, "pending")}
    assert {n: serving(roots[n]) for n in roots} == {**{n: v2 for n in roots}, "b6": v1, "b8": v1}
    assert accepted(boxes["b8"]) == before["b8"]                       # not reached: not even contacted
    per_box = [accepted(boxes[n]) - before[n] for n in ("b1", "b2", "b3", "b4", "b5", "b7")]
    assert per_box == [1] * 6                                          # one SSH connection per box per deploy
    failed = next(x for x in out["results"] if x["install_dir"] == str(roots["b6"]))
    assert failed["step"] == "golden" and failed["exit_code"] == 9 and failed["active_after"] == v1_version(roots["b6"])

    table = CliRunner().invoke(main, ["status", "--hosts", str(inv), "--bundle", str(bundles["v2"]), "--ssh-config",
                                      ok, "--json"])
    assert table.exit_code == 9
    matches = {b["name"]: b["matches"] for b in json.loads(table.output)["boxes"]}
    assert matches == {**{n: True for n in roots}, "b6": False, "b8": False}
    # the rollout's own fleet table: the version it asked for, and each box's outcome in it
    by_state = CliRunner().invoke(main, ["status", "--rollout", str(state), "--ssh-config", faulty, "--json"])
    assert by_state.exit_code == 9, by_state.output
    rows = {b["name"]: (b["matches"], b["rollout"]) for b in json.loads(by_state.output)["boxes"]}
    assert rows == {**{n: (True, "done") for n in roots}, "b6": (False, "failed"), "b8": (False, "not reached")}
    shown = CliRunner().invoke(main, ["status", "--rollout", str(state), "--ssh-config", faulty], env={"COLUMNS": "80"})
    assert shown.exit_code == 9 and all(len(line) <= 80 for line in shown.output.splitlines()), shown.output
    assert "not reached" in shown.output and "failed" in shown.output and json.loads(state.read_text())["id"] in \
        " ".join(shown.output.split())

    wrong = run("deploy", str(bundles["v1"]), "--resume", str(state))
    assert wrong.exit_code == 3 and "the rollout of another bundle" in wrong.output
    repaired = config(None, "ssh_config_rollout")    # b6 repaired; the state names each box's target
    unsaid = run("deploy", str(bundles["v2"]), "--resume", str(state))   # an ssh config is never read from the file
    assert unsaid.exit_code == 3 and f"pass --ssh-config {repaired}" in " ".join(unsaid.output.split()), unsaid.output
    plan = run("deploy", str(bundles["v2"]), "--resume", str(state), "--ssh-config", repaired, "--dry-run", "--json")
    assert plan.exit_code == 0 and json.loads(plan.output)["to_run"] == [[], [], ["b6"], ["b8"]], plan.output
    env = {"COLUMNS": "80"}
    resumed = CliRunner().invoke(main, ["deploy", str(bundles["v2"]), "--resume", str(state), "--ssh-config",
                                        repaired, "--no-latency-gate"], env=env)
    assert resumed.exit_code == 0, resumed.output
    assert all(len(line) <= 80 for line in resumed.output.splitlines())
    assert "rollout" in resumed.output and "complete" in resumed.output and "8 done, 0 failed" in resumed.output
    assert all(serving(r) == v2 for r in roots.values())
    assert json.loads(state.read_text())["runs"] == 2

    back = run("rollback", "--rollout", str(state), "--ssh-config", repaired, "--json")
    assert back.exit_code == 0, back.output
    assert json.loads(back.output)["rollout"]["status"] == "rolled back"
    assert all(serving(r) == v1 for r in roots.values())


def v1_version(root) -> str:
    return os.readlink(root / "current").rsplit("/", 1)[-1]


def test_rollout_options_are_checked(fleet, bundles):  # noqa: F811
    inv, config, _, _ = fleet
    for opts, said in ((["--canary", "8"], "a canary is fewer boxes than the fleet"),
                       (["--wave", "0"], "at least 1 box"), (["--wave", "150%"], "a percentage in (0, 100]"),
                       (["--max-fail", "two"], "is not a number of boxes or a percentage"),
                       (["--max-fail", "101%"], "a percentage in [0, 100]")):
        res = run("deploy", str(bundles["v2"]), "--hosts", str(inv), "--ssh-config", config(None), *opts)
        assert res.exit_code == 3 and said in res.output, (opts, res.output)
    alone = run("deploy", str(bundles["v2"]), "--host", "b1", "--wave", "2")
    assert alone.exit_code == 2 and "are for --hosts FILE" in alone.output


def test_a_dry_run_shows_the_waves_of_an_ini_inventory_and_contacts_no_box(fleet, bundles, tmp_path,  # noqa: F811
                                                                         monkeypatch):
    _, config, boxes, roots = fleet
    inv = tmp_path / "fleet.ini"
    inv.write_text("[canary]\n" + "".join(f"{n} edgehft_install_dir={roots[n]}\n" + ("[ny4]\n" if n == "b1" else "")
                                          for n in roots) +
                   "z9 ansible_host=127.0.0.1 ansible_port=1 edgehft_install_dir=/nonexistent/z9\n"   # nobody there
                   "[fleet:children]\ncanary\nny4\n")
    monkeypatch.chdir(tmp_path)
    before = {n: accepted(b) for n, b in boxes.items()}
    served = {n: serving(r) for n, r in roots.items()}
    args = ["deploy", str(bundles["v2"]), "--hosts", str(inv), "--ssh-config", config(None), "--dry-run"]
    res = run(*args, "--canary", "1", "--wave", "25%", "--max-fail", "10%", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["waves"] == [["b1"], ["b2", "b3", "b4"], ["b5", "b6", "b7"], ["b8", "z9"]]      # 25% of 9: 3 a wave
    assert d["contacted"] == 0 and "more than 0 boxes (--max-fail 10%)" in d["stop_rule"]
    assert [b["target"]["port"] for b in d["rollout"]["boxes"]][-1] == 1
    limited = run(*args, "--limit", "ny4", "--wave", "50%", "--max-fail", "1", "--json")
    assert json.loads(limited.output)["waves"] == [["b2", "b3", "b4", "b5"], ["b6", "b7", "b8", "z9"]]
    text = CliRunner().invoke(main, [*args, "--canary", "2", "--wave", "3", "--no-latency-gate"], env={"COLUMNS": "80"})
    assert text.exit_code == 0, text.output
    assert all(len(line) <= 80 for line in text.output.splitlines()), text.output
    assert "dry run: 9 boxes in 4 waves, no box contacted" in text.output and "127.0.0.1:1" in text.output
    assert "no --max-fail: the waves go on whatever fails" in " ".join(text.output.split())
    assert {n: accepted(b) for n, b in boxes.items()} == before                 # no box was contacted
    assert {n: serving(r) for n, r in roots.items()} == served and not (tmp_path / ".edgehft").exists()
    probe = run("deploy", str(bundles["v2"]), "--hosts", str(inv), "--probe")
    assert probe.exit_code == 2 and "--probe goes with --hosts FILE --dry-run" in probe.output
