"""edgehft's native CPU LSTM kernel against LiteRT's and ONNX Runtime's LSTM, on the LSTM alone.

Two shapes: DeepLOB's LSTM(64) over 100 steps x 192 features (last step), and STAC-ML LSTM_A's two stacked
LSTM(100) over 50 x 100 (last step); tf-keras models with seeded random weights and non-zero biases.
Peers, one pinned core, one thread, batch 1:

  native kernel fp32        edgehft.kernels.cpu.lstm.NativeLSTM.run_ptr (no Python checks)
  LiteRT float              the float TFLite conversion (UNIDIRECTIONAL_SEQUENCE_LSTM, float kernel),
                            set_tensor / invoke / get_tensor, variables reset before each call
  LiteRT dynamic            the dynamic-range conversion (int8 weights, LiteRT's hybrid LSTM kernel)
  ONNX Runtime float        tf2onnx (one ONNX LSTM node), threads 1, sequential, ORT_ENABLE_ALL

Timed first interleaved (benchmarks/cpu_peers.py's round-robin, rotating order), then each alone on the
core. Prints p50/p99 µs, the ratio of each peer's p50 to the kernel's, max |Δ| against Keras, and the
load average (a shared machine's load shows up in every figure). This is an LSTM-only comparison: do not
put its figures beside whole-model peers.

    python benchmarks/native_lstm.py [--samples 2000] [--cpu N] [--build DIR]
"""
from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
SHAPES = {  # name: (T, in, hidden per layer)
    "deeplob LSTM(64) 100x192": (100, 192, [64]),
    "lstm_a 2xLSTM(100) 50x100": (50, 100, [100, 100]),
}


def build(out: Path) -> None:
    """(subprocess, imports TensorFlow) models, conversions and reference outputs into ``out``."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    import tf2onnx
    import tf_keras as keras
    for i, (name, (T, IN, hs)) in enumerate(SHAPES.items()):
        rng = np.random.default_rng(7 + i)
        keras.utils.set_random_seed(1)
        inp = keras.Input((T, IN), batch_size=1)
        y = inp
        for li, h in enumerate(hs):
            y = keras.layers.LSTM(h, return_sequences=li < len(hs) - 1)(y)
        m = keras.Model(inp, y)
        wts, li = {}, 0
        for layer in m.layers:
            if isinstance(layer, keras.layers.LSTM):
                W, U, b = layer.get_weights()
                b = rng.normal(0, 0.3, b.shape).astype(np.float32)
                layer.set_weights([W, U, b])
                wts[f"W{li}"], wts[f"U{li}"], wts[f"b{li}"] = W, U, b
                li += 1
        X = rng.normal(0, 1, (64, 1, T, IN)).astype(np.float32)
        Y = np.stack([m(X[j], training=False).numpy() for j in range(8)])
        np.savez(out / f"{i}.npz", X=X, Y=Y, **wts)
        for q in ("float", "dynamic"):
            c = tf.lite.TFLiteConverter.from_keras_model(m)
            if q == "dynamic":
                c.optimizations = [tf.lite.Optimize.DEFAULT]
            (out / f"{i}_{q}.tflite").write_bytes(c.convert())
        tf2onnx.convert.from_keras(m, input_signature=(tf.TensorSpec((1, T, IN), tf.float32, name="x"),),
                                   opset=17, output_path=str(out / f"{i}.onnx"))


def litert(path: Path):
    from ai_edge_litert.interpreter import Interpreter
    it = Interpreter(model_path=str(path), num_threads=1)
    it.allocate_tensors()
    i, o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]

    def run(x):
        it.reset_all_variables()
        it.set_tensor(i, x)
        it.invoke()
        return it.get_tensor(o)
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--cpu", type=int, default=None, help="core to pin to (default: the last allowed)")
    ap.add_argument("--build", type=Path, default=None, help="keep the built models here (default: a temp dir)")
    ap.add_argument("--_build-only", dest="build_only", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.build_only:
        build(a.build_only)
        return 0
    tmp = None
    if a.build is None:
        tmp = tempfile.TemporaryDirectory(prefix="edgehft-native-lstm-")
        a.build = Path(tmp.name)
    a.build.mkdir(parents=True, exist_ok=True)
    if not (a.build / f"{len(SHAPES) - 1}.onnx").is_file():
        print(f"building models into {a.build} (TensorFlow, in a subprocess) ...", flush=True)
        subprocess.run([sys.executable, __file__, "--_build-only", str(a.build)], check=True,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1"})
    sys.path.insert(0, str(HERE))
    from cpu_peers import ort_session, pin_all_threads, time_interleaved

    from edgehft.kernels.cpu.lstm import NativeLSTM
    cpu = a.cpu if a.cpu is not None else max(os.sched_getaffinity(0))
    pin_all_threads(cpu)
    for i, name in enumerate(SHAPES):
        d = np.load(a.build / f"{i}.npz")
        X, Y = d["X"], d["Y"]
        nl = sum(1 for f in d.files if f.startswith("W"))
        k = NativeLSTM([(d[f"W{j}"], d[f"U{j}"], d[f"b{j}"]) for j in range(nl)], X.shape[2])

        def kernel(x, k=k):
            k.run_ptr(x.ctypes.data)
            return k.out
        peers = {"native kernel fp32": kernel,
                 "LiteRT float": litert(a.build / f"{i}_float.tflite"),
                 "LiteRT dynamic": litert(a.build / f"{i}_dynamic.tflite"),
                 "ONNX Runtime float": ort_session(a.build / f"{i}.onnx")}
        xs = [np.ascontiguousarray(X[j]) for j in range(len(X))]
        err = {p: max(float(np.abs(np.asarray(f(xs[j])).reshape(Y[j].shape) - Y[j]).max()) for j in range(len(Y)))
               for p, f in peers.items()}
        inter = time_interleaved({p: (f, xs) for p, f in peers.items()}, 200, a.samples, 10.0)
        alone = {}
        for p, f in peers.items():
            alone.update(time_interleaved({p: (f, xs)}, 200, a.samples, 5.0))
        print(f"\n== {name}  (core {cpu}, load average {' '.join(f'{v:.2f}' for v in os.getloadavg())})")
        print(f"   {'peer':22s} {'alone p50':>9s} {'p99':>8s} {'ratio':>6s} | {'interl p50':>10s} {'p99':>8s} "
              f"{'ratio':>6s} | max|Δ| vs Keras")
        k50a = np.percentile(alone["native kernel fp32"], 50)
        k50i = np.percentile(inter["native kernel fp32"], 50)
        for p in peers:
            a50, a99 = (np.percentile(alone[p], q) / 1e3 for q in (50, 99))
            i50, i99 = (np.percentile(inter[p], q) / 1e3 for q in (50, 99))
            print(f"   {p:22s} {a50:9.1f} {a99:8.1f} {a50 * 1e3 / k50a:5.2f}x | {i50:10.1f} {i99:8.1f} "
                  f"{i50 * 1e3 / k50i:5.2f}x | {err[p]:.2g}")
        gc.collect()
        time.sleep(0.1)
    print(f"\nkernel ISA: {k.isa}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
