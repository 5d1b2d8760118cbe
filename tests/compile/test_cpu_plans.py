"""cpu board speed work: the per-op profile (`bench --profile`) and the measured plan choice (`--quant auto`).

No timed assertions: the tests check that the profile covers every op and that the chosen plan is what the
bundle runs, what its golden vectors and drift figures come from, and what the report says.
"""
import json
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import DEEPLOB, FEED_DAY1
from edgehft import runtime
from edgehft.bundle import load_bundle
from edgehft.bundle_checks import check_golden
from edgehft.cli import main
from edgehft.compiler import ort_plans
from edgehft.compiler.plans import CANDIDATES, Candidate, choose
from edgehft.ir import TFLiteModel
from edgehft.report import Report

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlp_auto(mlp, tmp_path_factory):
    """The example MLP compiled for the cpu board with --quant auto."""
    out = tmp_path_factory.mktemp("plans") / "mlp.auto"
    res = CliRunner().invoke(main, ["compile", str(mlp / "mlp.keras"), "--board", "cpu", "--quant", "auto",
                                    "--calib", str(mlp / "x.npy"), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    return out


def test_profile_covers_every_op_and_sums_close_to_the_whole(deeplob_bundle):
    res = CliRunner().invoke(main, ["bench", str(deeplob_bundle), "--profile", "--samples", "20", "--warmup", "2",
                                    "--json"])
    assert res.exit_code == 0, res.output
    prof = json.loads(res.output.strip().splitlines()[-1])
    ir = TFLiteModel.from_file(deeplob_bundle / "model.tflite")
    assert [o["index"] for o in prof["ops"]] == [op.index for op in ir.main.ops]
    assert [o["op"] for o in prof["ops"]] == ir.op_names()
    assert prof["chain_max_abs_diff"] == 0.0          # cutting the model op by op changed no output bit
    assert all(o["us"]["p50"] > 0 for o in prof["ops"])
    assert abs(sum(o["share"] for o in prof["ops"]) - 1) < 1e-9
    lstm = next(o for o in prof["ops"] if o["op"] == "UNIDIRECTIONAL_SEQUENCE_LSTM")
    assert lstm["layer"] == "lstm" and lstm["kernel"] == lstm["kernel_in_model"] == "builtin"
    # each op alone pays one interpreter invoke of its own: the sum is near the whole, not equal to it
    assert 0.5 < prof["sum_over_whole"] < 2.0
    assert prof["fingerprint"]["libraries"]["ai-edge-litert"] and prof["rounds"] == 20


def test_profile_table_names_the_ops(deeplob_bundle):
    res = CliRunner().invoke(main, ["bench", str(deeplob_bundle), "--profile", "--samples", "5", "--warmup", "1",
                                    "--top", "3"])
    assert res.exit_code == 0, res.output
    assert "time per op" in res.output and "whole model p50" in res.output
    assert "reproduces the whole model's outputs exactly" in " ".join(res.output.split())


def test_auto_plan_report_names_the_plan_and_the_alternatives(mlp_auto):
    b = load_bundle(mlp_auto)
    rep = Report(**b.report())
    plan = rep.plan
    ort = [] if ort_plans.unavailable() else list(ort_plans.ORT_PLANS)     # ONNX Runtime's runs join where installed
    assert plan["mode"] == "auto" and plan["candidates"] == list(CANDIDATES) + ort
    assert [m["plan"] for m in plan["measured"]] == list(CANDIDATES) + ort
    assert [m["plan"] for m in plan["measured"] if m["chosen"]] == [plan["chosen"]]
    assert all(m["p50_us"] > 0 and m["p99_us"] >= m["p50_us"] for m in plan["measured"])
    chosen = next(m for m in plan["measured"] if m["chosen"])
    # the bundle is the chosen plan: its mode, its drift figures, its reference statement
    assert b.manifest.quantization.mode == plan["chosen"]
    assert rep.drift.candidate.startswith(plan["chosen"] + " on ")
    assert rep.drift.outputs[0].mae_rel == chosen["drift_rel_mae"] and chosen["drift_passed"]
    assert f"model.tflite is the {plan['chosen']} plan" in plan["reference"]
    ir = TFLiteModel.from_file(mlp_auto / "model.tflite")
    assert ir.main.tensors[ir.main.inputs[0]].dtype == b.manifest.inputs[0].dtype
    if plan["chosen"] != "int8":      # the full-int8 graph rides along for reference
        int8 = TFLiteModel.from_file(mlp_auto / b.manifest.artifacts["int8_ir"])
        assert int8.main.tensors[int8.main.inputs[0]].dtype == "int8"


def test_golden_vectors_reproduce_on_the_chosen_plan(mlp_auto):
    b = load_bundle(mlp_auto)
    with runtime.open(mlp_auto) as r:
        g = check_golden(r)
        assert g["ok"] and g["count"] == 16 and g["path"] == b.manifest.golden.reference_path
        assert r.describe()["interpreter"] == b.manifest.golden.reference_path
    # independently of the runner: a bare LiteRT interpreter on model.tflite gives the golden outputs
    from ai_edge_litert.interpreter import Interpreter
    it = Interpreter(model_path=str(mlp_auto / "model.tflite"), num_threads=1)
    it.allocate_tensors()
    ins, outs = b.golden()
    x, y = ins[b.manifest.inputs[0].name], outs[b.manifest.outputs[0].name]
    i, o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    for n in range(len(x)):
        it.set_tensor(i, x[n:n + 1])
        it.invoke()
        assert np.abs(it.get_tensor(o).astype(np.float64) - y[n:n + 1]).max() <= b.manifest.golden.atol


def _cand(plan, rel, passed):
    out = SimpleNamespace(mae_rel=rel, argmax_agreement=None)
    return Candidate(plan, None, None, SimpleNamespace(passed=passed, outputs=[out]), {})


def test_choose_takes_the_fastest_plan_that_passes_the_gate():
    timing = {"int8": {"p50_us": 30.0}, "dynamic": {"p50_us": 10.0}, "float": {"p50_us": 20.0}, "_core": 1}
    for t in timing.values():
        if isinstance(t, dict):
            t.update(p99_us=2 * t["p50_us"])
    best, sec = choose([_cand("int8", 0.008, True), _cand("dynamic", 0.02, False), _cand("float", 0.0002, True)],
                       timing)
    assert best.plan == "float" and sec["chosen"] == "float" and "pass the drift gate" in sec["why"]
    assert [m["chosen"] for m in sec["measured"]] == [False, False, True]
    best, sec = choose([_cand("int8", 0.03, False), _cand("dynamic", 0.02, False), _cand("float", 0.05, False)],
                       timing)
    assert best.plan == "dynamic" and "no plan passes" in sec["why"]


def test_auto_is_for_the_cpu_board_only(tmp_path):
    res = CliRunner().invoke(main, ["compile", str(DEEPLOB / "deeplob.keras"), "--board", "coral-usb",
                                    "--quant", "auto", "--calib", str(FEED_DAY1), "--out", str(tmp_path / "b")])
    assert res.exit_code == 3 and "for the cpu board" in " ".join(res.output.split())


def test_float_plan_fast_path_agrees_with_the_checked_path(mlp_auto, mlp):
    from edgehft.errors import NonFiniteInputError
    from edgehft.runtime.base import Runner
    x = np.load(mlp / "x.npy")[:5]
    with runtime.open(mlp_auto) as r:
        if r.inputs[0].dtype != np.float32:
            pytest.skip(f"the chosen plan here takes {r.inputs[0].dtype} windows")
        assert "predict" in r.__dict__                     # the float fast path is bound
        checked = Runner.predict.__get__(r)
        for w in x:
            assert np.array_equal(r.predict(w).copy(), checked(w).copy())
        bad = x[0].copy()
        bad[3] = np.inf
        with pytest.raises(NonFiniteInputError, match=r"first at index \(3,\)"):
            r.predict(bad)


def test_bench_percentiles_export_and_golden_inputs(deeplob_bundle, tmp_path):
    """``bench --percentile 50,99,99.9 --export-times FILE`` without --ticks: the golden inputs (said), the asked
    percentiles with the ones 50 samples cannot hold marked (p99 needs 100, p99.9 1000), min / throughput, every
    call's latency in the CSV (and JSON); at 80 columns nothing is cut; bad values are usage errors (exit 2)."""
    cli = CliRunner()
    csv = tmp_path / "t.csv"
    res = cli.invoke(main, ["bench", str(deeplob_bundle), "--samples", "50", "--warmup", "2", "--percentile",
                            "50,99,99.9", "--export-times", str(csv), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output.strip().splitlines()[-1])
    p = rep["percentiles_us"]
    assert list(p) == ["p50", "p99", "p99.9"] and rep["min_us"] <= p["p50"] <= p["p99"] <= rep["latency_us"]["max"]
    assert rep["thin_percentiles"] == [{"p": 99.0, "needs": 100}, {"p": 99.9, "needs": 1000}]
    assert rep["source"]["kind"] == "golden" and rep["samples"] == 50 and rep["throughput_per_s"] > 0
    rows = np.loadtxt(csv, delimiter=",", skiprows=1, dtype=np.int64)
    assert csv.read_text().splitlines()[0] == "call,latency_ns" and rows.shape == (50, 2)
    assert list(rows[:, 0]) == list(range(50)) and (rows[:, 1] > 0).all()
    assert abs(np.percentile(rows[:, 1] / 1e3, 50) - p["p50"]) < 1e-6
    res = cli.invoke(main, ["bench", str(deeplob_bundle), "--samples", "50", "--warmup", "2", "--percentile",
                            "50,90,99,99.9,99.99", "--export-times", str(tmp_path / "t.json")], terminal_width=80)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert all(len(x) <= 80 for x in lines) and "…" not in res.output
    assert "p99.99*" in res.output and "calls/s" in res.output and "golden inputs" in res.output
    assert "*: p99.9 from 50 samples (it needs 1,000)" in res.output
    assert len(json.loads((tmp_path / "t.json").read_text())["latency_ns"]) == 50
    for bad in (["--percentile", "abc"], ["--percentile", "100"], ["--export-times", str(tmp_path / "t.txt")]):
        r = cli.invoke(main, ["bench", str(deeplob_bundle), "--samples", "5", *bad])
        assert r.exit_code == 2, (bad, r.output)
