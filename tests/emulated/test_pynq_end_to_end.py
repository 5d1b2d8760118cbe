"""PYNQ boards end to end: compile here (TensorFlow venv), run in the board venv (.venv-board: pynq
4.0.0, numpy < 2, no TensorFlow) on the emulated board, and compare with the cpu board bit for bit."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import BOARD_PY, DEEPLOB, FEED_DAY1
from edgehft.compiler.pipeline import CompileOptions, compile_model

pytestmark = pytest.mark.needs("board-venv", "g++")

RUN_ON_BOARD = r"""
import json, sys
import numpy as np
from edgehft import runtime
from edgehft.bundle_checks import check_golden
from edgehft.runtime.litert import load_interpreter_module
bundle, xs_path, out_path = sys.argv[1:4]
xs = np.load(xs_path)
with runtime.open(bundle, emulate=True) as r:
    ys = np.stack([r.predict_raw(x)[0].copy() for x in xs])
    d = r.describe()
    golden = check_golden(r)
np.save(out_path, ys)
_, name, version = load_interpreter_module()
print(json.dumps({"emulated": d["emulated"], "steps": d["steps"], "starts": d["device"]["ips"],
                  "interpreter": d["interpreter"], "installed": f"{name} {version}", "golden": golden}))
"""


def _board(bundle: Path, xs: np.ndarray, tmp: Path) -> tuple[np.ndarray, dict]:
    np.save(tmp / "xs.npy", xs)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([str(BOARD_PY), "-c", RUN_ON_BOARD, str(bundle), str(tmp / "xs.npy"), str(tmp / "ys.npy")],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return np.load(tmp / "ys.npy"), json.loads(r.stdout.strip().splitlines()[-1])


def _cpu(bundle: Path, xs: np.ndarray | None = None, floats: np.ndarray | None = None):
    """The cpu board on the same int8 model (the pynq bundle's model.tflite): raw outputs for raw
    inputs ``xs``, or (raw inputs, raw outputs) for float windows ``floats``."""
    from edgehft.boards import load_board
    from edgehft.bundle import load_bundle
    from edgehft.runtime.cpu import Runner
    with Runner(load_bundle(bundle), load_board("cpu")) as r:
        if xs is not None:
            return np.stack([r.predict_raw(x)[0].copy() for x in xs])
        raw, ys = [], []
        for x in floats:
            r.predict(x)                              # quantizes into the interpreter's input
            raw.append(r.inputs[0].dest[0].copy())
            ys.append(r.outputs[0].src[0].copy())
        return np.stack(raw), np.stack(ys)


@pytest.fixture(scope="module")
def deeplob_pynq(tmp_path_factory):
    out = tmp_path_factory.mktemp("pynq") / "deeplob.pynq-z2"
    compile_model(DEEPLOB / "deeplob.keras", [FEED_DAY1], out, CompileOptions(board="pynq-z2"))
    return out


def test_deeplob_on_the_emulated_pynq_z2_equals_the_cpu_board(deeplob_pynq, deeplob_windows, tmp_path):
    xs = deeplob_windows["x"][:1000]
    assert len(xs) == 1000
    raw, cpu = _cpu(deeplob_pynq, floats=xs)
    ys, info = _board(deeplob_pynq, raw, tmp_path)
    assert info["emulated"] is True
    assert info["steps"] == ["cpu:litert", "fpga:lstm_int8", "cpu:litert", "fpga:dense_int8", "cpu:litert"]
    assert info["starts"]["lstm_int8_0"]["starts"] == 1 + len(raw)     # one weight load, then one per window
    assert np.array_equal(ys, cpu)
    # the ARM segments' interpreter, as the golden vectors record theirs (a refusal on another release names both)
    assert info["interpreter"] == info["installed"] + " BUILTIN+XNNPACK" == info["golden"]["path"]
    assert info["golden"]["ok"] and info["golden"]["matched"] == 16 and info["golden"]["compare"] == "exact"


def test_lstm_and_dense_only_model(models, tmp_path):
    out = tmp_path / "ld.kv260"
    compile_model(models / "k3_lstm_dense.keras", [models / "calib.npy"], out, CompileOptions(board="kv260"))
    rep = json.loads((out / "report.json").read_text())
    assert [o["placement"] for o in rep["ops"]] == ["accelerator", "accelerator"]
    xs = np.load(models / "calib.npy")[:200]
    raw, cpu = _cpu(out, floats=xs)
    ys, info = _board(out, raw, tmp_path)
    assert info["steps"] == ["fpga:lstm_int8", "fpga:dense_int8"]
    assert np.array_equal(ys, cpu)


FAULTS_ON_BOARD = r"""
import json, sys
import numpy as np
from edgehft import runtime
from edgehft.emulate import EmulatedBusError
bundle, xs_path = sys.argv[1:3]
xs = np.load(xs_path)
out = {}
with runtime.open(bundle, emulate=True) as r:
    good = [r.predict_raw(x)[0].copy() for x in xs]
    lstm = next(h for kind, st, h in r._steps if kind == "fpga" and st["kernel"] == "lstm_int8")
    lstm[1]["x"].flush = lambda: None                      # the driver forgets to flush the input
    stale = [r.predict_raw(x)[0].copy() for x in xs]
    out["forgotten_flush_equal"] = [bool(np.array_equal(a, b)) for a, b in zip(good, stale)]
with runtime.open(bundle, emulate=True) as r:
    ip = r.ips["lstm_int8"]
    offsets = dict(type(ip).OFFSETS)
    type(ip).OFFSETS = {**offsets, "x": (0x44, 64)}        # x pointer written one word too low
    try:
        wrong = [r.predict_raw(x)[0].copy() for x in xs]
        out["wrong_offset_equal"] = [bool(np.array_equal(a, b)) for a, b in zip(good, wrong)]
    except EmulatedBusError as exc:
        out["wrong_offset_error"] = str(exc)
    finally:
        type(ip).OFFSETS = offsets
print(json.dumps(out))
"""


def test_forgotten_flush_and_wrong_register_offset_fail(deeplob_pynq, deeplob_windows, tmp_path):
    raw, _ = _cpu(deeplob_pynq, floats=deeplob_windows["x"][:6])
    np.save(tmp_path / "xs.npy", raw)
    r = subprocess.run([str(BOARD_PY), "-c", FAULTS_ON_BOARD, str(deeplob_pynq), str(tmp_path / "xs.npy")],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # The device never sees the new windows: the LSTM keeps reading the stale buffer (the first call
    # after the fault still sees the previous window's input, so at most it can match by chance).
    assert out["forgotten_flush_equal"].count(False) >= 4
    assert "wrong_offset_error" in out or out["wrong_offset_equal"].count(False) >= 4
    if "wrong_offset_error" in out:
        assert "outside" in out["wrong_offset_error"] or "pointer" in out["wrong_offset_error"]


REFUSALS_ON_BOARD = r"""
import json, sys, tomllib
from pathlib import Path
from edgehft import runtime
from edgehft.boards import load_board
from edgehft.emulate import EmulatedPynqDevice, install, write_placeholder_bit
from edgehft.emulate.hwh import build_hwh, interface_path, write_emulation_hwh
from edgehft.errors import EdgeHFTError
bundle, tmp = sys.argv[1], Path(sys.argv[2])
out = {}
def attempt(key, **kw):
    try:
        with runtime.open(bundle, **kw):
            out[key] = "opened"
    except EdgeHFTError as exc:
        out[key] = f"{type(exc).__name__}: {exc.args[0]}"
attempt("no_overlay", overlay=tmp / "nope.bit")
lonely = tmp / "lonely.bit"; lonely.write_bytes(b"placeholder")
attempt("no_hwh", overlay=lonely)
kv = write_emulation_hwh(Path(load_board("kv260").path), interface_path(), tmp / "kv260")
attempt("wrong_part", overlay=write_placeholder_bit(kv))
iface = tomllib.loads(interface_path().read_text())
bumped = {k: {**v, "vlnv": v["vlnv"][:-3] + "1.1", "version": "1.1"} for k, v in iface.items()}
board = tomllib.loads(Path(load_board("pynq-z2").path).read_text())
hwh = tmp / "z2v11" / (board["overlay"]["name"] + ".hwh"); hwh.parent.mkdir()
hwh.write_text(build_hwh(board, bumped))
with install(EmulatedPynqDevice(hwh, {})):
    attempt("ip_version", overlay=write_placeholder_bit(hwh))
import hashlib, shutil
cut = tmp / "cut"; shutil.copytree(bundle, cut)
w = cut / "fpga" / "op31.weights.bin"; w.write_bytes(w.read_bytes()[:-100])
man = json.loads((cut / "manifest.json").read_text())
man["files"]["fpga/op31.weights.bin"] = hashlib.sha256(w.read_bytes()).hexdigest()
(cut / "manifest.json").write_text(json.dumps(man))
bundle = cut
attempt("truncated_weights", emulate=True)
print(json.dumps(out))
"""


def test_pynq_runtime_refusals(deeplob_pynq, tmp_path):
    r = subprocess.run([str(BOARD_PY), "-c", REFUSALS_ON_BOARD, str(deeplob_pynq), str(tmp_path)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["no_overlay"].startswith("BoardUnavailableError: no overlay bitstream")
    assert out["no_hwh"] == "BoardUnavailableError: lonely.bit has no lonely.hwh next to it"
    assert out["wrong_part"].startswith("BoardUnavailableError: edgehft_kv260.hwh was built for part xck26")
    assert "dense_int8_0 is edgehft:hls:dense_int8:1.1; this edgehft drives edgehft:hls:dense_int8:1.0" \
        in out["ip_version"]
    assert out["truncated_weights"].startswith("BundleError:") and "fpga/op31.weights.bin holds 65436 B" \
        in out["truncated_weights"]


def test_pynq_bundle_without_pynq_says_how_to_get_it(deeplob_pynq):
    from edgehft import runtime
    from edgehft.errors import BoardUnavailableError
    with pytest.raises(BoardUnavailableError, match="pynq is not installed") as err:
        runtime.open(deeplob_pynq)
    assert "numpy < 2" in err.value.hint


STEPS_EDITS_ON_BOARD = r"""
import json, sys
from pathlib import Path
from edgehft import runtime
results = {}
for d in sorted(Path(sys.argv[1]).iterdir()):
    try:
        runtime.open(d, emulate=True).close()
        results[d.name] = "opened"
    except Exception as exc:
        results[d.name] = f"{type(exc).__name__}: {exc.args[0] if exc.args else exc}"
print(json.dumps(results))
"""


def _steps_edit(src: Path, dst: Path, edit) -> None:
    from edgehft.bundle import MANIFEST, sha256_file
    shutil.copytree(src, dst)
    g = json.loads((dst / "steps.json").read_text())
    lstm = next(s for s in g["steps"] if s.get("kernel") == "lstm_int8")
    dense = next(s for s in g["steps"] if s.get("kernel") == "dense_int8")
    edit(dst, lstm, dense)
    (dst / "steps.json").write_text(json.dumps(g))
    m = json.loads((dst / MANIFEST).read_text())
    m["files"] = {rel: sha256_file(dst / rel) for rel in m["files"]}
    (dst / MANIFEST).write_text(json.dumps(m))


def test_steps_json_that_does_not_fit_its_kernels_is_refused(deeplob_pynq, tmp_path):
    """A hostile steps.json (the hashes re-recorded) is refused before any kernel call, exit 6: an unknown
    placement or kernel, dims or slot out of range, lengths or a params header that its dims do not read
    (each of these reached the kernel before: an out-of-bounds DMA read on a board)."""
    def trunc(d, lstm, dense):
        (d / lstm["weights"]).write_bytes((d / lstm["weights"]).read_bytes()[:100])
        lstm["weights_len"] = 100
    edits = {
        "placement": (lambda d, lstm, dense: lstm.update(placement="FPGA"), "is not a CPU segment or a kernel"),
        "kernel": (lambda d, lstm, dense: lstm.update(kernel="conv_int8"), "is not a CPU segment or a kernel"),
        "trunc": (trunc, "weights_len 100 is not the 65536 B its dims read"),
        "negative": (lambda d, lstm, dense: lstm["dims"].update(steps=-100, n_in=-192), "must be positive integers"),
        "slot": (lambda d, lstm, dense: dense.update(slot=2 ** 40), "outside the overlay's 4 slots"),
        "n_out": (lambda d, lstm, dense: dense["dims"].update(n_out=64), "is not the"),
        "requantize": (lambda d, lstm, dense: dense.update(requantize="nope"), "header"),
        "params_len": (lambda d, lstm, dense: dense.update(params_len=float(dense["params_len"])), "not an integer"),
        "len_str": (lambda d, lstm, dense: lstm.update(weights_len=str(lstm["weights_len"])), "weights_len '65536'"),
        "swap": (lambda d, lstm, dense: lstm.update(weights=lstm["params"]), "steps.json says 65536"),
    }
    root = tmp_path / "edits"
    root.mkdir()
    for name, (edit, _) in edits.items():
        _steps_edit(deeplob_pynq, root / name, edit)
    r = subprocess.run([str(BOARD_PY), "-c", STEPS_EDITS_ON_BOARD, str(root)], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for name, (_, message) in edits.items():
        assert got[name].startswith("BundleError:") and message in got[name], (name, got[name])
