"""A cpu bundle carries every plan that passes the drift gate (issue 15 item 4): ``compile --quant auto`` ships
the others as complete sub-bundles in ``plans/<plan>/``, each with its own golden vectors that the runtime
reproduces (``run --golden --plan X``); ``--select`` chooses the top level by p50, p99 or p99.9 of the same
measured figures. No timed assertions: where a choice is asserted, the figures are fixed.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from edgehft import runtime
from edgehft.bundle import MANIFEST, load_bundle, sha256_file
from edgehft.cli import main
from edgehft.compiler import ort_plans, plans
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.errors import BundleError, InputError
from edgehft.runtime.plans import check_select, pick

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lstm_auto(models, tmp_path_factory) -> Path:
    """k3_lstm.keras (Conv1D -> LSTM(16) -> Dense softmax) compiled with --quant auto: int8, dynamic, float and
    (with g++) native candidates."""
    out = tmp_path_factory.mktemp("plan-bundles") / "lstm.auto"
    compile_model(models / "k3_lstm.keras", [models / "calib.npy"], out, CompileOptions(board="cpu", quant="auto"))
    return out


def _report_plan(bundle: Path) -> dict:
    return json.loads((bundle / "report.json").read_text())["plan"]


def test_auto_ships_every_plan_that_passes_the_gate_and_only_those(lstm_auto):
    b = load_bundle(lstm_auto)
    rep = _report_plan(lstm_auto)
    measured = {m["plan"]: m for m in rep["measured"]}
    passing = [m["plan"] for m in rep["measured"] if m["drift_passed"]]
    assert len(passing) >= 2, rep                      # else there is nothing to carry
    assert set(b.manifest.plans) == set(passing) == set(rep["shipped"])
    assert b.plan_names()[0] == b.manifest.quantization.mode == rep["chosen"]
    assert b.manifest.plans[rep["chosen"]].dir is None
    for name, entry in b.manifest.plans.items():
        assert entry.drift_passed and entry.drift_rel_mae == measured[name]["drift_rel_mae"]
        assert entry.compile_host["p50_us"] == pytest.approx(measured[name]["p50_us"], abs=0.01)
        if name != rep["chosen"]:
            assert entry.dir == f"plans/{name}" and (lstm_auto / entry.dir / MANIFEST).is_file()
    for name in set(measured) - set(passing):         # measured and reported, not shipped
        assert not (lstm_auto / "plans" / name).exists() and not measured[name]["shipped"]
    if shutil.which("g++"):
        assert "native" in measured


def test_each_plan_is_a_complete_bundle_covered_by_the_top_manifest(lstm_auto):
    b = load_bundle(lstm_auto)
    for name in b.plan_names()[1:]:
        sub = b.plan(name)
        m = sub.manifest
        assert m.quantization.mode == name and m.board == "cpu" and not m.plans and m.golden.count == 16
        assert m.model_file in m.files and m.golden.file in m.files
        for rel, digest in m.files.items():            # what the signature covers: every sub-bundle file
            assert b.manifest.files[f"plans/{name}/{rel}"] == digest == sha256_file(sub.path / rel)
        assert b.manifest.files[f"plans/{name}/{MANIFEST}"] == sha256_file(sub.path / MANIFEST)
        if name.startswith("native"):
            assert m.artifacts["native"] == "native.json" and "native.json" in m.files
        load_bundle(sub.path)                          # a bundle of its own too


def test_run_golden_reproduces_every_plan(lstm_auto):
    b = load_bundle(lstm_auto)
    for name in b.plan_names():
        res = CliRunner().invoke(main, ["run", str(lstm_auto), "--golden", "--plan", name, "--json"])
        assert res.exit_code == 0, res.output
        g = json.loads(res.output.strip().splitlines()[-1])
        assert g["ok"] and g["count"] == g["matched"] == 16 and g["plan"] == name
        assert g["expected_path"] == b.plan(name).manifest.golden.reference_path
        assert g["plan_source"] == "asked for by name"
    with runtime.open(lstm_auto) as r:               # no plan named, not on a box: the top level
        assert r.plan == b.manifest.quantization.mode and r.bundle.path == b.path
        assert r.plan_source.startswith("the bundle's top level") and r.describe()["plan"] == r.plan


def test_golden_vectors_differ_between_plans(lstm_auto):
    """Each plan's golden outputs are its own (float plans differ from the int8 plan's raw int8 outputs)."""
    b = load_bundle(lstm_auto)
    outs = {n: b.plan(n).golden()[1] for n in b.plan_names()}
    name = b.manifest.outputs[0].name
    dtypes = {n: o[name].dtype for n, o in outs.items()}
    if "int8" in dtypes:
        assert dtypes["int8"] == np.int8
    assert any(dt == np.float32 for dt in dtypes.values())


def test_an_unknown_plan_is_exit_3_listing_the_plans(lstm_auto):
    names = load_bundle(lstm_auto).plan_names()
    with pytest.raises(InputError, match="has no plan 'nope'; its plans: " + ", ".join(names)) as e:
        runtime.open(lstm_auto, plan="nope")
    assert e.value.exit_code == 3
    res = CliRunner().invoke(main, ["run", str(lstm_auto), "--golden", "--plan", "nope"])
    assert res.exit_code == 3 and "its plans: " + ", ".join(names) in " ".join(res.output.split())
    assert "Traceback" not in res.output


def test_report_on_a_plan_directory_points_to_its_bundle(lstm_auto):
    """`edgehft report BUNDLE/plans/X`: a plan has no report.json of its own; exit 6 naming the plan and the bundle,
    with the commands that show it (not a schema error about an empty report)."""
    name = load_bundle(lstm_auto).plan_names()[-1]
    res = CliRunner().invoke(main, ["report", str(lstm_auto / "plans" / name)])
    text = " ".join(res.output.split())
    assert res.exit_code == 6, res.output
    assert f"is plan '{name}' of the bundle {lstm_auto}" in text and f"--streaming --plan {name}" in text
    assert "validation error" not in text and "Traceback" not in res.output


def test_a_plan_that_does_not_stream_names_the_bundles_native_plans(lstm_auto):
    """runner.stream() on a LiteRT plan of a bundle that also carries a native plan: refused (exit 3), and the hint
    names the native plan(s) to open instead, with the call."""
    names = load_bundle(lstm_auto).plan_names()
    native = [n for n in names if n.startswith("native")]
    litert = [n for n in names if n in ("float", "int8", "dynamic")]
    if not native or not litert:
        pytest.skip(f"the bundle carries {names}: no native plan beside a LiteRT one (no g++?)")
    with runtime.open(lstm_auto, plan=litert[0]) as r:
        with pytest.raises(InputError) as e:
            r.stream()
    assert e.value.exit_code == 3 and "runs plan" in str(e.value)
    assert all(f"plan={n!r}).stream()" in e.value.hint for n in native), e.value.hint
    assert str(lstm_auto) in e.value.hint


def _rehash(bundle: Path, sub: str | None = None) -> None:
    """Re-hash the sub-bundle ``plans/<sub>``'s manifest (if given), then the top manifest."""
    dirs = ([bundle / "plans" / sub] if sub else []) + [bundle]
    for d in dirs:
        m = json.loads((d / MANIFEST).read_text())
        m["files"] = {rel: sha256_file(d / rel) for rel in m["files"]}
        (d / MANIFEST).write_text(json.dumps(m, indent=1))


