"""What the sidecar's transport adds (issue 17 item 2): in one run on one machine, the round trip of
``SidecarClient.predict`` (edgehft/serving/client.py) to an ``edgehft serve`` process against ``runner.predict`` of
the same bundle in this process.

The bundle (DeepLOB on windows from the real Binance feed, or the example MLP on seeded random windows, compiled for
the cpu board ``--quant int8`` as the other benchmarks do; or ``--bundle DIR``) is installed with ``install_local``
into a temporary install dir and served by ``python -m edgehft serve DIR --core A``; this process opens the same
version with ``runtime.open`` and pins itself to core B (A and B the two highest allowed CPUs; with only one, both
share it and the round trip includes the switches between the two processes on it). The outputs are checked equal
(np.array_equal) on the first windows. Then, gc off, warm-up first, each round calls both once (order alternating),
each call timed with perf_counter_ns, so load from other processes hits both alike.

The difference of the percentiles is what the transport adds: two datagrams (send and receive system calls on each
side, two wake-ups of a blocked thread, one of them in another process) plus the sidecar's Python loop (header
parse, ``Server.predict``'s dispatch, copy of the outputs into the reply) and the client's (packing the window,
unpacking the outputs). It is not the model: both run the same interpreter on the same windows. To split the two,
a third row times the floor: a bare Python echo of the same datagram sizes (request size out, reply size back) to a
process pinned where the sidecar is, which does nothing else (``--echo-server``, started by this script).

With ``--spin`` both ends busy-poll (``edgehft serve --spin``, ``SidecarClient(spin=True)``, the echo as well): no
thread sleeps in the kernel waiting for a datagram, so the wake-ups leave the round trip, at the price of the
sidecar's core (and the client's thread while it waits) at 100 %. The echo is then timed after the sidecar has
stopped (two spinning processes cannot share its core), not in the same rounds.

    python benchmarks/serve_sidecar.py [--model deeplob|mlp] [--bundle DIR] [--samples 20000] [--spin] [--out r.json]
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

from edgehft.bench.fingerprint import machine_fingerprint  # noqa: E402
from edgehft.bench.replay import summarize_us  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEEPLOB = ROOT / "examples" / "deeplob"
FEED = DEEPLOB / "data" / "btcusd_perp_20240808_depth.gz"
KEYS = ("p50", "p90", "p99", "p99.9", "max", "mean")


def windows_and_model(name: str, build: Path) -> tuple[Path, list, np.ndarray]:
    """(model .keras, calibration files, float32 windows (N, 1, ...)) for ``name``."""
    if name == "deeplob":
        spec = importlib.util.spec_from_file_location("deeplob_features", DEEPLOB / "features.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        x = mod.windows_from_feed([FEED])["x"]
        return DEEPLOB / "deeplob.keras", [FEED], np.ascontiguousarray(x[:1000, None], np.float32)
    model = build / "mlp.keras"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1"}
    subprocess.run([sys.executable, str(ROOT / "examples" / "mlp" / "model.py"), str(model)], check=True,
                   capture_output=True, env=env)
    x = np.random.default_rng(0).standard_normal((2000, 64)).astype(np.float32)
    np.save(build / "mlp_calib.npy", x)
    return model, [build / "mlp_calib.npy"], np.ascontiguousarray(x[:1000, None])


def bundle_and_windows(args, build: Path) -> tuple[Path, np.ndarray]:
    if args.bundle:
        from edgehft.bundle import load_bundle
        spec = load_bundle(args.bundle, verify=False).manifest.inputs[0]
        x = np.random.default_rng(0).standard_normal((1000, *spec.shape)).astype(np.float32)
        return Path(args.bundle), x
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    model, calib, x = windows_and_model(args.model, build)
    t0 = time.time()
    out = build / f"{args.model}.int8"
    compile_model(model, calib, out, CompileOptions(board="cpu", quant="int8"))
    print(f"compiled {args.model} --quant int8 in {time.time() - t0:.0f} s")
    return out, x


def start_sidecar(root: Path, core, spin: bool = False) -> tuple:
    """(process, its ``listening`` event): ``edgehft serve root --json`` pinned to ``core`` (``--spin``: busy-polling
    its socket), once it listens."""
    cmd = [sys.executable, "-m", "edgehft", "serve", str(root), "--json"] + (["--core", str(core)] if core is not None
                                                                            else []) + (["--spin"] if spin else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        e = json.loads(line)
        if e["event"] == "listening":
            print(f"sidecar pid {proc.pid} listening on {e['socket']} (core {core}; largest datagram "
                  f"{e['max_datagram']} bytes, request {e['request_bytes']}, reply {e['reply_bytes']})")
            return proc, e
    raise SystemExit(f"the sidecar exited {proc.wait()} before listening")


def echo_server(path: str, core, reply_bytes: int, spin: bool = False) -> None:
    """The transport floor's other end: answer each datagram with ``reply_bytes`` bytes, nothing else (``spin``:
    busy-polling the socket, as the sidecar's ``--spin``)."""
    import socket
    if core is not None:
        os.sched_setaffinity(0, {core})
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    buf = bytearray(1 << 21)
    bufs, reply = [buf], memoryview(buf)[:reply_bytes]
    print("ready", flush=True)
    flags = socket.MSG_DONTWAIT if spin else 0
    while True:
        try:
            _, _, _, addr = s.recvmsg_into(bufs, 0, flags)
        except BlockingIOError:
            continue
        s.sendto(reply, addr)


