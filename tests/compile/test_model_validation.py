"""A model file that passes its manifest's hashes but is corrupt never crashes the process (issue 13, section 3).

Models are made here: a Keras MLP (16 -> 32 -> 3 softmax) converted to full int8 by tests/make_fuzz_models.py,
compiled as is into a cpu bundle. Corrupt variants are made from it three ways: precise edits through the TFLite
schema's object API (an index out of range, a wrong buffer size, bad quantization or options), precise byte
edits of the flatbuffer structure, and a seeded single-bit-flip fuzz. Expected outcomes: ``TFLiteModel`` (so
every reader) raises InvalidModelError naming the problem; ``edgehft run BUNDLE --golden`` exits 6, ``edgehft
report X.tflite`` 3 and ``edgehft compile X.tflite`` 4 (or 0, 3, 8 where a flip was harmless or only changed
values), never with a traceback or a signal. A model that passes validation but still crashes LiteRT (a SOFTMAX
whose beta makes LiteRT's reference kernels abort) crashes only the isolated child of the first open.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT, SHARED, run_maker
from hostile import bit_flips
from edgehft.bundle import MANIFEST, load_bundle
from edgehft.cli import main
from edgehft.errors import BundleError
from edgehft.ir import TFLiteModel
from edgehft.ir.validate import InvalidModelError

sys.path.insert(0, str(ROOT / "tests" / "tools"))
from cli_batch import run_batch  # noqa: E402

EDGEHFT = [sys.executable, "-m", "edgehft"]
FUZZ_MUTANTS, FUZZ_SEED = 200, 13
# What each command may answer for a mutant: 0 when the flip was harmless, 8 (run) when it only changed
# weights, 3 (compile) for a file that is no longer a .tflite or has no golden vectors; never anything else.
ALLOWED = {"run": {0, 6, 8}, "report": {0, 3}, "compile": {0, 3, 4}}


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory):
    """A fresh first-open cache for this module (so every first open here really runs its child)."""
    old = os.environ.get("EDGEHFT_CACHE")
    os.environ["EDGEHFT_CACHE"] = str(tmp_path_factory.mktemp("edgehft-cache"))
    yield Path(os.environ["EDGEHFT_CACHE"])
    if old is None:
        os.environ.pop("EDGEHFT_CACHE")
    else:
        os.environ["EDGEHFT_CACHE"] = old


@pytest.fixture(scope="module")
def fuzz_models(tmp_path_factory) -> Path:
    return run_maker(ROOT / "tests" / "make_fuzz_models.py", tmp_path_factory.mktemp("fuzz-models"), timeout=300)


@pytest.fixture(scope="module")
def mlp_bundle(fuzz_models, tmp_path_factory) -> Path:
    """The int8 MLP compiled as is for the cpu board (16 random golden inputs, exact compare)."""
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    out = tmp_path_factory.mktemp("fuzz-bundle") / "mlp.cpu"
    compile_model(fuzz_models / "mlp_int8.tflite", [], out, CompileOptions(board="cpu"))
    return out


def with_model(src: Path, dst: Path, data: bytes) -> Path:
    """A copy of bundle ``src`` whose model.tflite is ``data``, re-hashed so the copy verifies."""
    shutil.copytree(src, dst)
    (dst / "model.tflite").write_bytes(data)
    m = json.loads((dst / MANIFEST).read_text())
    m["files"] = {rel: hashlib.sha256((dst / rel).read_bytes()).hexdigest() for rel in m["files"]}
    (dst / MANIFEST).write_text(json.dumps(m, indent=1))
    load_bundle(dst, verify=True)
    return dst


# -- precise edits: the object API --------------------------------------------------------------------------
def edited(data: bytes, fn) -> bytes:
    """``data`` unpacked with the TFLite schema's object API, changed by ``fn(model)``, packed again."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as s
    m = s.ModelT.InitFromPackedBuf(bytearray(data), 0)
    fn(m)
    b = flatbuffers.Builder(len(data) + 1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _g(m):
    return m.subgraphs[0]


def _op(m, name):
    from ai_edge_litert import schema_py_generated as s
    code = getattr(s.BuiltinOperator, name)
    return next(op for op in _g(m).operators if max(m.operatorCodes[op.opcodeIndex].builtinCode,
                                                   m.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode) == code)


def _weights(m):
    """The first FULLY_CONNECTED's weight tensor (int8 (32, 16), per-channel quantized along axis 0)."""
    return _g(m).tensors[_op(m, "FULLY_CONNECTED").inputs[1]]


def _set(obj, **fields):
    for k, v in fields.items():
        setattr(obj, k, v)


def _beta(value):
    def fn(m):
        _op(m, "SOFTMAX").builtinOptions.beta = value
    return fn


def _other_options(m):
    from ai_edge_litert import schema_py_generated as s
    fc = _op(m, "FULLY_CONNECTED")
    fc.builtinOptionsType, fc.builtinOptions = s.BuiltinOptions.SoftmaxOptions, s.SoftmaxOptionsT()


SEMANTIC = [
    ("operator code", lambda m: _set(_g(m).operators[0], opcodeIndex=7), "names operator code 7"),
    ("op input", lambda m: _g(m).operators[0].inputs.__setitem__(0, 99), "input names tensor 99"),
    ("op output", lambda m: _g(m).operators[1].outputs.__setitem__(0, 99), "output names tensor 99"),
    ("graph output", lambda m: _set(_g(m), outputs=[99]), "its outputs name tensor 99"),
    ("buffer index", lambda m: _set(_g(m).tensors[0], buffer=99), "names buffer 99"),
    ("buffer size", lambda m: _set(m.buffers[_weights(m).buffer], data=m.buffers[_weights(m).buffer].data[:100]),
     "is a constant int8 [32, 16] of 512 B, and its buffer"),
    ("negative dim", lambda m: _set(_g(m).tensors[0], shape=[1, -16]), "negative dimension"),
    ("scales vs zero points", lambda m: _set(_weights(m).quantization, zeroPoint=[0] * 5),
     "32 quantization scales and 5 zero points"),
    ("per-channel count", lambda m: _set(_weights(m).quantization, scale=[0.1] * 5, zeroPoint=[0] * 5),
     "5 quantization scales for its 32 channels"),
    ("quantized axis", lambda m: _set(_weights(m).quantization, quantizedDimension=5), "quantized along axis 5"),
    ("NaN scale", lambda m: _weights(m).quantization.scale.__setitem__(3, float("nan")),
     "not a finite positive number (nan)"),
    ("zero point range", lambda m: _set(_g(m).tensors[_g(m).inputs[0]].quantization, zeroPoint=[300]),
     "zero point 300 outside the int8 range"),
    ("SOFTMAX without options", lambda m: _set(_op(m, "SOFTMAX"), builtinOptionsType=0, builtinOptions=None),
     "(SOFTMAX) has no builtin options"),
    ("SOFTMAX beta 0", _beta(0.0), "(SOFTMAX) has beta 0"),
    ("infinite option", _beta(float("inf")), "option Beta is inf"),
    ("options of another op", _other_options, "(FULLY_CONNECTED) carries builtin options of type 9"),
    ("no outputs", lambda m: _set(_g(m).operators[1], outputs=[]), "(FULLY_CONNECTED) has no output"),
    ("constant graph input", lambda m: _set(_g(m), inputs=[1]), "its input tensor 1 is a constant"),
    ("graph input twice", lambda m: _set(_g(m), inputs=[0, 0]), "its inputs [0, 0] name a tensor twice"),
    ("op writes a constant", lambda m: _g(m).operators[0].outputs.__setitem__(0, 2),
     "operator 0 (FULLY_CONNECTED) writes tensor 2, which is a constant"),
    ("op writes a graph input", lambda m: _g(m).operators[2].outputs.__setitem__(0, 0),
     "operator 2 (SOFTMAX) writes tensor 0, which is a graph input"),
    ("tensor written twice", lambda m: _g(m).operators[2].outputs.__setitem__(0, 4),
     "operator 2 (SOFTMAX) writes tensor 4, which is operator 1"),
    ("read before written", lambda m: _g(m).operators[1].inputs.__setitem__(1, 5),
     "operator 1 (FULLY_CONNECTED) reads tensor 5 before operator 2 writes it"),
    ("schema version", lambda m: _set(m, version=2), "schema version 2"),
    ("signature", lambda m: _set(m.signatureDefs[0].inputs[0], tensorIndex=99), "signature 0 input 0 names tensor 99"),
]


@pytest.mark.parametrize("case,fn,message", SEMANTIC, ids=[c[0] for c in SEMANTIC])
def test_inconsistent_models_are_refused(fuzz_models, case, fn, message):
    data = edited((fuzz_models / "mlp_int8.tflite").read_bytes(), fn)
    with pytest.raises(InvalidModelError, match="^m.tflite is not a valid TFLite model: .*" + _re(message)):
        TFLiteModel(data, "m.tflite")


def _re(text: str) -> str:
    import re
    return re.escape(text)


# -- precise edits: bytes -----------------------------------------------------------------------------------
def _u32(data: bytes, at: int) -> int:
    return int.from_bytes(data[at:at + 4], "little")


def _patch(data: bytes, at: int, value: int, size: int = 4, signed: bool = False) -> bytes:
    return data[:at] + value.to_bytes(size, "little", signed=signed) + data[at + size:]


def _root_field(data: bytes, voffset: int) -> int:
    """The position of the Model table's field at ``voffset`` (4 version, 8 subgraphs, ...)."""
    root = _u32(data, 0)
    vtable = root - int.from_bytes(data[root:root + 4], "little", signed=True)
    return root + int.from_bytes(data[vtable + voffset:vtable + voffset + 2], "little")


def _unterminated_name(data: bytes) -> bytes:
    at = data.index(b"StatefulPartitionedCall_1:0\x00") + len(b"StatefulPartitionedCall_1:0")
    return data[:at] + b"x" + data[at + 1:]


STRUCTURAL = [
    ("truncated", lambda d: d[:len(d) // 2], "the offset to Model.OperatorCodes points past the end of the file"),
    ("root past the end", lambda d: _patch(d, 0, len(d) + 64), "the offset to the root table points past the end"),
    ("misaligned root", lambda d: _patch(d, 0, _u32(d, 0) + 1), "Model is misaligned"),
    ("vtable outside", lambda d: _patch(d, _u32(d, 0), -(2 ** 30), signed=True), "the vtable of Model lies outside"),
    ("zero offset", lambda d: _patch(d, _root_field(d, 8), 0), "the offset to Model.Subgraphs is 0"),
    ("huge vector", lambda d: _patch(d, _root_field(d, 8) + _u32(d, _root_field(d, 8)), 2 ** 28),
     "Model.Subgraphs claims 268435456 elements"),
    ("string without NUL", _unterminated_name, "is not NUL-terminated"),
]


@pytest.mark.parametrize("case,fn,message", STRUCTURAL, ids=[c[0] for c in STRUCTURAL])
def test_broken_structure_is_refused(fuzz_models, case, fn, message):
    data = fn((fuzz_models / "mlp_int8.tflite").read_bytes())
    with pytest.raises(InvalidModelError, match="its flatbuffer structure is broken: .*" + _re(message)):
        TFLiteModel(data, "m.tflite")


def test_real_models_pass(fuzz_models):
    """No false alarm: the converter's float and int8 MLPs and every model of the shared Coral corpus (real
    models: MobileNet, DeepLab, PoseNet, compiled Edge TPU models) are read without complaint."""
    paths = [fuzz_models / "mlp_int8.tflite", fuzz_models / "mlp_float.tflite"]
    paths += sorted((SHARED / "edgetpu_pairs").rglob("*.tflite")) if (SHARED / "edgetpu_pairs").is_dir() else []
    for p in paths:
        m = TFLiteModel.from_file(p)
        assert m.main.ops and m.main.inputs and m.main.outputs, p


# -- report: the three IndexError sites ---------------------------------------------------------------------
REPORT_SITES = [   # where `edgehft report` raised IndexError before: partition/coral_predict.py, then partition/edgetpu.py (_own_refusal, and
    # predict's op output lookup) and cli/inspect.py, then cli_inspect.py (_print_tensors, --tensors)
    ("op input past the tensors", lambda m: _g(m).operators[0].inputs.__setitem__(0, 40), []),
    ("op output past the tensors", lambda m: _g(m).operators[2].outputs.__setitem__(0, 40), []),
    ("--tensors, op output past the tensors", lambda m: _g(m).operators[2].outputs.__setitem__(0, 40),
     ["--tensors"]),
]


@pytest.mark.parametrize("case,fn,flags", REPORT_SITES, ids=[c[0] for c in REPORT_SITES])
def test_report_refuses_inconsistent_models(fuzz_models, tmp_path, case, fn, flags):
    p = tmp_path / "m.tflite"
    p.write_bytes(edited((fuzz_models / "mlp_int8.tflite").read_bytes(), fn))
    r = CliRunner().invoke(main, ["report", str(p), *flags])
    assert r.exit_code == 3, (r.output, r.exception)
    assert isinstance(r.exception, SystemExit)
    text = " ".join(r.output.split())
    assert "is not a valid TFLite model" in text and "names tensor 40, and it has 6 tensors" in text


# -- a model that passes validation and still crashes LiteRT ------------------------------------------------
@pytest.fixture(scope="module")
def aborting_model(fuzz_models, tmp_path_factory) -> Path:
    """The int8 MLP with SOFTMAX beta 1e-9: valid, but LiteRT's reference kernels abort (SIGABRT) preparing
    it (their input multiplier must exceed 1)."""
    p = tmp_path_factory.mktemp("aborting") / "aborting.tflite"
    p.write_bytes(edited((fuzz_models / "mlp_int8.tflite").read_bytes(), _beta(1e-9)))
    TFLiteModel.from_file(p)                                 # passes validation
    return p


def test_a_crash_in_litert_is_a_bundle_error_from_an_isolated_child(aborting_model):
    from edgehft.runtime.isolate import check_models
    with pytest.raises(BundleError, match=r"LiteRT crashed \(SIGABRT\) while opening aborting.tflite on LiteRT's "
                                          r"reference kernels, in an isolated child process"):
        check_models([aborting_model])
    assert check_models([aborting_model], resolvers=("auto", "builtin")) == {"refusals": [], "io": []}


def test_compile_of_a_tflite_that_crashes_litert_is_exit_4(aborting_model, tmp_path):
    p = subprocess.run([*EDGEHFT, "compile", str(aborting_model), "--board", "cpu", "--out", str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 4, p.stderr                        # the code before: -6 (SIGABRT, the whole CLI)
    assert "LiteRT crashed (SIGABRT)" in " ".join(p.stderr.split()) and "Traceback" not in p.stderr
    assert not (tmp_path / "b").exists()


def test_compile_of_a_tflite_whose_ops_contradict_its_outputs_is_exit_4(fuzz_models, tmp_path):
    """An output declared (1, 131) that SOFTMAX makes (1, 3) (before: a numpy broadcast traceback, or exit 6
    about the compiler's own draft bundle)."""
    p = tmp_path / "m.tflite"
    p.write_bytes(edited((fuzz_models / "mlp_int8.tflite").read_bytes(), lambda m: _set(_g(m).tensors[5],
                                                                                         shape=[1, 131])))
    r = CliRunner().invoke(main, ["compile", str(p), "--board", "cpu", "--out", str(tmp_path / "b")])
    assert r.exit_code == 4, r.output
    assert ("m.tflite is inconsistent: output 'StatefulPartitionedCall_1:0' is declared int8 (1, 131), LiteRT "
            "makes it int8 (1, 3)") in " ".join(r.output.split())


def test_runtime_open_crashes_only_its_isolated_child(aborting_model, mlp_bundle, tmp_path):
    """The bundle's first open on LiteRT's reference kernels aborts in the child; the caller gets a
    BundleError and lives on (before: the caller itself died of SIGABRT)."""
    b = with_model(mlp_bundle, tmp_path / "b", aborting_model.read_bytes())
    script = ("import sys\nfrom edgehft import runtime\nfrom edgehft.errors import EdgeHFTError\n"
              f"try:\n    runtime.open({str(b)!r}, op_resolver='reference')\n"
              "except EdgeHFTError as exc:\n    print(type(exc).__name__, exc.args[0])\n    sys.exit(exc.exit_code)\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 6, (p.stdout, p.stderr)
    assert p.stdout.startswith(f"BundleError bundle {b}: LiteRT crashed (SIGABRT) while opening it"), p.stdout


def test_run_of_a_model_that_corrupted_litert_heap_is_exit_6(fuzz_models, mlp_bundle, tmp_path):
    """The second FULLY_CONNECTED reading the SOFTMAX's output as its weights (one flipped bit of an input
    index): LiteRT aborted `edgehft run` with "munmap_chunk(): invalid pointer" (exit -6)."""
    def late(m):
        _g(m).operators[1].inputs[1] = 5
    b = with_model(mlp_bundle, tmp_path / "b", edited((fuzz_models / "mlp_int8.tflite").read_bytes(), late))
    p = subprocess.run([*EDGEHFT, "run", str(b), "--golden"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 6, p.stderr
    assert "operator 1 (FULLY_CONNECTED) reads tensor 5 before operator 2 writes it" in " ".join(p.stderr.split())
    assert "Traceback" not in p.stderr


def test_litert_refusing_a_valid_model_is_exit_6(fuzz_models, mlp_bundle, tmp_path):
    """A SOFTMAX of version 99 passes validation; LiteRT has no kernel for it (before: a ValueError traceback,
    exit 1)."""
    def v99(m):
        m.operatorCodes[_op(m, "SOFTMAX").opcodeIndex].version = 99
    b = with_model(mlp_bundle, tmp_path / "b", edited((fuzz_models / "mlp_int8.tflite").read_bytes(), v99))
    p = subprocess.run([*EDGEHFT, "run", str(b), "--golden"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 6, p.stderr
    text = " ".join(p.stderr.split())
    assert "LiteRT cannot open the model (ValueError: Didn't find op for builtin opcode 'SOFTMAX' version '99'" in text
    assert "Traceback" not in p.stderr


def test_first_open_runs_once_per_bundle(mlp_bundle, cache, tmp_path):
    """The isolated first open is remembered: again in this process, and in another process through the marker
    in the cache directory; a bundle with other files runs its own."""
    from edgehft.boards import load_board
    from edgehft.runtime import isolate
    b = load_bundle(with_model(mlp_bundle, tmp_path / "b", (mlp_bundle / "model.tflite").read_bytes()))
    spec = load_board("cpu")
    assert isolate.first_open(b, spec, 2, {}) is True           # threads=2: not opened so yet in this module
    assert isolate.first_open(b, spec, 2, {}) is False
    markers = list((cache / "opened").iterdir())
    assert any(json.loads(m.read_text())["bundle"] == str(b.path) for m in markers)
    script = ("from edgehft.boards import load_board\nfrom edgehft.bundle import load_bundle\n"
              "from edgehft.runtime import isolate\n"
              f"print(isolate.first_open(load_bundle({str(b.path)!r}), load_board('cpu'), 2, {{}}))\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=os.environ)
    assert p.stdout.strip() == "False", p.stderr
    assert isolate.first_open(b, spec, 1, {"op_resolver": "reference"}) is True   # other options: its own


# -- the bit-flip fuzz --------------------------------------------------------------------------------------
def _mutants(data: bytes) -> list:
    return bit_flips(data, FUZZ_MUTANTS, FUZZ_SEED)


def _problems(name: str, bit: int, r: dict) -> list:
    where = f"{name} of the mutant with bit {bit} (byte {bit // 8}) flipped"
    if r.get("timeout"):
        return [f"{where}: no answer within 60 s"]
    if r.get("rc") is None or r["rc"] < 0:
        return [f"{where}: died (exit status {r.get('rc')})"]
    if r.get("uncaught") or "Traceback" in r.get("stderr", ""):
        return [f"{where}: traceback ({r.get('uncaught') or r['stderr'][-300:]})"]
    if r["rc"] not in ALLOWED[name]:
        return [f"{where}: exit {r['rc']}, not one of {sorted(ALLOWED[name])}: {r['stderr'][-300:]}"]
    return []


def test_bit_flip_fuzz(fuzz_models, mlp_bundle, tmp_path, capsys):
    """200 seeded single-bit flips of the int8 MLP, each through `run BUNDLE --golden` (the bundle re-hashed),
    `report X.tflite` and `compile X.tflite --board cpu`: a documented exit code, no traceback, no signal, no
    hang. The commands run through tests/tools/cli_batch.py (the CLI in a subprocess that is restarted after
    a crash; two in parallel); a few mutants also through the real `python -m edgehft`, which must agree."""
    mutants = _mutants((fuzz_models / "mlp_int8.tflite").read_bytes())
    jobs, names = [], []
    for k, (bit, data) in enumerate(mutants):
        w = tmp_path / f"m{k}"
        w.mkdir()
        (w / "x.tflite").write_bytes(data)
        shutil.copytree(mlp_bundle, w / "b")
        (w / "b" / "model.tflite").write_bytes(data)
        m = json.loads((w / "b" / MANIFEST).read_text())
        m["files"] = {rel: hashlib.sha256((w / "b" / rel).read_bytes()).hexdigest() for rel in m["files"]}
        (w / "b" / MANIFEST).write_text(json.dumps(m))
        for name, args in (("run", ["run", str(w / "b"), "--golden"]), ("report", ["report", str(w / "x.tflite")]),
                           ("compile", ["compile", str(w / "x.tflite"), "--board", "cpu", "--out", str(w / "c")])):
            jobs.append(args)
            names.append((name, bit, k))
    half = len(jobs) // 2
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as ex:
        parts = list(ex.map(lambda a: run_batch(*a), [(jobs[:half], tmp_path / "d0", dict(os.environ)),
                                                      (jobs[half:], tmp_path / "d1", dict(os.environ))]))
    results = parts[0] + parts[1]
    problems = [p for (name, bit, _), r in zip(names, results) for p in _problems(name, bit, r)]
    counts = {name: {} for name in ALLOWED}
    for (name, _, _), r in zip(names, results):
        counts[name][r.get("rc")] = counts[name].get(r.get("rc"), 0) + 1
    with capsys.disabled():
        print(f"\nbit-flip fuzz, {FUZZ_MUTANTS} mutants, exit codes: {counts}")
    assert not problems, "\n".join(problems[:20])
    assert counts["report"].get(3, 0) > FUZZ_MUTANTS // 4         # the validation refuses a good share of them
    assert counts["run"].get(6, 0) > FUZZ_MUTANTS // 4
    # the real CLI agrees with the batch driver on a sample (refused and accepted mutants)
    sample = [k for k in range(len(jobs)) if names[k][0] != "compile"][:12:3]
    for k in sample:
        p = subprocess.run([*EDGEHFT, *jobs[k]], capture_output=True, text=True, timeout=120)
        assert p.returncode == results[k]["rc"] and p.returncode >= 0, (jobs[k], p.stderr)
        assert "Traceback" not in p.stderr