def test_a_changed_plan_file_is_refused_like_any_other(lstm_auto, tmp_path):
    b = load_bundle(lstm_auto)
    other = b.plan_names()[1]
    bad = tmp_path / "bad"
    shutil.copytree(lstm_auto, bad)
    model = bad / "plans" / other / "model.tflite"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 1
    model.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=f"plans/{other}/model.tflite changed") as e:
        load_bundle(bad)
    assert e.value.exit_code == 6
    res = CliRunner().invoke(main, ["run", str(bad), "--golden", "--plan", other])
    assert res.exit_code == 6 and f"plans/{other}/model.tflite changed" in " ".join(res.output.split())


def test_a_sub_bundle_that_disagrees_with_the_top_level_is_refused(lstm_auto, tmp_path):
    other = load_bundle(lstm_auto).plan_names()[1]
    bad = tmp_path / "bad"
    shutil.copytree(lstm_auto, bad)
    sub = json.loads((bad / "plans" / other / MANIFEST).read_text())
    sub["board"] = "coral-usb"
    (bad / "plans" / other / MANIFEST).write_text(json.dumps(sub))
    _rehash(bad)                                      # the top manifest covers the edited sub manifest
    with pytest.raises(BundleError, match=f"plan {other} .*disagrees with the bundle: its board is 'coral-usb'"):
        load_bundle(bad)
    # an extra file in the sub-bundle the top manifest does not list
    shutil.rmtree(bad)
    shutil.copytree(lstm_auto, bad)
    (bad / "plans" / other / "extra.bin").write_bytes(b"x")
    sub = json.loads((bad / "plans" / other / MANIFEST).read_text())
    sub["files"]["extra.bin"] = hashlib.sha256(b"x").hexdigest()
    (bad / "plans" / other / MANIFEST).write_text(json.dumps(sub))
    _rehash(bad)
    with pytest.raises(BundleError, match="does not list with the same SHA-256: .*extra.bin"):
        load_bundle(bad)


