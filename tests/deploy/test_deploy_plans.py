"""The plan chosen on the box that runs it (issue 15 item 4), against the loopback sshd box: a bundle that
carries several plans has each plan's golden vectors checked and the plans timed on the box; the choice is
recorded in ``<install_dir>/plan/<vid>.json``, ``status`` shows it with every plan's figures, a serving process
opening ``current`` runs it, ``--plan`` forces another, a rollback keeps each version's plan, and a damaged
record is a clear exit 6. No timed assertions: the choice is checked against the figures the box recorded.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgehft import runtime
from edgehft.bundle import MANIFEST, load_bundle, sha256_file
from edgehft.bundle_checks import check_golden
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.errors import BundleError
from edgehft.runtime.plans import pick
from deploy_box import box, cli  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow


def _rehash(bundle: Path, tag: str, sub: str | None = None) -> Path:
    """Re-hash plan ``sub``'s manifest (if given), then the top manifest, with ``tag`` in its creation time (a
    distinct version)."""
    for d in ([bundle / "plans" / sub] if sub else []) + [bundle]:
        m = json.loads((d / MANIFEST).read_text())
        m["files"] = {rel: sha256_file(d / rel) for rel in m["files"]}
        if d == bundle:
            m["created_utc"] += tag
        (d / MANIFEST).write_text(json.dumps(m, indent=1))
    load_bundle(bundle)
    return bundle


@pytest.fixture(scope="module")
def plan_bundles(mlp, tmp_path_factory) -> dict:
    """The example MLP compiled with --quant auto (int8, dynamic and float all pass its drift gate), as two
    versions, and a copy whose int8 plan's golden vectors are off by one LSB in window 3."""
    work = tmp_path_factory.mktemp("plan-deploy")
    src = work / "mlp.auto"
    compile_model(mlp / "mlp.keras", [mlp / "x.npy"], src,          # the LiteRT plans (ORT: test_deploy_ort_plans)
                  CompileOptions(board="cpu", quant="auto", candidates=("int8", "dynamic", "float")))
    assert len(load_bundle(src).plan_names()) == 3
    out = {}
    for tag in ("v1", "v2"):
        shutil.copytree(src, work / tag)
        out[tag] = _rehash(work / tag, tag)
    bad = work / "bad_int8"
    shutil.copytree(src, bad)
    sub = "int8" if load_bundle(src).manifest.quantization.mode != "int8" else None
    golden = bad / ("plans/int8" if sub else "") / "golden.npz"
    with np.load(golden) as z:
        arrays = {k: z[k].copy() for k in z.files}
    key = next(k for k in arrays if k.startswith("outputs/"))
    arrays[key][3] = arrays[key][3] + 1
    np.savez(golden, **arrays)
    out["bad_int8"] = _rehash(bad, "bad", sub)
    return out


def _deploy(box, bundle, *args, code: int = 0) -> dict:
    res = cli(box, "deploy", str(bundle), "--host", "box", *args, "--json")
    assert res.exit_code == code, res.output
    return json.loads(res.output)["results"][0]


