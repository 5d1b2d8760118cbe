"""ONNX Runtime as a candidate engine of the cpu board (issue 15 item 5): ``--quant auto`` measures the model's
float ONNX export (``ort-float``) and ONNX Runtime's static int8 Q/DQ quantization of it (``ort-int8``) on ONNX
Runtime like the other plans, ships them when they pass the drift gate, and the cpu runtime runs them: golden
vectors reproduced, the same input checks, reused buffers, no allocation per call; a damaged or hostile
``model.onnx`` is exit 6 with one line. No timed assertions.
"""
from __future__ import annotations

import json
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgehft import runtime
from edgehft.boards import load_board
from edgehft.bundle import FORMAT_VERSION_FOR_PLAN, MANIFEST, load_bundle, sha256_file
from edgehft.cli import main
from edgehft.compiler import ort_plans
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.errors import BundleError, DTypeError, InputError, NonFiniteInputError, ShapeError
from edgehft.runtime import cpu as cpu_runtime

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(ort_plans.unavailable() is not None, reason=str(ort_plans.unavailable()))]
ORT = ("ort-float", "ort-int8")


@pytest.fixture(scope="module")
def mlp_ort(mlp, tmp_path_factory) -> Path:
    """The example MLP compiled with --quant auto: int8, dynamic, float, ort-float and ort-int8 measured."""
    out = tmp_path_factory.mktemp("ort") / "mlp.auto"
    compile_model(mlp / "mlp.keras", [mlp / "x.npy"], out, CompileOptions(board="cpu", quant="auto"))
    return out


def _plan_dir(bundle: Path, plan: str) -> Path:
    b = load_bundle(bundle)
    return bundle if b.manifest.quantization.mode == plan else bundle / "plans" / plan


def _output_step(onnx_path: Path) -> float:
    """The scale of the DequantizeLinear that makes the graph's one output (read here, not by edgehft)."""
    import onnx
    from onnx import numpy_helper
    g = onnx.load(str(onnx_path)).graph
    (out,) = g.output
    node = next(n for n in g.node if out.name in n.output)
    assert node.op_type == "DequantizeLinear"
    return float(numpy_helper.to_array(next(t for t in g.initializer if t.name == node.input[1])))


def test_auto_measures_and_ships_the_ort_plans(mlp_ort):
    b = load_bundle(mlp_ort)
    rep = json.loads((mlp_ort / "report.json").read_text())["plan"]
    measured = {m["plan"]: m for m in rep["measured"]}
    assert set(ORT) <= set(rep["candidates"]) and set(ORT) <= set(rep["shipped"]) <= set(b.manifest.plans)
    for plan in ORT:
        m, entry = measured[plan], b.manifest.plans[plan]
        assert m["drift_passed"] and 0 < m["p50_us"] <= m["p99_us"] and entry.compile_host["p50_us"] > 0
        assert entry.drift_rel_mae == m["drift_rel_mae"]
    assert measured["ort-float"]["drift_rel_mae"] < 1e-5               # the float export computes the model
    assert 1e-4 < measured["ort-int8"]["drift_rel_mae"] < 0.01        # int8: a real, gated error
    top = b.manifest.quantization.mode
    assert b.manifest.format_version == FORMAT_VERSION_FOR_PLAN.get(top, 1)
    for plan in ORT:
        sub = b.plan(plan)
        m = sub.manifest
        assert m.model_file == "model.onnx" and m.format_version == 3 and m.quantization.mode == plan
        assert [s.dtype for s in m.inputs + m.outputs] == ["float32", "float32"]
        assert m.golden.count == 16 and m.golden.compare == "allclose"
        assert m.golden.reference_path.startswith("onnxruntime ") and "ORT_ENABLE_ALL" in m.golden.reference_path
        assert b.manifest.files[f"plans/{plan}/model.onnx" if plan != top else "model.onnx"] == sha256_file(
            sub.path / "model.onnx")


