"""The figures of a Q/DQ ONNX (drift against Keras, the comparison with the int8 TFLite model, the golden
vectors) are those of the Q/DQ semantics, not of the compile host's int8 kernels (issue 15).

onnxruntime at its default optimization level rewrites DequantizeLinear -> MatMul/Conv -> QuantizeLinear into
int8 kernels (QLinearMatMul, MatMulIntegerToFloat, QLinearConv, QGemm, QLinearConcat), with the activations
moved to uint8 (zero point + 128). On AVX2 without VNNI (and AVX-512 without VNNI) those use ``vpmaddubsw``,
whose pairwise uint8 x int8 sums saturate at int16: 2 x 255 x 127 = 64770 > 32767. edgehft's Q/DQ models are
meant for TensorRT, so their figures must not depend on that: ``edgehft.compiler.onnx_check`` runs a graph
that holds Q/DQ nodes with graph optimizations off, every node as itself, Q/DQ as float ops.

The graphs here are built with onnx.helper: ``dense``, Q/DQ around two MatMuls (the MLP's pattern; it becomes
QLinearMatMul + MatMulIntegerToFloat); ``conv``, Q/DQ around a Conv (QLinearConv); ``branch``, the conv graph
whose dequantized input also feeds a 1x1 Conv, as in DeepLOB's inception module (onnxruntime copies such a
shared DequantizeLinear even with graph optimizations off, unless ``session.disable_quant_qdq`` is set).
Their inputs and int8 weights make the pairwise sums overflow int16. Their scales are dyadic with small odd
factors (3/64, 7/128, 1/1024...) so that every product and sum is exact in float32: the numpy reference of the
ONNX spec (QuantizeLinear: saturate(round_half_even(x / scale) + zero_point), computed in float32;
DequantizeLinear: (q - zero_point) * scale) and a correct float evaluation agree to the bit, whatever the
summation order; the test allows 1e-6 relative. This machine's own kernels are checked in process; an AVX2-only CPU (no AVX-512, no VNNI) is
emulated with ``qemu-x86_64 -cpu Haswell`` where qemu-user is installed.
"""
from __future__ import annotations

import functools
import json
import platform
import shutil
import subprocess
import sys
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import ROOT
from edgehft.compiler import onnx_check

OPSET = 17
INT16_MAX = 32767
INTEGER_OPS = ("QLinear", "Integer", "QGemm", "QAttention", "DynamicQuantize")   # op-type parts of int8 kernels
RTOL = 1e-6
# the int8 kernels onnxruntime 1.32 turns each graph into at ORT_ENABLE_ALL on x86
FUSED = [("dense", ["MatMulIntegerToFloat", "QLinearMatMul"]), ("conv", ["QLinearConv"])]
CASES = ["dense", "conv", "branch"]

# dense: x(n, 64) -> Q/DQ(3/64, zp 10) -> MatMul(int8 w1 (64, 32), per-column scales) -> Q/DQ(7/128)
#        -> MatMul(int8 w2 (32, 8)) -> y
DENSE = {"k": 64, "h": 32, "m": 8, "sx": 3 / 64, "zx": 10, "sh": 7 / 128,
         "s1": (1 / 1024, 3 / 1024), "s2": (1 / 512, 3 / 512)}
# conv: x(n, 4, 6, 6) -> Q/DQ(5/128) -> Conv 3x3 pad 1 (int8 w (8, 4, 3, 3), per-channel, float bias)
#       -> Q/DQ(11/64) -> y;  the same dequantized x -> Conv 1x1 (int8 v (8, 4, 1, 1)) -> Q/DQ(3/128) -> y1
CONV = {"c": 4, "o": 8, "hw": 6, "sx": 5 / 128, "sy": 11 / 64, "sw": (1 / 1024, 3 / 1024), "sy1": 3 / 128,
        "sv": (1 / 256, 3 / 256)}


# ---- the ONNX spec's Q/DQ in numpy ------------------------------------------------------------------------

def quantize(x: np.ndarray, scale, zero_point) -> np.ndarray:
    """ONNX QuantizeLinear to int8: saturate(round_half_even(x / scale) + zero_point), x / scale in float32;
    ``scale`` and ``zero_point`` broadcast against ``x`` (per-tensor or per-channel)."""
    q = np.rint(np.asarray(x, np.float32) / np.asarray(scale, np.float32)) + np.asarray(zero_point, np.float32)
    return np.clip(q, -128, 127).astype(np.int8)


