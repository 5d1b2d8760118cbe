"""``edgehft serve`` (issue 17 item 2): the in-process server as a sidecar process on a Unix datagram socket, driven
by the reference client (edgehft/serving/client.py) on an install dir filled with ``install_local`` (no SSH). The
example MLP compiled ``--quant float`` for the cpu board is served; the client's outputs equal ``runner.predict``'s
bit for bit, bad windows come back as predict's own errors, garbage does not stop the loop, a second version is
shadow-run on the client's calls and swapped in, the client rolls back, SIGTERM/SIGINT exit 0 and remove the socket.
No timing assertions (benchmarks/serve_sidecar.py measures the round trip)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import ROOT
from deploy_box import resign
from edgehft import runtime
from edgehft.cli import main
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.deploy.local import install_local
from edgehft.errors import BoardUnavailableError, DTypeError, InputError, NonFiniteInputError, ShapeError
from edgehft.serving import sidecar
from edgehft.serving.client import SidecarClient, SidecarUnavailableError, error_from_reply

pytestmark = pytest.mark.slow
FAST = dict(calib_windows=64, drift_windows=64, golden_count=8)
SHADOW = ("--shadow-calls", "30", "--shadow-seconds", "30", "--budget-p99-us", "1e9", "--budget-p999-us", "1e9")


@pytest.fixture(scope="module")
def versions(mlp, tmp_path_factory):
    """{"v1", "v2"}: the MLP's float bundle and a re-hashed copy (same model, another version id)."""
    work = tmp_path_factory.mktemp("sidecar")
    v1 = work / "mlp.float"
    compile_model(mlp / "mlp.keras", [mlp / "x.npy"], v1, CompileOptions(board="cpu", quant="float", **FAST))
    return {"v1": v1, "v2": resign(v1, work / "mlp.float.v2", tag="v2")}


@pytest.fixture
def windows(mlp):
    return np.load(mlp / "x.npy")[:50]


class ServeProcess:
    """``edgehft serve ROOT --json`` as a subprocess; ``events`` the JSON lines it printed so far."""

    def __init__(self, root, *args):
        self.root, self.sock = root, str(root / "serve.sock")
        self.proc = subprocess.Popen([sys.executable, "-m", "edgehft", "serve", str(root), "--json", *args],
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events: list = []
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for("listening", timeout=60)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def event(self, kind, version=None):
        return next((e for e in self.events if e["event"] == kind and version in (None, e["version"])), None)

    def wait_for(self, kind, version=None, timeout=60.0) -> dict:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            e = self.event(kind, version)
            if e is not None:
                return e
            if self.proc.poll() is not None:
                time.sleep(0.2)                    # the reader's last lines
                e = self.event(kind, version)
                if e is not None:
                    return e
                raise AssertionError(f"sidecar exited {self.proc.returncode}: {self.proc.stderr.read()}")
            time.sleep(0.02)
        raise AssertionError(f"no {kind} event within {timeout} s: {self.events}")

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)


@pytest.fixture
def served(versions, tmp_path):
    """(ServeProcess, version id of v1, install dir): v1 installed and served."""
    root = tmp_path / "box"
    vid = install_local(root, versions["v1"])["version"]
    car = ServeProcess(root, *SHADOW)
    yield car, vid, root
    if car.proc.poll() is None:
        car.proc.kill()
        car.proc.wait()


def _raised(fn, *args):
    try:
        fn(*args)
    except Exception as exc:                   # the error is what the test compares
        return exc
    raise AssertionError(f"{fn} did not raise")


def test_client_predict_equals_in_process_predict_and_bad_windows_raise_its_errors(served, windows):
    car, vid, root = served
    assert car.event("serving", vid)["plan"] == "float"
    assert oct(os.stat(car.sock).st_mode & 0o777) == "0o600"
    with SidecarClient(car.sock) as c, runtime.open(root / "versions" / vid) as r:
        for x in windows[:20]:
            got, want = c.predict(x), r.predict(x)
            assert got.dtype == want.dtype == np.float32 and got.shape == want.shape == (1, 1)
            assert np.array_equal(got, want)
        assert np.array_equal(c.predict(windows[3][None]), r.predict(windows[3][None]))     # (1, 64) too
        nan = windows[0].copy()
        nan[5] = np.nan
        bad = [(windows[0][:10],), (nan,), (windows[0].astype(np.int32),), (windows[0], windows[1])]
        for args in bad:
            got, want = _raised(c.predict, *args), _raised(r.predict, *args)
            assert type(got) is type(want) and got.exit_code == want.exit_code == 3
            assert str(got) == str(want)                                   # message and hint
            assert np.array_equal(c.predict(windows[1]), r.predict(windows[1]))
        assert [type(_raised(c.predict, *a)) for a in bad[:3]] == [ShapeError, NonFiniteInputError, DTypeError]
        assert isinstance(_raised(c.predict, [0.0] * 64), DTypeError)   # not an array: refused by the client
        st = c.status()
    assert (st["active"], st["previous"]) == (vid, None)
    assert st["inputs"] == [{"shape": [1, 64], "dtype": "float32"}]
    assert st["counters"]["predictions"] == 25 and st["counters"]["errors"] == 7 and st["counters"]["malformed"] == 0