def test_ort_int8_is_onnx_runtimes_qdq_with_7_bit_weights_and_a_one_step_tolerance(mlp_ort):
    import onnx
    from onnx import numpy_helper
    d = _plan_dir(mlp_ort, "ort-int8")
    g = onnx.load(str(d / "model.onnx")).graph
    ops = [n.op_type for n in g.node]
    assert ops.count("QuantizeLinear") >= 5 and ops.count("MatMul") == 5      # Q/DQ around every Dense
    int8 = [numpy_helper.to_array(t) for t in g.initializer if t.data_type == onnx.TensorProto.INT8 and t.dims]
    assert int8 and max(int(np.abs(w.astype(np.int32)).max()) for w in int8) <= 64   # reduce_range: 7 bits
    step = _output_step(d / "model.onnx")
    m = load_bundle(d).manifest
    assert m.golden.atol == pytest.approx(step) and step > 1e-4
    f = load_bundle(_plan_dir(mlp_ort, "ort-float")).manifest.golden
    assert f.atol == pytest.approx(1e-5)        # ENABLE_ALL and DISABLE_ALL agree here: the 1e-5 floor


@pytest.mark.parametrize("plan", ORT)
def test_run_golden_reproduces_the_ort_plan_and_a_bare_session_agrees(mlp_ort, plan):
    res = CliRunner().invoke(main, ["run", str(mlp_ort), "--golden", "--plan", plan, "--json"])
    assert res.exit_code == 0, res.output
    g = json.loads(res.output.strip().splitlines()[-1])
    assert g["ok"] and g["count"] == 16 and g["plan"] == plan and g["path"].startswith("onnxruntime ")
    import onnxruntime as ort
    d = _plan_dir(mlp_ort, plan)
    b = load_bundle(d)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(d / "model.onnx"), so, providers=["CPUExecutionProvider"])
    ins, outs = b.golden()
    x, y = ins[b.manifest.inputs[0].name], outs[b.manifest.outputs[0].name]
    got = np.concatenate([sess.run(None, {sess.get_inputs()[0].name: x[n:n + 1]})[0] for n in range(len(x))])
    assert np.abs(got.astype(np.float64) - y).max() <= b.manifest.golden.atol


def test_the_ort_runner_checks_inputs_and_reuses_its_buffers(mlp_ort):
    b = load_bundle(_plan_dir(mlp_ort, "ort-float"))
    ins, outs = b.golden()
    x, y = ins["features"], outs["signal"]
    with runtime.open(mlp_ort, plan="ort-float") as r:
        d = r.describe()
        assert d["engine"] == "onnxruntime" and d["interpreter"].startswith("onnxruntime ") and d["zero_copy"]
        assert r.plan == "ort-float" and r.plan_source == "asked for by name"
        first = r.predict(x[0])
        assert np.abs(first - y[0]).max() <= b.manifest.golden.atol
        again = r.predict(x[1])
        assert again is first and np.abs(again - y[1]).max() <= b.manifest.golden.atol   # one reused buffer
        assert np.array_equal(r.predict(x[1].astype(np.float64)), again)
        with pytest.raises(ShapeError, match=r"shape \(63,\)"):
            r.predict(x[0][:63])
        bad = x[0].copy()
        bad[5] = np.nan
        with pytest.raises(NonFiniteInputError, match="first at index"):
            r.predict(bad)
        with pytest.raises(DTypeError):
            r.predict(x[0].astype(np.int32))


def test_the_ort_runner_does_not_allocate_per_call(mlp_ort):
    xs = [w for w in load_bundle(_plan_dir(mlp_ort, "ort-int8")).golden()[0]["features"]]
    with runtime.open(mlp_ort, plan="ort-int8") as r:
        for x in xs * 4:
            r.predict(x)
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for _ in range(12):
            for x in xs:
                r.predict(x)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename") if s.size_diff > 0)
    assert grown < 2048, f"predict grew Python memory by {grown} bytes over {12 * len(xs)} calls"


