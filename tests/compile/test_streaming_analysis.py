"""The streaming analysis (edgehft/streaming/, issue 21 items 2 and 6) on graphs the real compiler makes.

Window t+1 is window t with its oldest row dropped and one new row appended. Each test model has T = 8 rows
along axis 1 (tests/make_streaming_models.py), so the expected rows below are derived by hand in each
test's docstring: a kernel of k rows with dilation d reads rows i - before + j*d (TFLite SAME padding:
``before = (extent - 1) // 2``, a 4-row kernel pads 1 above and 2 below); a row is critical when it reads the
newest row, prepared when it reads padding that moved or a row that changed, cached otherwise. Keras 3's
Conv1D lowers to RESHAPE (1, T, C) -> (1, 1, T, C) + CONV_2D along W, so its time axis is 2 there.

The brute-force test cannot be fooled by the analysis' own reasoning: it runs each float graph on LiteRT's
reference kernels with every tensor kept (experimental_preserve_all_tensors), on two consecutive windows,
on the later one with its newest row changed and on the earlier one with its oldest row changed, and
classifies every row of every tensor from the values alone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from rich.console import Console

from conftest import BOARD_PY, DEEPLOB, FEED_DAY1, ROOT, run_maker
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.ir import TFLiteModel
from edgehft.streaming.analysis import (VERDICT_CRITICAL, VERDICT_PREPARED, VERDICT_WHOLE, analyze, analyze_path, main,
                                        summary, table)

pytestmark = pytest.mark.slow
T = 8
FAST = dict(calib_windows=12, drift_windows=8, golden_count=2)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """``small(name, quant="float")`` -> the bundle of tests/make_streaming_models.py's model ``name`` compiled for
    the cpu board (each compiled once per module)."""
    src = run_maker(ROOT / "tests" / "make_streaming_models.py", tmp_path_factory.mktemp("stream_models"))
    out = tmp_path_factory.mktemp("stream_bundles")
    done = {}

    def get(name, quant="float"):
        if (name, quant) not in done:
            model = src / (f"{name}.h5" if name.startswith("tfk_") else f"{name}.keras")
            done[name, quant] = out / f"{name}.{quant}"
            compile_model(model, [src / f"{name}.npy"], done[name, quant],
                          CompileOptions(board="cpu", quant=quant, **FAST))
        return done[name, quant]
    return get


@pytest.fixture(scope="module")
def deeplob_float(tmp_path_factory):
    """The shipped DeepLOB compiled for the cpu board as a float graph, calibrated on the shipped feed."""
    out = tmp_path_factory.mktemp("deeplob_stream") / "deeplob.float"
    compile_model(DEEPLOB / "deeplob.keras", [FEED_DAY1], out,
                  CompileOptions(board="cpu", quant="float", drift_windows=16, golden_count=4))
    return out


@pytest.fixture(scope="module")
def lstm_a_float(tmp_path_factory):
    """benchmarks/lstm_a.py's LSTM_A (LSTM(100) x 2 over 50 x 100, Dense(1)) compiled as a float graph."""
    work = tmp_path_factory.mktemp("lstm_a")
    run_maker(ROOT / "benchmarks" / "lstm_a.py", work / "lstm_a.keras")
    np.save(work / "x.npy", np.random.default_rng(0).standard_normal((24, 50, 100)).astype(np.float32))
    compile_model(work / "lstm_a.keras", [work / "x.npy"], work / "lstm_a.float",
                  CompileOptions(board="cpu", quant="float", **FAST))
    return work / "lstm_a.float"


def rows(a, index: int) -> tuple:
    """``(kept, prepared, critical)`` row tuples of op ``index`` (kept: cached and constant rows)."""
    o = a.op(index)
    return tuple(sorted(o.rows_cached + o.rows_constant)), o.rows_prepared, o.rows_critical


def r(lo: int, hi: int) -> tuple:
    """Rows ``lo`` to ``hi`` inclusive."""
    return tuple(range(lo, hi + 1))


# --- DeepLOB and LSTM_A: the issue's worked examples --------------------------------------------------------

