"""The ONNX Runtime plans on the box (issue 15 item 5), against the loopback sshd box. The board venv has no
onnxruntime: a deploy there leaves ort-float and ort-int8 out with the reason (pip install onnxruntime) and
picks among the rest; the same venv with onnxruntime on its path (``scripts/box-ort.sh``: onnxruntime
installed for it into .venv-board/ort-site, no onnx package) checks their golden vectors and times them with
the others; a box whose ORT int8 outputs differ beyond the tolerance leaves that plan out. No timed
assertions: the choice is checked against the figures the box recorded.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import BOARD_PY, ROOT
from deploy_box import box  # noqa: F401 (fixture)
from edgehft import runtime
from edgehft.bundle import MANIFEST, load_bundle, sha256_file
from edgehft.bundle_checks import check_golden
from edgehft.cli import main
from edgehft.compiler import ort_plans
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.runtime.plans import pick

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(ort_plans.unavailable() is not None, reason=str(ort_plans.unavailable()))]
ORT = ("ort-float", "ort-int8")
ORT_SITE = ROOT / ".venv-board" / "ort-site"


def _box_has_ort() -> str | None:
    """Why the board venv cannot be a box with onnxruntime here, or None."""
    if not BOARD_PY.exists():
        return "no board venv (scripts/board-venv.sh)"
    r = subprocess.run([str(BOARD_PY), "-c", "import onnxruntime"], env={**os.environ, "PYTHONPATH": str(ORT_SITE)},
                       capture_output=True, text=True)
    return None if r.returncode == 0 else f"no onnxruntime for the board venv in {ORT_SITE} (run scripts/box-ort.sh)"


@pytest.fixture
def no_ort_box(box):
    """The box as the board venv is: without onnxruntime (skipped where someone installed it there)."""
    if subprocess.run([str(BOARD_PY), "-c", "import onnxruntime"], capture_output=True).returncode == 0:
        pytest.skip(f"{BOARD_PY} imports onnxruntime: no box without it here")
    return box


@pytest.fixture(scope="module")
def ort_bundles(mlp, tmp_path_factory) -> dict:
    """The example MLP with --quant auto (five plans, the ORT ones among them), as two versions, and a copy
    whose ort-int8 golden outputs are off by three steps of its tolerance in window 5."""
    work = tmp_path_factory.mktemp("ort-deploy")
    src = work / "mlp.auto"
    compile_model(mlp / "mlp.keras", [mlp / "x.npy"], src, CompileOptions(board="cpu", quant="auto"))
    assert set(ORT) <= set(load_bundle(src).plan_names())
    out = {}
    for tag in ("v1", "v2", "off"):
        shutil.copytree(src, work / tag)
        out[tag] = work / tag
    top = load_bundle(src).manifest.quantization.mode
    sub = None if top == "ort-int8" else "plans/ort-int8"
    d = out["off"] / (sub or "")
    atol = load_bundle(d).manifest.golden.atol
    with np.load(d / "golden.npz") as z:
        arrays = {k: z[k].copy() for k in z.files}
    key = next(k for k in arrays if k.startswith("outputs/"))
    arrays[key][5] = arrays[key][5] + 3 * atol
    np.savez(d / "golden.npz", **arrays)
    for tag, b in out.items():
        for m_dir in ([d] if tag == "off" and sub else []) + [b]:
            m = json.loads((m_dir / MANIFEST).read_text())
            m["files"] = {rel: sha256_file(m_dir / rel) for rel in m["files"]}
            m["created_utc"] += tag if m_dir == b else ""
            (m_dir / MANIFEST).write_text(json.dumps(m, indent=1))
        load_bundle(b)
    return out


@pytest.fixture
def ort_python(tmp_path) -> str:
    """A box Python with onnxruntime: the board venv's, with .venv-board/ort-site on PYTHONPATH."""
    why = _box_has_ort()
    if why:
        pytest.skip(why)
    wrapper = tmp_path / "python-with-ort"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{ORT_SITE}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{BOARD_PY}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def _deploy(box, bundle, *args, python: str | None = None, code: int = 0) -> dict:
    sshd, cfg, root = box
    res = CliRunner().invoke(main, ["deploy", str(bundle), "--host", "box", *args, "--json", "--ssh-config", str(cfg),
                                    "--remote-python", python or sshd.python, "--install-dir", str(root)])
    assert res.exit_code == code, res.output
    return json.loads(res.output)["results"][0]


