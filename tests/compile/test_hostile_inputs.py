"""The bad-input corpus for what `run` and `bench` read besides the bundle: tick files, tick times and
options (generated here, small). Each entry runs `python -m edgehft` in a fresh process and must end with
its documented exit code and one error line: no traceback, no signal, no hang (tests/hostile.py). The
bundle and manifest corpus is tests/unit/test_bundle_hostile.py; model files, tests/compile/test_model_validation.py."""
import io
import zipfile

import numpy as np
import pytest

from hostile import assert_refused, run_cli

pytestmark = pytest.mark.slow

WINDOW = (100, 40, 1)                   # DeepLOB's input window


def _npy_bytes(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=True)
    return buf.getvalue()


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def _forged_header(path):
    """A valid .npy of 2 windows whose header claims 10^12 windows (about 16 PB)."""
    raw = _npy_bytes(np.zeros((2, *WINDOW), np.float32))
    head = b"(2, 100, 40, 1)"
    forged = b"(1000000000000, 100, 40, 1)"
    header_end = raw.index(b"\n") + 1
    header = raw[10:header_end].replace(head, forged)
    header = header.rstrip(b"\n").rstrip(b" ")
    pad = (-(10 + len(header) + 1)) % 64
    header = header + b" " * pad + b"\n"
    out = raw[:8] + len(header).to_bytes(2, "little") + header + raw[header_end:]
    path.write_bytes(out)
    return path


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _saved(path, a):
    np.save(path, a)
    return path


def _flipped(path, src: bytes, at: float):
    data = bytearray(src)
    data[int(len(data) * at)] ^= 0x55
    path.write_bytes(bytes(data))
    return path


