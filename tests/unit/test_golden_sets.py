"""Golden sets per interpreter release (issue 18): the manifest records which interpreter made which set, the
check on a box picks the set its own interpreter path made (else the default, with the old message and the
compile option that makes them), every set file is hash-checked, the old layout reads and writes as before,
and the compile's choice of side Python (--golden-python, $EDGEHFT_GOLDEN_PYTHON, the board venv)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from edgehft.boards import load_board
from edgehft.bundle import GoldenSet, MANIFEST, load_bundle, write_bundle
from edgehft.bundle_checks import check_golden, golden_mismatch
from edgehft.compiler import golden_sets
from edgehft.errors import BundleError, InputError
from edgehft.runtime import cpu
from tiny_bundle import npz_bytes, write_tiny_bundle

TFLRT = "tflite-runtime 2.14.0 BUILTIN+XNNPACK"


def _with_set(src, dst, shift: float = 0.5):
    """A copy of the tiny bundle ``src`` at ``dst`` carrying a set made by TFLRT: the default outputs + ``shift``
    (what another release would compute), written by write_bundle as the compile writes it."""
    b = load_bundle(src)
    m = b.manifest.model_copy(deep=True)
    _, outs = b.golden()
    gs = GoldenSet(file=golden_sets.set_file(TFLRT), reference_path=TFLRT, made_by="Python 3.10.13 x86_64 (test)")
    m.golden.sets.append(gs)
    files = {rel: src / rel for rel in m.files if rel != "report.json"}
    files[gs.file] = npz_bytes({"outputs/y": outs["y"] + np.float32(shift)})
    return write_bundle(dst, m, files).path


class PathAs:
    """A cpu runner that reports another interpreter path (a box of another release), computing as this one."""

    def __init__(self, runner, path: str):
        self._r, self._path = runner, path

    def __getattr__(self, name):
        return getattr(self._r, name)

    def describe(self) -> dict:
        return {**self._r.describe(), "interpreter": self._path}


@pytest.fixture
def tiny(tmp_path):
    return write_tiny_bundle(tmp_path)


def test_the_manifest_records_who_made_each_set_and_the_old_layout_stays(tiny, tmp_path):
    assert "sets" not in json.loads((tiny / MANIFEST).read_text())["golden"]      # no set: the manifest as before
    b = load_bundle(_with_set(tiny, tmp_path / "s"))
    raw = json.loads((b.path / MANIFEST).read_text())["golden"]
    assert raw["sets"] == [{"file": "golden/tflite-runtime-2.14.0-builtin-xnnpack.npz", "reference_path": TFLRT,
                            "made_by": "Python 3.10.13 x86_64 (test)"}]
    assert b.manifest.files["golden/tflite-runtime-2.14.0-builtin-xnnpack.npz"] != b.manifest.files["golden.npz"]
    assert b.golden_set(TFLRT).reference_path == TFLRT and b.golden_set(cpu.interpreter_path()) is None
    ins, outs = b.golden(TFLRT)
    d_ins, d_outs = b.golden()
    assert np.array_equal(ins["x"], d_ins["x"]) and np.allclose(outs["y"] - d_outs["y"], 0.5)


def test_the_check_picks_the_set_of_the_box_interpreter(tiny, tmp_path):
    b = load_bundle(_with_set(tiny, tmp_path / "s"))
    with cpu.Runner(b, load_board("cpu")) as r:
        here = check_golden(r)                    # this host's release: the default set, which it made
        assert (here["ok"], here["matched"], here["expected_path"], here["golden_file"]) == \
            (True, 8, cpu.interpreter_path(), "golden.npz")
        there = check_golden(PathAs(r, TFLRT))    # a box of the set's release: checked against that set
        assert (there["ok"], there["matched"], there["expected_path"]) == (False, 0, TFLRT)
        assert there["golden_file"] == "golden/tflite-runtime-2.14.0-builtin-xnnpack.npz"
        assert there["max_diff"] == pytest.approx(0.5, abs=1e-6)


def test_without_a_set_the_mismatch_names_the_compile_option(tiny):
    with cpu.Runner(load_bundle(tiny), load_board("cpu")) as r:
        res = check_golden(PathAs(r, TFLRT))
    assert res["ok"] and res["expected_path"] == cpu.interpreter_path() and res["golden_file"] == "golden.npz"
    hint = golden_mismatch({**res, "matched": 5, "count": 16, "max_diff": 11.0}, "cpu").hint
    assert hint.startswith(f"this runs tflite-runtime 2.14.0, the golden vectors were made with "
                           f"{' '.join(cpu.interpreter_path().split()[:2])}")
    assert "compile with `edgehft compile --golden-python PY`, PY a Python with tflite-runtime==2.14.0" in hint


def test_a_tampered_or_unlisted_set_is_refused(tiny, tmp_path):
    s = _with_set(tiny, tmp_path / "s")
    rel = "golden/tflite-runtime-2.14.0-builtin-xnnpack.npz"
    bad = tmp_path / "tampered"
    shutil.copytree(s, bad)
    data = bytearray((bad / rel).read_bytes())
    data[-30] ^= 1
    (bad / rel).write_bytes(bytes(data))
    with pytest.raises(BundleError, match=f"{rel} changed"):
        load_bundle(bad)
    unlisted = tmp_path / "unlisted"
    shutil.copytree(s, unlisted)
    m = json.loads((unlisted / MANIFEST).read_text())
    del m["files"][rel]
    (unlisted / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(BundleError, match=r"golden.sets\[0\].file golden/tflite-runtime-2.14.0-builtin-xnnpack.npz "
                                          "is not listed in files"):
        load_bundle(unlisted)
    twice = tmp_path / "twice"
    shutil.copytree(s, twice)
    m = json.loads((twice / MANIFEST).read_text())
    m["golden"]["sets"][0]["reference_path"] = m["golden"]["reference_path"]
    (twice / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(BundleError, match="two sets name the same interpreter path"):
        load_bundle(twice)


def test_a_set_with_the_wrong_arrays_is_refused_when_read(tiny, tmp_path):
    s = _with_set(tiny, tmp_path / "s")
    rel = "golden/tflite-runtime-2.14.0-builtin-xnnpack.npz"
    m = json.loads((s / MANIFEST).read_text())
    (s / rel).write_bytes(npz_bytes({"outputs/y": np.zeros((8, 4), np.float64)}))
    from edgehft.bundle import sha256_file
    m["files"][rel] = sha256_file(s / rel)
    (s / MANIFEST).write_text(json.dumps(m))
    b = load_bundle(s)
    assert b.golden()[1]["y"].dtype == np.float32            # the default set still reads
    with pytest.raises(BundleError, match=f"{rel} outputs/y is <f8 \\(float64\\), the tensor is float32"):
        b.golden(TFLRT)


def test_which_side_python_the_compile_takes(monkeypatch, tmp_path):
    z2, cpu_board = load_board("pynq-z2"), load_board("cpu")
    monkeypatch.delenv(golden_sets.GOLDEN_PYTHON_ENV, raising=False)
    assert golden_sets.golden_python(cpu_board, None) == (None, None)          # the host's package is the board's
    assert golden_sets.golden_python(cpu_board, "/x/py") == ("/x/py", None)
    assert golden_sets.golden_python(z2, "none") == (None, None)
    monkeypatch.setenv(golden_sets.GOLDEN_PYTHON_ENV, "/env/py")
    assert golden_sets.golden_python(z2, None) == ("/env/py", None)
    monkeypatch.delenv(golden_sets.GOLDEN_PYTHON_ENV)
    from edgehft.emulate import board_venv
    venv_py = tmp_path / ".venv-board-z2" / "bin" / "python"
    venv_py.parent.mkdir(parents=True)
    venv_py.write_text("")
    monkeypatch.setattr(board_venv, "checkout_root", lambda: tmp_path)
    assert golden_sets.golden_python(z2, None) == (str(venv_py), None)     # the recipe's venv, where it is
    venv_py.unlink()
    py, warning = golden_sets.golden_python(z2, None)
    assert py is None and warning.startswith("board pynq-z2 runs tflite-runtime, this host ai-edge-litert ")
    assert "compile with `--golden-python PY`" in warning
    assert "python -m edgehft.emulate.board_venv --stack z2 VENV" in warning
    assert golden_sets.set_file("tflite-runtime 2.14.0 BUILTIN+XNNPACK") == \
        "golden/tflite-runtime-2.14.0-builtin-xnnpack.npz"


def test_a_misbehaving_side_python_is_an_error_not_a_traceback(tmp_path):
    """Issue 18 review: a side Python whose last line is not JSON, or whose outputs file is missing or not an npz,
    is an InputError (exit 3) naming the worker; a set far beyond another release's rounding is refused."""
    import numpy as np
    from edgehft.compiler.golden_sets import _check_distance, read_outputs, run_worker
    fake = tmp_path / "fakepy"
    fake.write_text("#!/bin/sh\necho '{not json'\n")
    fake.chmod(0o755)
    with pytest.raises(InputError, match="the golden worker failed") as e:
        run_worker(str(fake), tmp_path, tmp_path / "out.npz")
    assert e.value.exit_code == 3
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 truncated")
    from types import SimpleNamespace as NS
    manifest = NS(golden=NS(count=4), outputs=[NS(name="signal", shape=[1, 3], dtype="int8")])
    for name in ("missing.npz", "junk.npz"):
        with pytest.raises(InputError, match="cannot be read"):
            read_outputs(tmp_path / name, manifest)
    ints = {"signal": np.zeros((4, 3), np.int8)}
    _check_distance({"max_diff_vs_default": 11.0, "windows_differing_from_default": 3}, ints, "py")   # DeepLOB's
    with pytest.raises(InputError, match="more than 32 LSB"):
        _check_distance({"max_diff_vs_default": 232.0, "windows_differing_from_default": 16}, ints, "py")
    floats = {"y": np.array([[0.0], [2.0]], np.float32)}
    with pytest.raises(InputError, match="10% of the outputs' range"):
        _check_distance({"max_diff_vs_default": 0.5, "windows_differing_from_default": 1}, floats, "py")