def test_deeplob_rows_and_macs_follow_the_issue(deeplob_float):
    """DeepLOB (1, 100, 40, 1), float graph. Through the nine conv blocks the rows that read the newest row are
    1, 3, 5, 5, 7, 9, 9, 11, 13 (each (4,1) SAME kernel reads 2 rows below, a (1,k) kernel none), as the issue
    says; the inception towers give 13 -> 15 (5x1), 13 -> 14 (3x1), 14 (3x1 max pool, 1x1), concatenated: 15
    critical rows into the LSTM, and 8 top rows prepared (each (4,1) kernel pads one row above), 77 cached.
    The LSTM: 85 steps before the tick, 15 after.

    MACs (rows x W_out x C_out x kh x kw x C_in): 2,166,016 conv on the critical path, 983,040 LSTM
    (15 x 4*64*(192+64): projection and recurrence of the 15 critical steps), 192 head: 3,149,248 of
    39,040,192 (8.1 %). The issue's "about 3.2 M" is 2.2 M + 1.0 M rounded; its 39 M total is this one.
    Prepare: 948,224 conv MACs of the top rows + 8 prepared projection rows (8 x 49,152) + 85 recurrence
    steps (85 x 4*64*64) = 2,734,080."""
    a = analyze_path(deeplob_float)
    assert (a.time_axis, a.window, a.streamable, a.blocking) == (1, 100, True, None)
    convs = [o for o in a.ops if o.op == "CONV_2D"]
    assert [len(o.rows_critical) for o in convs[:9]] == [1, 3, 5, 5, 7, 9, 9, 11, 13]
    assert [len(o.rows_prepared) for o in convs[:9]] == [0, 1, 2, 2, 3, 4, 4, 5, 6]
    assert all(o.rows_critical == r(100 - len(o.rows_critical), 99) for o in convs)
    assert all(o.rows_prepared == r(0, len(o.rows_prepared) - 1) for o in convs if o.rows_prepared)
    inception = {18: 13, 20: 15, 22: 13, 24: 14, 26: 14, 27: 14, 29: 15}      # op index -> critical rows
    assert {k: len(a.op(k).rows_critical) for k in inception} == inception
    assert rows(a, 29) == (r(8, 84), r(0, 7), r(85, 99))                       # the concatenation
    lstm = a.op(31)
    assert (lstm.op, lstm.steps_prepared, lstm.steps_critical) == ("UNIDIRECTIONAL_SEQUENCE_LSTM", 85, 15)
    assert [a.op(k).verdict for k in (31, 32, 33, 34)] == [VERDICT_CRITICAL] * 4
    assert a.op(32).time_axis is None and "the last step" in a.op(32).reason
    assert sum(o.macs_critical for o in convs) == 2_166_016
    assert (lstm.macs_critical, lstm.macs_prepare, lstm.macs_full) == (983_040, 1_785_856, 6_553_600)
    assert (a.macs_critical, a.macs_prepare, a.macs_full) == (3_149_248, 2_734_080, 39_040_192)


def test_deeplob_int8_graph_has_the_same_rows(deeplob_float, deeplob_bundle):
    """The full-int8 DeepLOB graph (the session's cpu bundle) has the float graph's ops, so the same rows,
    steps and MACs op by op."""
    f, q = analyze_path(deeplob_float), analyze_path(deeplob_bundle)
    assert [o.op for o in q.ops] == [o.op for o in f.ops]
    key = [(o.rows_cached, o.rows_prepared, o.rows_critical, o.steps_prepared, o.macs_critical, o.verdict)
           for o in f.ops]
    assert [(o.rows_cached, o.rows_prepared, o.rows_critical, o.steps_prepared, o.macs_critical, o.verdict)
            for o in q.ops] == key
    assert q.streamable and q.macs_critical == 3_149_248


def test_lstm_a_one_step_of_each_layer_after_the_tick(lstm_a_float):
    """LSTM_A: the first LSTM's input rows 0-48 are cached, so its 49 first steps run before the tick (and
    their projections are cached); its outputs are new each window, so the second LSTM's 49 first steps and
    their projections are prepared. Critical: one step of each layer (4*100*(100+100) = 80,000 MACs each) and
    the head's 100: 160,100 (~0.16 M, as the issue says). Prepare: 49 x 40,000 + 49 x 80,000 = 5,880,000."""
    a = analyze_path(lstm_a_float)
    assert (a.time_axis, a.window, a.streamable) == (1, 50, True)
    for k in (0, 1):
        o = a.op(k)
        assert (o.steps_prepared, o.steps_critical, o.rows_critical, o.rows_prepared) == (49, 1, (49,), r(0, 48))
        assert o.macs_critical == 80_000 and o.macs_full == 4_000_000
    assert (a.op(0).macs_prepare, a.op(1).macs_prepare) == (1_960_000, 3_920_000)
    assert (a.macs_critical, a.macs_prepare, a.macs_full) == (160_100, 5_880_000, 8_000_100)
    assert "49 rows cached" in a.op(0).reason and "49 prepared" in a.op(1).reason


