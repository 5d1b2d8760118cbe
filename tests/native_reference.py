"""Independent references for the cpu board's native kernels and chains (edgehft.kernels.cpu), shared by the
kernels' unit tests (tests/unit/test_native_*.py) and the native plans' tests (tests/compile/): float64 TFLite
CONV_2D on bf16-rounded operands, a float64 Keras-semantics LSTM, TFLite MAX_POOL_2D, and one native.json
LiteRT step on a plain interpreter.

BOUND and SAT_BOUND are the native LSTM's error bounds (reasoned in tests/unit/test_native_lstm.py).
"""
from __future__ import annotations

import numpy as np

from edgehft.kernels.cpu.conv import geometry


def bf16(a):
    """Round float32 to bfloat16 (nearest even), returned as float32."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def reference_conv(x, w, b, stride, padding, act="none", alpha=0.0):
    """float64 TFLite CONV_2D: x (H, W, C), w (Co, kh, kw, C) -> (Ho, Wo, Co) and the sum of |products|."""
    H, W, C = x.shape
    Co, kh, kw, _ = w.shape
    Ho, Wo, ph, pw = geometry((H, W), (kh, kw), stride, padding)
    xp = np.zeros(((Ho - 1) * stride[0] + kh, (Wo - 1) * stride[1] + kw, C))
    rows, cols = min(H, xp.shape[0] - ph), min(W, xp.shape[1] - pw)
    xp[ph:ph + rows, pw:pw + cols] = x[:rows, :cols]
    y = np.zeros((Ho, Wo, Co))
    mag = np.zeros((Ho, Wo, Co))
    for i in range(kh):
        for j in range(kw):
            patch = xp[i:i + (Ho - 1) * stride[0] + 1:stride[0], j:j + (Wo - 1) * stride[1] + 1:stride[1]]
            y += patch @ w[:, i, j, :].T.astype(np.float64)
            mag += np.abs(patch) @ np.abs(w[:, i, j, :].T.astype(np.float64))
    if b is not None:
        y += b
    y = {"none": y, "relu": np.maximum(y, 0), "relu6": np.clip(y, 0, 6), "relu_n1_to_1": np.clip(y, -1, 1),
         "leaky_relu": np.where(y > 0, y, alpha * y)}[act]
    return y, mag


def cpu_targets() -> list[str]:
    """Every dispatch target of the native kernels this CPU runs, best first (for parametrizing the kernel
    tests); ["best"] when the kernel library cannot be had here (the tests then say why)."""
    from edgehft.errors import BoardUnavailableError
    from edgehft.kernels.cpu.build import targets
    try:
        return targets()
    except BoardUnavailableError:
        return ["best"]


def simd_target(target: str) -> str:
    """What a kernel other than the conv runs when ``target`` is in force: the conv-only levels (amx,
    avx3_bf16) give the best Highway SIMD target."""
    from edgehft.kernels.cpu.build import CONV_ONLY, targets
    return target if target not in CONV_ONLY else [t for t in targets() if t not in CONV_ONLY][0]


BOUND = 2e-6
# The saturating case drives c to ~15 and back to ~0: fp32 rounding of c (ulp(15) = 9.5e-7) accumulates
# over 30 steps and survives the cancellation, so it gets its own bound (measured ~7e-6).
SAT_BOUND = 3e-5


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def reference_lstm(layers, x, return_sequences, cell_clip=0.0):
    """Keras LSTM semantics in float64: z = x@W + h@U + b, gates i, f, c, o (c clamped to +-cell_clip
    when > 0, as TFLite does)."""
    X = np.asarray(x, np.float64)
    for W, U, b in layers:
        W, U, b = (np.asarray(a, np.float64) for a in (W, U, b))
        H = U.shape[0]
        h, c, seq = np.zeros(H), np.zeros(H), []
        for t in range(X.shape[0]):
            z = X[t] @ W + h @ U + b
            c = sigmoid(z[H:2 * H]) * c + sigmoid(z[:H]) * np.tanh(z[2 * H:3 * H])
            if cell_clip > 0:
                c = np.clip(c, -cell_clip, cell_clip)
            h = sigmoid(z[3 * H:]) * np.tanh(c)
            seq.append(h)
        X = np.array(seq)
    return X if return_sequences else X[-1]


def reference_maxpool(x, f, stride, padding, act="none"):
    """TFLite MAX_POOL_2D: max over the window clipped to the input. x (H, W, C) -> (Ho, Wo, C)."""
    H, W, C = x.shape
    Ho, Wo, ph, pw = geometry((H, W), f, stride, padding)
    y = np.empty((Ho, Wo, C), np.float32)
    for oy in range(Ho):
        for ox in range(Wo):
            y0, x0 = oy * stride[0] - ph, ox * stride[1] - pw
            win = x[max(y0, 0):min(y0 + f[0], H), max(x0, 0):min(x0 + f[1], W)]
            y[oy, ox] = win.max(axis=(0, 1))
    return {"none": y, "relu": np.maximum(y, 0), "relu6": np.clip(y, 0, 6), "relu_n1_to_1": np.clip(y, -1, 1)}[act]


def run_segment(bundle_dir, st: dict, env: dict, interpreters: dict) -> None:
    """One native.json LiteRT step on ``env`` (tensor name -> array) with a plain LiteRT interpreter
    (cached in ``interpreters`` by model file): the independent checks' stand-in for the runtime."""
    from ai_edge_litert.interpreter import Interpreter
    it = interpreters.get(st["model"])
    if it is None:
        it = interpreters[st["model"]] = Interpreter(model_path=str(bundle_dir / st["model"]), num_threads=1)
        it.allocate_tensors()
    for d in it.get_input_details():
        it.set_tensor(d["index"], env[d["name"]].astype(d["dtype"]).reshape(d["shape"]))
    it.invoke()
    for d in it.get_output_details():
        env[d["name"]] = it.get_tensor(d["index"])
