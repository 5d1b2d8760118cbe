"""The cpu board's ``native`` plan: the dynamic-range graph with each LSTM on edgehft's native kernel.

The choice among plans is a timing; to test the native bundle whatever this machine measures, one test
compiles with the native plan's p50 lowered after the measurement (the drift gate still decides). No timed
assertions.
"""
import numpy as np
import pytest

from edgehft import runtime
from edgehft.bundle import load_bundle
from edgehft.bundle_checks import check_golden
from edgehft.compiler import plans
from edgehft.compiler.native import native_files
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.errors import LoweringError
from edgehft.report import Report

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def native_bundle(models, tmp_path_factory):
    """k3_lstm.keras (Conv1D -> LSTM(16) -> Dense softmax) compiled with --quant auto, native chosen."""
    real = plans.time_plans

    def native_first(bundles, *a, **k):
        t = real(bundles, *a, **k)
        if "native" in t:                    # fastest by every statistic --select may use (p50, p99, p99.9)
            t["native"] = {**t["native"], **{k: 1e-3 for k, v in t["native"].items() if k.endswith("_us")}}
        return t
    out = tmp_path_factory.mktemp("native") / "lstm.auto"
    mp = pytest.MonkeyPatch()
    mp.setattr(plans, "time_plans", native_first)
    try:
        compile_model(models / "k3_lstm.keras", [models / "calib.npy"], out,   # no ORT plans: native is the subject
                      CompileOptions(board="cpu", quant="auto",
                                     candidates=(*plans.CANDIDATES, "native", "native-bf16")))
    finally:
        mp.undo()
    return out


def test_native_plan_is_a_measured_candidate_and_the_bundle_runs_it(native_bundle):
    b = load_bundle(native_bundle)
    rep = Report.model_validate_json((native_bundle / "report.json").read_text())
    measured = {m["plan"]: m for m in rep.plan["measured"]}
    assert set(measured) == {*plans.CANDIDATES, "native", "native-bf16"}    # native-bf16 on every host (fp32 loop)
    assert rep.plan["chosen"] == "native" and measured["native"]["drift_passed"]
    assert b.manifest.quantization.mode == "native" and b.manifest.artifacts["native"] == "native.json"
    assert b.manifest.format_version == 1                    # readable by edgehft 0.2.0 boxes
    assert {"native.json", "model.tflite", "model_int8.tflite"} <= set(b.manifest.files)
    assert "native plan" in rep.plan["reference"]
    lstm = [o for o in rep.ops if o.op == "UNIDIRECTIONAL_SEQUENCE_LSTM"]
    assert [o.kernel for o in lstm] == ["native"]
    with runtime.open(native_bundle) as r:
        d = r.describe()
        assert "lstm" in d["steps"] and "native LSTM" in d["interpreter"]
        g = check_golden(r)
        assert g["ok"] and g["count"] == 16 and g["path"] == b.manifest.golden.reference_path


def test_native_chain_computes_segments_and_a_keras_lstm(native_bundle):
    """Independently of the runner: LiteRT on each segment and a float64 Keras-semantics LSTM (with the
    op's cell clip) on the stored weights reproduce the golden outputs."""
    import json

    from native_reference import reference_lstm, run_segment
    b = load_bundle(native_bundle)
    graph = json.loads((native_bundle / "native.json").read_text())
    assert [s["kind"] for s in graph["steps"]] == ["litert", "lstm", "litert"]
    ins, outs = b.golden()
    x, y = ins[b.manifest.inputs[0].name], outs[b.manifest.outputs[0].name]
    its = {}
    for n in range(len(x)):
        env = {graph["inputs"][0]: x[n:n + 1]}
        for st in graph["steps"]:
            if st["kind"] == "litert":
                run_segment(native_bundle, st, env, its)
            else:
                w = np.load(native_bundle / st["weights"])
                h = reference_lstm([(w["kernel"], w["recurrent_kernel"], w["bias"])], env[st["inputs"][0]][0],
                                   True, float(w["cell_clip"]))
                env[st["outputs"][0]] = h[None].astype(np.float32)
        assert np.abs(env[graph["outputs"][0]] - y[n:n + 1]).max() < 1e-5


def test_native_files_refuses_a_graph_without_lstm(native_bundle, tmp_path):
    with pytest.raises(LoweringError, match="no UNIDIRECTIONAL_SEQUENCE_LSTM op: nothing"):
        native_files(native_bundle / "native" / "seg0.tflite")


def test_profile_times_each_step_of_the_native_chain(native_bundle):
    import json
    from edgehft.bench.profile import profile_runner
    with runtime.open(native_bundle) as r:
        prof = profile_runner(r, None, rounds=5, warmup=1)
        assert check_golden(r)["ok"]                             # profiling left the runner as it was
    chain = json.loads((native_bundle / "native.json").read_text())["steps"]
    assert [s["placement"] for s in prof["segments"]] == ["cpu" if st["kind"] == "litert" else "native" for st in chain]
    assert [s["what"] for s in prof["segments"] if s["placement"] == "cpu"] == \
        [st["model"] for st in chain if st["kind"] == "litert"]
    assert abs(sum(s["share"] for s in prof["segments"]) - 1) < 1e-9 and prof["ops"] == []