# --- rows derived by hand, T = 8 ----------------------------------------------------------------------------

def test_conv1d_valid(small):
    """Conv1D(4, 3, valid): row i reads rows i..i+2 of 8; row 5 reads the newest row 7, rows 0-4 are the
    previous window's 1-5. Conv1D(2, 2, valid) on those 6 rows: row i reads i, i+1: row 4 critical, 0-3
    cached. MACs per row: 3 x 3 x 4 = 36, 2 x 4 x 2 = 16."""
    a = analyze_path(small("conv1d_valid"))
    assert (a.op(1).op, a.op(1).time_axis) == ("CONV_2D", 2)
    assert rows(a, 1) == (r(0, 4), (), (5,)) and rows(a, 3) == (r(0, 3), (), (4,))
    assert (a.op(1).macs_critical, a.op(3).macs_critical, a.op(1).macs_full) == (36, 16, 216)
    assert a.op(5).rows == 5 and a.streamable


def test_conv1d_same_and_dilated(small):
    """Conv1D(4, 4, same) pads 1 above, 2 below: row i reads i-1..i+2; rows 5-7 read row 7; row 0 reads the top
    padding (-1), which was row 0 one window ago: prepared; rows 1-4 cached. Conv1D(4, 3, same, dilation 2)
    pads 2 and 2: row i reads i-2, i, i+2; rows 3-7 read a critical row; row 0 reads -2 (padding now and
    before: equal), row 0 (prepared); row 1 reads -1 (padding now, data before); row 2 reads row 0: rows 0-2
    prepared, none cached."""
    a = analyze_path(small("conv1d_same"))
    assert rows(a, 1) == (r(1, 4), (0,), r(5, 7))
    assert rows(a, 3) == ((), r(0, 2), r(3, 7))
    assert a.op(3).verdict == VERDICT_CRITICAL and a.op(3).macs_prepare == 3 * 48


def test_conv1d_causal(small):
    """Conv1D(4, 3, causal) lowers to PAD (2 rows above) + a VALID conv: the padded rows are constant, and
    row i reads input rows i-2..i: row 7 critical, rows 0-1 read padding that was data one window ago:
    prepared, 2-6 cached. Conv1D(2, 2, causal, dilation 2): PAD 2 + VALID, row i reads i-2, i: row 7
    critical, rows 0-1 (padding) and 2-3 (prepared rows 0-1) prepared, 4-6 cached."""
    a = analyze_path(small("conv1d_causal"))
    assert a.op(0).op == "PAD" and a.op(0).rows_constant == (0, 1)
    assert rows(a, 2) == (r(2, 6), (0, 1), (7,))
    assert rows(a, 7) == (r(4, 6), r(0, 3), (7,))


def test_conv2d_and_pooling_along_time(small):
    """Input (8, 6, 1). Conv2D((3, 2), same) pads 1 above and below: rows 6-7 critical, row 0 prepared.
    MaxPooling2D((2, 1), strides 1, same) pads 0 above and 1 below: row i reads i, i+1: rows 5-7 critical,
    row 0 prepared (reads prepared row 0). AveragePooling2D((3, 2), strides (1, 2), valid): 6 rows, row i reads
    i..i+2: rows 3-5 critical, row 0 prepared, rows 1-2 cached. MACs per conv row: 6 x 4 x 3 x 2 x 1 = 144."""
    a = analyze_path(small("conv2d_pool"))
    assert rows(a, 0) == (r(1, 5), (0,), (6, 7)) and a.op(0).time_axis == 1
    assert rows(a, 2) == (r(1, 4), (0,), r(5, 7))
    assert rows(a, 3) == ((1, 2), (0,), r(3, 5))
    assert (a.op(0).macs_critical, a.op(0).macs_prepare) == (288, 144)