def dequantize(q: np.ndarray, scale, zero_point) -> np.ndarray:
    """ONNX DequantizeLinear from int8: (q - zero_point) * scale in float32."""
    diff = q.astype(np.float32) - np.asarray(zero_point, np.float32)
    return (diff * np.asarray(scale, np.float32)).astype(np.float32)


def qdq(x: np.ndarray, scale, zero_point) -> np.ndarray:
    return dequantize(quantize(x, scale, zero_point), scale, zero_point)


def dense_reference(x: np.ndarray, w: dict) -> list[np.ndarray]:
    """The dense graph's output [(n, 8)] by the spec, the MatMuls in float64 (exact here)."""
    w1 = dequantize(w["w1"], w["s1"], 0).astype(np.float64)
    w2 = dequantize(w["w2"], w["s2"], 0).astype(np.float64)
    h = (qdq(x, DENSE["sx"], DENSE["zx"]).astype(np.float64) @ w1).astype(np.float32)
    return [(qdq(h, DENSE["sh"], 0).astype(np.float64) @ w2).astype(np.float32)]


def conv_reference(x: np.ndarray, w: dict) -> list[np.ndarray]:
    """The conv graph's output [(n, 8, 6, 6)] by the spec: 3x3 correlation with zero padding 1, in float64."""
    return branch_reference(x, w)[:1]


def branch_reference(x: np.ndarray, w: dict) -> list[np.ndarray]:
    """The branch graph's outputs [(n, 8, 6, 6)] * 2 by the spec: the conv graph's, and the 1x1 correlation
    of the same dequantized input, in float64."""
    xd = qdq(x, CONV["sx"], 0).astype(np.float64)
    win = np.lib.stride_tricks.sliding_window_view(np.pad(xd, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3),
                                                   axis=(2, 3))                    # (n, c, h, w, 3, 3)
    wd = dequantize(w["w"], w["sw"][:, None, None, None], 0).astype(np.float64)
    c = np.einsum("nchwij,ocij->nohw", win, wd) + w["b"].astype(np.float64)[None, :, None, None]
    vd = dequantize(w["v"], w["sv"][:, None, None, None], 0).astype(np.float64)
    c1 = np.einsum("nchw,oc->nohw", xd, vd[:, :, 0, 0])
    return [qdq(c.astype(np.float32), CONV["sy"], 0), qdq(c1.astype(np.float32), CONV["sy1"], 0)]


# ---- the graphs -------------------------------------------------------------------------------------------

def _act_qdq(name: str, scale: float, zp: int, inits: list) -> list:
    """QuantizeLinear + DequantizeLinear of activation ``name`` -> ``name + '_dq'`` (per tensor)."""
    inits += [numpy_helper.from_array(np.array(scale, np.float32), name + "_s"),
              numpy_helper.from_array(np.array(zp, np.int8), name + "_z")]
    return [helper.make_node("QuantizeLinear", [name, name + "_s", name + "_z"], [name + "_q"]),
            helper.make_node("DequantizeLinear", [name + "_q", name + "_s", name + "_z"], [name + "_dq"])]


def _weight_dq(name: str, q: np.ndarray, scales: np.ndarray, axis: int, inits: list) -> list:
    """Per-channel DequantizeLinear (zero point 0, as TensorRT wants) of int8 weight ``q`` -> ``name``."""
    inits += [numpy_helper.from_array(q, name + "_q"), numpy_helper.from_array(scales, name + "_s"),
              numpy_helper.from_array(np.zeros(len(scales), np.int8), name + "_z")]
    return [helper.make_node("DequantizeLinear", [name + "_q", name + "_s", name + "_z"], [name], axis=axis)]


def _model(nodes: list, inits: list, in_shape: list, out_shape: list, outputs=("y",)) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, out_shape) for o in outputs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _scales(pattern: tuple, n: int) -> np.ndarray:
    return np.array([pattern[j % len(pattern)] for j in range(n)], np.float32)


def _paired_weights(rng, shape: tuple, sign_shape: tuple, repeat: dict) -> np.ndarray:
    """int8 weights with |w| in [100, 127] and one random sign per block (``repeat``: axis -> block length),
    so that neighbouring K elements, which vpmaddubsw adds pairwise, share a sign."""
    signs = rng.choice([-1, 1], sign_shape)
    for axis, k in repeat.items():
        signs = np.repeat(signs, k, axis=axis)
    return (signs * rng.integers(100, 128, shape)).astype(np.int8)