def _status(box) -> dict:
    res = cli(box, "status", "--host", "box", "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["status"]


def test_deploy_chooses_the_plan_on_the_box_and_status_shows_it(box, plan_bundles):
    _, _, root = box
    r = _deploy(box, plan_bundles["v1"])
    names = load_bundle(plan_bundles["v1"]).plan_names()
    assert list(r["seconds"]) == ["probe", "hold", "upload", "verify", "golden", "plan", "latency", "switch"]
    rec = r["plan_choice"]
    assert rec["how"] == "timed" and rec["select"] == "p99" and rec["version"] == r["version"]
    assert set(rec["measured"]) == set(names) and rec["excluded"] == {}
    assert rec["plan"] == pick(rec["measured"], "p99")          # the lowest p99 the box measured
    assert all(0 < f["p50_us"] <= f["p99_us"] <= f["p99.9_us"] for f in rec["measured"].values())
    assert rec["pinned_cpu"] in os.sched_getaffinity(0) and rec["rounds"] == 300 and rec["windows"] == 16
    assert rec["manifest_sha256"] == sha256_file(plan_bundles["v1"] / MANIFEST)
    assert r["golden"]["plan"] == rec["plan"] and r["golden"]["ok"]
    assert {n: g["ok"] for n, g in r["golden"]["plans"].items()} == {n: True for n in names}
    # the record on the box, outside the version's own files
    on_box = json.loads((root / "plan" / f"{r['version']}.json").read_text())
    assert on_box == rec and not (root / "versions" / r["version"] / "plan").exists()
    st = _status(box)
    assert st["active_plan"]["plan"] == rec["plan"] and st["active_plan"]["how"] == "timed"
    assert st["active_plan"]["measured"] == rec["measured"] and st["active_plan"]["plans"] == names
    assert st["plan_problem"] is None and [v["plan"] for v in st["versions"]] == [rec["plan"]]
    human = cli(box, "status", "--host", "box")
    text = " ".join(human.output.split())
    assert human.exit_code == 0 and f"plan: {rec['plan']} — timed on the box at deploy, the lowest p99" in text
    assert "plans measured on the box" in text and all(n in text for n in names)
    # a serving process opening current runs the recorded plan
    with runtime.open(root / "current") as run:
        assert run.plan == rec["plan"] and run.plan_source.startswith("recorded on this box: the lowest p99")
        assert check_golden(run)["ok"]


def test_forcing_a_plan_and_rollback_keeps_each_versions_plan(box, plan_bundles):
    _, _, root = box
    first = _deploy(box, plan_bundles["v1"], "--select", "p50")
    chosen = first["plan_choice"]["plan"]
    assert first["plan_choice"]["select"] == "p50" and chosen == pick(first["plan_choice"]["measured"], "p50")
    other = next(n for n in load_bundle(plan_bundles["v2"]).plan_names() if n != chosen)
    second = _deploy(box, plan_bundles["v2"], "--plan", other)
    rec = second["plan_choice"]
    assert rec["plan"] == other and rec["how"] == "forced" and len(rec["measured"]) == 3   # the others still timed
    assert _status(box)["active_plan"]["how"] == "forced"
    with runtime.open(root / "current") as run:
        assert run.plan == other and run.plan_source == "recorded on this box: forced at deploy"
    rb = cli(box, "rollback", "--host", "box", "--json")
    assert rb.exit_code == 0, rb.output
    st = _status(box)
    assert st["active"] == first["version"] and st["active_plan"]["plan"] == chosen
    assert {v["version"]: v["plan"] for v in st["versions"]} == {first["version"]: chosen, second["version"]: other}
    with runtime.open(root / "current") as run:
        assert run.plan == chosen
    cli(box, "rollback", "--host", "box", "--json")
    with runtime.open(root / "current") as run:
        assert run.plan == other


def test_a_plan_whose_golden_vectors_differ_on_the_box_is_left_out(box, plan_bundles):
    _, _, root = box
    r = _deploy(box, plan_bundles["bad_int8"])
    rec = r["plan_choice"]
    assert set(rec["excluded"]) == {"int8"} and "golden vectors differ: 1 of 16" in rec["excluded"]["int8"]
    assert "int8" not in rec["measured"] and rec["plan"] != "int8" and len(rec["measured"]) == 2
    assert any("plan int8 left out on the box" in w for w in r["warnings"])
    assert r["golden"]["plans"]["int8"]["matched"] == 15
    # forcing that plan: exit 8, nothing switched
    before = os.readlink(root / "current")
    failed = _deploy(box, plan_bundles["bad_int8"], "--plan", "int8", code=8)
    assert failed["step"] == "golden" and "plan int8: golden vectors differ" in failed["error"]
    assert os.readlink(root / "current") == before and not any((root / "incoming").iterdir())
    assert not (root / "plan" / f"{failed['version']}.json").exists()


def test_an_unknown_plan_is_exit_3_before_the_box_is_touched(box, plan_bundles):
    _, _, root = box
    res = cli(box, "deploy", str(plan_bundles["v1"]), "--host", "box", "--plan", "nope")
    assert res.exit_code == 3 and "its plans: " in " ".join(res.output.split()) and "Traceback" not in res.output
    assert not root.exists()
    dry = cli(box, "deploy", str(plan_bundles["v1"]), "--host", "box", "--dry-run")
    assert dry.exit_code == 0 and "would time the plans" in " ".join(dry.output.split())


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_text("{not json"), "is not JSON"),
    (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "plan": "nope"})),
     "plan 'nope' is not one of the bundle's plans"),
    (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "manifest_sha256": "0" * 64})),
     "manifest_sha256 is"),
    (lambda p: (p.unlink(), p.mkdir()), "is not a regular file"),
])
def test_a_damaged_plan_record_is_a_clear_error(box, plan_bundles, damage, message):
    _, _, root = box
    r = _deploy(box, plan_bundles["v1"])
    damage(root / "plan" / f"{r['version']}.json")
    res = cli(box, "status", "--host", "box", "--json")
    st = json.loads(res.output)["status"]
    assert res.exit_code == 6 and message in st["plan_problem"] and st["active_plan"] is None
    human = cli(box, "status", "--host", "box")
    assert human.exit_code == 6 and "plan record is damaged" in human.output and "Traceback" not in human.output
    with pytest.raises(BundleError, match="the box's plan record .*" + re.escape(message)) as e:
        runtime.open(root / "current")
    assert e.value.exit_code == 6
    with runtime.open(root / "current", plan="float") as run:      # naming a plan still opens it
        assert run.plan == "float" and check_golden(run)["ok"]
    again = _deploy(box, plan_bundles["v2"])                           # the next deploy writes a good record
    with runtime.open(root / "current") as run:
        assert run.plan == again["plan_choice"]["plan"]