def test_per_timestep_dense(small):
    """Dense(5) and Dense(2) on (8, 3) are FULLY_CONNECTED with keep_num_dims: per row, so only row 7 is
    computed each tick (15 + 10 MACs)."""
    a = analyze_path(small("dense_steps"))
    assert [a.op(k).op for k in (0, 2)] == ["FULLY_CONNECTED"] * 2
    assert rows(a, 0) == (r(0, 6), (), (7,)) == rows(a, 2)
    assert (a.macs_critical, a.macs_prepare, a.macs_full) == (25, 0, 200)


def test_lstm_stack_and_dense_head(small):
    """Conv1D(4, 3, same) -> LSTM(5, return_sequences) -> LSTM(4) -> Dense(2, softmax). The conv: rows 6-7
    critical, row 0 prepared. LSTM 1: 6 steps from the zero state before the tick, 2 after; LSTM 2 reads
    those rows (0-5 prepared, 6-7 critical): 6 and 2 again. The last step (STRIDED_SLICE), the Dense head and
    the softmax have no time axis: critical, whole. MACs: LSTM 1 per projection row 4*5*4 = 80, per step
    4*5*5 = 100: critical 2 x 180; prepare 1 prepared projection row + 6 steps = 680."""
    a = analyze_path(small("lstm_head"))
    assert rows(a, 1) == (r(1, 5), (0,), (6, 7))
    for k in (4, 5):
        assert (a.op(k).steps_prepared, a.op(k).steps_critical) == (6, 2)
        assert rows(a, k) == ((), r(0, 5), (6, 7))
    assert (a.op(4).macs_critical, a.op(4).macs_prepare) == (360, 680)
    assert [(a.op(k).time_axis, a.op(k).verdict) for k in (6, 7, 8)] == [(None, VERDICT_CRITICAL)] * 3
    assert a.streamable


def test_reduction_over_time_ends_the_time_axis(small):
    """GlobalAveragePooling1D is a MEAN over the time axis: it reads all 6 conv rows each tick and leaves no
    time axis; the model still streams (the conv's rows 0-4 are cached)."""
    a = analyze_path(small("gap_head"))
    mean = a.op(4)
    assert (mean.op, mean.time_axis, mean.verdict) == ("MEAN", None, VERDICT_CRITICAL)
    assert "all 6 rows" in mean.reason and a.streamable


def test_cropping_along_time_shifts_rows(small):
    """Cropping1D is a STRIDED_SLICE along time. crop: Conv1D(4, 3, same) (rows 6-7 critical, row 0 prepared)
    cropped by (1, 1): rows 0-5 are conv rows 1-6, so rows 0-4 cached and row 5 critical. lag: Conv1D(4, 3,
    valid) (row 5 critical) cropped by (0, 1) drops the critical row: rows 0-3 are cached and row 4 (conv row
    4, computed at the previous tick as its row 5) is prepared: the slice and the Dense after it need nothing
    from the newest row ("prepared", no critical MACs)."""
    a = analyze_path(small("crop"))
    assert (a.op(4).op, rows(a, 4), rows(a, 5)) == ("STRIDED_SLICE", (r(0, 4), (), (5,)), (r(0, 4), (), (5,)))
    lag = analyze_path(small("lag"))
    assert rows(lag, 4) == (r(0, 3), (4,), ()) == rows(lag, 5)
    assert [lag.op(k).verdict for k in (4, 5)] == [VERDICT_PREPARED] * 2
    assert (lag.op(5).macs_critical, lag.op(5).macs_prepare, lag.macs_critical) == (0, 8, 36) and lag.streamable


# --- refusals -----------------------------------------------------------------------------------------------

def _blocking(a) -> tuple:
    return a.blocking["index"], a.blocking["op"], a.blocking["reason"]


def test_flatten_then_dense_is_refused(small):
    """Flatten (1, 6, 4) -> (1, 24) folds the 6 conv rows into the features; the Dense reads all of them in
    every output: whole window each tick. The conv before it still has only row 5 on the critical path."""
    a = analyze_path(small("flatten_dense"))
    assert not a.streamable
    index, op, reason = _blocking(a)
    assert (index, op) == (4, "FULLY_CONNECTED") and "all 6 rows" in reason and "Flatten" in reason
    assert a.op(4).verdict == VERDICT_WHOLE and a.op(4).macs_critical == a.op(4).macs_full == 48
    assert rows(a, 1) == (r(0, 4), (), (5,))


