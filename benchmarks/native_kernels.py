"""edgehft's native CPU kernels per dispatch target: the same kernel on every SIMD target this CPU runs
(forced with edgehft.kernels.cpu.build.force_target), against the pre-Highway kernels built with
``-march=native`` from a git revision, and LiteRT's float LSTM for the LSTM shapes.

Shapes: DeepLOB's convs (each distinct CONV_2D of examples/deeplob/model.py, and all 14 in one chain), its
MAX_POOL_2D (3x1 SAME over 100x1x32) and FULLY_CONNECTED (64 -> 3), its LSTM(64) over 100 steps x 192, and
STAC-ML LSTM_A's two LSTM(100) over 50 steps x 100. Seeded random weights and inputs. One pinned core, one
thread, batch 1, every variant of a shape timed interleaved (benchmarks/cpu_peers.py's round robin); prints
p50 / p99 µs, each p50 against the best target's, and whether the outputs are bit-identical to the best
Highway SIMD target's (max |Δ| otherwise; the conv's avx3_bf16 and amx levels sum in other orders).

    python benchmarks/native_kernels.py [--samples 2000] [--cpu N] [--baseline REV] [--no-litert]

``--baseline REV`` (default ac32aab, the last commit before the Highway port): that revision's cpu_*.cpp
compiled with ``g++ -O3 -march=native`` (its own AVX-512 paths where this CPU has AVX-512; ``none`` skips
it). LiteRT's LSTMs come from benchmarks/native_lstm.py's models (TensorFlow, in a subprocess; skipped
with ``--no-litert`` or without TensorFlow).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONVS = [  # DeepLOB's CONV_2Ds (+ LEAKY_RELU 0.01): (H, W, C, Co), kernel, stride, padding, count in the model
    ((100, 40, 1, 32), (1, 2), (1, 2), "VALID", 1),
    ((100, 20, 32, 32), (4, 1), (1, 1), "SAME", 2),
    ((100, 20, 32, 32), (1, 2), (1, 2), "VALID", 1),
    ((100, 10, 32, 32), (4, 1), (1, 1), "SAME", 2),
    ((100, 10, 32, 32), (1, 10), (1, 1), "VALID", 1),
    ((100, 1, 32, 32), (4, 1), (1, 1), "SAME", 2),
    ((100, 1, 32, 64), (1, 1), (1, 1), "SAME", 3),
    ((100, 1, 64, 64), (3, 1), (1, 1), "SAME", 1),
    ((100, 1, 64, 64), (5, 1), (1, 1), "SAME", 1),
]
LSTMS = {"deeplob LSTM(64) 100x192": (100, 192, [64]), "lstm_a 2xLSTM(100) 50x100": (50, 100, [100, 100])}


def baseline_library(rev: str, out: Path) -> ctypes.CDLL:
    """``rev``'s kernel sources (one file each then) built together with -O3 -march=native."""
    srcs = []
    for name in ("cpu_conv.cpp", "cpu_lstm.cpp", "cpu_ops.cpp"):
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:edgehft/kernels/cpu/{name}"],
                              check=True, capture_output=True, text=True).stdout
        (out / name).write_text(text)
        srcs.append(str(out / name))
    lib = out / "libbaseline.so"
    subprocess.run([os.environ.get("CXX", "g++"), "-O3", "-march=native", "-std=c++17", "-fPIC", "-shared",
                    "-ffp-contract=off", *srcs, "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


class Baseline:
    """The baseline library's kernels with the same create arguments as today's wrappers."""

    def __init__(self, lib: ctypes.CDLL):
        vp, i32, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        self.lib = lib
        for name, args in (("edgehft_lstm_create", [i32, i32, i32, vp, vp, vp, vp, i32, f32]),
                           ("edgehft_conv_create", [vp, vp, vp, i32, f32, i32]),
                           ("edgehft_pool_create", [vp, i32]), ("edgehft_dense_create", [i32, i32, i32, vp, vp, i32])):
            getattr(lib, name).restype = vp
            getattr(lib, name).argtypes = args
        for name in ("edgehft_lstm_run", "edgehft_conv_run", "edgehft_pool_run", "edgehft_dense_run"):
            getattr(lib, name).argtypes = [vp, vp, vp]

    def runner(self, kind: str, handle: int, out: np.ndarray):
        run, h, o = getattr(self.lib, f"edgehft_{kind}_run"), ctypes.c_void_p(handle), out.ctypes.data
        return lambda x: run(h, x.ctypes.data, o)

    def lstm(self, layers, T, out):
        n, P = len(layers), ctypes.c_void_p * len(layers)
        h = self.lib.edgehft_lstm_create(n, T, layers[0][0].shape[0], (ctypes.c_int * n)(*[u.shape[0] for _, u, _ in layers]),
                                         P(*[w.ctypes.data for w, _, _ in layers]), P(*[u.ctypes.data for _, u, _ in layers]),
                                         P(*[b.ctypes.data for _, _, b in layers]), 0, 0.0)
        return self.runner("lstm", h, out)

    def conv(self, hw, stride, padding, w, b, out):
        from edgehft.kernels.cpu.conv import geometry
        Co, kh, kw, C = w.shape
        Ho, Wo, ph, pw = geometry(hw, (kh, kw), stride, padding)
        dims = (ctypes.c_int * 12)(*hw, C, Co, kh, kw, *stride, ph, pw, Ho, Wo)
        return self.runner("conv", self.lib.edgehft_conv_create(dims, w.ctypes.data, b.ctypes.data, 4, 0.01, 1), out)


def conv_variants(targets, base, rng):
    """Per DeepLOB conv shape: variant name -> run(x) and the inputs; plus the chain of all 14."""
    from edgehft.kernels.cpu.build import force_target
    from edgehft.kernels.cpu.conv import NativeConv2D
    shapes, chain = {}, {t: [] for t in targets}
    for (H, W, C, Co), kern, stride, pad, count in CONVS:
        w = (rng.standard_normal((Co, *kern, C)) / np.sqrt(C * kern[0] * kern[1])).astype(np.float32)
        b = rng.standard_normal(Co).astype(np.float32)
        xs = [rng.standard_normal((H, W, C)).astype(np.float32) for _ in range(4)]
        v = {}
        for t in targets:
            with force_target(t):
                k = NativeConv2D(w, b, (H, W), C, stride, pad, activation="leaky_relu", alpha=0.01)
            v[t] = (lambda x, k=k: k.run_ptr(x.ctypes.data), k.out)
            chain[t] += [(k, xs[0])] * count
        if base is not None:
            out = np.zeros_like(k.out)
            v["old -march=native"] = (base.conv((H, W), stride, pad, w, b, out), out)
        shapes[f"conv {kern[0]}x{kern[1]} {H}x{W}x{C}->{Co}" + (f" (x{count})" if count > 1 else "")] = (v, xs)
    v = {t: (lambda x, ks=ks: [k.run_ptr(x0.ctypes.data) for k, x0 in ks], ks[-1][0].out) for t, ks in chain.items()}
    shapes["all 14 DeepLOB convs"] = (v, [None])
    return shapes


def lstm_variants(targets, base, rng, models: Path | None):
    """Per LSTM shape: variant name -> run(x), output; LiteRT float where ``models`` has its conversion."""
    from edgehft.kernels.cpu.build import CONV_ONLY, force_target
    from edgehft.kernels.cpu.lstm import NativeLSTM
    shapes = {}
    for i, (name, (T, IN, hs)) in enumerate(LSTMS.items()):
        if models is not None:
            d = np.load(models / f"{i}.npz")
            layers = [(d[f"W{j}"], d[f"U{j}"], d[f"b{j}"]) for j in range(len(hs))]
            xs = [np.ascontiguousarray(d["X"][j, 0]) for j in range(8)]
        else:
            layers, n_in = [], IN
            for H in hs:
                layers.append(tuple(rng.normal(0, s, shp).astype(np.float32) for s, shp in
                                    ((1 / np.sqrt(n_in), (n_in, 4 * H)), (1 / np.sqrt(H), (H, 4 * H)), (0.3, (4 * H,)))))
                n_in = H
            xs = [rng.normal(0, 1, (T, IN)).astype(np.float32) for _ in range(4)]
        v = {}
        for t in targets:
            with force_target(t):
                k = NativeLSTM(layers, T)
            v[t] = (lambda x, k=k: k.run_ptr(x.ctypes.data), k.out)
        for t in [t for t in targets if t not in CONV_ONLY]:    # the native-bf16 plan's recurrent weights
            with force_target(t):
                k = NativeLSTM(layers, T, recurrent_bf16=True)
            v[f"{t} U bf16"] = (lambda x, k=k: k.run_ptr(x.ctypes.data), k.out)
        if base is not None:
            out = np.zeros(hs[-1], np.float32)
            v["old -march=native"] = (base.lstm(layers, T, out), out)
        if models is not None:
            sys.path.insert(0, str(HERE))
            from native_lstm import litert
            run = litert(models / f"{i}_float.tflite")
            v["LiteRT float"] = (lambda x, run=run: run(x[None]), None)
        shapes[name] = (v, xs)
    return shapes


def ops_variants(targets, rng):
    """DeepLOB's MAX_POOL_2D and FULLY_CONNECTED per target."""
    from edgehft.kernels.cpu.build import force_target
    from edgehft.kernels.cpu.ops import NativeDense, NativeMaxPool2D
    xp = [rng.standard_normal((1, 100, 1, 32)).astype(np.float32) for _ in range(4)]
    xd = [rng.standard_normal((1, 64)).astype(np.float32) for _ in range(4)]
    w, b = rng.standard_normal((3, 64)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    pool, dense = {}, {}
    for t in targets:
        with force_target(t):
            p, d = NativeMaxPool2D((100, 1), 32, (3, 1), (1, 1), "SAME"), NativeDense(w, b, 1)
        pool[t] = (lambda x, p=p: p.run_ptr(x.ctypes.data), p.out)
        dense[t] = (lambda x, d=d: d.run_ptr(x.ctypes.data), d.out)
    return {"maxpool 3x1 100x1x32": (pool, xp), "dense 64->3": (dense, xd)}


def report(name: str, variants: dict, xs: list, args) -> None:
    """Time the variants of one shape interleaved and print their row."""
    from cpu_peers import time_interleaved
    outs = {}
    for v, (fn, out) in variants.items():
        r = fn(xs[0])
        outs[v] = np.array(out if out is not None else r, np.float32).ravel()
    lat = time_interleaved({v: (fn, xs) for v, (fn, _) in variants.items()}, 200, args.samples, args.budget)
    from edgehft.kernels.cpu.build import CONV_ONLY
    best = next(iter(variants))
    simd = next(v for v in variants if v not in CONV_ONLY)        # bits compared with the best Highway target's
    b50 = np.percentile(lat[best], 50)
    print(f"\n== {name}  (time vs {best}, outputs vs {simd})")
    for v in variants:
        p50, p99 = (np.percentile(lat[v], q) / 1e3 for q in (50, 99))
        d = np.abs(outs[v] - outs[simd]).max() if outs[v].shape == outs[simd].shape else float("nan")
        same = "bit-identical" if np.array_equal(outs[v], outs[simd]) else f"max|Δ| {d:.2g}"
        print(f"   {v:20s} p50 {p50:9.1f} µs  p99 {p99:9.1f} µs  {p50 * 1e3 / b50:6.2f}x  {same}")


def litert_models(args) -> Path | None:
    """benchmarks/native_lstm.py's LSTM models (TensorFlow in a subprocess), or None where it fails."""
    if args.no_litert:
        return None
    out = Path(tempfile.mkdtemp(prefix="edgehft-native-kernels-"))
    res = subprocess.run([sys.executable, str(HERE / "native_lstm.py"), "--_build-only", str(out)],
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1"},
                         capture_output=True, text=True)
    if res.returncode != 0:
        print(f"(no LiteRT LSTMs: building them failed: {res.stderr.strip().splitlines()[-1:]})")
        return None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--budget", type=float, default=3.0, help="seconds of each variant's own time per shape")
    ap.add_argument("--cpu", type=int, default=None, help="core to pin to (default: the last allowed)")
    ap.add_argument("--baseline", default="ac32aab", help="git revision of the -march=native kernels, or none")
    ap.add_argument("--no-litert", action="store_true")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from cpu_peers import pin_all_threads

    from edgehft.kernels.cpu.build import compiled_targets, targets
    cpu = args.cpu if args.cpu is not None else max(os.sched_getaffinity(0))
    models = litert_models(args)
    pin_all_threads(cpu)
    ts = [t for t in targets() if t != "amx"] + (["amx"] if "amx" in targets() else [])
    base = None
    tmp = tempfile.TemporaryDirectory(prefix="edgehft-baseline-")
    if args.baseline != "none":
        base = Baseline(baseline_library(args.baseline, Path(tmp.name)))
    rng = np.random.default_rng(7)
    print(f"core {cpu}, targets {ts} (compiled: {compiled_targets()}), baseline {args.baseline}, "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    shapes = {**conv_variants(ts, base, rng), **ops_variants(ts, rng), **lstm_variants(ts, base, rng, models)}
    for name, (variants, xs) in shapes.items():
        report(name, variants, xs, args)
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