def test_garbage_datagrams_do_not_stop_the_sidecar(served, windows):
    car, vid, root = served
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as anon:                # no sender address: dropped
        anon.sendto(b"not a request", car.sock)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("")
        s.settimeout(10)
        header = sidecar.HEADER.pack(sidecar.MAGIC, sidecar.VERSION, sidecar.PREDICT, 1, 77)
        replies = []
        for dgram in (b"xy", b"garbage!" * 4, header, header + b"\x63" * 40 + b"\0" * 8,
                      sidecar.HEADER.pack(sidecar.MAGIC, sidecar.VERSION, 9, 0, 78)):
            s.sendto(dgram, car.sock)
            replies.append(s.recv(4096))
    for rep in replies:
        magic, version, status, count, _ = sidecar.HEADER.unpack_from(rep, 0)
        assert (magic, version, status, count) == (sidecar.MAGIC, 1, 3, 0)
        err = error_from_reply(status, rep[sidecar.HEADER.size:])
        assert type(err) is InputError and err.args[0].startswith("malformed request: ")
    assert sidecar.HEADER.unpack_from(replies[2], 0)[4] == 77                       # the reply names the request
    with SidecarClient(car.sock) as c, runtime.open(root / "versions" / vid) as r:
        assert np.array_equal(c.predict(windows[0]), r.predict(windows[0]))
        counters = c.status()["counters"]
    assert counters["malformed"] == 6 and counters["dropped"] == 1 and counters["predictions"] == 1


def test_a_second_version_is_shadow_run_on_the_clients_calls_then_swapped_and_rolled_back(served, versions,
                                                                                           windows):
    car, v1, root = served
    seen = {"calls": 0, "failed": [], "wrong": 0}
    stop = threading.Event()
    with runtime.open(root / "versions" / v1) as r:
        want = [r.predict(x).copy() for x in windows]

    def caller():
        with SidecarClient(car.sock) as c:
            while not stop.is_set():
                i = seen["calls"] % len(windows)
                try:
                    seen["wrong"] += not np.array_equal(c.predict(windows[i]), want[i])
                except Exception as exc:     # a failed call fails the test below, with what it was
                    seen["failed"].append(repr(exc))
                seen["calls"] += 1
    t = threading.Thread(target=caller)
    t.start()
    try:
        v2 = install_local(root, versions["v2"])["version"]
        swapped = car.wait_for("swapped", v2, timeout=120)
        time.sleep(0.2)
    finally:
        stop.set()
        t.join()
    assert car.event("refused") is None and swapped["from_version"] == v1
    shadow = car.event("shadow", v2)
    assert shadow["ok"] and shadow["live_calls"] == 30 and shadow["rel_mae"] == 0.0
    assert seen["failed"] == [] and seen["wrong"] == 0 and seen["calls"] > 30
    with SidecarClient(car.sock) as c:
        st = c.status()
        assert (st["active"], st["previous"]) == (v2, v1) and st["counters"]["predictions"] == seen["calls"]
        assert c.rollback() == v1
        st = c.status()
        assert (st["active"], st["previous"]) == (v1, v2)
        assert np.array_equal(c.predict(windows[4]), want[4])
        assert car.wait_for("rolled_back", v1)["why"] == "asked by a sidecar client"
        assert c.rollback() == v2                    # and back: the other one is warm too


def test_spin_on_both_sides_answers_the_same_and_stops_on_a_signal(versions, windows, tmp_path):
    """``edgehft serve --spin`` (busy-polling its socket) and ``SidecarClient(spin=True)``: the same outputs as
    runner.predict, bad windows' errors, a client timeout when nothing answers, SIGTERM exit 0."""
    root = tmp_path / "box"
    vid = install_local(root, versions["v1"])["version"]
    car = ServeProcess(root, *SHADOW, "--spin")
    try:
        assert car.event("listening")["spin"] is True
        with SidecarClient(car.sock, spin=True) as c, runtime.open(root / "versions" / vid) as r:
            for x in windows[:20]:
                assert np.array_equal(c.predict(x), r.predict(x))
            assert isinstance(_raised(c.predict, windows[0][:10]), ShapeError)
            assert np.array_equal(c.predict(windows[2]), r.predict(windows[2]))
            assert c.status()["counters"]["predictions"] == 21
        assert car.stop() == 0 and not os.path.exists(car.sock)
    finally:
        if car.proc.poll() is None:
            car.proc.kill()
            car.proc.wait()
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)       # bound, never answers
    mute.bind(str(tmp_path / "mute.sock"))
    with mute, SidecarClient(tmp_path / "mute.sock", timeout=0.3, spin=True) as c:
        t0 = time.monotonic()
        assert isinstance(_raised(c.predict, windows[0]), SidecarUnavailableError)
        assert 0.3 <= time.monotonic() - t0 < 5.0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_it_with_exit_0_and_removes_the_socket(served, windows, sig):
    car, vid, _ = served
    with SidecarClient(car.sock, timeout=2.0) as c:
        c.predict(windows[0])
        assert car.stop(sig) == 0
        assert not os.path.exists(car.sock)
        stopped = car.wait_for("stopped")
        assert stopped["why"] == sig.name and stopped["counters"]["predictions"] == 1
        assert isinstance(_raised(c.predict, windows[0]), SidecarUnavailableError)