def test_a_box_without_onnxruntime_leaves_the_ort_plans_out_and_picks_among_the_rest(no_ort_box, ort_bundles):
    box = no_ort_box
    _, _, root = box
    r = _deploy(box, ort_bundles["v1"])
    rec = r["plan_choice"]
    assert set(rec["excluded"]) == set(ORT)
    for plan in ORT:
        why = rec["excluded"][plan]
        assert "ONNX Runtime is not installed here" in why and "pip install onnxruntime" in why
        assert r["golden"]["plans"][plan] == {"ok": False, "skipped": why}
        assert any(w.startswith(f"plan {plan} left out on the box: ONNX Runtime is not installed")
                   for w in r["warnings"])
    assert set(rec["measured"]) == set(load_bundle(ort_bundles["v1"]).plan_names()) - set(ORT)
    assert rec["plan"] == pick(rec["measured"], "p99") and rec["plan"] not in ORT
    on_box = json.loads((root / "plan" / f"{r['version']}.json").read_text())
    assert on_box["excluded"] == rec["excluded"]


def test_a_box_with_onnxruntime_times_the_ort_plans_with_the_others(box, ort_bundles, ort_python):
    _, _, root = box
    names = load_bundle(ort_bundles["v2"]).plan_names()
    r = _deploy(box, ort_bundles["v2"], python=ort_python)
    rec = r["plan_choice"]
    assert rec["excluded"] == {} and set(rec["measured"]) == set(names)
    assert rec["plan"] == pick(rec["measured"], "p99")
    for plan in ORT:
        g = r["golden"]["plans"][plan]
        assert g["ok"] and g["count"] == g["matched"] == 16 and g["path"].startswith("onnxruntime ")
        assert 0 < rec["measured"][plan]["p50_us"] <= rec["measured"][plan]["p99_us"]
    forced = _deploy(box, ort_bundles["v1"], "--plan", "ort-int8", python=ort_python)
    assert forced["plan_choice"]["plan"] == "ort-int8" and forced["plan_choice"]["how"] == "forced"
    assert set(forced["plan_choice"]["measured"]) == set(names)        # the others still timed
    with runtime.open(root / "current") as run:       # a serving process here runs the recorded plan
        assert run.plan == "ort-int8" and run.describe()["engine"] == "onnxruntime"
        assert check_golden(run)["ok"]


def test_ort_int8_results_beyond_the_tolerance_leave_the_plan_out(box, ort_bundles, ort_python):
    r = _deploy(box, ort_bundles["off"], python=ort_python)
    rec = r["plan_choice"]
    assert set(rec["excluded"]) == {"ort-int8"} and "golden vectors differ: 1 of 16" in rec["excluded"]["ort-int8"]
    assert "ort-float" in rec["measured"] and "ort-int8" not in rec["measured"]
    assert rec["plan"] == pick(rec["measured"], "p99")


def test_a_bundle_of_one_ort_plan_on_a_box_without_onnxruntime_is_refused_and_nothing_switched(no_ort_box, mlp,
                                                                                                tmp_path):
    """--quant ort-float alone: the box has no plan it can run, so the deploy stops at golden (exit 9) saying
    what to install; nothing is switched."""
    sshd, cfg, root = no_ort_box
    out = tmp_path / "ort-float"
    compile_model(mlp / "mlp.keras", [mlp / "x.npy"], out, CompileOptions(board="cpu", quant="ort-float"))
    res = CliRunner().invoke(main, ["deploy", str(out), "--host", "box", "--ssh-config", str(cfg),
                                    "--remote-python", sshd.python, "--install-dir", str(root)])
    text = " ".join(res.output.split())
    assert res.exit_code == 9, res.output                # refused on the box: golden could not run there
    assert "deploy failed at golden on box: box: ONNX Runtime is not installed here" in text
    assert "pip install onnxruntime" in text and "the box serves: nothing" in text
    assert not (root / "current").exists() and not list((root / "versions").glob("*"))
