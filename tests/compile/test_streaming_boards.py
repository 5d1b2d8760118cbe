"""Streaming per board (issue 21 item 5, edgehft/streaming/boards.py): which plans of a cpu bundle stream and why
the others do not, and on the accelerator boards (PYNQ, Coral, Jetson) what streaming would move per side of the
partition and that the board does not stream yet; through ``edgehft report BUNDLE --streaming``.

Small models of tests/make_models.py (input 20 x 8): k3_seq_lstm (LSTM(12) -> Dense(3)), k3_lstm (Conv1D(8, 3,
same) -> LSTM(16) -> Dense(3)) and k3_cnn_lstm (DeepLOB in small). MAC figures by hand: an LSTM(H) over F
features costs F*4H per input row (projection) and H*4H per step; a tick recomputes what the analysis says.
"""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from edgehft.cli import main
from edgehft.compiler import plans
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.streaming.boards import (VERDICT_NOT, VERDICT_STREAMS, VERDICT_UNSUPPORTED, bundle_streaming)

pytestmark = [pytest.mark.slow, pytest.mark.needs("g++")]
FAST = dict(calib_windows=12, drift_windows=8, golden_count=2)
# auto's timing fixed (int8 fastest): the top level is the LiteRT plan, the native plan is in plans/native
FIGURES = {"int8": {"p50_us": 5.0, "p99_us": 9.0, "p99.9_us": 12.0, "mean_us": 6.0, "p99_over_p50": 1.8},
           "native": {"p50_us": 7.0, "p99_us": 11.0, "p99.9_us": 15.0, "mean_us": 8.0, "p99_over_p50": 1.6}}


@pytest.fixture(scope="module")
def compiled(models, tmp_path_factory):
    """``compiled(name)``: one of the bundles below, compiled once per module."""
    kinds = {
        "seq.auto": ("k3_seq_lstm", CompileOptions(board="cpu", quant="auto", candidates=("int8", "native"),
                                                   drift_threshold=0.05, **FAST)),
        "cnn.bf16": ("k3_cnn_lstm", CompileOptions(board="cpu", quant="native-bf16", **FAST)),
        "lstm.kv260": ("k3_lstm", CompileOptions(board="kv260", **FAST)),
        "cnn.coral": ("k3_cnn_lstm", CompileOptions(board="coral-usb", **FAST)),
        "lstm.jetson": ("k3_lstm", CompileOptions(board="jetson-orin-nano", **FAST)),
    }
    out, done = tmp_path_factory.mktemp("streaming_boards"), {}

    def get(name):
        if name not in done:
            model, opts = kinds[name]
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(plans, "time_plans", lambda bundles, *a, **k: {**{p: dict(FIGURES[p]) for p in bundles},
                                                                          "_core": 0})
                mp.setenv("PATH", f"/usr/bin{os.pathsep}/bin")         # no edgetpu_compiler: a predicted partition
                compile_model(models / f"{model}.keras", [models / "calib.npy"], out / name, opts)
            done[name] = out / name
        return done[name]
    return get


def test_cpu_litert_plan_is_not_streaming_and_names_the_native_plan(compiled):
    view = bundle_streaming(compiled("seq.auto"))
    rows = {r.plan: r for r in view.boards}
    assert [r.plan for r in view.boards] == ["int8", "native"] and view.plan == "int8"
    # LSTM(12) over 8 features: projection 384 and step 576 MACs per row; the Dense 36
    window = 20 * (384 + 576) + 36
    for r in rows.values():
        assert r.macs == {"critical": 384 + 576 + 36, "prepare": 19 * 576, "window": window} == {
            "critical": 996, "prepare": 10_944, "window": 19_236}
    native, int8 = rows["native"], rows["int8"]
    assert (native.verdict, native.streams, native.executor) == (VERDICT_STREAMS, True, "lstm-stack")
    assert "996 of 19,236 MACs (5.2%)" in native.reason
    assert (int8.verdict, int8.streams, int8.executor, int8.streamable) == (VERDICT_NOT, False, None, True)
    assert int8.reason.startswith("plan 'int8' runs the whole graph as one LiteRT invoke per window")
    assert "critical path would be 996 of 19,236 MACs" in int8.reason
    assert int8.reason.endswith("plan 'native' of this bundle streams (runtime.open(bundle, plan='native'))")


def test_cpu_native_bf16_conv_front_end_streams_on_the_chain(compiled):
    view = bundle_streaming(compiled("cnn.bf16"))
    (r,) = view.boards
    assert (r.board, r.plan, r.verdict, r.streams, r.executor) == ("cpu", "native-bf16", VERDICT_STREAMS, True, "chain")
    assert r.macs == {"critical": 28_848, "prepare": 26_624, "window": 166_448}
    assert view.analysis.macs_critical == 28_848 and view.analysis.streamable


