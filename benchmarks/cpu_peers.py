"""edgehft's cpu board against its CPU peers: one process, one pinned core, one thread, batch 1.

For each model (DeepLOB on windows from the real Binance feed; a 64-512-256-128-64-1 MLP and the STAC-ML
LSTM_A shape, 2 x LSTM(100) over 50 x 100 + Dense(1), both with seeded random weights and windows) it
compiles with edgehft the cpu board's chosen plan (``--quant auto``: int8, dynamic, float and the native
plans that apply measured on this host, the fastest that passes the drift gate), the int8 plan and the
float plan, then times
one call per window of:

  edgehft cpu (chosen plan)     runtime.open(auto bundle).predict on float32 windows: every ratio is
                                against this row
  edgehft cpu (int8 plan)       predict on the --quant int8 bundle (float windows, quantized inside)
  LiteRT raw loop int8 / float  Interpreter(num_threads=1): set_tensor / invoke / get_tensor on the
                                int8 and float bundles' .tflite
  ONNX Runtime float            the Keras model as ONNX (tf2onnx on the tf-keras rebuild: one ONNX LSTM
                                node; Keras' own export as fallback), intra/inter-op threads 1, sequential,
                                graph optimizations ORT_ENABLE_ALL
  ONNX Runtime int8 QDQ         onnxruntime.quantization.quantize_static (QDQ, int8 activations and
                                per-channel int8 weights, calibrated on the same windows) of that ONNX
  tf.function                   tf.function(model) on one window, result to numpy
  Keras predict                 Keras 3 model.predict(x, verbose=0)

Timing is interleaved: round r calls every peer that still has samples left once, in a rotating order,
each call timed with perf_counter_ns, gc off, so load from other processes on a shared machine hits
every peer alike. A peer gets --samples calls or as many as fit in --budget-s seconds of its own time
(at least 30), after --warmup calls. Outputs are checked against the Keras model on the first 10 windows
(max |Δ| column). A peer that fails is reported as "failed: <reason>"; the others still run. Bundles
are compiled first, before this process is pinned or imports TensorFlow. Interleaving also evicts each
peer's weights from the caches between its calls, which inflates every p99; so edgehft's chosen plan and
the fastest peers are then timed once more each alone on the core, back to back (a dedicated box), and
so are two fixed workloads of about edgehft's p50, the machine's own jitter floors: matrix products held in
L1/L2 (compute) and an elementwise multiply streaming a 1 MiB working set, about DeepLOB's weights and
activations (memory). JSON: ``models.<name>.machine_floor`` and ``.memory_floor``.

Streaming (issue 21): the script opens ``runner.stream()`` on the chosen plan (``--quant auto``) when it streams,
else on a plan the stream executor takes (LSTM_A ``--quant native``, DeepLOB ``--quant native-bf16``; compiled beside
the others), and times, on the same pinned core in the same run, back to back, ``stream.push`` per tick (tick to
signal: the row handed to push to the output written) with the inline ``stream.prepare()`` between ticks timed
apart (not in push): the row "edgehft cpu streaming (push)", its ratio against the fastest peer timed alone (peer /
push), the same pushes timed inside the native library (``stream.time_pushes``: what a C or C++ caller sees,
without Python's row check, copy and call), and the prepare per tick. A model that does not stream prints "not
streaming: <reason>" (the InputError's message) and the other models still run. ONNX Runtime and LiteRT have no
streaming mode: their rows recompute the whole window each tick. JSON: ``models.<name>.streaming``.

    python benchmarks/cpu_peers.py [--models deeplob,mlp,lstm_a] [--samples 2000] [--budget-s 3] [--out r.json]
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
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
MODELS = ("deeplob", "mlp", "lstm_a")
MAX_WINDOWS = 1000        # windows cycled through while timing
CHECK_WINDOWS = 10
MIN_SAMPLES = 30
EDGEHFT = "edgehft cpu (chosen plan)"
EDGEHFT_INT8 = "edgehft cpu (int8 plan)"
STREAMING = "edgehft cpu streaming (push)"
STREAM_QUANT = {"lstm_a": "native", "deeplob": "native-bf16"}   # a plan the stream executor takes, where auto's does not
NO_STREAMING = ("ONNX Runtime and LiteRT have no streaming mode: their rows (and every predict row) recompute the "
                "whole window each tick")
STAC_P99_US = {"A100": 35.2, "FPGA (Myrtle VOLLO)": 5.07, "GH200": 4.6}
MEMORY_FLOOR_BYTES = 1 << 20    # the memory floor's working set: about DeepLOB's weights and activations


def prepare(name: str, build: Path) -> tuple[Path, list[Path], np.ndarray]:
    """(model .keras, calibration files, float32 windows (N, 1, ...)) for ``name``."""
    if name == "deeplob":
        spec = importlib.util.spec_from_file_location("deeplob_features", DEEPLOB / "features.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        x = mod.windows_from_feed([FEED])["x"]
        return DEEPLOB / "deeplob.keras", [FEED], np.ascontiguousarray(x[:MAX_WINDOWS, None], np.float32)
    maker, shape = {"mlp": (ROOT / "examples" / "mlp" / "model.py", (64,)),
                    "lstm_a": (ROOT / "benchmarks" / "lstm_a.py", (50, 100))}[name]
    model = build / f"{name}.keras"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1"}
    subprocess.run([sys.executable, str(maker), str(model)], check=True, capture_output=True, env=env)
    x = np.random.default_rng(0).standard_normal((2000, *shape)).astype(np.float32)
    np.save(build / f"{name}_calib.npy", x)
    return model, [build / f"{name}_calib.npy"], np.ascontiguousarray(x[:MAX_WINDOWS, None])


def compile_bundles(name: str, model: Path, calib: list[Path], build: Path) -> dict:
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    out = {}
    for quant in ("auto", "int8", "float") + ((STREAM_QUANT[name],) if name in STREAM_QUANT else ()):
        t0 = time.time()
        try:
            res = compile_model(model, calib, build / f"{name}_{quant}.bundle",
                                CompileOptions(board="cpu", quant=quant))
            out[quant] = res.bundle.path
            note = f"; warnings: {'; '.join(res.warnings)}" if res.warnings else ""
            if quant == "auto":
                plan = res.report.plan
                note += "; plans measured at compile (p50 µs): " + ", ".join(
                    f"{m['plan']} {m['p50_us']:.1f}" for m in plan["measured"]) + f" -> {plan['chosen']}"
            print(f"  compiled {name} {quant} in {time.time() - t0:.1f} s{note}")
        except Exception as exc:  # noqa: BLE001 - reported, the other peers still run
            out[quant] = exc
            print(f"  compile {name} {quant} failed: {type(exc).__name__}: {exc}")
    return out


def pin_all_threads(cpu: int) -> None:
    """Pin every thread of this process (sched_setaffinity(0) alone pins only the calling thread)."""
    os.sched_setaffinity(0, {cpu})
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except OSError:
            pass


ALONE = (EDGEHFT, "ONNX Runtime float", "ONNX Runtime int8 QDQ", "LiteRT float (raw loop)")


def time_interleaved(peers: dict, warmup: int, samples: int, budget_s: float) -> dict:
    """``peers``: name -> (fn, inputs). Warm each up, size its sample count to ``budget_s`` of its own time,
    then time them interleaved (one call per peer per round, rotating order). Returns name -> latency ns."""
    perf = time.perf_counter_ns
    counts, lat = {}, {}
    gc.collect()
    gc.disable()
    try:
        for name, (fn, xs) in peers.items():
            t0, k = perf(), 0
            while k < max(warmup, 3) and (k < 3 or perf() - t0 < 1e9):
                fn(xs[k % len(xs)])
                k += 1
            per_call = (perf() - t0) / k
            counts[name] = max(MIN_SAMPLES, min(samples, int(budget_s * 1e9 / per_call)))
            lat[name] = np.empty(counts[name], np.int64)
        order = list(peers.items())
        for r in range(max(counts.values())):
            shift = r % len(order)
            for name, (fn, xs) in order[shift:] + order[:shift]:
                if r < counts[name]:
                    x = xs[r % len(xs)]
                    t0 = perf()
                    fn(x)
                    lat[name][r] = perf() - t0
    finally:
        gc.enable()
    return lat


def median_ns(op, calls: int = 400, warmup: int = 100) -> float:
    """The median time of one ``op()`` call, ns, after ``warmup`` calls."""
    one = np.empty(calls, np.int64)
    for i in range(-warmup, calls):
        t0 = time.perf_counter_ns()
        op()
        if i >= 0:
            one[i] = time.perf_counter_ns() - t0
    return float(np.median(one))


def time_fixed_workload(op, one_ns: float, target_us: float, args) -> tuple[int, np.ndarray]:
    """``op`` repeated to ~``target_us`` per call (``one_ns`` one call's median), timed alone like the peers:
    (repetitions, latencies in ns)."""
    reps = max(1, round(target_us * 1e3 / one_ns))

    def work(_x):
        for _ in range(reps):
            op()
    return reps, time_interleaved({"floor": (work, [None])}, args.warmup, args.samples, args.budget_s)["floor"]


def machine_floor(target_us: float, args) -> dict:
    """The same core's jitter on a fixed workload: repeated single-thread float32 matrix products
    (OpenBLAS, 128x128 @ 128x128, the same inputs every call) sized to ~``target_us``, timed alone like
    the peers. Its p99/p50 is what this machine does to a constant amount of work: no model's p99/p50 can
    be expected below it here."""
    for n in (128, 64, 32):                             # the largest product that fits the target
        a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
        out = np.empty_like(a)
        one = median_ns(lambda: np.matmul(a, a, out=out))
        if one <= target_us * 1e3 or n == 32:
            break
    reps, ns = time_fixed_workload(lambda: np.matmul(a, a, out=out), one, target_us, args)
    return {"workload": f"{reps} x float32 matmul {n}x{n} @ {n}x{n} (OpenBLAS, 1 thread)",
            "latency_us": summarize_us(ns)}


def memory_floor(target_us: float, working_set_bytes: int, args) -> dict:
    """The same core's jitter on a fixed memory-bound workload: an elementwise float32 multiply streaming
    a ``working_set_bytes`` buffer into another (numpy, 1 thread), repeated to ~``target_us`` per call. The
    matmul floor above lives in L1/L2 and is set by the FMA units; a model's call reads and writes a working
    set of weights and activations, which a neighbour on the host's caches and memory slows too. Returns
    the workload's description and its latency summary (µs)."""
    n = max(1024, working_set_bytes // 8)              # two buffers of n float32 = working_set_bytes
    src = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    dst = np.empty_like(src)

    def op():
        np.multiply(src, 1.0001, out=dst)
    reps, ns = time_fixed_workload(op, median_ns(op, 200, 50), target_us, args)
    return {"workload": f"{reps} x float32 multiply streaming {2 * n * 4 // 1024} KiB (numpy, 1 thread)",
            "latency_us": summarize_us(ns)}


def interruptions(cpu: int, seconds: float = 2.0) -> dict:
    """How often this core is taken away: a loop on ``cpu`` reading the clock for ``seconds``; a gap
    between two reads longer than 20 µs is time the loop did not run (an interrupt, the hypervisor
    running something else). Returns gaps per second by length and the share of time lost."""
    edges = (20, 50, 100, 200, 500)
    counts = [0] * len(edges)
    lost = 0
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    gc.disable()
    try:
        perf = time.perf_counter_ns
        end = perf() + int(seconds * 1e9)
        prev = perf()
        while prev < end:
            now = perf()
            gap = (now - prev) // 1000
            if gap >= 20:
                lost += gap
                counts[sum(gap >= e for e in edges) - 1] += 1
            prev = now
    finally:
        gc.enable()
        os.sched_setaffinity(0, before)
    labels = [f"{a}-{b} µs" for a, b in zip(edges, edges[1:])] + [f">= {edges[-1]} µs"]
    return {"gaps_per_s": {k: round(c / seconds, 1) for k, c in zip(labels, counts)},
            "lost_share": lost / (seconds * 1e6)}


def raw_loop(model_path: Path):
    from ai_edge_litert.interpreter import Interpreter
    interp = Interpreter(model_path=str(model_path), num_threads=1)
    interp.allocate_tensors()
    i, o = interp.get_input_details()[0], interp.get_output_details()[0]
    idx, odx = i["index"], o["index"]
    if i["dtype"] == np.int8:                   # the raw loop quantizes like any LiteRT user would
        s, zp = i["quantization"]
        so, zo = o["quantization"]

        def run(x):
            interp.set_tensor(idx, np.clip(np.round(x / s) + zp, -128, 127).astype(np.int8))
            interp.invoke()
            return (interp.get_tensor(odx).astype(np.float32) - zo) * so
        return run

    def run_float(x):
        interp.set_tensor(idx, x)
        interp.invoke()
        return interp.get_tensor(odx)
    return run_float


def onnx_export(model, x0: np.ndarray, path: Path) -> str:
    """The Keras model as ONNX: tf2onnx on the tf-keras rebuild (fused LSTM -> one ONNX LSTM node), else
    Keras 3's own export (LSTM as an ONNX Loop)."""
    try:
        import tensorflow as tf
        import tf2onnx
        import tf_keras  # noqa: F401 - keras3_to_tf_keras needs it
        del tf_keras
        from edgehft.compiler.lowering import keras3_to_tf_keras
        sig = (tf.TensorSpec(x0.shape, tf.float32, name="x"),)
        tf2onnx.convert.from_keras(keras3_to_tf_keras(model), input_signature=sig, opset=17,
                                   output_path=str(path))
        return "tf2onnx on the tf-keras rebuild"
    except Exception as exc:  # noqa: BLE001
        print(f"  tf2onnx failed ({type(exc).__name__}: {exc}); trying Keras' ONNX export")
        model(x0)
        model.export(str(path), format="onnx", verbose=False)
        return "keras export"


def ort_session(path: Path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    iname, oname = sess.get_inputs()[0].name, sess.get_outputs()[0].name
    return lambda x: sess.run([oname], {iname: x})[0]


def ort_qdq(float_path: Path, calib: np.ndarray, out: Path) -> Path:
    """ONNX Runtime's own static int8 quantization (QDQ, per-channel weights) calibrated on ``calib``."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quant_pre_process,
                                          quantize_static)
    name = onnx.load(str(float_path)).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(calib)

        def get_next(self):
            x = next(self.it, None)
            return None if x is None else {name: x}
    pre = out.with_suffix(".pre.onnx")
    try:
        quant_pre_process(str(float_path), str(pre))
    except Exception:  # noqa: BLE001 - pre-processing is advice, not required
        pre = float_path
    quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return out


def bench_model(name: str, args, build: Path, cpu: int, model_path: Path, x: np.ndarray,
                bundles: dict) -> dict:
    import keras
    import tensorflow as tf
    from edgehft import runtime

    xs = [x[i] for i in range(len(x))]
    result: dict = {"windows": len(x), "bundles": {q: str(b) for q, b in bundles.items()}, "peers": []}
    keras_model = keras.models.load_model(model_path, compile=False)
    ref = np.asarray(keras_model(x[:CHECK_WINDOWS, 0]))
    onnx_path = build / f"{name}.onnx"

    def bundle(quant):
        if isinstance(bundles[quant], Exception):
            raise RuntimeError(f"{quant} compile failed: {bundles[quant]}")
        return bundles[quant]

    def p_edgehft(quant):
        def make():
            r = runtime.open(bundle(quant), threads=1)
            if quant == "auto":
                plan = r.bundle.report().get("plan", {})
                result["chosen_plan"] = plan.get("chosen")
                result["plans_at_compile"] = plan.get("measured")
            return r.predict
        return make

    def p_raw(quant):
        return lambda: raw_loop(Path(bundle(quant)) / "model.tflite")

    def p_onnx():
        result["onnx_route"] = onnx_export(keras_model, xs[0], onnx_path)
        return ort_session(onnx_path)

    def p_onnx_qdq():
        if not onnx_path.exists():
            raise RuntimeError("no float ONNX model")
        return ort_session(ort_qdq(onnx_path, x[:200], build / f"{name}.qdq.onnx"))

    def p_tf_function():
        f = tf.function(lambda t: keras_model(t, training=False), jit_compile=False)
        return lambda w: f(w).numpy()

    def p_keras_predict():
        return lambda w: keras_model.predict(w, verbose=0)

    makers = [(EDGEHFT, p_edgehft("auto")), (EDGEHFT_INT8, p_edgehft("int8")),
              ("LiteRT int8 (raw loop)", p_raw("int8")), ("LiteRT float (raw loop)", p_raw("float")),
              ("ONNX Runtime float", p_onnx), ("ONNX Runtime int8 QDQ", p_onnx_qdq),
              ("tf.function", p_tf_function), ("Keras predict", p_keras_predict)]
    peers, rows = {}, {}
    for peer, make in makers:
        row: dict = {"peer": peer}
        try:
            fn = make()
            got = np.concatenate([np.array(fn(xs[i]), np.float32).reshape(1, -1) for i in range(CHECK_WINDOWS)])
            row["max_abs_diff_vs_keras"] = float(np.abs(got - ref.reshape(len(ref), -1)).max())
            peers[peer] = (fn, xs)
            row["status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - one failing peer must not stop the others
            row["status"] = f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]
            print(f"  {peer}: {row['status']}")
        rows[peer] = row
    pin_all_threads(cpu)  # threads the peers started
    lat = time_interleaved(peers, args.warmup, args.samples, args.budget_s)
    for peer, ns in lat.items():
        rows[peer].update(samples=len(ns), latency_us=summarize_us(ns))
    for peer in ALONE:             # then each alone on the core, back to back, as on a dedicated box
        if peer in peers:
            ns = time_interleaved({peer: peers[peer]}, args.warmup, args.samples, args.budget_s)[peer]
            rows[peer]["alone_latency_us"] = summarize_us(ns)
    if "alone_latency_us" in rows.get(EDGEHFT, {}):
        target = rows[EDGEHFT]["alone_latency_us"]["p50"]
        result["machine_floor"] = machine_floor(target, args)
        result["memory_floor"] = memory_floor(target, MEMORY_FLOOR_BYTES, args)
    result["streaming"] = stream_row(name, bundles, x, keras_model, args, rows, peers)
    result["peers"] = list(rows.values())
    base = rows[EDGEHFT].get("latency_us") if EDGEHFT in rows else None
    for r in result["peers"]:
        if base and "latency_us" in r:
            r["ratio_p50"] = r["latency_us"]["p50"] / base["p50"]
            r["ratio_p99"] = r["latency_us"]["p99"] / base["p99"]
            r["p99_over_p50"] = r["latency_us"]["p99"] / r["latency_us"]["p50"]
    return result


def fastest_peer(rows: dict, peers: dict, args) -> tuple[str, dict] | tuple[None, None]:
    """The fastest peer that is not edgehft, alone on the core: the lowest alone p50 among the peers timed alone and
    the one with the lowest interleaved p50 (timed alone now when the alone pass did not). Returns
    ``(name, alone summary µs)``, or ``(None, None)`` when no peer ran."""
    timed = [r for r in rows.values() if "latency_us" in r and not r["peer"].startswith("edgehft")]
    if not timed:
        return None, None
    first = min(timed, key=lambda r: r["latency_us"]["p50"])
    if "alone_latency_us" not in first:
        ns = time_interleaved({first["peer"]: peers[first["peer"]]}, args.warmup, args.samples, args.budget_s)
        first["alone_latency_us"] = summarize_us(ns[first["peer"]])
    best = min((r for r in timed if "alone_latency_us" in r), key=lambda r: r["alone_latency_us"]["p50"])
    return best["peer"], best["alone_latency_us"]


def time_stream(s, rows: np.ndarray, window: int, args) -> tuple[np.ndarray, np.ndarray]:
    """``s.push`` (tick to signal) and the inline ``s.prepare()`` after it, per tick, back to back on this core,
    over ``rows`` (from :func:`edgehft.bench.replay.stream_rows`) cycled after the first ``window - 1``: warm-up
    ticks, then as many as ``--samples`` / ``--budget-s`` allow. Returns (push ns, prepare ns) int64 arrays."""
    perf = time.perf_counter_ns
    push, prepare, ticks = s.push, s.prepare, rows[window - 1:]
    n = len(ticks)
    gc.collect()
    gc.disable()
    try:
        t0, k = perf(), 0
        while k < max(args.warmup, 3) and (k < 3 or perf() - t0 < 1e9):
            push(ticks[k % n])
            prepare()
            k += 1
        count = max(MIN_SAMPLES, min(args.samples, int(args.budget_s * 1e9 * k / (perf() - t0))))
        lat, prep = np.empty(count, np.int64), np.empty(count, np.int64)
        for i in range(count):
            row = ticks[(k + i) % n]
            t0 = perf()
            push(row)
            t1 = perf()
            prepare()
            lat[i], prep[i] = t1 - t0, perf() - t1
    finally:
        gc.enable()
    return lat, prep


def stream_check(s, r, rows: np.ndarray, window: int, keras_model) -> dict:
    """Push the first ``window - 1 + CHECK_WINDOWS`` rows; each output against Keras on the stream's window (max
    |Δ|) and against ``predict`` of the same plan on it (bit for bit)."""
    diffs, equal = [], 0
    for i, row in enumerate(rows[:window - 1 + CHECK_WINDOWS]):
        y = s.push(row)
        if y is not None:
            w = s.window()[None]
            y = np.array(y, np.float32).reshape(-1)
            diffs.append(float(np.abs(y - np.asarray(keras_model(w)).reshape(-1)).max()))
            equal += bool(np.array_equal(y, np.asarray(r.predict(w), np.float32).reshape(-1)))
        s.prepare()
    return {"max_abs_diff_vs_keras": max(diffs), "equal_to_predict": f"{equal} of {len(diffs)}"}


def time_in_library(s, rows: np.ndarray, window: int, count: int) -> np.ndarray:
    """``s.time_pushes`` (each push timed inside the native library: what a C or C++ caller sees, no Python) over
    ``count`` ticks of ``rows`` cycled after the first ``window - 1``, prepare inline between them; the ns of the
    pushes that gave an output after the first 10 % (warm-up). Empty when the stream's head runs in LiteRT."""
    if s.head == "litert":                     # the library's push ends before a LiteRT head
        return np.empty(0, np.int64)
    ticks = rows[window - 1:]
    ns = s.time_pushes(np.ascontiguousarray(ticks[np.arange(count) % len(ticks)], np.float32))[count // 10:]
    return ns[ns > 0].astype(np.int64)


def _open_stream(runtime, src) -> tuple:
    """``(runner, stream, None)`` on bundle ``src``, or ``(None, None, reason)`` when it does not stream (the runner
    closed)."""
    from edgehft.errors import InputError
    r = runtime.open(src, threads=1)
    try:
        return r, r.stream(), None
    except InputError as exc:
        r.close()
        return None, None, str(exc).splitlines()[0]


def stream_row(name: str, bundles: dict, x: np.ndarray, keras_model, args, rows: dict, peers: dict) -> dict:
    """The streaming row of ``name``: the chosen plan (``--quant auto``) when it streams, else its streamable plan
    (:data:`STREAM_QUANT`), opened, ``runner.stream()`` (inline prepare) timed by :func:`time_stream` (Python's
    push) and :func:`time_in_library` (the native push alone) on this pinned core, against the fastest peer
    alone. A stream that does not open (InputError) gives ``status`` "not streaming: <reason>"; any other failure
    "failed: <reason>". ``x``: the model's windows (N, 1, ...) float32."""
    from edgehft import runtime
    from edgehft.bench.replay import stream_rows
    out: dict = {"peer": STREAMING, "note": NO_STREAMING}
    reasons = []
    try:
        for quant in dict.fromkeys(("auto", STREAM_QUANT.get(name, "auto"))):
            src = bundles.get(quant)
            if src is None or isinstance(src, Exception):
                reasons.append(f"--quant {quant}: " + (f"the compile failed: {src}" if src else "not compiled"))
                continue
            r, s, why = _open_stream(runtime, src)
            if why:
                reasons.append(f"--quant {quant}: {why}")
                continue
            out["plan_compiled"], out["plan"] = quant, getattr(r, "plan", None)
            with r, s:
                T = s.window_rows
                feed, _ = stream_rows(x[:, 0])
                out.update(stream_check(s, r, feed, T, keras_model))
                lat, prep = time_stream(s, feed, T, args)
                native = time_in_library(s, feed, T, max(len(lat), MIN_SAMPLES))
                c, d = s.counters, s.describe()
            break
        else:
            return {**out, "plan_compiled": STREAM_QUANT.get(name, "auto"),
                    "status": ("not streaming: " + "; ".join(reasons)).splitlines()[0][:300]}
        out.update(status="ok", samples=len(lat), latency_us=summarize_us(lat), prepare_us=summarize_us(prep),
                   isa=d.get("isa"), head=d.get("head"), macs=d.get("macs"),
                   prepared_ahead=c["prepared_ahead"], prepared_late=c["prepared_late"])
        if len(native):
            out.update(library_latency_us=summarize_us(native), library_samples=len(native))
    except Exception as exc:  # noqa: BLE001 - one model's stream must not stop the others
        return {**out, "status": f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]}
    peer, alone = fastest_peer(rows, peers, args)
    if peer:
        out.update(fastest_peer=peer, fastest_peer_alone_latency_us=alone,
                   ratio_p50_vs_fastest_peer=alone["p50"] / out["latency_us"]["p50"],
                   ratio_p99_vs_fastest_peer=alone["p99"] / out["latency_us"]["p99"])
    chosen = rows.get(EDGEHFT, {}).get("alone_latency_us")
    if chosen:
        out.update(ratio_p50_vs_chosen_plan=chosen["p50"] / out["latency_us"]["p50"],
                   ratio_p99_vs_chosen_plan=chosen["p99"] / out["latency_us"]["p99"])
    return out


def print_table(console, name: str, res: dict) -> None:
    from rich.table import Table
    plan = f", chosen plan: {res['chosen_plan']}" if res.get("chosen_plan") else ""
    t = Table(title=f"{name}: batch 1, one thread, pinned, interleaved{plan} (ratio = peer / edgehft chosen plan; "
                    "> 1: edgehft faster)", title_justify="left")
    for col in ("peer", "p50 µs", "p99 µs", "p99.9 µs", "p99/p50", "samples", "ratio p50", "ratio p99",
                "max|Δ| vs Keras"):
        t.add_column(col, justify="left" if col == "peer" else "right", no_wrap=True)
    for r in res["peers"]:
        if "latency_us" not in r:
            t.add_row(r["peer"], f"[red]{r['status']}[/red]", *[""] * 7)
            continue
        u, d = r["latency_us"], r.get("max_abs_diff_vs_keras")
        t.add_row(r["peer"], f"{u['p50']:,.1f}", f"{u['p99']:,.1f}", f"{u['p99.9']:,.1f}",
                  f"{r.get('p99_over_p50', 0):.2f}", str(r["samples"]),
                  f"{r['ratio_p50']:.2f}x" if "ratio_p50" in r else "-",
                  f"{r['ratio_p99']:.2f}x" if "ratio_p99" in r else "-", "-" if d is None else f"{d:.2g}")
    console.print(t)
    alone = [r for r in res["peers"] if "alone_latency_us" in r]
    if alone:
        base = next((r["alone_latency_us"]["p50"] for r in alone if r["peer"] == EDGEHFT), None)
        console.print(f"{name}, each alone on the core (back to back, warm caches): " + "; ".join(
            f"{r['peer']} p50 {r['alone_latency_us']['p50']:,.1f} µs, p99 {r['alone_latency_us']['p99']:,.1f} µs "
            f"(p99/p50 {r['alone_latency_us']['p99'] / r['alone_latency_us']['p50']:.2f}"
            + (f", ratio p50 {r['alone_latency_us']['p50'] / base:.2f}x)" if base else ")") for r in alone))
    for key, kind in (("machine_floor", "compute"), ("memory_floor", "memory")):
        floor = res.get(key)
        if floor:
            u = floor["latency_us"]
            console.print(f"{name}, machine floor, {kind} (a fixed workload of about edgehft's p50, alone on "
                          f"the core: {floor['workload']}): p50 {u['p50']:,.1f} µs, p99 {u['p99']:,.1f} µs, "
                          f"p99/p50 {u['p99'] / u['p50']:.2f}")
    if res.get("streaming"):
        print_streaming(console, name, res["streaming"])
    if name == "lstm_a":
        console.print("STAC-ML LSTM_A audited p99 records: "
                      + ", ".join(f"{k} {v} µs" for k, v in STAC_P99_US.items())
                      + " (their harness, not ours: ours is in process, a row in memory to the output in memory)")


def print_streaming(console, name: str, st: dict) -> None:
    """The streaming rows of ``name``: push (tick to signal) and the prepare per tick beside the fastest peer alone
    on the core (ratio = peer / push: > 1, the stream is faster), or why the model does not stream."""
    from rich.table import Table
    if st.get("status") != "ok":
        console.print(f"{name}, {STREAMING}: [yellow]{st.get('status')}[/yellow]")
        return
    t = Table(title=f"{name}: streaming, plan {st.get('plan')} ({st.get('isa')}, head {st.get('head')}), inline "
                    "prepare between ticks, back to back on the same pinned core (ratio = fastest peer alone / push)",
              title_justify="left")
    for col in ("row", "p50 µs", "p99 µs", "p99.9 µs", "p99/p50", "samples", "ratio p50", "ratio p99",
                "max|Δ| vs Keras"):
        t.add_column(col, justify="left" if col == "row" else "right", no_wrap=True)
    u, q = st["latency_us"], st["prepare_us"]
    t.add_row(STREAMING, f"{u['p50']:,.1f}", f"{u['p99']:,.1f}", f"{u['p99.9']:,.1f}", f"{u['p99'] / u['p50']:.2f}",
              str(st["samples"]), f"{st['ratio_p50_vs_fastest_peer']:.2f}x" if "fastest_peer" in st else "-",
              f"{st['ratio_p99_vs_fastest_peer']:.2f}x" if "fastest_peer" in st else "-",
              f"{st['max_abs_diff_vs_keras']:.2g}")
    if "library_latency_us" in st:
        n = st["library_latency_us"]
        t.add_row("  the same push timed in the library (no Python)", f"{n['p50']:,.1f}", f"{n['p99']:,.1f}",
                  f"{n['p99.9']:,.1f}", f"{n['p99'] / n['p50']:.2f}", str(st["library_samples"]), "", "", "")
    t.add_row("  prepare per tick (between ticks, not in push)", f"{q['p50']:,.1f}", f"{q['p99']:,.1f}",
              f"{q['p99.9']:,.1f}", f"{q['p99'] / q['p50']:.2f}", str(st["samples"]), "", "", "")
    if "fastest_peer" in st:
        a = st["fastest_peer_alone_latency_us"]
        t.add_row(f"{st['fastest_peer']} alone (recomputes the window)", f"{a['p50']:,.1f}", f"{a['p99']:,.1f}",
                  f"{a['p99.9']:,.1f}", f"{a['p99'] / a['p50']:.2f}", "", "1.00x", "1.00x", "")
    console.print(t)
    chosen = (f"; vs the chosen plan's predict alone: p50 {st['ratio_p50_vs_chosen_plan']:.2f}x, p99 "
              f"{st['ratio_p99_vs_chosen_plan']:.2f}x" if "ratio_p50_vs_chosen_plan" in st else "")
    console.print(f"{name}: every push equal to predict of its window on the same plan: {st['equal_to_predict']}; "
                  f"{st['prepared_ahead']} windows prepared ahead, {st['prepared_late']} late{chosen}. "
                  f"{NO_STREAMING}.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    ap.add_argument("--samples", type=int, default=2000, help="timed calls per peer at most")
    ap.add_argument("--budget-s", type=float, default=3.0, help="timed seconds per peer at most (min 30 calls)")
    ap.add_argument("--warmup", type=int, default=100, help="warm-up calls per peer (capped at ~1 s)")
    ap.add_argument("--out", type=Path, help="write all figures as JSON here")
    ap.add_argument("--build-dir", type=Path, help="keep models/bundles here (default: a temp dir)")
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models or set(models) - set(MODELS):
        ap.error(f"--models: choose from {', '.join(MODELS)} (got {args.models!r})")
    started = time.time()
    cpu = max(os.sched_getaffinity(0))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    from rich.console import Console
    console = Console()
    if not console.is_terminal:          # piped to a file: do not squeeze the tables into 80 columns
        console = Console(width=150)
    tmp = None if args.build_dir else tempfile.TemporaryDirectory(prefix="edgehft-peers-")
    build = args.build_dir or Path(tmp.name)
    build.mkdir(parents=True, exist_ok=True)
    results: dict = {"models": {}}
    try:
        prepared = {}
        for name in models:
            console.print(f"[bold]{name}[/bold]: prepare and compile")
            t0 = time.time()
            model_path, calib, x = prepare(name, build)
            print(f"  {len(x)} windows of shape {x.shape[1:]} ({time.time() - t0:.1f} s)")
            prepared[name] = (model_path, x, compile_bundles(name, model_path, calib, build))
        # Only now: one thread each for TensorFlow, onnxruntime and LiteRT, all on the last CPU. TF is
        # imported after the pin so the threads it starts inherit it.
        os.environ.update(TF_NUM_INTEROP_THREADS="1", TF_NUM_INTRAOP_THREADS="1")
        pin_all_threads(cpu)
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        for name, (model_path, x, bundles) in prepared.items():
            console.print(f"[bold]{name}[/bold]: time peers on CPU {cpu}")
            results["models"][name] = bench_model(name, args, build, cpu, model_path, x, bundles)
    finally:
        if tmp is not None:
            tmp.cleanup()
    fp = machine_fingerprint()
    from importlib.metadata import version
    fp["libraries"].update({p: version(p) for p in ("tensorflow", "keras", "onnxruntime", "tf2onnx")})
    load = os.getloadavg()
    gaps = interruptions(cpu)
    console.print("\n[bold]machine[/bold]", fp)
    console.print(f"CPU {cpu} taken away from a clock-reading loop (2 s): "
                  + ", ".join(f"{k}: {v}/s" for k, v in gaps["gaps_per_s"].items())
                  + f"; {gaps['lost_share']:.1%} of the time. A call of p50 T µs is hit by a gap of g µs with "
                  "probability ~ rate x T: where that exceeds 1 %, the gaps set its p99.")
    console.print(f"load average during the run (1/5/15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for name, res in results["models"].items():
        print_table(console, name, res)
    results.update(fingerprint=fp, loadavg=load, interruptions=gaps, args={k: str(v) for k, v in vars(args).items()},
                   pinned_cpu=cpu, wall_s=round(time.time() - started, 1))
    console.print(f"run took {results['wall_s']:.0f} s")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
        console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