@pytest.mark.parametrize("name, op, words", [
    ("permute_dense", "FULLY_CONNECTED", "all 8 rows"),
    ("stride2", "CONV_2D", "stride 2 along the time axis"),
    ("long_kernel", "CONV_2D", "as long as the 8-row window"),
    ("attention", "BATCH_MATMUL", "attention over time"),
])
def test_dense_over_time_stride_long_kernel_and_attention_are_refused(small, name, op, words):
    """A Dense over the time axis (a Permute moved it last: TRANSPOSE + FULLY_CONNECTED), a stride 2 along
    time (an output row per 2 ticks), a kernel of 8 rows on an 8-row window, and self-attention
    (BATCH_MATMUL of two tensors from the window) are each refused at that op, with why."""
    a = analyze_path(small(name))
    index, got, reason = _blocking(a)
    assert (got, a.streamable, a.op(index).verdict) == (op, False, VERDICT_WHOLE) and words in reason


def test_bidirectional_lstm_is_refused(small):
    """tf-keras Bidirectional(LSTM(4)) lowers to REVERSE_V2 + an LSTM (backward) and an LSTM (forward): the
    backward one's first step reads the newest row, so it is refused; the forward one is still 7 + 1 steps."""
    a = analyze_path(small("tfk_bidir"))
    index, op, reason = _blocking(a)
    assert (index, op, a.op(0).op) == (1, "UNIDIRECTIONAL_SEQUENCE_LSTM", "REVERSE_V2")
    assert "reverse-direction" in reason and "Bidirectional" in reason
    assert (a.op(3).steps_prepared, a.op(3).steps_critical) == (7, 1)


def test_dynamic_range_conv_is_refused_and_hybrid_dense_and_lstm_stream(small):
    """Dynamic-range quantization makes CONV_2D quantize its float input with one scale over the whole
    window (every row then depends on the newest row: refused); a hybrid FULLY_CONNECTED quantizes per row
    and a hybrid LSTM per step, so they stream as their float versions do."""
    conv = analyze_path(small("wide_conv", "dynamic"))
    index, op, reason = _blocking(conv)
    assert (index, op) == (1, "CONV_2D") and "dynamic-range" in reason
    steps = analyze_path(small("wide_steps", "dynamic"))
    g = TFLiteModel.from_file(small("wide_steps", "dynamic") / "model.tflite").main
    assert g.tensors[g.ops[0].inputs[1]].dtype == "int8"                       # really a hybrid FC
    assert steps.streamable and rows(steps, 0) == (r(0, 6), (), (7,))
    assert (steps.op(2).steps_prepared, steps.op(2).steps_critical) == (7, 1)


def _edit(bundle, fn) -> TFLiteModel:
    """``bundle``'s graph with ``fn(schema, model)`` applied to its object tree (the tflite schema's ModelT),
    packed again: a real flatbuffer the IR reader validates."""
    import flatbuffers
    from edgehft.compiler.tflite_graph import schema
    s = schema()
    m = s.ModelT.InitFromPackedBuf((bundle / "model.tflite").read_bytes(), 0)
    fn(s, m)
    b = flatbuffers.Builder(1 << 16)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return TFLiteModel(bytes(b.Output()), "edited.tflite")


def _state_constant(value: float):
    """An edit making the first LSTM's hidden-state input (op 4, input 18) a constant holding ``value``."""
    def fn(s, m):
        g = m.subgraphs[0]
        t = g.tensors[g.operators[4].inputs[18]]
        buf = s.BufferT()
        buf.data = np.full([int(d) for d in t.shape], value, np.float32).tobytes()
        m.buffers.append(buf)
        t.buffer, t.isVariable = len(m.buffers) - 1, False
    return fn


def test_recurrence_with_a_non_zero_initial_state_is_refused(small):
    """An LSTM whose initial hidden state is a constant 0.5 (a learned initial state) does not restart from
    zero each window: refused. A constant zero state is the zero state: it streams as before. A state fed by
    a graph input is refused too, naming where it comes from."""
    b = small("lstm_head")
    a = analyze(_edit(b, _state_constant(0.5)))
    assert _blocking(a)[:2] == (4, "UNIDIRECTIONAL_SEQUENCE_LSTM") and "non-zero" in _blocking(a)[2]
    assert analyze(_edit(b, _state_constant(0.0))).streamable

    def from_input(s, m):
        g = m.subgraphs[0]
        g.inputs = list(g.inputs) + [g.operators[4].inputs[18]]
        g.tensors[g.operators[4].inputs[18]].isVariable = False
    a = analyze(_edit(b, from_input))
    assert _blocking(a)[0] == 4 and "comes from a graph input" in _blocking(a)[2]