def test_the_reference_path_is_onnx_runtime_without_optimizations(mlp_ort):
    sub = load_bundle(_plan_dir(mlp_ort, "ort-int8"))
    ins, outs = sub.golden()
    run = cpu_runtime.Runner(sub, load_board("cpu"), op_resolver="reference")
    try:
        assert "ORT_DISABLE_ALL (Q/DQ as float ops)" in run.path
        got = np.concatenate([run.predict(x[None]).copy() for x in ins["features"]])
    finally:
        run.close()
    # the exact Q/DQ semantics land on the fused kernels' values within the golden tolerance
    assert np.abs(got - outs["signal"]).max() <= sub.manifest.golden.atol


def _with_model(src: Path, dst: Path, plan: str, data: bytes) -> Path:
    """A copy of bundle ``src`` whose plan ``plan`` has ``model.onnx`` = ``data``, re-hashed so it verifies."""
    shutil.copytree(src, dst)
    sub = _plan_dir(dst, plan)
    (sub / "model.onnx").write_bytes(data)
    for d in ([sub] if sub != dst else []) + [dst]:
        m = json.loads((d / MANIFEST).read_text())
        m["files"] = {rel: sha256_file(d / rel) for rel in m["files"]}
        (d / MANIFEST).write_text(json.dumps(m, indent=1))
    load_bundle(dst)
    return dst


