"""A PYNQ-Z2 checks DeepLOB int8 against its own interpreter's golden outputs (issue 18). The Z2 runs
tflite-runtime 2.14.0 (armv7l has no ai-edge-litert), whose XNNPACK takes none of DeepLOB's int8 ops: its
builtin kernels give other outputs than the compile host's ai-edge-litert 2.3.0. Compiled with
``--golden-python`` = the Z2's stack (.venv-board-z2: Python 3.10, pynq 3.1, tflite-runtime 2.14.0), the bundle
carries that release's set: the emulated Z2 passes bit for bit, the ZU+ stack (.venv-board: ai-edge-litert
2.3.0) still passes on the default set, the old layout (no set) fails on the Z2 naming the compile option, and a
tampered set is caught by the bundle's hash check."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BOARD_PY, BOARD_Z2_PY, DEEPLOB, FEED_DAY1
from edgehft.compiler.pipeline import CompileOptions, compile_model

pytestmark = pytest.mark.needs("board-venv", "board-venv-z2", "g++")
TFLRT = "tflite-runtime 2.14.0 BUILTIN+XNNPACK"
LITERT = "ai-edge-litert 2.3.0 BUILTIN+XNNPACK"
SET = "golden/tflite-runtime-2.14.0-builtin-xnnpack.npz"


@pytest.fixture(scope="module")
def z2_bundle(tmp_path_factory) -> Path:
    """DeepLOB int8 for pynq-z2 with the Z2 interpreter's golden set (read-only: copy it to change it)."""
    out = tmp_path_factory.mktemp("z2") / "deeplob.pynq-z2"
    compile_model(DEEPLOB / "deeplob.keras", [FEED_DAY1], out,
                  CompileOptions(board="pynq-z2", golden_python=str(BOARD_Z2_PY)))
    return out


def _run_golden(python: Path, bundle: Path) -> tuple[int, list]:
    """``edgehft run BUNDLE --golden --emulate --json`` in the venv of ``python``: (exit code, JSON lines)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([str(python), "-m", "edgehft", "run", str(bundle), "--golden", "--emulate", "--json"],
                       capture_output=True, text=True, timeout=600, env=env)
    lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, r.stdout + r.stderr[-2000:]
    return r.returncode, lines


def _without_set(src: Path, dst: Path) -> Path:
    """``src`` in the old layout: golden.npz only, as a compile without --golden-python writes it."""
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    del m["golden"]["sets"], m["files"][SET]
    (dst / SET).unlink()
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def test_the_manifest_records_the_z2_set(z2_bundle):
    m = json.loads((z2_bundle / "manifest.json").read_text())
    assert m["golden"]["reference_path"] == LITERT and m["files"][SET]
    (gs,) = m["golden"]["sets"]
    assert gs["file"] == SET and gs["reference_path"] == TFLRT
    assert gs["made_by"].startswith("Python 3.10.") and gs["made_by"].endswith("pynq-z2 emulated")
    (section,) = json.loads((z2_bundle / "report.json").read_text())["golden"]["sets"]
    assert section["file"] == SET and section["windows_differing_from_default"] > 0


def test_the_z2_passes_on_its_own_set_and_litert_on_the_default(z2_bundle):
    rc, (res, *_) = _run_golden(BOARD_Z2_PY, z2_bundle)
    assert rc == 0 and (res["matched"], res["count"], res["max_diff"]) == (16, 16, 0.0), res
    assert (res["path"], res["expected_path"], res["golden_file"]) == (TFLRT, TFLRT, SET)
    rc, (res, *_) = _run_golden(BOARD_PY, z2_bundle)              # the ZU+ stack: pynq 4.0, ai-edge-litert 2.3.0
    assert rc == 0 and (res["matched"], res["count"], res["max_diff"]) == (16, 16, 0.0), res
    assert (res["path"], res["expected_path"], res["golden_file"]) == (LITERT, LITERT, "golden.npz")


def test_without_the_set_the_z2_fails_and_is_told_the_option(z2_bundle, tmp_path):
    old = _without_set(z2_bundle, tmp_path / "old")
    rc, (res, err) = _run_golden(BOARD_Z2_PY, old)
    section = json.loads((z2_bundle / "report.json").read_text())["golden"]["sets"][0]
    assert rc == 8 and res["expected_path"] == LITERT and res["golden_file"] == "golden.npz"
    # the same difference the compile measured between the two sets
    assert res["count"] - res["matched"] == section["windows_differing_from_default"]
    assert res["max_diff"] == section["max_diff_vs_default"] > 0
    assert err["error"] == f"{16 - res['matched']} of 16 golden vectors differ (max diff {res['max_diff']})"
    assert err["hint"].startswith("this runs tflite-runtime 2.14.0, the golden vectors were made with "
                                  "ai-edge-litert 2.3.0")
    assert "compile with `edgehft compile --golden-python PY`, PY a Python with tflite-runtime==2.14.0" in err["hint"]


def test_a_tampered_z2_set_is_caught_by_the_hash_check(z2_bundle, tmp_path):
    bad = tmp_path / "tampered"
    shutil.copytree(z2_bundle, bad)
    data = bytearray((bad / SET).read_bytes())
    data[-40] ^= 1
    (bad / SET).write_bytes(bytes(data))
    rc, (err,) = _run_golden(BOARD_Z2_PY, bad)
    assert rc == 6 and f"{SET} changed" in err["error"], err


def test_the_hil_plugin_on_the_z2_stack_checks_its_set(z2_bundle, tmp_path):
    """The HIL plugin in .venv-board-z2 (its own entry point) on the emulated Z2: golden vectors pass bit for bit
    against the Z2 release's set."""
    out = tmp_path / "hil.json"
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "400"}
    r = subprocess.run([str(BOARD_Z2_PY), "-m", "pytest", "-p", "no:cacheprovider", "-rs", "--edgehft-board=pynq-z2",
                        f"--edgehft-bundle={z2_bundle}", "--edgehft-emulate", "--edgehft-samples=20",
                        "--edgehft-warmup=2", f"--edgehft-json={out}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0 and "1 passed, 1 skipped" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    golden = json.loads(out.read_text())["checks"]["golden"]
    assert (golden["ok"], golden["matched"], golden["path"], golden["expected_path"]) == (True, 16, TFLRT, TFLRT)