def test_a_single_plan_bundle_deploys_as_before(box, mlp, tmp_path):
    out = tmp_path / "int8"
    compile_model(mlp / "mlp.keras", [mlp / "x.npy"], out, CompileOptions(board="cpu", quant="int8"))
    r = _deploy(box, out)
    assert set(r["seconds"]) == {"probe", "hold", "upload", "verify", "golden", "latency", "switch"}
    assert r["plan_choice"] is None and r["golden"]["compare"] == "exact" and "plans" not in r["golden"]
    assert not (box[2] / "plan").exists()
    st = _status(box)
    assert st["active_plan"] == {"plan": "int8", "how": "only", "plans": ["int8"]}


def test_the_box_refuses_an_unlisted_manifest_json_inside_a_plan(plan_bundles, tmp_path):
    """Only the top manifest may be unlisted: a manifest.json anywhere else that the manifest does not list
    (a plan directory the top level does not name) is refused at verify, exit 9."""
    from edgehft.deploy.store import Store
    from edgehft.errors import DeployError
    store = Store(tmp_path / "install")
    vid = "20261201T000000Z-0123456789ab-cdef"
    staged = store.incoming / vid
    shutil.copytree(plan_bundles["v1"], staged)
    assert store.verify(vid)["files"] == len(load_bundle(staged).manifest.files) + 1
    (staged / "plans" / "ghost").mkdir()
    shutil.copy(staged / MANIFEST, staged / "plans" / "ghost" / MANIFEST)
    with pytest.raises(DeployError, match=r"files not in the manifest: plans/ghost/manifest.json") as e:
        store.verify(vid)
    assert e.value.exit_code == 9


def test_record_plan_refuses_a_forced_plan_that_was_not_timed(plan_bundles, tmp_path):
    from edgehft.deploy.store import Store
    from edgehft.errors import DeployError
    store = Store(tmp_path / "install")
    vid = "20261201T000000Z-0123456789ab-cdef"
    shutil.copytree(plan_bundles["v1"], store.incoming / vid)
    timed = {"measured": {"float": {"p50_us": 1.0, "p99_us": 2.0, "p99.9_us": 3.0, "mean_us": 1.1,
                                    "p99_over_p50": 2.0}}, "pinned_cpu": 0, "rounds": 10, "windows": 16}
    with pytest.raises(DeployError, match="the forced plan 'int8' was not timed on the box"):
        store.record_plan(vid, timed, forced="int8")
    assert not (tmp_path / "install" / "plan" / f"{vid}.json").exists()
    rec = store.record_plan(vid, timed, select="p99.9")
    assert rec["plan"] == "float" and rec["how"] == "timed" and rec["select"] == "p99.9"
    assert json.loads((tmp_path / "install" / "plan" / f"{vid}.json").read_text()) == rec