def dense_weights(rng) -> dict:
    k, h, m = DENSE["k"], DENSE["h"], DENSE["m"]
    return {"w1": _paired_weights(rng, (k, h), (k // 2, h), {0: 2}), "s1": _scales(DENSE["s1"], h),
            "w2": rng.integers(-127, 128, (h, m)).astype(np.int8), "s2": _scales(DENSE["s2"], m)}


def dense_model(w: dict) -> onnx.ModelProto:
    inits: list = []
    nodes = _act_qdq("x", DENSE["sx"], DENSE["zx"], inits) + _weight_dq("w1", w["w1"], w["s1"], 1, inits)
    nodes += [helper.make_node("MatMul", ["x_dq", "w1"], ["h"])] + _act_qdq("h", DENSE["sh"], 0, inits)
    nodes += _weight_dq("w2", w["w2"], w["s2"], 1, inits) + [helper.make_node("MatMul", ["h_dq", "w2"], ["y"])]
    return _model(nodes, inits, ["n", DENSE["k"]], ["n", DENSE["m"]])


def conv_weights(rng) -> dict:
    c, o = CONV["c"], CONV["o"]
    return {"w": _paired_weights(rng, (o, c, 3, 3), (o, c // 2, 1, 1), {1: 2, 2: 3, 3: 3}),
            "sw": _scales(CONV["sw"], o), "b": (rng.integers(-50, 50, o) / 64).astype(np.float32),
            "v": _paired_weights(rng, (o, c, 1, 1), (o, c // 2, 1, 1), {1: 2}), "sv": _scales(CONV["sv"], o)}


def conv_model(w: dict, branch: bool = False) -> onnx.ModelProto:
    """The conv graph; ``branch``: its dequantized input also feeds a 1x1 Conv, whose Q/DQ'd output is y1."""
    inits = [numpy_helper.from_array(w["b"], "b")]
    nodes = _act_qdq("x", CONV["sx"], 0, inits) + _weight_dq("w", w["w"], w["sw"], 0, inits)
    nodes += [helper.make_node("Conv", ["x_dq", "w", "b"], ["c"], pads=[1, 1, 1, 1])]
    nodes += _act_qdq("c", CONV["sy"], 0, inits) + [helper.make_node("Identity", ["c_dq"], ["y"])]
    if branch:
        nodes += _weight_dq("v", w["v"], w["sv"], 0, inits) + [helper.make_node("Conv", ["x_dq", "v"], ["c1"])]
        nodes += _act_qdq("c1", CONV["sy1"], 0, inits) + [helper.make_node("Identity", ["c1_dq"], ["y1"])]
    c, o, hw = CONV["c"], CONV["o"], CONV["hw"]
    return _model(nodes, inits, ["n", c, hw, hw], ["n", o, hw, hw], outputs=("y", "y1") if branch else ("y",))


def dense_inputs(rng) -> np.ndarray:
    """(12, 64) float32: 3 rows at the top of the input's int8 range (q = 127, 255 once moved to uint8), 3 at
    exact rounding ties ((k + 0.5) * scale), 2 beyond the range (Q saturates), 4 uniform over the range."""
    k, s, z = DENSE["k"], DENSE["sx"], DENSE["zx"]
    top = np.full((3, k), (127 - z) * s)
    ties = (rng.integers(-100, 100, (3, k)) + 0.5) * s
    beyond = rng.choice([-1, 1], (2, k)) * 200 * s
    uniform = rng.uniform((-128 - z) * s, (127 - z) * s, (4, k))
    return np.concatenate([top, ties, beyond, uniform]).astype(np.float32)


def conv_inputs(rng) -> np.ndarray:
    """(4, 4, 6, 6) float32: one window at the top of the int8 range, one of exact ties, two uniform."""
    c, hw, s = CONV["c"], CONV["hw"], CONV["sx"]
    top = np.full((1, c, hw, hw), 127 * s)
    ties = (rng.integers(-100, 100, (1, c, hw, hw)) + 0.5) * s
    uniform = rng.uniform(-128 * s, 127 * s, (2, c, hw, hw))
    return np.concatenate([top, ties, uniform]).astype(np.float32)


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    """name -> {"path": the model, "x": inputs, "ref": the spec's outputs, "ops": the graph's node op types
    (Counter), "w": its weights}."""
    rng = np.random.default_rng(15)
    work = tmp_path_factory.mktemp("qdq")
    out = {}
    branch_model = functools.partial(conv_model, branch=True)
    for name, weights, model, inputs, ref in (("dense", dense_weights, dense_model, dense_inputs, dense_reference),
                                              ("conv", conv_weights, conv_model, conv_inputs, conv_reference),
                                              ("branch", conv_weights, branch_model, conv_inputs, branch_reference)):
        w = weights(rng)
        m = model(w)
        onnx.save(m, str(work / f"{name}.onnx"))
        x = inputs(rng)
        out[name] = {"path": work / f"{name}.onnx", "x": x, "ref": ref(x, w), "w": w,
                     "ops": Counter(n.op_type for n in m.graph.node)}
    return out


def _optimized_ops(path, level, tmp_path) -> list[str]:
    """Op types of ``path`` as onnxruntime rewrites it at graph optimization ``level`` on this CPU."""
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.optimized_model_filepath = str(tmp_path / f"opt_{path.stem}_{int(level)}.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]


def _profiled(path, so, x: np.ndarray, tmp_path) -> Counter:
    """Op type -> kernels onnxruntime's profile says ran for one call of ``path`` on ``x`` with options ``so``."""
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / f"prof_{path.stem}")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    sess.run(None, {"x": x})
    events = json.loads(open(sess.end_profiling()).read())
    return Counter(e["args"]["op_name"] for e in events
                   if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"))


def _integer_ops(ops) -> list[str]:
    return sorted({op for op in ops if any(part in op for part in INTEGER_OPS)})


# ---- the tests --------------------------------------------------------------------------------------------

def test_inputs_overflow_int16_pair_sums(cases):
    """The inputs are what breaks vpmaddubsw: once moved to uint8 (q + 128), neighbouring K products of the
    first weighted op sum beyond int16; and onnxruntime's default level does turn these graphs into int8
    kernels (without that, the tests below would prove nothing)."""
    x, w = cases["dense"]["x"], cases["dense"]["w"]["w1"].astype(np.int64)
    u8 = quantize(x, DENSE["sx"], DENSE["zx"]).astype(np.int64) + 128          # onnxruntime's S8 -> U8 move
    pairs = u8[:, 0::2, None] * w[None, 0::2] + u8[:, 1::2, None] * w[None, 1::2]
    assert np.abs(pairs).max() > INT16_MAX
    assert (np.abs(pairs) > INT16_MAX).mean() > 0.25


@pytest.mark.parametrize("name,fused", FUSED)
def test_default_level_would_fuse_into_int8_kernels(cases, tmp_path, name, fused):
    """The graphs are ones onnxruntime runs on int8 kernels when nothing stops it (ORT_ENABLE_ALL), and all
    their nodes as themselves with ORT_DISABLE_ALL."""
    path, ops = cases[name]["path"], cases[name]["ops"]
    assert _integer_ops(_optimized_ops(path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, tmp_path)) == fused
    assert Counter(_optimized_ops(path, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, tmp_path)) == ops


@pytest.mark.parametrize("name", CASES)
def test_run_onnx_equals_the_qdq_spec(cases, name):
    """edgehft's Q/DQ evaluation (run_onnx) on this CPU equals the numpy reference of the ONNX spec."""
    path, x, refs = (cases[name][k] for k in ("path", "x", "ref"))
    ys = onnx_check.run_onnx(path, x)
    assert len(ys) == len(refs)
    for y, ref in zip(ys, refs):
        np.testing.assert_allclose(y, ref, rtol=RTOL, atol=RTOL * np.abs(ref).max())
        assert np.abs(ref).max() > 1.0 and len(np.unique(ref)) > 20               # not a trivial output


@pytest.mark.parametrize("name", CASES)
def test_qdq_session_runs_every_node_as_itself(cases, tmp_path, name):
    """The session edgehft runs a Q/DQ graph in has graph optimizations off, and the kernels onnxruntime's
    profile says ran are exactly the graph's nodes: float MatMul/Conv plus QuantizeLinear/DequantizeLinear,
    no int8 kernel."""
    path, x, ops = (cases[name][k] for k in ("path", "x", "ops"))
    so = onnx_check.session(path).get_session_options()
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ran = _profiled(path, so, x[:1], tmp_path)
    assert ran == ops and not _integer_ops(ran)


@pytest.mark.parametrize("name", CASES)
def test_kernels_run_reports_the_graphs_nodes(cases, tmp_path, name):
    """onnx_check.kernels_run (what the Jetson int8 stage records in the report) lists the kernels that ran,
    one count per op type: the graph's own nodes, so foreign_kernels (the stage's guard) finds none; on the
    profile of the default level it names the int8 kernels onnxruntime put in."""
    path, x, ops = (cases[name][k] for k in ("path", "x", "ops"))
    ran = onnx_check.kernels_run(path, x[:1])
    assert ran == dict(ops) and onnx_check.graph_ops(path) == dict(ops)
    assert onnx_check.foreign_kernels(ran, path) == []
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    foreign = onnx_check.foreign_kernels(dict(_profiled(path, so, x[:1], tmp_path)), path)
    assert set(dict(FUSED).get(name, [])) <= set(foreign) and "DequantizeLinear" in foreign


def test_shared_dequantize_is_not_copied(cases, tmp_path):
    """A DequantizeLinear read by two nodes (the branch graph; DeepLOB's inception module) is copied by
    onnxruntime even at ORT_DISABLE_ALL (one copy per consumer), unless ``session.disable_quant_qdq`` is set,
    as edgehft's session does: it runs the graph's own five (x, two weights, two outputs)."""
    path, x, ops = (cases["branch"][k] for k in ("path", "x", "ops"))
    plain = Counter(_optimized_ops(path, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, tmp_path))
    assert ops["DequantizeLinear"] == 5 and plain["DequantizeLinear"] == 6
    so = onnx_check.session(path).get_session_options()
    assert so.get_session_config_entry("session.disable_quant_qdq") == "1"
    assert _profiled(path, so, x[:1], tmp_path)["DequantizeLinear"] == 5


def test_float_graph_keeps_the_default_optimizations(tmp_path):
    """A graph without Q/DQ (the float32 / fp16 exports) keeps onnxruntime's default level: the float export
    checks are unchanged."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [w], ["n", 4], ["n", 4])
    onnx.save(m, str(tmp_path / "f.onnx"))
    assert not onnx_check.has_qdq(tmp_path / "f.onnx")
    level = onnx_check.session(tmp_path / "f.onnx").get_session_options().graph_optimization_level
    assert level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(onnx_check.run_onnx(tmp_path / "f.onnx", x)[0], x)


# What the emulated AVX2 CPU runs: its ISA as numpy sees it, then edgehft's run_onnx on each case.
AVX2_SCRIPT = """
import json, sys
import numpy as np
from numpy._core._multiarray_umath import __cpu_features__ as f
from edgehft.compiler.onnx_check import run_onnx
out = {f"{name}/{k}": y for name, path, x in json.loads(sys.argv[1]) for k, y in enumerate(run_onnx(path, np.load(x)))}
np.savez(sys.argv[2], **out)
print(json.dumps({k: bool(f[k]) for k in ("AVX2", "FMA3", "AVX512F", "AVX512VNNI", "AVX512_SPR")}))
"""


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("qemu-x86_64") is None,
                    reason="no qemu-x86_64 to emulate an AVX2-only CPU (apt-get install qemu-user)")
def test_run_onnx_equals_the_qdq_spec_on_an_avx2_cpu(cases, tmp_path):
    """On an emulated Haswell (AVX2 + FMA, no AVX-512, no VNNI: the CPU of the issue), run_onnx of both
    graphs still equals the spec's reference."""
    jobs = []
    for name, case in cases.items():
        np.save(tmp_path / f"{name}_x.npy", case["x"])
        jobs.append([name, str(case["path"]), str(tmp_path / f"{name}_x.npy")])
    cmd = ["qemu-x86_64", "-cpu", "Haswell", sys.executable, "-c", AVX2_SCRIPT, json.dumps(jobs),
           str(tmp_path / "avx2.npz")]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    isa = json.loads(r.stdout.strip().splitlines()[-1])
    assert isa == {"AVX2": True, "FMA3": True, "AVX512F": False, "AVX512VNNI": False, "AVX512_SPR": False}
    with np.load(tmp_path / "avx2.npz") as got:
        for name, case in cases.items():
            names = [f"{name}/{k}" for k in range(len(case["ref"]))]
            assert sorted(k for k in got.files if k.startswith(name + "/")) == names
            for k, ref in enumerate(case["ref"]):
                np.testing.assert_allclose(got[f"{name}/{k}"], ref, rtol=RTOL, atol=RTOL * np.abs(ref).max(),
                                           err_msg=f"{name} output {k}")