def _corpus(tmp):
    """(name, file maker, exit code, message) for tick files."""
    x = np.random.default_rng(0).standard_normal((12, *WINDOW)).astype(np.float32)
    t = np.arange(12, dtype=np.int64) * 1_000_000
    good = _npz(tmp / "good.npz", x=x, t_ns=t)
    nan_x = x.copy()
    nan_x[5, 3, 2, 0] = np.nan
    big = x.astype(np.float64)
    big[7, 0, 0, 0] = 1e300
    nan_t = t.astype(np.float64)
    nan_t[4] = np.nan
    back_t = t.copy()
    back_t[6] = back_t[2]
    obj = np.empty(3, dtype=object)
    obj[:] = [1, "a", None]
    return [
        ("truncated.npz", lambda p: _write(p, good.read_bytes()[: len(good.read_bytes()) // 2]),
         3, "is not a readable numpy file"),
        ("bitflip.npz", lambda p: _flipped(p, good.read_bytes(), 0.5), 3, "not a readable numpy file"),
        ("empty.npy", lambda p: _write(p, b""), 3, "not a readable numpy file"),
        ("garbage.npy", lambda p: _write(p, b"\x93NUMPY\x01\x00\xff\xff{{{{"), 3, "not a readable numpy file"),
        ("petabytes.npy", lambda p: _forged_header(p), 3, "its header claims"),
        ("pickled.npy", lambda p: _write(p, _npy_bytes(obj)), 3, "holds Python objects"),
        ("t2d.npz", lambda p: _npz(p, x=x, t_ns=t.reshape(3, 4)), 3, "t_ns must be one tick time per window"),
        ("tshort.npz", lambda p: _npz(p, x=x, t_ns=t[:5]), 3, "t_ns must be one tick time per window"),
        ("tnan.npz", lambda p: _npz(p, x=x, t_ns=nan_t), 3, "t_ns holds NaN or infinity at index 4"),
        ("tback.npz", lambda p: _npz(p, x=x, t_ns=back_t), 3, "tick times go backwards at window 6"),
        ("nanwin.npy", lambda p: _saved(p, nan_x), 3, "window 5 (of 12) holds NaN"),
        ("f64big.npy", lambda p: _saved(p, big), 3, "window 7 (of 12) holds NaN, infinity or values beyond"),
        ("scalar.npy", lambda p: _saved(p, np.float32(1)), 3, "expected a non-empty numeric array"),
        ("nowindows.npy", lambda p: _saved(p, np.zeros((0, *WINDOW), np.float32)), 3,
         "expected a non-empty numeric array"),
        ("strings.npy", lambda p: _saved(p, np.array([["a", "b"]])), 3, "expected a non-empty numeric array"),
        ("nox.npz", lambda p: _npz(p, a=x, b=x), 3, "needs an array named 'x'"),
        ("shape.npy", lambda p: _saved(p, np.zeros((3, 10, 4), np.float32)), 3, "the model takes (N, 100, 40, 1)"),
        ("zipbomb.npz", lambda p: _zip_claiming(p), 3, "its header claims"),
        ("tu64.npz", lambda p: _npz(p, x=x, t_ns=np.full(12, 2**64 - 1, np.uint64)), 3, "exceed int64"),
    ]


def _zip_claiming(path):
    """An .npz whose member's header claims far more data than the member holds."""
    raw = _forged_header(path.with_suffix(".member")).read_bytes()
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x.npy", raw)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile-ticks")
    return [(name, make(tmp / name), code, msg) for name, make, code, msg in _corpus(tmp)]


def test_tick_file_corpus(deeplob_bundle, corpus):
    """Each hostile tick file, through `run` and `bench`: exit 3, the reason, nothing else."""
    tried = 0
    for name, path, code, message in corpus:
        for cmd in (["run", deeplob_bundle, "--ticks", path], ["bench", deeplob_bundle, "--ticks", path,
                                                               "--samples", "5", "--warmup", "0"]):
            assert_refused(run_cli(*cmd, timeout=60), code, message)
            tried += 1
    assert tried == 2 * len(corpus) == 38


def test_recorded_replay_caps_absurd_gaps(deeplob_bundle, tmp_path):
    """A gap of 10^18 ns (31 years) between two ticks: replayed as 1 s and said so, not slept through."""
    x = np.random.default_rng(1).standard_normal((4, *WINDOW)).astype(np.float32)
    t = np.array([0, 1_000, 10**18, 10**18 + 1_000], np.int64)
    out = run_cli("bench", deeplob_bundle, "--ticks", _npz(tmp_path / "gap.npz", x=x, t_ns=t), "--replay",
                  "recorded", "--samples", "4", "--warmup", "0", timeout=60)
    assert_refused(out, 0)
    assert "1 recorded gap(s) longer than 1 s (the longest 1e+09 s) were replayed as 1 s" in out.text


@pytest.mark.parametrize("args,code,message", [
    (["--threads", "100000"], 3, "this machine has"),
    (["--threads", "0"], 2, "--threads"),
    (["--plot", "/nonexistent-dir/lat.png"], 2, "the directory /nonexistent-dir does not exist"),
    (["--plot", "/proc/version"], 2, "the plot is a PNG file"),
    (["--plot", "/proc/lat.png"], 2, "cannot write a file there"),
    (["--affinity", "1180591620717411303424"], 2, "expected CPU ids"),
    (["--affinity", ","], 2, "expected CPU ids"),
    (["--samples", "1000000000000"], 2, "--samples"),
])
def test_bench_options_are_bounded(deeplob_bundle, tmp_path, args, code, message):
    x = np.zeros((3, *WINDOW), np.float32)
    np.save(tmp_path / "w.npy", x)
    out = run_cli("bench", deeplob_bundle, "--ticks", tmp_path / "w.npy", "--samples", "3", *args, timeout=60)
    assert_refused(out, code, message)


@pytest.mark.parametrize("role,index,message", [("inputs", 99, "is tensor 99, which is not an input of the model"),
                                                ("outputs", 0, "which is not an output of the model")])
def test_a_tensor_index_the_model_does_not_have(deeplob_bundle, tmp_path, role, index, message):
    """The manifest names a tensor the model lacks (or one of the other role): refused when the runtime
    opens the model, before any buffer is touched."""
    import json
    import shutil
    from edgehft.bundle import MANIFEST
    b = shutil.copytree(deeplob_bundle, tmp_path / "b")
    m = json.loads((b / MANIFEST).read_text())
    m[role][0]["index"] = index
    (b / MANIFEST).write_text(json.dumps(m))
    assert_refused(run_cli("run", b, "--golden", timeout=60), 6, message)


@pytest.mark.parametrize("report", [{"ops": "not a list"}, {"board": ["x"], "verdict": 5}, {}])
def test_a_report_json_of_another_schema(deeplob_bundle, tmp_path, report):
    """`edgehft report BUNDLE` on a report.json that is JSON but not edgehft's report: exit 6, no traceback."""
    import json
    import shutil
    from edgehft.bundle import MANIFEST, sha256_file
    b = shutil.copytree(deeplob_bundle, tmp_path / "b")
    (b / "report.json").write_text(json.dumps(report))
    m = json.loads((b / MANIFEST).read_text())
    m["files"]["report.json"] = sha256_file(b / "report.json")
    (b / MANIFEST).write_text(json.dumps(m))
    assert_refused(run_cli("report", b, timeout=60), 6, "report.json is not an edgehft report")


def _rehashed_copy(src, dst, mutate):
    import json
    import shutil
    from edgehft.bundle import MANIFEST, sha256_file
    b = shutil.copytree(src, dst)
    mutate(b)
    m = json.loads((b / MANIFEST).read_text())
    m["files"] = {rel: sha256_file(b / rel) for rel in m["files"] if (b / rel).is_file()}
    (b / MANIFEST).write_text(json.dumps(m))
    return b


def test_a_golden_npz_with_a_shadow_member(deeplob_bundle, tmp_path):
    """golden.npz holds outputs/signal.npy (valid, header-checked) and outputs/signal (raw bytes), which is
    what numpy's NpzFile returns for the key: refused, exit 6."""
    def shadow(b):
        with zipfile.ZipFile(b / "golden.npz", "a") as zf:
            zf.writestr("outputs/signal", b"not an array")
    b = _rehashed_copy(deeplob_bundle, tmp_path / "b", shadow)
    assert_refused(run_cli("run", b, "--golden", timeout=60), 6, "not .npy arrays, or are named twice")


def test_a_manifest_that_is_a_directory(deeplob_bundle, tmp_path):
    import shutil
    b = shutil.copytree(deeplob_bundle, tmp_path / "b")
    (b / "manifest.json").unlink()
    (b / "manifest.json").mkdir()
    assert_refused(run_cli("run", b, "--golden", timeout=60), 6, "manifest.json")


@pytest.mark.parametrize("text", ["[bold red]x[/]", "[/]", "\x1b]0;PWNED\x07\x1b[2J"])
def test_strings_from_a_bundle_are_printed_as_text(deeplob_bundle, tmp_path, text):
    """Markup or terminal control codes in report.json or in a manifest name reach the terminal as text:
    `report` exits 0 (rich does not choke on the markup), errors stay one line, no raw ESC byte."""
    import json
    def edit_report(b):
        r = json.loads((b / "report.json").read_text())
        r["notes"].append(text)
        r["ops"][0]["reason"] = text
        (b / "report.json").write_text(json.dumps(r))
    b = _rehashed_copy(deeplob_bundle, tmp_path / "r", edit_report)
    out = run_cli("report", b, timeout=60)
    assert_refused(out, 0)
    assert "\x1b" not in out.stdout + out.stderr
    def edit_name(b):
        m = json.loads((b / "manifest.json").read_text())
        m["inputs"][0]["index"] = 999
        m["inputs"][0]["name"] = "lob" + text
        (b / "manifest.json").write_text(json.dumps(m))
    b = _rehashed_copy(deeplob_bundle, tmp_path / "n", edit_name)
    out = run_cli("run", b, "--golden", timeout=60)
    assert out.returncode == 6 and "\x1b" not in out.stdout + out.stderr
    assert sum(line.startswith("error:") for line in out.stderr.splitlines()) == 1


def test_the_box_refuses_an_unlisted_fifo(deeplob_bundle, tmp_path):
    """A staged bundle with a FIFO the manifest does not list: verify on the box refuses it (exit 9)."""
    import os
    import shutil
    from edgehft.deploy.store import Store
    from edgehft.errors import DeployError
    store = Store(tmp_path / "install")
    vid = "20261201T000000Z-0123456789ab-cdef"
    staged = store.incoming / vid
    shutil.copytree(deeplob_bundle, staged)
    os.mkfifo(staged / "features" / "pipe")
    with pytest.raises(DeployError, match=r"files not in the manifest: features/pipe") as exc:
        store.verify(vid)
    assert exc.value.exit_code == 9