@pytest.mark.parametrize("edit, message", [
    (lambda m, o: m["plans"][o].update(dir="elsewhere/x"), "dir is 'elsewhere/x', not plans/"),
    (lambda m, o: m["plans"][o].update(dir=None), r"as the top level \(dir null\)"),
    (lambda m, o: m["plans"][o]["compile_host"].update(p50_us=-1.0), "not a finite number >= 0"),
    (lambda m, o: m["plans"].pop(m["quantization"]["mode"]), "as the top level"),
])
def test_a_malformed_plans_field_is_refused(lstm_auto, tmp_path, edit, message):
    other = load_bundle(lstm_auto).plan_names()[1]
    bad = tmp_path / "bad"
    shutil.copytree(lstm_auto, bad)
    m = json.loads((bad / MANIFEST).read_text())
    edit(m, other)
    (bad / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(BundleError, match=message) as e:
        load_bundle(bad)
    assert e.value.exit_code == 6


def _cand(plan: str, passed: bool = True):
    out = SimpleNamespace(mae_rel=0.001, argmax_agreement=None)
    return plans.Candidate(plan, None, None, SimpleNamespace(passed=passed, outputs=[out]), {})


# one host's figures: int8 is fastest at the median but has the worst tail; float the best tail
FIGURES = {"int8": {"p50_us": 10.0, "p99_us": 135.0, "p99.9_us": 400.0, "mean_us": 12.0, "p99_over_p50": 13.5},
           "dynamic": {"p50_us": 12.0, "p99_us": 30.0, "p99.9_us": 90.0, "mean_us": 13.0, "p99_over_p50": 2.5},
           "float": {"p50_us": 14.0, "p99_us": 20.0, "p99.9_us": 95.0, "mean_us": 14.5, "p99_over_p50": 1.43}}


def test_select_chooses_from_the_same_figures():
    timing = {**FIGURES, "_core": 1}
    cands = [_cand("int8"), _cand("dynamic"), _cand("float")]
    chosen = {s: plans.choose(cands, timing, s) for s in ("p50", "p99", "p99.9")}
    assert {s: c.plan for s, (c, _) in chosen.items()} == {"p50": "int8", "p99": "float", "p99.9": "dynamic"}
    best, sec = chosen["p99"]
    assert sec["select"] == "p99" and sec["chosen"] == "float" and "lowest p99" in sec["why"]
    assert sec["shipped"] == ["int8", "dynamic", "float"]
    assert plans.choose(cands, timing)[0].plan == "float"              # p99 is the default
    # a plan that fails the drift gate is neither chosen nor shipped, however fast
    best, sec = plans.choose([_cand("int8"), _cand("dynamic"), _cand("float", passed=False)], timing, "p99")
    assert best.plan == "dynamic" and sec["shipped"] == ["int8", "dynamic"]
    assert [m["shipped"] for m in sec["measured"]] == [True, True, False]


def test_pick_ties_eligible_and_unknown_select():
    same = {"a": {"p50_us": 5.0, "p99_us": 9.0}, "b": {"p50_us": 4.0, "p99_us": 9.0}, "c": {"p50_us": 4.0, "p99_us": 9.0}}
    assert pick(same, "p99") == "b"                   # tie on p99: the lower p50, then the one listed first
    assert pick(FIGURES, "p99", eligible={"int8", "dynamic"}) == "dynamic"
    with pytest.raises(InputError, match="--select 'p95': choose one of p50, p99, p99.9") as e:
        check_select("p95")
    assert e.value.exit_code == 3
    with pytest.raises(ValueError, match="no plan"):
        pick(FIGURES, "p99", eligible=set())


@pytest.fixture
def fixed_timing(monkeypatch):
    """plans.time_plans returning FIGURES (each plan's drift is still measured): the choice is deterministic."""
    slow = {"p50_us": 50.0, "p99_us": 500.0, "p99.9_us": 900.0, "mean_us": 60.0, "p99_over_p50": 10.0}   # ORT plans
    monkeypatch.setattr(plans, "time_plans", lambda bundles, *a, **k: {**{p: dict(FIGURES.get(p, slow)) for p in
                                                                          bundles}, "_core": 0})


def test_compile_select_sets_the_top_level(mlp, tmp_path, fixed_timing):
    tops = {}
    for select in ("p50", "p99"):
        res = CliRunner().invoke(main, ["compile", str(mlp / "mlp.keras"), "--board", "cpu", "--calib",
                                        str(mlp / "x.npy"), "--select", select, "--out", str(tmp_path / select),
                                        "--json"])
        assert res.exit_code == 0, res.output
        b = load_bundle(tmp_path / select)
        tops[select] = b.manifest.quantization.mode
        assert _report_plan(b.path)["select"] == select
        assert b.manifest.plans[tops[select]].compile_host["p99_us"] == FIGURES[tops[select]]["p99_us"]
        ort = set() if ort_plans.unavailable() else set(ort_plans.ORT_PLANS)
        assert set(b.plan_names()) == {"int8", "dynamic", "float"} | ort    # the MLP's plans all pass the gate
    assert tops == {"p50": "int8", "p99": "float"}
    bad = CliRunner().invoke(main, ["compile", str(mlp / "mlp.keras"), "--calib", str(mlp / "x.npy"),
                                    "--select", "p95", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and not (tmp_path / "x").exists()


def test_a_single_plan_bundle_is_as_before(mlp, tmp_path):
    out = tmp_path / "int8"
    compile_model(mlp / "mlp.keras", [mlp / "x.npy"], out, CompileOptions(board="cpu", quant="int8"))
    raw = json.loads((out / MANIFEST).read_text())
    assert "plans" not in raw and raw["format_version"] == 1 and not (out / "plans").exists()
    b = load_bundle(out)
    assert b.plan_names() == ["int8"] and b.plan("int8") is b
    with runtime.open(out) as r:
        assert r.plan == "int8" and r.plan_source == "the bundle's only plan"
    with pytest.raises(InputError, match="its plans: int8"):
        runtime.open(out, plan="float")