def test_unknown_op_is_refused_by_name(small):
    """An op the analysis has no rule for (here the conv's TANH replaced by a custom op) is refused by name:
    "unknown op X: whole window each tick"."""
    def custom(s, m):
        code = s.OperatorCodeT()
        code.builtinCode, code.deprecatedBuiltinCode, code.customCode = s.BuiltinOperator.CUSTOM, 32, b"TickMixer"
        m.operatorCodes.append(code)
        m.subgraphs[0].operators[2].opcodeIndex = len(m.operatorCodes) - 1
    a = analyze(_edit(small("lstm_head"), custom))
    assert _blocking(a) == (2, "CUSTOM:TickMixer", "unknown op CUSTOM:TickMixer: whole window each tick")


# --- the brute-force check ----------------------------------------------------------------------------------

def _all_tensors(model_file, windows) -> list:
    """Every tensor of the graph after invoking it on each window (LiteRT reference kernels, state reset)."""
    from ai_edge_litert import interpreter as litert
    it = litert.Interpreter(model_path=str(model_file), experimental_preserve_all_tensors=True,
                            experimental_op_resolver_type=litert.OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    inp = it.get_input_details()[0]
    out = []
    for w in windows:
        if inp["dtype"] == np.int8:
            scale, zp = inp["quantization"]
            w = np.clip(np.round(w / scale) + zp, -128, 127)
        it.reset_all_variables()
        it.set_tensor(inp["index"], w[None].astype(inp["dtype"]))
        it.invoke()
        out.append({d["index"]: it.get_tensor(d["index"]).copy() for d in it.get_tensor_details()})
    return out


def empirical(model_file, a, seed: int = 0) -> dict:
    """tensor index -> per row (one entry for a tensor without a time axis) what the values show, as facts
    ``(changes, constant, shifted)``: it changes when the newest row of window t+1 changes; it is the same in
    windows t, t+1 and t with its oldest row changed; row i of t+1 equals row i+1 of t, also with t's oldest
    row changed."""
    rng = np.random.default_rng(seed)
    g = TFLiteModel.from_file(model_file).main
    shape = g.tensors[g.inputs[0]].shape[2:]
    x = rng.standard_normal((a.window + 1, *shape)).astype(np.float32)
    newest, oldest = x[1:].copy(), x[:-1].copy()
    newest[-1] = rng.standard_normal(shape) * 3 + 1
    oldest[0] = rng.standard_normal(shape) * 3 + 1
    ys = _all_tensors(model_file, [x[:-1], x[1:], newest, oldest])
    found = {}
    for t in a.tensors:
        if t.index not in ys[0]:
            continue
        if t.time_axis is None:
            v = [y[t.index].reshape(1, -1) for y in ys]
        else:
            v = [np.moveaxis(y[t.index], t.time_axis, 0).reshape(t.rows, -1) for y in ys]
        found[t.index] = [_facts(v, i) for i in range(len(v[0]))]
    return found


def _facts(v, i: int) -> tuple:
    at, at1, at1p, atp = v
    shifted = i + 1 < len(at) and np.array_equal(at1[i], at[i + 1]) and np.array_equal(at1[i], atp[i + 1])
    return (not np.array_equal(at1[i], at1p[i]), np.array_equal(at1[i], at[i]) and np.array_equal(atp[i], at[i]),
            bool(shifted))


def status_of(facts: tuple) -> str:
    """The status the facts show: critical, else constant, else cached, else prepared."""
    changes, constant, shifted = facts
    return "critical" if changes else "constant" if constant else "cached" if shifted else "prepared"


def claimed(t) -> list:
    """The analysis' status per row of tensor ``t`` (one entry for a tensor without a time axis)."""
    if t.time_axis is None:
        return [t.status]
    status = [None] * t.rows
    for what in ("cached", "constant", "prepared", "critical"):
        for i in getattr(t, what):
            status[i] = what
    return status


STREAMING_MODELS = ["conv1d_valid", "conv1d_same", "conv1d_causal", "conv2d_pool", "dense_steps", "lstm_head",
                    "gap_head", "crop", "lag", "permute_dense", "flatten_dense", "stride2", "long_kernel", "attention",
                    "tfk_bidir"]


@pytest.mark.parametrize("name", STREAMING_MODELS)
def test_every_row_of_every_tensor_agrees_with_litert(small, name):
    """For every tensor of the float graph, every row's status is what LiteRT's values show, exactly. Past an
    op that is whole window each tick the plan recomputes everything at the tick, so there the analysis
    says critical where the values may show less (a stride-2 conv never reads row 7): checked one way only
    (whatever the values show as critical, the analysis says critical)."""
    f = small(name) / "model.tflite"
    a = analyze(TFLiteModel.from_file(f))
    for seed in (0, 1):
        seen = empirical(f, a, seed)
        assert seen, "no tensor compared"
        for t in a.tensors:
            if t.index not in seen:
                continue
            shown = [status_of(f) for f in seen[t.index]]
            if t.exact:
                assert claimed(t) == shown, (t.index, t.name)
            else:
                assert all(c == "critical" for c, s in zip(claimed(t), shown) if s == "critical")


def test_deeplob_lstm_a_and_hybrid_graphs_agree_with_litert(deeplob_float, lstm_a_float, small):
    """The same check on DeepLOB's and LSTM_A's float graphs (every one of DeepLOB's 36 tensors, row by row)
    and on the dynamic-range wide_steps / wide_conv graphs (hybrid FC and LSTM per row; the hybrid conv's
    rows all change)."""
    for b in (deeplob_float, lstm_a_float, small("wide_steps", "dynamic"), small("wide_conv", "dynamic")):
        f = b / "model.tflite"
        a = analyze(TFLiteModel.from_file(f))
        seen = empirical(f, a)
        exact = [t for t in a.tensors if t.exact and t.index in seen]
        assert len(exact) >= 2
        for t in exact:
            assert claimed(t) == [status_of(f) for f in seen[t.index]], (b.name, t.index, t.name)
    f = small("wide_conv", "dynamic") / "model.tflite"   # why its conv is refused: a new row 7 changes all 8 rows
    conv = TFLiteModel.from_file(f).main.ops[1]
    x = np.random.default_rng(5).standard_normal((2, T, 32)).astype(np.float32)
    y = _all_tensors(f, [x[0], np.concatenate([x[0][:-1], x[1][-1:]])])
    rows_of = [np.moveaxis(v[conv.outputs[0]], 2, 0).reshape(T, -1) for v in y]
    assert conv.name == "CONV_2D" and all(not np.array_equal(p, q) for p, q in zip(*rows_of))


def test_int8_graph_claims_hold_where_quantization_can_hide_changes(small):
    """In a full-int8 graph a changed input may round to the same int8 value, so the values can show fewer
    critical or prepared rows than the analysis; what the analysis claims must still hold: every row it calls
    cached or constant is equal, and every row the values show changing with the newest row it calls
    critical."""
    f = small("lstm_head", "int8") / "model.tflite"
    a = analyze(TFLiteModel.from_file(f))
    assert TFLiteModel.from_file(f).main.tensors[0].dtype == "int8"
    held = 0
    for seed in (0, 1, 2):
        seen = empirical(f, a, seed)
        for t in a.tensors:
            for c, (changes, constant, shifted) in zip(claimed(t), seen.get(t.index, [])):
                assert {"cached": shifted, "constant": constant}.get(c, True), (t.name, c)
                assert c == "critical" or not changes, (t.name, c)
                held += c in ("cached", "constant")
    assert held > 3 * 20


# --- the table and the entry point --------------------------------------------------------------------------

def test_table_fits_80_columns_and_says_why(deeplob_float, small):
    """The table of DeepLOB (35 ops) and of a refused model print within 80 columns; the lines under it give
    the MAC totals, the recurrence's steps and the blocking op with its reason."""
    for b, want in ((deeplob_float, "streamable: yes"), (small("flatten_dense"), "streamable: no, op #4")):
        a = analyze_path(b)
        console = Console(width=80, record=True, color_system=None)
        console.print(table(a))
        for line in summary(a):
            console.print(line)
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= 80
        assert want in text
    assert "85 steps from the zero state before the tick, 15 after it" in " ".join(summary(analyze_path(deeplob_float)))


def test_entry_point_exit_codes_and_json(small, tmp_path, capsys):
    """``python -m edgehft.streaming.analysis``: 0 and JSON once analysed (streamable or not: the JSON and the
    last line say which), 3 for no such file or an axis the input lacks, 6 for a bundle whose model file was
    changed; no traceback."""
    assert main([str(small("lstm_head")), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["streamable"] and d["ops"][4]["steps_critical"] == 2 and d["ops"][4]["rows_critical"] == [6, 7]
    assert main([str(small("flatten_dense") / "model.tflite"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert not d["streamable"] and d["blocking"]["index"] == 4 and d["ops"][4]["verdict"] == VERDICT_WHOLE
    assert main([str(small("flatten_dense") / "model.tflite")]) == 0
    assert "streamable: no, op #4 FULLY_CONNECTED" in capsys.readouterr().out
    assert main([str(tmp_path / "nope.tflite")]) == 3
    assert main([str(small("lstm_head")), "--time-axis", "3"]) == 3
    assert "time axis 3" in capsys.readouterr().err
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(small("lstm_head"), bad)
    (bad / "model.tflite").write_bytes((bad / "model.tflite").read_bytes()[:-4] + b"XXXX")
    assert main([str(bad)]) == 6
    env = {**os.environ, "PYTHONWARNINGS": "error::RuntimeWarning"}
    p = subprocess.run([sys.executable, "-m", "edgehft.streaming.analysis", str(small("lstm_head"))],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert p.returncode == 0 and "streamable: yes" in p.stdout and "Traceback" not in p.stderr


@pytest.mark.needs("board-venv")
def test_analysis_runs_on_the_box_side(lstm_a_float):
    """The analysis runs in the board venv (numpy < 2, no TensorFlow) and gives the same figures."""
    p = subprocess.run([str(BOARD_PY), "-m", "edgehft.streaming.analysis", str(lstm_a_float), "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert (d["macs_critical"], d["macs_prepare"], d["macs_full"]) == (160_100, 5_880_000, 8_000_100)
    assert [o["verdict"] for o in d["ops"]] == [VERDICT_CRITICAL] * 4


def _add_constant(shape: tuple):
    """An edit turning dense_steps' TANH (op 1, on (1, 8, 5)) into an ADD of a seeded constant of ``shape``."""
    def fn(s, m):
        g = m.subgraphs[0]
        buf = s.BufferT()
        buf.data = np.random.default_rng(7).standard_normal(shape).astype(np.float32).tobytes()
        m.buffers.append(buf)
        t = s.TensorT()
        t.shape, t.type, t.buffer, t.name = list(shape), s.TensorType.FLOAT32, len(m.buffers) - 1, b"positional"
        g.tensors.append(t)
        code = s.OperatorCodeT()
        code.builtinCode, code.deprecatedBuiltinCode, code.version = s.BuiltinOperator.ADD, s.BuiltinOperator.ADD, 1
        m.operatorCodes.append(code)
        op = g.operators[1]
        op.opcodeIndex, op.inputs = len(m.operatorCodes) - 1, list(op.inputs) + [len(g.tensors) - 1]
    return fn


def test_a_constant_that_varies_along_time_makes_rows_new(small, tmp_path):
    """x + c with c (1, 8, 5) (a positional term: row i adds c[i]) computes row i of window t+1 from the row
    that was row i+1 of window t, plus another constant row: rows 0-6 are prepared, not cached. A c of
    (1, 1, 5) broadcasts along time: rows 0-6 stay cached. LiteRT's values on the edited graphs agree, row by
    row, for every tensor."""
    for shape, kept, prepared in (((1, T, 5), (), r(0, 6)), ((1, 1, 5), r(0, 6), ())):
        m = _edit(small("dense_steps"), _add_constant(shape))
        f = tmp_path / f"add_{shape[1]}.tflite"
        f.write_bytes(m.data)
        a = analyze(m)
        assert (a.op(1).op, rows(a, 1), rows(a, 2)) == ("ADD", (kept, prepared, (7,)), (kept, prepared, (7,)))
        seen = empirical(f, a)
        for t in a.tensors:
            assert claimed(t) == [status_of(x) for x in seen[t.index]], t.name