def test_start_up_failures_have_their_exit_codes(served, tmp_path):
    """Nothing deployed 3, a live sidecar on the socket 7, a --socket that is not a socket 3, a --core not allowed
    3: the one JSON line is the error; the socket is claimed before the model opens, so nothing says "serving" and
    nothing is appended to the live sidecar's --events file."""
    car, _, root = served

    def last(res):
        return json.loads(res.output.splitlines()[-1])
    cli = CliRunner()
    empty = tmp_path / "empty"
    empty.mkdir()
    res = cli.invoke(main, ["serve", str(empty), "--json"])
    assert res.exit_code == 3 and "nothing is deployed" in last(res)["error"]
    log = tmp_path / "events.jsonl"
    res = cli.invoke(main, ["serve", str(root), "--json", "--events", str(log)])  # the live sidecar's socket
    assert res.exit_code == 7 and "another process serves on it" in last(res)["error"]
    assert len(res.output.splitlines()) == 1 and not log.exists()
    (tmp_path / "plain").write_text("")
    res = cli.invoke(main, ["serve", str(root), "--socket", str(tmp_path / "plain"), "--json"])
    assert res.exit_code == 3 and "is not a socket" in last(res)["error"] and len(res.output.splitlines()) == 1
    res = cli.invoke(main, ["serve", str(root), "--core", str(max(os.sched_getaffinity(0)) + 1), "--json"])
    assert res.exit_code == 3 and "not a CPU this process may run on" in last(res)["error"]
    with SidecarClient(car.sock) as c:                                            # still serving
        assert c.status()["counters"]["requests"] == 1


def test_the_datagram_limit_is_checked_against_the_model():
    """A request of the MLP's (1, 64) float32 window is 16 + 40 + 256 bytes, its (1, 1) reply 16 + 40 + 8; a window
    over the limit is refused with the sizes; the limit measured here passes a datagram of its own size."""
    assert sidecar.check_fits([((1, 64), "float32")], [((1, 1), "float32")], 312) == (312, 64)
    assert sidecar.check_fits([((1, 64), "int8")], [((1, 1), "int8")], 312) == (312, 64)    # float32 windows
    err = _raised(sidecar.check_fits, [((1, 100, 40), "float32")], [((1, 3), "float32")], 16_000)
    assert isinstance(err, BoardUnavailableError) and err.exit_code == 7
    assert "request is 16056 bytes, over the largest Unix datagram here (16000 bytes)" in str(err)
    limit = sidecar.max_datagram(65536)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with a, b:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
        assert a.send(b"\0" * limit) == limit and len(b.recv(limit + 1)) == limit
        with pytest.raises(OSError):
            a.send(b"\0" * (limit + 1), socket.MSG_DONTWAIT)


@pytest.mark.parametrize("joined", [False, True], ids=["stdout", "stdout-and-stderr"])
def test_a_closed_stdout_does_not_stop_it(versions, windows, tmp_path, joined):
    """``edgehft serve ... | head -1`` (and ``2>&1 | head -1``): the reader goes away after the first line; the
    sidecar says so once on stderr (when that is still open), keeps serving (events to --events only, no traceback)
    and still exits 0 on SIGTERM, removing the socket."""
    root = tmp_path / "box"
    install_local(root, versions["v1"])
    log = tmp_path / "events.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "edgehft", "serve", str(root), "--events", str(log)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT if joined else subprocess.PIPE, text=True)
    proc.stdout.readline()                                   # "serving"
    proc.stdout.close()                                      # the reader is gone
    sock = str(root / "serve.sock")
    t0 = time.monotonic()
    while not (log.exists() and "listening" in log.read_text()) and time.monotonic() - t0 < 60:
        time.sleep(0.05)
    with SidecarClient(sock, timeout=5.0) as c:
        assert c.predict(windows[0]).shape == (1, 1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    if not joined:
        err = proc.stderr.read()
        assert "stdout was closed; events go on to --events only" in err and "Traceback" not in err, err
    assert [json.loads(x)["event"] for x in log.read_text().splitlines()][-1] == "stopped"
    assert not os.path.exists(sock)
