"""edgehft's cpu board against its CPU peers: one process, one pinned core, one thread, batch 1.

For each model (DeepLOB on windows from the real Binance feed; a 64-512-256-128-64-1 MLP on seeded random
windows) it compiles int8 and float bundles with edgehft, then times one call per window of:

  edgehft predict (int8 in)     runtime.open(bundle).predict on windows already quantized to int8: the
                                same work as the raw loop; every ratio is against this row
  edgehft predict (float in)    predict on float32 windows (input quantization inside predict)
  edgehft predict_raw           int8 windows in, the raw int8 output out: exactly the raw loop's work
  LiteRT raw loop int8          Interpreter(num_threads=1): set_tensor / invoke / get_tensor, same .tflite
  LiteRT raw loop int8 + deq    the raw loop plus numpy dequantization, (q - zero_point) * scale: the
                                same work as edgehft predict (int8 in)
  LiteRT raw loop float         the same loop on the float bundle's .tflite
  ONNX Runtime float            the Keras model exported to ONNX, 1 intra/inter-op thread, sequential
  tf.function                   tf.function(model, jit_compile=False) on one window, result to numpy
  Keras predict                 Keras 3 model.predict(x, verbose=0)

Each call is timed with perf_counter_ns, gc off, after a warm-up (--warmup calls, at most ~2 s). A peer is
measured for --samples calls or ~10 s, whichever is fewer, but at least 50 calls. Before timing, the raw
int8 loop must match edgehft's predict_raw bit for bit on the first 10 windows. A peer that fails is
reported as "failed: <reason>" and the others still run. All bundles are compiled first, before this
process is pinned or imports TensorFlow, so the converter subprocess can use every core.

    python benchmarks/cpu_peers.py [--models deeplob,mlp] [--samples 2000] [--warmup 200] [--out r.json]
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
MAX_WINDOWS = 1000        # windows cycled through while timing
CHECK_WINDOWS = 10
BUDGET_S = 10.0           # measured time per peer
WARMUP_S = 2.0            # warm-up time cap per peer
MIN_SAMPLES = 50
EDGEHFT = "edgehft predict (int8 in)"
EDGEHFT_RAW = "edgehft predict_raw"
RAW_INT8 = "LiteRT raw loop int8"
RAW_DEQ = "LiteRT raw loop int8 + deq"


def prepare(name: str, build: Path) -> tuple[Path, list[Path], np.ndarray]:
    """(model .keras, calibration files, float32 windows (N, 1, ...)) for ``name``."""
    if name == "deeplob":
        spec = importlib.util.spec_from_file_location("deeplob_features", DEEPLOB / "features.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        x = mod.windows_from_feed([FEED])["x"]
        return DEEPLOB / "deeplob.keras", [FEED], np.ascontiguousarray(x[:MAX_WINDOWS, None], np.float32)
    model = build / "mlp.keras"
    subprocess.run([sys.executable, str(ROOT / "examples" / "mlp" / "model.py"), str(model)],
                   check=True, capture_output=True)
    x = np.random.default_rng(0).standard_normal((2000, 64)).astype(np.float32)
    np.save(build / "mlp_calib.npy", x)
    return model, [build / "mlp_calib.npy"], np.ascontiguousarray(x[:MAX_WINDOWS, None])


def compile_bundles(name: str, model: Path, calib: list[Path], build: Path) -> dict:
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    out = {}
    for quant in ("int8", "float"):
        t0 = time.time()
        try:
            res = compile_model(model, calib, build / f"{name}_{quant}.bundle",
                                CompileOptions(board="cpu", quant=quant))
            out[quant] = res.bundle.path
            note = f"; warnings: {'; '.join(res.warnings)}" if res.warnings else ""
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


def time_peer(fn, xs: list[np.ndarray], warmup: int, samples: int) -> tuple[np.ndarray, int]:
    """Warm up, then time ``fn(window)`` per call. Returns (latency ns int64, warm-up calls)."""
    n, perf = len(xs), time.perf_counter_ns
    gc.collect()
    gc.disable()
    try:
        t0, k = perf(), 0
        while k < max(warmup, 1) and (k < 5 or perf() - t0 < WARMUP_S * 1e9):
            fn(xs[k % n])
            k += 1
        per_call = (perf() - t0) / k
        count = min(samples, max(MIN_SAMPLES, int(BUDGET_S * 1e9 / per_call)))
        lat = np.empty(count, dtype=np.int64)
        for i in range(count):
            x = xs[(k + i) % n]
            t1 = perf()
            fn(x)
            lat[i] = perf() - t1
    finally:
        gc.enable()
    return lat, k


def raw_loop(model_path: Path):
    from ai_edge_litert.interpreter import Interpreter
    interp = Interpreter(model_path=str(model_path), num_threads=1)
    interp.allocate_tensors()
    i, o = interp.get_input_details()[0]["index"], interp.get_output_details()[0]["index"]

    def run(x):
        interp.set_tensor(i, x)
        interp.invoke()
        return interp.get_tensor(o)
    return run


def onnx_session(model, x0: np.ndarray, path: Path):
    """Export the Keras model to ONNX (Keras 3 export, else tf2onnx on the tf-keras rebuild)."""
    import onnxruntime as ort
    try:
        model(x0)                               # Keras' ONNX export wants a model that has been called
        model.export(str(path), format="onnx", verbose=False)
        route = "keras export"
    except Exception as exc:  # noqa: BLE001
        print(f"  keras ONNX export failed ({type(exc).__name__}: {exc}); trying tf2onnx on tf-keras")
        import tensorflow as tf
        import tf2onnx
        import tf_keras  # noqa: F401 - keras3_to_tf_keras needs it
        from edgehft.compiler.lowering import keras3_to_tf_keras
        sig = (tf.TensorSpec(x0.shape, tf.float32, name="x"),)
        tf2onnx.convert.from_keras(keras3_to_tf_keras(model), input_signature=sig, opset=17,
                                   output_path=str(path))
        route = "tf2onnx"
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    iname, oname = sess.get_inputs()[0].name, sess.get_outputs()[0].name
    return (lambda x: sess.run([oname], {iname: x})[0]), route


def bench_model(name: str, args, build: Path, cpu: int, model_path: Path, x: np.ndarray,
                bundles: dict) -> dict:
    import keras
    import tensorflow as tf
    from edgehft import runtime

    xs = [x[i] for i in range(len(x))]
    result: dict = {"windows": len(x), "bundles": {q: str(b) for q, b in bundles.items()}, "peers": []}
    keras_model = keras.models.load_model(model_path, compile=False)
    ref = np.asarray(keras_model(x[:CHECK_WINDOWS, 0]))
    state: dict = {}

    def edgehft_runner():
        if "runner" not in state:
            if isinstance(bundles["int8"], Exception):
                raise RuntimeError(f"int8 compile failed: {bundles['int8']}")
            r = runtime.open(bundles["int8"], threads=1)
            xq = []
            for w in xs:                      # the runner's own quantization, so the work equals raw's
                r.inputs[0].write(w)
                xq.append(r.inputs[0].dest.copy().reshape(w.shape))
            state["runner"], state["xq"] = r, xq
        return state["runner"], state["xq"]

    def bundle_tflite(quant):
        if isinstance(bundles[quant], Exception):
            raise RuntimeError(f"{quant} compile failed: {bundles[quant]}")
        return Path(bundles[quant]) / "model.tflite"

    def p_edgehft_int8():
        r, xq = edgehft_runner()
        return r.predict, xq, True

    def p_edgehft_float():
        r, _ = edgehft_runner()
        return r.predict, xs, True

    def p_raw_int8():
        r, xq = edgehft_runner()
        run = raw_loop(bundle_tflite("int8"))
        for i in range(CHECK_WINDOWS):
            want = np.array(r.predict_raw(xq[i]))
            got = run(xq[i])
            assert got.dtype == want.dtype and np.array_equal(got, want), f"window {i}: {got} != {want}"
        print(f"  check: raw LiteRT int8 output == edgehft predict_raw, bit-exact on {CHECK_WINDOWS} windows: OK")
        result["bit_exact_check"] = "OK"
        return run, xq, False

    def p_edgehft_raw():
        r, xq = edgehft_runner()
        return r.predict_raw, xq, False

    def p_raw_deq():
        r, xq = edgehft_runner()
        run = raw_loop(bundle_tflite("int8"))
        o = r.bundle.manifest.outputs[0]
        scale, zp = np.float32(o.scale[0]), np.float32(o.zero_point[0])
        return (lambda w: (run(w).astype(np.float32) - zp) * scale), xq, True

    def p_raw_float():
        return raw_loop(bundle_tflite("float")), xs, True

    def p_onnx():
        fn, route = onnx_session(keras_model, xs[0], build / f"{name}.onnx")
        result["onnx_route"] = route
        return fn, xs, True

    def p_tf_function():
        f = tf.function(lambda t: keras_model(t, training=False), jit_compile=False)
        return (lambda w: f(w).numpy()), xs, True

    def p_keras_predict():
        return (lambda w: keras_model.predict(w, verbose=0)), xs, True

    peers = [(EDGEHFT, p_edgehft_int8), ("edgehft predict (float in)", p_edgehft_float),
             (EDGEHFT_RAW, p_edgehft_raw), (RAW_INT8, p_raw_int8), (RAW_DEQ, p_raw_deq),
             ("LiteRT raw loop float", p_raw_float),
             ("ONNX Runtime float", p_onnx), ("tf.function", p_tf_function),
             ("Keras predict", p_keras_predict)]
    for peer, make in peers:
        row: dict = {"peer": peer}
        try:
            fn, inputs, float_out = make()
            if float_out:  # agreement with the Keras float model on the first windows
                got = np.concatenate([np.array(fn(inputs[i])).reshape(1, -1) for i in range(CHECK_WINDOWS)])
                row["max_abs_diff_vs_keras"] = float(np.abs(got - ref.reshape(len(ref), -1)).max())
            pin_all_threads(cpu)  # threads the peer started
            lat, warm = time_peer(fn, inputs, args.warmup, args.samples)
            row.update(status="ok", samples=len(lat), warmup=warm, latency_us=summarize_us(lat))
        except Exception as exc:  # noqa: BLE001 - one failing peer must not stop the others
            row.update(status=f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:300])
        print(f"  {peer}: {row['status']}")
        result["peers"].append(row)
    if "runner" in state:
        state["runner"].close()
    by = {r["peer"]: r for r in result["peers"] if r["status"] == "ok"}
    base = by.get(EDGEHFT, {}).get("latency_us", {}).get("p50")
    for r in result["peers"]:
        if base and r["status"] == "ok":
            r["ratio_p50"] = r["latency_us"]["p50"] / base
    def pct(a, b):
        if a in by and b in by:
            return 100.0 * (by[a]["latency_us"]["p50"] / by[b]["latency_us"]["p50"] - 1.0)
        return None
    result["edgehft_vs_raw_p50_pct"] = {"predict vs raw loop + dequantize": pct(EDGEHFT, RAW_DEQ),
                                        "predict_raw vs raw loop": pct(EDGEHFT_RAW, RAW_INT8)}
    return result


def print_table(console, name: str, res: dict) -> None:
    from rich.table import Table
    t = Table(title=f"{name}: batch 1, one thread, pinned", title_justify="left")
    for col in ("peer", "p50 µs", "p99 µs", "p99.9 µs", "samples", "ratio p50", "max|Δ| vs Keras"):
        t.add_column(col, justify="left" if col == "peer" else "right", no_wrap=True)
    for r in res["peers"]:
        if r["status"] != "ok":
            t.add_row(r["peer"], f"[red]{r['status']}[/red]", "", "", "", "", "")
            continue
        u, d = r["latency_us"], r.get("max_abs_diff_vs_keras")
        t.add_row(r["peer"], f"{u['p50']:,.1f}", f"{u['p99']:,.1f}", f"{u['p99.9']:,.1f}", str(r["samples"]),
                  f"{r['ratio_p50']:.2f}x" if "ratio_p50" in r else "-", "-" if d is None else f"{d:.2g}")
    console.print(t)
    for what, pct in res.get("edgehft_vs_raw_p50_pct", {}).items():
        console.print(f"edgehft vs raw interpreter at p50 ({what}): "
                      + (f"{pct:+.1f} % (target: within +5 %)" if pct is not None else "n/a (a row failed)"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="deeplob,mlp", help="comma-separated: deeplob, mlp")
    ap.add_argument("--samples", type=int, default=2000, help="timed calls per peer (capped at ~10 s)")
    ap.add_argument("--warmup", type=int, default=200, help="warm-up calls per peer (capped at ~2 s)")
    ap.add_argument("--out", type=Path, help="write all figures as JSON here")
    ap.add_argument("--build-dir", type=Path, help="keep models/bundles here (default: a temp dir)")
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models or set(models) - {"deeplob", "mlp"}:
        ap.error(f"--models: choose from deeplob, mlp (got {args.models!r})")
    started = time.time()
    cpu = max(os.sched_getaffinity(0))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    from rich.console import Console
    console = Console()
    if not console.is_terminal:          # piped to a file: do not squeeze the tables into 80 columns
        console = Console(width=110)
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
    console.print("\n[bold]machine[/bold]", fp)
    for name, res in results["models"].items():
        print_table(console, name, res)
    results.update(fingerprint=fp, args={k: str(v) for k, v in vars(args).items()},
                   pinned_cpu=cpu, wall_s=round(time.time() - started, 1))
    console.print(f"run took {results['wall_s']:.0f} s")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
        console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
