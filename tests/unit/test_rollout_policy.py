"""The rollout policy (issue 18), on a fake fan-out engine (no box): the waves' layout, --max-fail as Ansible's
max_fail_percentage (more failures than it allows stop the rollout; 0 allows none), the canary, the boxes not
reached, --resume and the fleet rollback's set of boxes."""
from __future__ import annotations

import json

import pytest

from edgehft.cli import rollout as rollout_cli
from edgehft.deploy import rollout
from edgehft.deploy.fanout import target_json
from edgehft.deploy.ssh import parse_target
from edgehft.errors import InputError


V1, V2 = "20261207T201539Z-ede0aec49de1-0873", "20261207T211539Z-45e0aec49de1-a3e2"   # versions as boxes name them


class FakeEngine:
    """An engine whose deploy fails on the boxes named in ``failing``; it records the boxes each call ran."""

    def __init__(self, failing=()):
        self.failing, self.calls = set(failing), []

    def run(self, jobs, parallel):
        self.calls.append([j["name"] for j in jobs])
        out = []
        for j in jobs:
            if j["kind"] == "rollback":
                out.append({"host": j["name"], "ok": True, "active": j["to"]})
            elif j["name"] in self.failing:
                out.append({"ok": False, "exit_code": 8, "step": "golden", "error": "differs", "box_reached": True,
                            "active_before": V1})
            else:
                out.append({"ok": True, "exit_code": 0, "box_reached": True, "active_before": V1, "active_after": V2})
        return out


def deploy_jobs(boxes):
    return [{"kind": "deploy", "name": b.name} for b in boxes]


def rollback_jobs(boxes):
    return [{"kind": "rollback", "name": b.name, "to": b.version_before} for b in boxes]


def fleet(n=8, **kw) -> rollout.Rollout:
    names = [f"b{i}" for i in range(1, n + 1)]
    targets = [target_json(parse_target(f"edgehft@10.0.0.{i}:22", install_dir="/opt/edgehft")) for i in range(n)]
    return rollout.plan(names, targets, ["cpu"] * n, "/bundle", "ab" * 32, state_dir=None, **kw)


def waves(r):
    return [[b.name for b in w] for w in r.waves]


@pytest.mark.parametrize("text, total, allowed", [
    (None, 8, None), ("0", 8, 0), ("0%", 8, 0), ("2", 8, 2), ("10%", 8, 0), ("25%", 8, 2), ("25%", 9, 2),
    ("30%", 10, 3), ("100%", 8, 8), (" 1 ", 8, 1)])
def test_max_fail_is_the_failures_allowed(text, total, allowed):
    assert rollout.allowed_failures(text, total) == allowed


@pytest.mark.parametrize("text, said", [("1.5", "not a number of boxes"), ("-1", "not a number of boxes"),
                                        ("two", "not a number of boxes"), ("101%", "a percentage in [0, 100]")])
def test_a_bad_max_fail_is_refused(text, said):
    with pytest.raises(InputError) as e:
        rollout.allowed_failures(text, 8)
    assert e.value.exit_code == 3 and said in str(e.value) and "--max-fail 0" in e.value.hint


def test_waves_canary_then_sizes_or_percentages():
    assert waves(fleet(8, canary=1, wave="3")) == [["b1"], ["b2", "b3", "b4"], ["b5", "b6", "b7"], ["b8"]]
    assert waves(fleet(9, canary=2, wave="25%")) == [["b1", "b2"], ["b3", "b4", "b5"], ["b6", "b7", "b8"], ["b9"]]
    assert waves(fleet(4)) == [["b1", "b2", "b3", "b4"]]
    assert waves(fleet(4, canary=1)) == [["b1"], ["b2", "b3", "b4"]]


def test_max_fail_0_stops_after_the_wave_of_the_first_failure():
    r, eng = fleet(8, canary=1, wave="3", max_fail="0"), FakeEngine({"b3"})
    rollout.run(r, deploy_jobs, eng, 8)
    assert eng.calls == [["b1"], ["b2", "b3", "b4"]]                  # wave 3 and 4 never contacted
    assert r.status == "stopped" and r.stop_reason == "1 box failed, more than --max-fail 0 allows, after wave 2 of 4"
    assert {b.name: b.status for b in r.boxes} == {"b1": "ok", "b2": "ok", "b3": "failed", "b4": "ok",
                                                   **{f"b{i}": "pending" for i in range(5, 9)}}
    failed = r.boxes[2]
    assert (failed.exit_code, failed.step, failed.version_before, failed.version) == (8, "golden", V1, None)