def test_pynq_says_what_the_overlay_and_the_arm_cores_would_stream(compiled):
    b = compiled("lstm.kv260")
    (r,) = bundle_streaming(b).boards
    assert (r.board, r.backend, r.plan, r.verdict, r.streams) == ("kv260", "pynq", "int8", VERDICT_UNSUPPORTED, False)
    assert "the overlay has no streaming mode" in r.reason and r.placement == "predicted"
    fpga, arm = r.sides
    # FPGA: the LSTM(16) (projection 512, step 1024 per row) and the Dense(16 -> 3); a tick runs 2 steps and 2
    # projections (the SAME conv's newest row reaches rows 18-19), 18 steps and the padded row's projection before it
    assert (fpga.where, fpga.ops) == ("FPGA overlay", [3, 5])
    assert (fpga.macs_critical, fpga.macs_prepare, fpga.macs_window) == (2 * 1024 + 2 * 512 + 48, 18 * 1024 + 512,
                                                                          20 * 1536 + 48)
    report = json.loads((b / "report.json").read_text())
    assert fpga.macs_window == report["accelerator"]["macs"] == 30_768        # the partition's own count
    # ARM: the Conv1D(8, 3, same), 192 MACs a row: rows 18-19 on the critical path, row 0 (padding) prepared
    assert (arm.where, arm.ops, arm.macs_critical, arm.macs_prepare, arm.macs_window) == (
        "ARM cores", [0, 1, 2, 4, 6], 2 * 192, 192, 20 * 192)
    assert r.moves[0] == ("#1 CONV_2D (cpu (LiteRT)): 2 of 20 rows per tick (17 cached, 1 prepared); 384 of 3,840 "
                          "MACs per tick on the critical path, 192 before it")
    assert r.moves[1].startswith("#3 UNIDIRECTIONAL_SEQUENCE_LSTM (fpga:lstm_int8): 18 steps from the zero state "
                                 "before the tick, 2 after it")
    assert r.moves[1].endswith("3,072 of 30,720 MACs per tick on the critical path, 18,944 before it")


def test_coral_edge_tpu_and_cpu_sides(compiled):
    (r,) = bundle_streaming(compiled("cnn.coral")).boards
    assert (r.board, r.verdict, r.streams) == ("coral-usb", VERDICT_UNSUPPORTED, False)
    assert r.reason.startswith("the Edge TPU runs its whole compiled subgraph per invoke, with the fixed shapes")
    tpu, cpu = r.sides
    # the Edge TPU takes the reshape and the 1x2/2 conv (4 x 16 outputs of 2 taps a row: 128 MACs); the rest is on
    # the CPU (predicted: LEAKY_RELU is not in the Edge TPU op set, and everything after it follows)
    assert (tpu.where, tpu.ops, tpu.macs_critical, tpu.macs_prepare, tpu.macs_window) == ("Edge TPU", [0, 1], 128, 0,
                                                                                          20 * 128)
    assert (cpu.where, cpu.ops, cpu.macs_critical, cpu.macs_prepare, cpu.macs_window) == (
        "host CPU", list(range(2, 14)), 28_720, 26_624, 163_888)
    assert r.macs == {"critical": 28_848, "prepare": 26_624, "window": 166_448}
    assert [m.split(":")[0] for m in r.moves] == ["#1 CONV_2D (edgetpu)", "#3 CONV_2D (cpu (LiteRT))",
                                                  "#6 CONV_2D (cpu (LiteRT))", "#7 CONV_2D (cpu (LiteRT))",
                                                  "#10 UNIDIRECTIONAL_SEQUENCE_LSTM (cpu (LiteRT))"]


def test_report_streaming_cli_on_a_pynq_bundle(compiled):
    b = compiled("lstm.kv260")
    r = CliRunner().invoke(main, ["report", str(b), "--streaming", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["streaming"]["macs_critical"] == 3_504
    (row,) = d["boards"]
    assert (row["verdict"], row["streams"], [s["where"] for s in row["sides"]]) == (
        VERDICT_UNSUPPORTED, False, ["FPGA overlay", "ARM cores"])
    r = CliRunner().invoke(main, ["report", str(b), "--streaming"], terminal_width=80, env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80
    assert "streamable: yes" in r.output and "kv260 int8: not supported on this board yet" in r.output
    assert "FPGA overlay (ops #3, #5): 3,120 MACs per tick on the critical path" in r.output


def test_report_streaming_cli_on_a_jetson_bundle_has_no_analysis_but_a_verdict(compiled):
    r = CliRunner().invoke(main, ["report", str(compiled("lstm.jetson")), "--streaming", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["streaming"] is None
    (row,) = d["boards"]
    assert (row["board"], row["plan"], row["verdict"], row["macs"]) == ("jetson-orin-nano", "fp16",
                                                                        VERDICT_UNSUPPORTED, None)
    assert "TensorRT runs one engine per window" in row["reason"] and "model_fp16.onnx" in row["reason"]
    assert [(s["where"], s["ops"]) for s in row["sides"]] == [("GPU", list(range(15)))]
    assert row["moves"] == ["nodes along time a streaming engine would split by row: #3 Conv (GPU), #8 LSTM (GPU)"]
    r = CliRunner().invoke(main, ["report", str(compiled("lstm.jetson")), "--streaming"], terminal_width=80,
                           env={"COLUMNS": "80"})
    assert r.exit_code == 0 and "no streaming analysis: plan fp16's model is model_fp16.onnx" in r.output