def echo_client(path: str, core, request_bytes: int, reply_bytes: int, spin: bool = False):
    """(process, fn(window)): an echo server pinned to ``core`` and a round trip to it of the sidecar's sizes (both
    ends busy-polling with ``spin``)."""
    import socket
    proc = subprocess.Popen([sys.executable, __file__, "--echo-server", path, "--reply-bytes", str(reply_bytes)]
                            + (["--core", str(core)] if core is not None else []) + (["--spin"] if spin else []),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    c = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    c.bind("")
    c.connect(path)
    msg, rbuf = memoryview(bytearray(request_bytes)), bytearray(1 << 21)
    send, recv = c.send, c.recv_into

    def round_trip(_x):
        send(msg)
        recv(rbuf)

    def round_trip_spin(_x):
        send(msg)
        while True:
            try:
                recv(rbuf, 0, socket.MSG_DONTWAIT)
                return
            except BlockingIOError:
                pass
    return proc, (round_trip_spin if spin else round_trip)


def time_both(calls: dict, xs: np.ndarray, warmup: int, samples: int) -> dict:
    """``calls``: name -> fn(window). Warm each up, then ``samples`` rounds calling each once (order rotating),
    every call timed. Returns name -> latencies in ns."""
    perf = time.perf_counter_ns
    for fn in calls.values():
        for i in range(warmup):
            fn(xs[i % len(xs)])
    lat = {name: np.empty(samples, np.int64) for name in calls}
    order = list(calls.items())
    gc.collect()
    gc.disable()
    try:
        for r in range(samples):
            x = xs[r % len(xs)]
            k = r % len(order)
            for name, fn in order[k:] + order[:k]:
                t0 = perf()
                fn(x)
                lat[name][r] = perf() - t0
    finally:
        gc.enable()
    return lat


def report(lat: dict, cores) -> dict:
    local, car = summarize_us(lat["runner.predict"]), summarize_us(lat["SidecarClient.predict"])
    echo = summarize_us(lat["echo"])
    added = {k: car[k] - local[k] for k in KEYS}
    print(f"\n{'µs':<40}" + "".join(f"{k:>10}" for k in KEYS))
    for name, s in (("runner.predict (in-process)", local), ("SidecarClient.predict (round trip)", car),
                    ("added by the sidecar (difference)", added), ("floor: bare Python datagram echo", echo)):
        print(f"{name:<40}" + "".join(f"{s[k]:>10.1f}" for k in KEYS))
    print(f"\nwhat the sidecar adds (difference of percentiles): p50 {added['p50']:.1f} µs, p99 {added['p99']:.1f} µs, "
          f"p99.9 {added['p99.9']:.1f} µs: the transport (two Unix datagrams, send/receive system calls and wake-ups "
          "on both sides) plus the sidecar's Python loop (and the client's packing), not the model "
          f"(client on core {cores[0]}, sidecar on core {cores[1]}); of it the bare datagram round trip, same sizes, "
          f"same cores: p50 {echo['p50']:.1f} µs, p99 {echo['p99']:.1f} µs, p99.9 {echo['p99.9']:.1f} µs")
    return {"runner_us": local, "sidecar_us": car, "added_us": added, "echo_us": echo}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("deeplob", "mlp"), default="deeplob")
    ap.add_argument("--bundle", default=None, help="a cpu bundle to serve instead of compiling --model")
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--spin", action="store_true",
                    help="busy-poll on both sides: edgehft serve --spin, SidecarClient(spin=True), the echo too")
    ap.add_argument("--echo-server", default=None, help=argparse.SUPPRESS)   # the floor's other end (internal)
    ap.add_argument("--reply-bytes", type=int, default=64, help=argparse.SUPPRESS)
    ap.add_argument("--core", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.echo_server:
        echo_server(args.echo_server, args.core, args.reply_bytes, args.spin)
        return 0
    from edgehft import runtime
    from edgehft.deploy.local import install_local
    from edgehft.serving.client import SidecarClient
    allowed = sorted(os.sched_getaffinity(0))
    client_core, car_core = (allowed[-2], allowed[-1]) if len(allowed) >= 2 else (allowed[0], allowed[0])
    with tempfile.TemporaryDirectory(prefix="serve_sidecar.") as tmp:
        build, root = Path(tmp) / "build", Path(tmp) / "box"
        build.mkdir()
        bundle, xs = bundle_and_windows(args, build)
        vid = install_local(root, bundle)["version"]
        proc, listening = start_sidecar(root, car_core, args.spin)
        echo_proc = None
        try:
            os.sched_setaffinity(0, {client_core})
            with runtime.open(root / "versions" / vid, threads=1) as r, SidecarClient(root / "serve.sock",
                                                                                 spin=args.spin) as c:
                for x in xs[:20]:
                    assert np.array_equal(c.predict(x), r.predict(x)), "the sidecar's outputs differ"
                print(f"outputs equal on 20 windows; timing {args.samples} rounds of each, shape {xs.shape[1:]}")
                calls = {"runner.predict": r.predict, "SidecarClient.predict": c.predict}
                if not args.spin:      # a sleeping echo server beside the sidecar on its core: timed in the same rounds
                    echo_proc, calls["echo"] = echo_client(str(Path(tmp) / "echo.sock"), car_core,
                                                           listening["request_bytes"], listening["reply_bytes"])
                lat = time_both(calls, xs, args.warmup, args.samples)
                counters = c.status()["counters"]
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=60)
            if args.spin:              # two spinning processes cannot share the core: the echo after the sidecar
                echo_proc, echo = echo_client(str(Path(tmp) / "echo.sock"), car_core, listening["request_bytes"],
                                              listening["reply_bytes"], True)
                lat["echo"] = time_both({"echo": echo}, xs, args.warmup, args.samples)["echo"]
        finally:
            if echo_proc is not None:
                echo_proc.kill()
            if proc.poll() is None:
                proc.kill()
    res = report(lat, (client_core, car_core))
    print(f"sidecar counters {counters}; exit {rc} after SIGTERM; load average {os.getloadavg()}")
    if args.out:
        res.update(model=args.bundle or args.model, samples=args.samples, spin=args.spin, cores={"client": client_core,
                   "sidecar": car_core}, fingerprint=machine_fingerprint(), loadavg=os.getloadavg())
        args.out.write_text(json.dumps(res, indent=1, default=str))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
