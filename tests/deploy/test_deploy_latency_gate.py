"""The deploy's latency gate (issue 17 item 3) on the loopback sshd box: before the switch the box times the plan
it will serve (edgehft.hil.checks.latency on the bundle's golden inputs, in the agent's child process, pinned to
the plan step's core) and a p99 or p99.9 over the budget refuses the switch (exit 9, the previous version keeps
serving, the staged copy removed, the refusal in the box's history.jsonl); --no-latency-gate switches untimed,
loudly. No timing assertions: the verdicts are checked against budgets far on either side of the figures (the
board file's 5000 / 10000 µs against the example MLP's tens of µs; 0.001 µs)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from edgehft.boards import load_board
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.deploy.deploy import deploy
from deploy_box import box, cli, target  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow

BOARD_BUDGET = dict(load_board("cpu").latency_budget_us)          # {"p99": 5000.0, "p999": 10000.0}


@pytest.fixture(scope="module")
def mlp_plans(mlp, tmp_path_factory) -> Path:
    """The example MLP compiled for the cpu board with two plans (int8, dynamic): the box chooses one, and the
    gate times that one."""
    out = tmp_path_factory.mktemp("gate") / "mlp.auto"
    compile_model(mlp / "mlp.keras", [mlp / "x.npy"], out,
                  CompileOptions(board="cpu", quant="auto", candidates=("int8", "dynamic")))
    return out


def _deploy(box, bundle, *args, code: int = 0) -> dict:
    res = cli(box, "deploy", str(bundle), "--host", "box", *args, "--json")
    assert res.exit_code == code, res.output
    return json.loads(res.output)["results"][0]


def _status(box) -> dict:
    res = cli(box, "status", "--host", "box", "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["status"]


def _text(res) -> str:
    return " ".join(res.output.split())          # rich wraps lines at the console width


def test_a_deploy_within_budget_switches_and_reports_the_gates_figures(box, mlp_plans):
    assert BOARD_BUDGET == {"p99": 5000.0, "p999": 10000.0}
    dry = cli(box, "deploy", str(mlp_plans), "--host", "box", "--dry-run", "--budget-p99-us", "50")
    assert dry.exit_code == 0, dry.output
    assert "would time 2000 calls on the golden inputs on the box, pinned to CPU (its highest allowed), and " \
           "refuse the switch if over p99 50 µs, p99.9 10000 µs" in _text(dry)
    r = _deploy(box, mlp_plans)
    assert list(r["seconds"]) == ["probe", "hold", "upload", "verify", "golden", "plan", "latency", "switch"]
    g, rec = r["latency_gate"], r["plan_choice"]
    assert r["active_after"] == r["version"] and r["warnings"] == []
    assert g["verdict"] == "pass" and g["plan"] == rec["plan"]            # the plan the box recorded and serves
    assert g["core"] == rec["pinned_cpu"] == max(os.sched_getaffinity(0))   # cpu.toml names no [runtime] core
    assert (g["samples"], g["warmup"], g["mode"]) == (2000, 100, "max")
    assert g["source"] == {"kind": "golden", "windows": 16, "timing": "back-to-back"} and g["emulated"] is False
    assert g["budget_us"] == BOARD_BUDGET and g["budget_from"] == "boards/cpu.toml [latency_budget_us]"
    assert 0 < g["p50_us"] <= g["p99_us"] <= g["p99.9_us"] <= g["max_us"]
    assert g["verdicts"] == {"p99": {"value_us": g["p99_us"], "budget_us": 5000.0, "ok": True},
                             "p999": {"value_us": g["p99.9_us"], "budget_us": 10000.0, "ok": True}}
    human = cli(box, "deploy", str(mlp_plans), "--host", "box")
    text = _text(human)
    assert human.exit_code == 0, human.output
    assert "box latency …" in text and "latency gate pass: p50 " in text
    assert "(budget 5000), p99.9 " in text and "(budget 10000); 2000 calls of plan " in text
    assert "on 16 golden inputs back-to-back, pinned to CPU" in text


def test_a_deploy_over_budget_is_refused_and_the_previous_version_keeps_serving(box, mlp_plans):
    _, _, root = box
    first = _deploy(box, mlp_plans)
    r = _deploy(box, mlp_plans, "--budget-p99-us", "0.001", code=9)
    g = r["latency_gate"]
    assert (r["ok"], r["step"], r["exit_code"]) == (False, "latency", 9)
    assert r["error"].startswith("latency gate: p99 ") and "µs over the budget 0.001 µs on the box" in r["error"]
    assert "nothing was switched" in r["error"] and "--no-latency-gate" in r["hint"]
    assert g["verdict"] == "refused" and g["budget_us"] == {"p99": 0.001, "p999": 10000.0}
    assert g["budget_from"] == "options, else boards/cpu.toml [latency_budget_us]"
    assert g["verdicts"]["p99"] == {"value_us": g["p99_us"], "budget_us": 0.001, "ok": False}
    assert "switch" not in r["seconds"] and r["active_after"] == first["version"]
    st = _status(box)
    assert st["active"] == first["version"] and st["staged"] == [] and st["partial"] == []
    assert os.readlink(root / "current") == f"versions/{first['version']}"
    assert not (root / "incoming" / r["version"]).exists() and not (root / "plan" / f"{r['version']}.json").exists()
    last = st["history"][-1]
    assert (last["event"], last["version"]) == ("failed", r["version"])
    assert last["reason"].startswith("latency: latency gate: p99 ")
    human = cli(box, "deploy", str(mlp_plans), "--host", "box", "--budget-p99-us", "0.001", "--budget-p999-us", "0.002")
    text = _text(human)
    assert human.exit_code == 9 and "deploy failed at latency" in text
    assert "µs over the budget 0.001 µs; p99.9 " in text and "µs over the budget 0.002 µs on the box" in text
    assert f"the box serves: {first['version']}" in text and "latency gate REFUSED: p50 " in text
    assert _status(box)["active"] == first["version"]


def test_no_latency_gate_switches_over_budget_and_warns(box, mlp_plans):
    first = _deploy(box, mlp_plans)
    r = _deploy(box, mlp_plans, "--no-latency-gate", "--budget-p99-us", "0.001")
    assert r["ok"] and r["active_after"] == r["version"] != first["version"]
    assert r["latency_gate"] == {"verdict": "off"} and "latency" in r["seconds"]
    assert r["warnings"] == ["--no-latency-gate: switched WITHOUT the latency gate; p99 and p99.9 were not held "
                             "to the budget"]
    events = [(h["event"], h["version"]) for h in _status(box)["history"]]
    assert events[-2:] == [("latency-gate-off", r["version"]), ("activate", r["version"])]
    off = next(h for h in _status(box)["history"] if h["event"] == "latency-gate-off")
    assert off["reason"] == r["warnings"][0]
    human = cli(box, "deploy", str(mlp_plans), "--host", "box", "--no-latency-gate", "--budget-p99-us", "0.001")
    assert human.exit_code == 0, human.output
    assert "warning: box: --no-latency-gate: switched WITHOUT the latency gate" in _text(human)
    assert "latency gate pass" not in _text(human)


def test_a_box_whose_agent_predates_the_gate_deploys_with_a_warning(box, mlp_plans):
    def old_agent(step, tgt, ctx):          # the probe's facts as an agent without the gate answers them
        if step == "hold":
            ctx["facts"].pop("latency_gate")

    r = deploy(target(box), mlp_plans, budget_p99_us=0.001, on_step=old_agent)
    assert r.ok and r.active_after == r.version and "latency" not in r.seconds
    assert r.latency_gate == {"verdict": "unsupported"}
    assert len(r.warnings) == 1 and "has no latency gate: switched without timing the bundle there" in r.warnings[0]
