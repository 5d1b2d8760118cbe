"""DeepLOB compiled for the cpu board from the shipped real feed: report, drift, golden, CLI."""
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import DEEPLOB, FEED_DAY1
from edgehft import runtime
from edgehft.bundle import load_bundle
from edgehft.cli import main
from edgehft.report import Report

pytestmark = pytest.mark.slow


def test_manifest_records_what_was_built(deeplob_bundle):
    m = load_bundle(deeplob_bundle).manifest
    assert (m.board, m.backend, m.quantization.mode) == ("cpu", "cpu", "int8")
    assert m.source.flavour == "keras3" and "tf-keras rebuild" in m.source.lowering
    assert m.inputs[0].name == "lob" and m.inputs[0].shape == [1, 100, 40, 1] and m.inputs[0].dtype == "int8"
    assert m.outputs[0].name == "signal" and m.outputs[0].shape == [1, 3]
    # int8 softmax output: TFLite fixes scale 1/256 and zero point -128
    assert m.outputs[0].scale == [0.00390625] and m.outputs[0].zero_point == [-128]
    assert m.quantization.calibration_windows == 300 and len(m.quantization.calibration_sha256) == 64
    assert m.features.file == "features/features.py" and m.features.callable == "windows_from_feed"
    assert {"model.tflite", "golden.npz", "report.json", "features/features.py"} <= set(m.files)
    assert m.toolchain["tensorflow"] == "2.21.0" and m.toolchain["tf-keras"] == "2.21.0"


def test_report_places_every_op_and_the_fused_lstm(deeplob_bundle):
    rep = Report(**load_bundle(deeplob_bundle).report())
    ops = [o.op for o in rep.ops]
    assert ops.count("UNIDIRECTIONAL_SEQUENCE_LSTM") == 1 and "WHILE" not in ops
    assert ops.count("CONV_2D") == 14 and ops[-1] == "SOFTMAX"
    lstm = next(o for o in rep.ops if o.op == "UNIDIRECTIONAL_SEQUENCE_LSTM")
    assert lstm.layer == "lstm" and lstm.kernel == "builtin"       # XNNPACK has no int8 LSTM
    assert all(o.placement == "cpu" for o in rep.ops)
    assert all(o.kernel == "XNNPACK" for o in rep.ops if o.op == "CONV_2D")
    assert rep.verdict == "confirmed" and sum(rep.counts.values()) == len(rep.ops)


def test_drift_on_the_shipped_feed(deeplob_bundle):
    d = Report(**load_bundle(deeplob_bundle).report()).drift
    assert d.windows == 500 and d.passed and d.threshold_rel_mae == 0.01
    out = d.outputs[0]
    assert out.name == "signal"
    assert 0.001 < out.mae_rel < 0.01                  # 0.79 % measured
    assert out.argmax_agreement > 0.95                 # 98.4 % measured
    assert out.max_abs < 0.25


def test_golden_vectors_reproduced_bit_exactly_by_run(deeplob_bundle):
    res = CliRunner().invoke(main, ["run", str(deeplob_bundle), "--golden", "--json"])
    assert res.exit_code == 0, res.output
    g = json.loads(res.output.strip().splitlines()[-1])
    assert g == {**g, "count": 16, "matched": 16, "ok": True, "compare": "exact", "max_diff": 0.0}


def test_tampered_bundle_is_refused(deeplob_bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(deeplob_bundle, copy)
    with np.load(copy / "golden.npz") as z:
        arrays = dict(z)
    arrays["outputs/signal"][0, 0] += 1
    np.savez(copy / "golden.npz", **arrays)
    res = CliRunner().invoke(main, ["run", str(copy), "--golden"])
    assert res.exit_code == 6 and "golden.npz changed" in res.output


def test_run_prints_predictions_from_raw_feed(deeplob_bundle, deeplob_windows):
    res = CliRunner().invoke(main, ["run", str(deeplob_bundle), "--run-features", "--ticks", str(FEED_DAY1),
                                    "--limit", "4", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["windows"] == 26725 and len(out["predictions"]) == 4
    with runtime.open(deeplob_bundle) as r:
        for p in out["predictions"]:
            expect = r.predict(deeplob_windows["x"][p["window"]])[0]
            assert p["signal"] == expect.tolist()
            assert abs(sum(p["signal"]) - 1) < 0.02


@pytest.mark.parametrize("mode,extra", [("max", []), ("recorded", ["--speed", "50"]),
                                        ("burst", ["--burst-size", "8"])])
def test_bench_reports_percentiles(deeplob_bundle, tmp_path, mode, extra):
    png = tmp_path / "lat.png"
    res = CliRunner().invoke(main, ["bench", str(deeplob_bundle), "--run-features", "--ticks", str(FEED_DAY1),
                                    "--replay", mode,
                                    "--warmup", "10", "--samples", "40", "--plot", str(png), "--json", *extra])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output.strip().splitlines()[-1])
    assert rep["mode"] == mode and rep["samples"] == 40 and rep["warmup"] == 10
    lat = rep["latency_us"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
    assert rep["fingerprint"]["libraries"]["ai-edge-litert"]
    assert (rep["start_delay_us"] is not None) == (mode == "recorded")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_recorded_replay_needs_timestamps(deeplob_bundle, deeplob_windows, tmp_path):
    np.save(tmp_path / "w.npy", deeplob_windows["x"][:20])
    res = CliRunner().invoke(main, ["bench", str(deeplob_bundle), "--ticks", str(tmp_path / "w.npy"),
                                    "--replay", "recorded"])
    assert res.exit_code == 3 and "needs tick timestamps" in res.output


def test_tick_file_of_the_wrong_shape_names_the_file(deeplob_bundle, tmp_path):
    np.save(tmp_path / "w.npy", np.zeros((10, 50, 40, 1), np.float32))
    res = CliRunner().invoke(main, ["run", str(deeplob_bundle), "--ticks", str(tmp_path / "w.npy")])
    assert res.exit_code == 3
    assert "w.npy have shape (10, 50, 40, 1); the model takes (N, 100, 40, 1)" in " ".join(res.output.split())


def test_strict_drift_gate_fails_and_writes_nothing(tmp_path):
    """int8 named: under the default auto, the ort-float plan (1e-8 from Keras) passes even a 0.01 % gate."""
    out = tmp_path / "strict"
    res = CliRunner().invoke(main, ["compile", str(DEEPLOB / "deeplob.keras"), "--calib", str(FEED_DAY1),
                                    "--out", str(out), "--calib-windows", "50", "--drift-windows", "50",
                                    "--quant", "int8", "--drift-threshold", "0.0001", "--strict"])
    assert res.exit_code == 5, res.output
    assert "relative MAE" in res.output and not out.exists()