def _hostile_models(good: bytes) -> dict:
    import onnx
    from onnx import TensorProto, helper
    model = onnx.load_model_from_string(good)
    typed = helper.make_model(helper.make_graph(        # float + int64 into one Add: ONNX Runtime refuses it
        [helper.make_node("Add", ["features", "k"], ["signal"])], "typed",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("signal", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor("k", TensorProto.INT64, [1], [1])]), opset_imports=[helper.make_opsetid("", 17)])
    custom = onnx.load_model_from_string(good)
    custom.graph.node[0].domain = "evil.ops"
    custom.opset_import.append(helper.make_opsetid("evil.ops", 1))
    external = onnx.load_model_from_string(good)
    t = external.graph.initializer[0]
    t.data_location = TensorProto.EXTERNAL
    t.ClearField("raw_data")
    t.external_data.add(key="location", value="../../../../etc/passwd")
    del model
    return {"truncated": (good[:len(good) // 2], "is not an ONNX model"),
            "typed": (typed.SerializeToString(), "ONNX Runtime cannot open the model"),
            "custom": (custom.SerializeToString(), "operator domain(s) 'evil.ops'"),
            "external": (external.SerializeToString(), "keep their data in external files")}


def test_a_damaged_or_hostile_onnx_model_is_exit_6_with_one_line(mlp_ort, tmp_path):
    good = (_plan_dir(mlp_ort, "ort-float") / "model.onnx").read_bytes()
    for name, (data, said) in _hostile_models(good).items():
        bundle = _with_model(mlp_ort, tmp_path / name, "ort-float", data)
        res = CliRunner().invoke(main, ["run", str(bundle), "--golden", "--plan", "ort-float"])
        assert res.exit_code == 6, (name, res.output)
        first = res.output.strip().splitlines()[0]
        assert first.startswith("error: ") and said in first and "Traceback" not in res.output, (name, res.output)
        ok = CliRunner().invoke(main, ["run", str(bundle), "--golden", "--plan", "int8"])
        assert ok.exit_code == 0, ok.output                 # the bundle's other plans still run


def test_an_ort_plan_by_name_is_a_single_plan_bundle(mlp, tmp_path):
    out = tmp_path / "ort-int8"
    res = CliRunner().invoke(main, ["compile", str(mlp / "mlp.keras"), "--board", "cpu", "--quant", "ort-int8",
                                    "--calib", str(mlp / "x.npy"), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    raw = json.loads((out / MANIFEST).read_text())
    assert "plans" not in raw and raw["format_version"] == 3 and raw["model_file"] == "model.onnx"
    assert raw["quantization"]["mode"] == "ort-int8" and raw["quantization"]["calibration_windows"] == 200
    rep = json.loads((out / "report.json").read_text())
    assert rep["verdict_source"].startswith("onnxruntime ") and {o["kernel"] for o in rep["ops"]} == {"onnxruntime"}
    assert any("QLinearMatMul" in n for n in rep["notes"])     # what ONNX Runtime ran: its fused int8 kernels
    assert not (out / "model.tflite").exists() and not (out / "plans").exists()
    run = CliRunner().invoke(main, ["run", str(out), "--golden", "--json"])
    assert run.exit_code == 0 and json.loads(run.output.strip().splitlines()[-1])["ok"], run.output


def test_an_export_that_fails_leaves_the_ort_plans_out(tmp_path):
    """The worker's optional ONNX stage: tf2onnx refusing the model is recorded, not an error, and the
    pipeline then leaves the two plans out, saying why."""
    from edgehft.compiler import pipeline, worker
    out = tmp_path / "w"
    out.mkdir()

    def refuses(x):
        raise ValueError("no ONNX for this model")
    held = np.zeros((4, 8), np.float32)
    info = worker._onnx({"onnx": True, "onnx_optional": True}, out, refuses, (8,), "x", held, [held[:, :1]])
    assert info["error"].startswith("ConverterError: tf2onnx could not export the model")
    assert not (out / "model.onnx").exists()
    said = []
    assert pipeline._ort_candidates(tmp_path, {"info": {"onnx": info}}, said.append) == []
    assert said == [f"plans ort-float, ort-int8: skipped ({info['error']})"]


def test_candidates_name_the_plans_auto_measures(mlp, tmp_path):
    """CompileOptions.candidates (e.g. a fleet without onnxruntime: the LiteRT and native plans only) is
    checked before anything runs."""
    for cands, quant, said in ((("int8", "onnx"), "auto", "not 'onnx'"), (("int8",), "int8", "--quant auto chooses"),
                               ((), "auto", "--quant auto chooses among int8, dynamic, float, native")):
        with pytest.raises(InputError, match=said) as e:
            compile_model(mlp / "mlp.keras", [mlp / "x.npy"], tmp_path / "x",
                          CompileOptions(board="cpu", quant=quant, candidates=cands))
        assert e.value.exit_code == 3 and not (tmp_path / "x").exists()


def test_the_first_open_of_an_ort_plan_is_isolated_and_keyed_by_onnxruntime(mlp_ort, tmp_path, monkeypatch):
    import onnxruntime as ort

    from edgehft.runtime import isolate
    monkeypatch.setenv("EDGEHFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(isolate, "_passed", set())
    sub = load_bundle(mlp_ort).plan("ort-int8")
    board = load_board("cpu")
    assert isolate._engine_versions(sub)["onnxruntime"] == ort.__version__
    assert isolate.first_open(sub, board, 1, {}) is True               # a child opened it and ran it once
    assert len(list((tmp_path / "cache" / "opened").iterdir())) == 1
    assert isolate.first_open(sub, board, 1, {}) is False              # remembered: no child the second time
    with pytest.raises(BundleError, match=r"ONNX Runtime crashed \(SIGSEGV\) while opening it, in an isolated"):
        isolate._raise_for({"signal": "SIGSEGV", "step": "opening it"}, "bundle b", isolate._engine(sub))


@pytest.fixture(scope="module")
def ort_on_top(mlp, tmp_path_factory) -> Path:
    """The example MLP with --quant auto, ort-float's measured figures made the lowest (the drift gate still
    decides): the ONNX Runtime plan at the bundle's top level, what a host where ONNX Runtime is fastest gets."""
    from edgehft.compiler import plans
    real = plans.time_plans

    def ort_first(bundles, *a, **k):
        t = real(bundles, *a, **k)
        t["ort-float"] = {**t["ort-float"], "p50_us": 1e-3, "p99_us": 1e-3, "p99.9_us": 1e-3}
        return t
    out = tmp_path_factory.mktemp("ort-top") / "mlp.auto"
    mp = pytest.MonkeyPatch()
    mp.setattr(plans, "time_plans", ort_first)
    try:
        compile_model(mlp / "mlp.keras", [mlp / "x.npy"], out, CompileOptions(board="cpu", quant="auto"))
    finally:
        mp.undo()
    return out


def test_an_ort_plan_at_the_top_level(ort_on_top):
    b = load_bundle(ort_on_top)
    m = b.manifest
    assert m.quantization.mode == "ort-float" and m.model_file == "model.onnx" and m.format_version == 3
    assert m.artifacts["int8_ir"] == "model_int8.tflite" and "model_int8.tflite" in m.files
    assert not (ort_on_top / "model.tflite").exists() and m.plans["ort-float"].dir is None
    rep = json.loads((ort_on_top / "report.json").read_text())
    assert rep["plan"]["chosen"] == "ort-float" and "the ort-float plan: model.onnx is the float32 ONNX" in \
        rep["plan"]["reference"]
    assert [o["op"] for o in rep["ops"]] == ["MatMul", "Relu"] * 4 + ["MatMul"]      # the ONNX graph's nodes
    assert rep["golden"]["reference_kernels_path"].endswith("ORT_DISABLE_ALL (Q/DQ as float ops)")
    for name in ("int8", "dynamic", "float"):                       # the LiteRT plans: sub-bundles, format 1
        assert b.plan(name).manifest.format_version == 1 and b.plan(name).manifest.model_file == "model.tflite"
    with runtime.open(ort_on_top) as r:
        assert r.plan == "ort-float" and r.plan_source.startswith("the bundle's top level")
        from edgehft.bundle_checks import check_golden
        assert check_golden(r)["ok"]
    res = CliRunner().invoke(main, ["run", str(ort_on_top), "--golden", "--plan", "dynamic", "--json"])
    assert res.exit_code == 0 and json.loads(res.output.strip().splitlines()[-1])["ok"], res.output


AVX2_GOLDEN = """
import json, sys
from edgehft.boards import load_board
from edgehft.bundle import load_bundle
from edgehft.bundle_checks import check_golden
from edgehft.runtime import cpu
b, out = load_bundle(sys.argv[1]), {}
for plan in ("ort-float", "ort-int8"):
    r = cpu.Runner(b.plan(plan), load_board("cpu"))
    out[plan] = check_golden(r)
    r.close()
print(json.dumps(out))
"""


@pytest.mark.skipif(shutil.which("qemu-x86_64") is None or __import__("platform").machine() != "x86_64",
                    reason="no qemu-x86_64 to emulate an AVX2-only CPU (apt-get install qemu-user)")
def test_the_ort_plans_golden_vectors_hold_on_an_avx2_only_cpu(mlp_ort):
    """On an emulated Haswell (AVX2 + FMA, no AVX-512, no VNNI) ONNX Runtime's int8 kernels add uint8 x int8
    pairs in int16: with 7-bit weights nothing saturates, so the ort-int8 golden vectors made on this host
    reproduce to the bit (8-bit weights differed by up to 0.076 on the example MLP); ort-float within its tolerance."""
    import subprocess
    import sys
    p = subprocess.run(["qemu-x86_64", "-cpu", "Haswell", sys.executable, "-c", AVX2_GOLDEN, str(mlp_ort)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["ort-int8"]["ok"] and got["ort-int8"]["matched"] == 16 and got["ort-int8"]["max_diff"] == 0.0
    atol = load_bundle(mlp_ort).plan("ort-float").manifest.golden.atol
    assert got["ort-float"]["ok"] and got["ort-float"]["max_diff"] <= atol
