"""Hostile bundles: every malformed manifest, path, golden file or tensor spec is a BundleError (exit 6) with a
one-line message and a hint, from load_bundle() or a Bundle accessor, and `edgehft run --golden` says so
without a traceback.

The bundle under attack is tiny and built here (tests/tiny_bundle.py): a one-op LiteRT model (LOGISTIC, float32
(1, 4)) written with the TFLite schema's object API, golden vectors from LiteRT, written with write_bundle. Each
case edits a copy the way an attacker who controls the whole directory can: a changed file gets its new SHA-256 in the
manifest, so the hash check alone does not catch it.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import ROOT
from edgehft import bundle as bundle_mod
from edgehft.bundle import MANIFEST, check_io_details, load_bundle, write_bundle
from edgehft.cli import main
from edgehft.errors import BundleError
from tiny_bundle import COUNT, npz_bytes, write_tiny_bundle


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return write_tiny_bundle(tmp_path_factory.mktemp("tiny"))


# -- edits --------------------------------------------------------------------------------------------------
def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _edit(d: Path, fn) -> None:
    raw = json.loads((d / MANIFEST).read_text())
    fn(raw)
    (d / MANIFEST).write_text(json.dumps(raw))


def _rehash(d: Path, *extra: str) -> None:
    """Record the current SHA-256 of every listed regular file, and list ``extra`` too (an attacker's move)."""
    def fn(m):
        for rel in [*m["files"], *extra]:
            p = d / rel
            if p.is_file() and not p.is_symlink():
                m["files"][rel] = _sha(p)
    _edit(d, fn)


def put(keys: tuple, value):
    """Set manifest[k0][k1]... = value."""
    def mutate(d):
        def fn(m):
            for k in keys[:-1]:
                m = m[k]
            m[keys[-1]] = value
        _edit(d, fn)
    return mutate


def drop(*keys):
    def mutate(d):
        def fn(m):
            for k in keys[:-1]:
                m = m[k]
            del m[keys[-1]]
        _edit(d, fn)
    return mutate


def raw_manifest(data: bytes):
    return lambda d: (d / MANIFEST).write_bytes(data)


def golden_file(arrays=None, data: bytes | None = None, edit=None):
    """Replace golden.npz with ``arrays`` (dict), raw ``data``, or ``edit(arrays)`` of the good ones."""
    def mutate(d):
        new = arrays
        if data is None and new is None:
            with np.load(d / "golden.npz") as z:
                new = {k: z[k] for k in z.files}
            edit(new)
        (d / "golden.npz").write_bytes(data if data is not None else npz_bytes(new))
        _rehash(d)
    return mutate


def file_bytes(rel: str, fn):
    def mutate(d):
        (d / rel).write_bytes(fn((d / rel).read_bytes()))
        _rehash(d)
    return mutate


def add_file(rel: str, data: bytes, listed: bool, then=None):
    def mutate(d):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
        if then:
            then(d)
        _rehash(d, *([rel] if listed else []))
    return mutate


def plan(role: str, rel: str, steps, files=()):
    """A native.json/steps.json (listed) with ``steps``; ``files`` written but not listed."""
    def mutate(d):
        for f in files:
            (d / f).parent.mkdir(parents=True, exist_ok=True)
            (d / f).write_bytes(b"\0")
        (d / rel).write_text(json.dumps({"inputs": ["x"], "outputs": ["y"], "steps": steps}))
        put(("artifacts",), {role: rel})(d)
        _rehash(d, rel)
    return mutate


def symlink_model_outside(d):
    outside = d.parent / f"{d.name}-outside.tflite"
    shutil.copyfile(d / "model.tflite", outside)
    (d / "model.tflite").unlink()
    (d / "model.tflite").symlink_to(outside)


def symlink_golden_inside(d):
    os.rename(d / "golden.npz", d / "golden_real.npz")
    (d / "golden.npz").symlink_to("golden_real.npz")
    _rehash(d, "golden_real.npz")


def symlinked_dir(d):
    ext = d.parent / f"{d.name}-ext"
    ext.mkdir()
    (ext / "w.bin").write_bytes(b"weights")
    (d / "sub").symlink_to(ext)
    put(("artifacts",), {"int8_ir": "sub/w.bin"})(d)
    _rehash(d, "sub/w.bin")


def model_is_directory(d):
    (d / "model.tflite").unlink()
    (d / "model.tflite").mkdir()


def model_is_fifo(d):
    (d / "model.tflite").unlink()
    os.mkfifo(d / "model.tflite")


def manifest_symlink(d):
    os.rename(d / MANIFEST, d.parent / f"{d.name}-manifest.json")
    (d / MANIFEST).symlink_to(d.parent / f"{d.name}-manifest.json")


def oversize_manifest(d):
    with open(d / MANIFEST, "r+b") as fh:
        fh.truncate((16 << 20) + 1)                  # sparse: costs no disk


def quant_input(scale, zero_point):
    return put(("inputs", 0), {"name": "x", "index": 0, "shape": [1, 4], "dtype": "int8", "scale": scale,
                                "zero_point": zero_point})


def input_field(key, value):
    return put(("inputs", 0, key), value)


def npy_member_short(d):
    """golden.npz whose inputs/x header says (8, 4) float32 but holds half the data (the zip itself is sound)."""
    with np.load(d / "golden.npz") as z:
        y = z["outputs/y"]
    hdr = io.BytesIO()
    np.lib.format.write_array_header_1_0(hdr, {"descr": "<f4", "fortran_order": False, "shape": (COUNT, 4)})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("inputs/x.npy", hdr.getvalue() + np.zeros(COUNT * 2, np.float32).tobytes())
        out = io.BytesIO()
        np.save(out, y)
        zf.writestr("outputs/y.npy", out.getvalue())
    (d / "golden.npz").write_bytes(buf.getvalue())
    _rehash(d)


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _flip_data_byte(b: bytes) -> bytes:
    k = b.index(b"\x93NUMPY") + 200                  # inside the first array's data
    return b[:k] + bytes([b[k] ^ 0x40]) + b[k + 1:]


NESTED = b'{"format": "edgehft-bundle", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

# (name, edit, where it is refused: load | golden | report, expected part of the message)
CASES = [
    # 1. integrity: every path the manifest names is plain, inside, listed; listed files are plain files
    ("files empty", put(("files",), {}), "load", "lists no files"),
    ("model_file unlisted", drop("files", "model.tflite"), "load", "model_file model.tflite is not listed in files"),
    ("golden.file unlisted", drop("files", "golden.npz"), "load", "golden.file golden.npz is not listed"),
    ("report.json unlisted", drop("files", "report.json"), "load", "report.json is in the bundle but not listed"),
    ("artifact unlisted", add_file("model_int8.tflite", b"x", False, put(("artifacts",), {"int8_ir":
                                                                                          "model_int8.tflite"})),
     "load", "artifacts.int8_ir model_int8.tflite is not listed"),
    ("features.file unlisted", add_file("features/f.py", b"", False, put(("features",), {"file": "features/f.py",
                                                                                         "callable": "f"})),
     "load", "features.file features/f.py is not listed"),
    ("native.json names an unlisted file", plan("native", "native.json", [{"kind": "litert", "model":
                                                "native/seg0.tflite"}], files=["native/seg0.tflite"]),
     "load", "step 0 model 'native/seg0.tflite' is not listed"),
    ("steps.json names ../", plan("steps", "steps.json", [{"placement": "fpga", "weights": "../../etc/passwd"}]),
     "load", "step 0 weights '../../etc/passwd' is not a plain relative path"),
    ("native.json is not a plan", plan("native", "native.json", "steps"), "load", "native.json is not a plan"),
    ("files key ../", add_file("../outside.bin", b"x", True), "load", "files key '../outside.bin' is not a plain"),
    ("model_file absolute", put(("model_file",), "/etc/hostname"), "load", "model_file '/etc/hostname' is an "
                                                                           "absolute path"),
    ("golden.file ../", put(("golden", "file"), "../golden.npz"), "load", "golden.file '../golden.npz' is not a "
                                                                          "plain relative path"),
    ("features.file absolute", put(("features",), {"file": "/etc/hostname", "callable": "x"}), "load",
     "features.file '/etc/hostname' is an absolute path"),
    ("artifact a/../b", put(("artifacts",), {"edgetpu_model": "a/../model.tflite"}), "load", "is not a plain"),
    ("./ in a files key", put(("files", "./model.tflite"), "0" * 64), "load", "files key './model.tflite' is not"),
    ("newline in a files key", put(("files", "a\nb"), "0" * 64), "load", "files key 'a\\nb' holds a backslash or a "
                                                                            "control character"),
    ("format missing", drop("format"), "load", "is not an edgehft manifest (format=None)"),
    ("manifest listed in files", put(("files", MANIFEST), "0" * 64), "load", "is the manifest itself"),
    ("digest not a sha256", put(("files", "model.tflite"), "abc"), "load", "is not a SHA-256"),
    ("model symlink out", symlink_model_outside, "load", "model.tflite is a symlink"),
    ("golden symlink in", symlink_golden_inside, "load", "golden.npz is a symlink"),
    ("symlinked directory", symlinked_dir, "load", "sub/w.bin is reached through a symlinked directory"),
    ("model_file a directory", model_is_directory, "load", "model.tflite is a directory, not a regular file"),
    ("model_file a fifo", model_is_fifo, "load", "model.tflite is a FIFO, socket or device, not a regular file"),
    ("manifest a symlink", manifest_symlink, "load", "manifest.json is a symlink"),
    # 2. the manifest itself
    ("manifest a list", raw_manifest(b"[1, 2]"), "load", "manifest.json is a JSON list, not an object"),
    ("manifest a string", raw_manifest(b'"edgehft-bundle"'), "load", "manifest.json is a JSON str, not an object"),
    ("manifest a number", raw_manifest(b"42"), "load", "manifest.json is a JSON int, not an object"),
    ("manifest not UTF-8", raw_manifest(b'{"format": "edgehft-bundle\xff"}'), "load", "is not UTF-8 text"),
    ("manifest nested deeply", raw_manifest(NESTED), "load", "nested too deeply"),
    ("manifest 16 MiB + 1", oversize_manifest, "load", "more than the 16,777,216 B"),
    ("format_version null", put(("format_version",), None), "load", "format_version None, not an integer"),
    ("format_version string", put(("format_version",), "2"), "load", "format_version '2', not an integer"),
    ("format_version 0", put(("format_version",), 0), "load", "format_version 0, not an integer from 1"),
    ("format_version true", put(("format_version",), True), "load", "format_version True"),
    ("board missing", drop("board"), "load", "manifest.json is malformed: board: Field required"),
    ("inputs a dict", put(("inputs",), {"x": 1}), "load", "inputs: Input should be a valid list"),
    ("no outputs", put(("outputs",), []), "load", "names no outputs"),
    ("duplicate input name", put(("inputs",), [{"name": "x", "index": 0, "shape": [1, 4], "dtype": "float32"}] * 2),
     "load", "two inputs share a name"),
    # 3. golden vectors
    ("golden count 0", put(("golden", "count"), 0), "load", "golden count 0"),
    ("golden count -1", put(("golden", "count"), -1), "load", "golden count -1"),
    ("golden count > arrays", put(("golden", "count"), COUNT + 1), "golden", "expected (9, 4) (golden count 9"),
    ("golden count absurd", put(("golden", "count"), 10 ** 12), "load", "more than 1,073,741,824 B"),
    ("atol negative", put(("golden", "atol"), -1e-3), "load", "golden atol -0.001 is not a finite number >= 0"),
    ("atol NaN", put(("golden", "atol"), float("nan")), "load", "golden atol nan is not a finite"),
    ("atol inf", put(("golden", "atol"), float("inf")), "load", "golden atol inf is not a finite"),
    ("atol 1e300", put(("golden", "atol"), 1e300), "golden", "golden atol 1e+300 is larger than max(0.05"),
    ("atol 0.5 on probabilities", put(("golden", "atol"), 0.5), "golden", "golden atol 0.5 is larger than"),
    ("output array missing", golden_file(edit=lambda a: a.pop("outputs/y")), "golden", "has no array outputs/y"),
    ("input array missing", golden_file(edit=lambda a: a.pop("inputs/x")), "golden", "has no array inputs/x"),
    ("wrong shape", golden_file(edit=lambda a: a.update({"inputs/x": np.zeros((COUNT, 5), np.float32)})),
     "golden", "inputs/x has shape (8, 5), expected (8, 4)"),
    ("wrong dtype", golden_file(edit=lambda a: a.update({"inputs/x": np.zeros((COUNT, 4), np.int32)})),
     "golden", "inputs/x is <i4 (int32), the tensor is float32"),
    ("float64 beyond float32", golden_file(edit=lambda a: a.update({"outputs/y": np.full((COUNT, 4), 1e39)})),
     "golden", "turn float64 beyond float32's range into inf"),
    ("big-endian", golden_file(edit=lambda a: a.update({"inputs/x": a["inputs/x"].astype(">f4")})), "golden",
     "inputs/x is >f4 (float32), the tensor is float32"),
    ("inf input", golden_file(edit=lambda a: a["inputs/x"].__setitem__((0, 0), np.inf)), "golden",
     "inputs/x holds 1 NaN or inf"),
    ("NaN output", golden_file(edit=lambda a: a["outputs/y"].__setitem__((1, 2), np.nan)), "golden",
     "outputs/y holds 1 NaN or inf"),
    ("pickled object array", golden_file(edit=lambda a: a.update({"inputs/x": np.array([[{}] * 4] * COUNT,
                                                                                      dtype=object)})),
     "golden", "inputs/x holds Python objects (pickled data)"),
    ("golden truncated", file_bytes("golden.npz", lambda b: b[:len(b) // 2]), "golden", "golden.npz cannot be read"),
    ("golden bit-flipped data", file_bytes("golden.npz", _flip_data_byte), "golden", "golden.npz cannot be read "
                                                                                      "(BadZipFile"),
    ("golden not a zip", golden_file(data=b"\x00" * 300), "golden", "golden.npz cannot be read"),
    ("golden empty", golden_file(data=b""), "golden", "golden.npz cannot be read"),
    ("golden a .npy", golden_file(data=_npy_bytes(np.zeros((COUNT, 4), np.float32))), "golden",
     "golden.npz is a single .npy array"),
    ("golden a pickle", golden_file(data=b"\x80\x04K\x01."), "golden", "golden.npz cannot be read"),
    ("npy data shorter than header", npy_member_short, "golden", "holds 64 B of data, its header says 128 B"),
    # 4. tensor specs
    ("input scale 0", quant_input([0.0], [0]), "load", "input 'x': scale 0.0 is not a finite positive number"),
    ("input scale negative", quant_input([-0.1], [0]), "load", "scale -0.1 is not a finite positive"),
    ("input scale NaN", quant_input([float("nan")], [0]), "load", "scale nan is not a finite positive"),
    ("input scale inf", quant_input([float("inf")], [0]), "load", "scale inf is not a finite positive"),
    ("zero_point out of int8", quant_input([0.1], [200]), "load", "zero_point 200 is outside int8's range -128..127"),
    ("zero_point missing", quant_input([0.1], None), "load", "needs one scale and one zero_point"),
    ("per-channel I/O", quant_input([0.1, 0.2], [0, 0]), "load", "needs one scale and one zero_point"),
    ("index negative", input_field("index", -1), "load", "tensor index -1 is negative"),
    ("dim 0", input_field("shape", [1, 0]), "load", "shape [1, 0] needs at most 32 dimensions, each at least 1"),
    ("dim negative", input_field("shape", [1, -4]), "load", "each at least 1"),
    ("absurd shape", input_field("shape", [1, 10 ** 12]), "load", "more than the 1,073,741,824 B"),
    ("rank 40", input_field("shape", [1] * 40), "load", "needs at most 32 dimensions"),
    ("dtype unknown", input_field("dtype", "float33"), "load", "dtype 'float33' is not a numpy dtype"),
    ("dtype object", input_field("dtype", "object"), "load", "dtype 'object' is not a numeric numpy dtype name"),
    ("dtype alias", input_field("dtype", "f4"), "load", "dtype 'f4' is not a numeric numpy dtype name"),
    # 5. report.json
    ("report malformed", file_bytes("report.json", lambda b: b"{"), "report", "report.json is not valid JSON"),
    ("report a list", file_bytes("report.json", lambda b: b"[1]"), "report", "report.json is a JSON list"),
    ("report not UTF-8", file_bytes("report.json", lambda b: b'{"a": "\xfe"}'), "report", "report.json is not UTF-8"),
]


def _damaged(good: Path, tmp_path: Path, edit) -> Path:
    d = tmp_path / "b"
    shutil.copytree(good, d, symlinks=True)
    edit(d)
    return d


def _refusal(d: Path):
    """``(stage, error)``: where the bundle at ``d`` is first refused, or ``(None, None)``."""
    try:
        b = load_bundle(d)
    except BundleError as exc:
        return "load", exc
    for stage, call in (("golden", b.golden), ("report", b.report)):
        try:
            call()
        except BundleError as exc:
            return stage, exc
    return None, None


def test_the_tiny_bundle_itself_is_sound(good):
    b = load_bundle(good)
    ins, outs = b.golden()
    assert ins["x"].shape == outs["y"].shape == (COUNT, 4) and 0 < outs["y"].min() and outs["y"].max() < 1
    assert b.report() == {"board": "cpu", "notes": []}
    assert b.resolve("golden.npz") == good / "golden.npz"
    res = CliRunner().invoke(main, ["run", str(good), "--golden", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["matched"] == COUNT


@pytest.mark.parametrize("name,edit,stage,expected", CASES, ids=[c[0] for c in CASES])
def test_refused(good, tmp_path, name, edit, stage, expected):
    d = _damaged(good, tmp_path, edit)
    got_stage, exc = _refusal(d)
    assert got_stage == stage, f"{name}: refused at {got_stage} ({exc}), expected at {stage}"
    msg = exc.args[0]
    assert expected in msg and "\n" not in msg, msg
    assert exc.exit_code == 6 and exc.hint
    if stage != "report":                            # `run --golden` reads no report
        res = CliRunner().invoke(main, ["run", str(d), "--golden", "--json"])
        assert res.exit_code == 6, res.output
        out = json.loads(res.output)
        assert out["type"] == "BundleError" and expected in out["error"] and "Traceback" not in res.output


@pytest.mark.parametrize("name", ["model symlink out", "manifest nested deeply", "golden bit-flipped data",
                                  "input scale 0"])
def test_cli_subprocess_exit_6_without_traceback(good, tmp_path, name):
    _, edit, _, expected = next(c for c in CASES if c[0] == name)
    d = _damaged(good, tmp_path, edit)
    res = subprocess.run([sys.executable, "-m", "edgehft", "run", str(d), "--golden"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 6, res.stderr
    assert "Traceback" not in res.stderr and "hint:" in res.stderr
    assert expected in " ".join(res.stderr.split())


def test_bit_flips_of_golden_and_manifest(good, tmp_path):
    """One bit flipped at every byte of golden.npz (hash re-recorded) and at every 4th of manifest.json: each
    load is a BundleError or succeeds, and a golden.npz that still loads holds the very same arrays (the zip's
    CRC, the headers' checks); nothing else is ever raised."""
    base = tmp_path / "base"
    shutil.copytree(good, base)
    want_in, want_out = load_bundle(good).golden()
    outcomes = {"refused": 0, "passed": 0}
    for rel, step in (("golden.npz", 1), (MANIFEST, 4)):
        data = (good / rel).read_bytes()
        for k in range(0, len(data), step):
            (base / rel).write_bytes(data[:k] + bytes([data[k] ^ (1 << (k % 8))]) + data[k + 1:])
            if rel == "golden.npz":
                _rehash(base)
            stage, _ = _refusal(base)
            outcomes["refused" if stage else "passed"] += 1
            if stage is None and rel == "golden.npz":
                ins, outs = load_bundle(base).golden()
                assert np.array_equal(ins["x"], want_in["x"]) and np.array_equal(outs["y"], want_out["y"]), k
            (base / MANIFEST).write_bytes((good / MANIFEST).read_bytes())
        (base / rel).write_bytes(data)
    assert outcomes["refused"] > 800 and sum(outcomes.values()) > 1000, outcomes


def test_tensor_index_the_model_does_not_have(good):
    from edgehft.runtime import cpu
    b = load_bundle(good)
    it = cpu.make_interpreter(b.model_path)
    check_io_details(b.manifest.inputs, it.get_input_details(), "input", b.model_path)
    check_io_details(b.manifest.outputs, it.get_output_details(), "output", b.model_path)
    bad = b.manifest.inputs[0].model_copy(update={"index": 7})
    with pytest.raises(BundleError, match=r"input 'x' is tensor 7, which is not an input of the model \(its "
                                          r"inputs are tensors \[0\]\)") as e:
        check_io_details([bad], it.get_input_details(), "input", b.model_path)
    assert e.value.exit_code == 6 and e.value.hint
    out_as_in = b.manifest.outputs[0]                 # tensor 1 exists, but is the output
    with pytest.raises(BundleError, match="is tensor 1, which is not an input"):
        check_io_details([out_as_in], it.get_input_details(), "input", b.model_path)
    wide = b.manifest.inputs[0].model_copy(update={"shape": [1, 5]})
    with pytest.raises(BundleError, match=r"is float32 \(1, 5\), the model's tensor 0 is float32 \(1, 4\)"):
        check_io_details([wide], it.get_input_details(), "input", b.model_path)


def test_resolve_refuses_what_is_not_listed_or_leaves(good, tmp_path):
    d = _damaged(good, tmp_path, lambda d: (d / "stray.bin").write_bytes(b"x"))
    b = load_bundle(d)
    assert b.resolve("model.tflite") == d / "model.tflite"
    for rel, expected in (("stray.bin", "stray.bin is not listed in the manifest's files"),
                          ("../b/model.tflite", "is not a plain relative path"),
                          (str(d / "model.tflite"), "is an absolute path"), ("", "is empty")):
        with pytest.raises(BundleError, match=re.escape(expected)):
            b.resolve(rel)


def test_verify_hashes_each_file_once(good, tmp_path, monkeypatch):
    """A changed file was hashed twice (once to compare, once more for the message)."""
    d = _damaged(good, tmp_path, lambda d: (d / "golden.npz").write_bytes(b"changed"))
    made = []
    real = bundle_mod.hashlib.sha256
    monkeypatch.setattr(bundle_mod.hashlib, "sha256", lambda *a: made.append(1) or real(*a))
    with pytest.raises(BundleError, match=r"golden\.npz changed \(sha256 ") as e:
        load_bundle(d)
    assert len(made) == 3                             # model.tflite, golden.npz, report.json


def test_write_bundle_refuses_what_load_would_refuse(good, tmp_path):
    m = load_bundle(good).manifest
    with pytest.raises(BundleError, match="files key '../x.bin' is not a plain relative path"):
        write_bundle(tmp_path / "w", m.model_copy(deep=True), {"model.tflite": b"m", "golden.npz": b"g",
                                                               "../x.bin": b"x"})
    zero = m.model_copy(deep=True)
    zero.golden.count = 0
    with pytest.raises(BundleError, match="golden count 0"):
        write_bundle(tmp_path / "w", zero, {"model.tflite": b"m", "golden.npz": b"g"})
    assert not (tmp_path / "x.bin").exists() and list(tmp_path.iterdir()) == []