def test_failures_up_to_max_fail_go_on():
    r, eng = fleet(8, canary=1, wave="3", max_fail="25%"), FakeEngine({"b2", "b6"})    # 25% of 8: 2 allowed
    rollout.run(r, deploy_jobs, eng, 8)
    assert r.status == "complete" and len(eng.calls) == 4 and r.counts() == {"pending": 0, "ok": 6, "failed": 2,
                                                                             "rolled back": 0}
    r, eng = fleet(8, canary=1, wave="3", max_fail="25%"), FakeEngine({"b2", "b6", "b7"})
    rollout.run(r, deploy_jobs, eng, 8)
    assert r.status == "stopped" and eng.calls[-1] == ["b5", "b6", "b7"] and r.boxes[7].status == "pending"


def test_a_failed_canary_stops_without_max_fail():
    r, eng = fleet(8, canary=2, wave="3"), FakeEngine({"b2"})
    rollout.run(r, deploy_jobs, eng, 8)
    assert eng.calls == [["b1", "b2"]] and r.status == "stopped"
    assert r.stop_reason == "the canary failed, after wave 1 of 3"


def test_resume_runs_the_boxes_not_done_then_rollback_takes_back_exactly_those_switched():
    r, eng = fleet(8, canary=1, wave="3", max_fail="0"), FakeEngine({"b3"})
    rollout.run(r, deploy_jobs, eng, 8)
    eng.failing = set()                                                 # the box repaired
    rollout.run(r, deploy_jobs, eng, 8)
    assert eng.calls[2:] == [["b3"], ["b5", "b6", "b7"], ["b8"]] and r.status == "complete" and r.runs == 2
    r2, eng2 = fleet(8, canary=1, wave="3", max_fail="0"), FakeEngine({"b3"})
    rollout.run(r2, deploy_jobs, eng2, 8)
    rollout.rollback(r2, rollback_jobs, eng2, 8)
    assert eng2.calls[-1] == ["b1", "b2", "b4"]                        # not b3 (failed), not b5..b8 (not reached)
    assert [b.status for b in r2.boxes[:4]] == ["rolled back", "rolled back", "failed", "rolled back"]
    assert r2.status == "rolled back"


def test_the_report_says_done_failed_with_its_exit_code_and_not_reached(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    r = fleet(8, canary=1, wave="3", max_fail="0")
    rollout.run(r, deploy_jobs, FakeEngine({"b3"}), 8)
    rollout_cli.print_rollout(r)
    text = capsys.readouterr().out
    assert all(len(line) <= 80 for line in text.splitlines()), text
    rows = {line.split("│")[2].strip(): line.split("│")[3].strip() for line in text.splitlines()
            if line.startswith("│") and line.split("│")[2].strip()}
    assert rows == {"b1": "done", "b2": "done", "b3": "failed at golden, exit 8", "b4": "done",
                    **{f"b{i}": "not reached" for i in range(5, 9)}}
    assert ("3 done, 1 failed, 4 not reached (they keep their version); stopped: 1 box failed, more than --max-fail "
            "0 allows, after wave 2 of 4") in " ".join(text.split())
    assert rollout_cli.outcomes(r) == {"done": ["b1", "b2", "b4"], "failed": ["b3"],
                                       "not_reached": ["b5", "b6", "b7", "b8"]}


def test_the_dry_run_lists_the_waves_in_order(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    rollout_cli.show_waves(fleet(9, canary=1, wave="25%", max_fail="10%"), as_json=False)
    text = capsys.readouterr().out
    assert all(len(line) <= 80 for line in text.splitlines()), text
    rows = [(c[1].strip(), c[2].strip(), c[3].strip()) for c in (line.split("│") for line in text.splitlines())
            if len(c) > 3 and c[2].strip().startswith("b")]
    assert rows == [("1 canary", "b1", "edgehft@10.0.0.0:22"), ("2", "b2", "edgehft@10.0.0.1:22"),
                    ("2", "b3", "edgehft@10.0.0.2:22"), ("2", "b4", "edgehft@10.0.0.3:22"),
                    ("3", "b5", "edgehft@10.0.0.4:22"), ("3", "b6", "edgehft@10.0.0.5:22"),
                    ("3", "b7", "edgehft@10.0.0.6:22"), ("4", "b8", "edgehft@10.0.0.7:22"),
                    ("4", "b9", "edgehft@10.0.0.8:22")]
    assert "dry run: 9 boxes in 4 waves, no box contacted" in text
    assert "more than 0 boxes (--max-fail 10%)" in " ".join(text.split())


def test_a_dry_run_of_a_resume_marks_the_boxes_done(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    r = fleet(8, canary=1, wave="3", max_fail="0")
    rollout.run(r, deploy_jobs, FakeEngine({"b3"}), 8)
    rollout_cli.show_waves(r, as_json=True)
    d = json.loads(capsys.readouterr().out)
    assert d["to_run"] == [[], ["b3"], ["b5", "b6", "b7"], ["b8"]] and d["contacted"] == 0
    rollout_cli.show_waves(r, as_json=False)
    text = capsys.readouterr().out
    assert "(3 done: --resume skips them)" in " ".join(text.split()) and "b2 (done)" in text
    assert "b3 (done)" not in text and all(len(line) <= 80 for line in text.splitlines())
