"""The streaming runtime on real native bundles (issue 21 items 1 and 3): ``runner.stream()`` on the ``--quant
native`` plan of the STAC-ML LSTM_A (benchmarks/lstm_a.py) and of small LSTM models
(tests/make_stream_runtime_models.py), compared with ``predict`` of the same plan on the same window.

Every push's output must be np.array_equal to ``predict`` of the window of the last T rows (the stream runs the
native LSTM kernel's own step code and, for a Dense head, XNNPACK's sum order, checked at open against the
plan's LiteRT head; any other head runs on that LiteRT segment). Bad rows get the errors ``predict`` gives bad
windows; models and plans this slice does not stream are refused with the reason.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from edgehft import runtime
from edgehft.errors import DTypeError, InputError, NonFiniteInputError, RunnerStateError, ShapeError
from edgehft.kernels.cpu import build
from edgehft.kernels.cpu.build import force_target
from native_reference import cpu_targets

pytestmark = [pytest.mark.slow, pytest.mark.needs("g++")]
SIMD = [t for t in cpu_targets() if t not in build.CONV_ONLY]
T_A, F_A = 50, 100


@pytest.fixture(scope="module")
def bundles(stream_runtime_bundle):
    """``bundles(name, quant)`` -> tests/make_stream_runtime_models.py's model compiled for the cpu board
    (conftest's session fixture: once per session)."""
    return stream_runtime_bundle


def _rows(n, features, seed=0):
    return np.random.default_rng(seed).standard_normal((n, features)).astype(np.float32)


def _replay(runner, stream, rows, T, prepare=True, check_window_every=0):
    """Push every row; returns (outputs compared with predict, outputs that differ)."""
    compared = differ = 0
    for i, row in enumerate(rows):
        y = stream.push(row)
        if i + 1 < T:
            assert y is None and stream.warming_up
            continue
        y = y.copy()
        want = runner.predict(rows[i - T + 1:i + 1])
        compared += 1
        differ += not np.array_equal(y, want)
        if check_window_every and i % check_window_every == 0:
            assert np.array_equal(stream.window(), rows[i - T + 1:i + 1])
        if prepare:
            stream.prepare()
    return compared, differ


@pytest.mark.parametrize("target", SIMD)
def test_lstm_a_native_bf16_streams_on_the_chain(bundles, target):
    """LSTM_A's native-bf16 plan (what --quant auto picks where bf16 runs in hardware: projections on the conv
    kernel, bf16 recurrent weights) streams on the chain program: the first LSTM's steps are row calls (49 in
    prepare, 1 on the tick) writing every step's h into the rows the second layer's projection reads. 600 seeded
    rows on the best target, 200 on the others, every 3rd window left for the push to prepare: every output equals
    predict bit for bit. On the tick the kernels run the two input projections and the head (80,100 MACs): each
    layer's last recurrent sum h_48 @ U ran in prepare."""
    n = 600 if target == SIMD[0] else 200
    rows = _rows(n, F_A, seed=5)
    with force_target(target):
        r = runtime.open(bundles("lstm_a", "native-bf16"))
        s = r.stream()
    with r, s:
        d = s.describe()
        assert (d["executor"], d["layers"], d["window"], d["head"]) == ("chain", [100, 100], 50, "native")
        assert d["macs_run"] == {"critical": 80_100, "prepare": 5_880_000}
        assert s._native._prog.warm_calls == 2        # both projections' weights read back after each prepare
        assert f"LSTM {target}" in d["isa"], d["isa"]
        compared = differ = 0
        for i, row in enumerate(rows):
            y = s.push(row)
            if i + 1 < T_A:
                continue
            compared += 1
            differ += not np.array_equal(y, r.predict(rows[i - T_A + 1:i + 1]))
            if i % 3:
                s.prepare()
        assert (compared, differ) == (n - T_A + 1, 0)
        assert s.counters["prepared_late"] >= (n - T_A) // 3


@pytest.mark.parametrize("target", SIMD)
def test_lstm_a_every_push_equals_predict_on_every_target(bundles, target):
    """A seeded stream through LSTM_A's native plan (3,000 rows on the best target, 600 on the others, 300 on
    the scalar fallback), prepare() after each output: every output equals predict of the window, bit for bit;
    the stream and the runner's kernels run the forced target; the head is computed natively after its check;
    every window but the first (no prepare() before it) was prepared ahead."""
    n = 3000 if target == SIMD[0] else 300 if target == "scalar" else 600
    rows = _rows(n, F_A, seed=1)
    with force_target(target):
        r = runtime.open(bundles("lstm_a"))
        s = r.stream()
    with r, s:
        d = s.describe()
        assert d["isa"] == target and f"native LSTM ({target})" in r.describe()["interpreter"]
        assert (d["head"], d["head_check"], d["window"], d["layers"]) == ("native", "equal on 64 probes", 50, [100, 100])
        assert d["macs"] == {"critical": 160_100, "prepare": 5_880_000, "window": 8_000_100}
        assert d["macs_run"] == {"critical": 80_100, "prepare": 5_880_000}   # the last h @ U runs in prepare
        assert _replay(r, s, rows, T_A, check_window_every=500) == (n - T_A + 1, 0)
        c = s.counters
        assert (c["outputs"], c["prepared_ahead"], c["prepared_late"]) == (n - T_A + 1, n - T_A + 1 - 1, 1)
        assert c["prepares"] == n - T_A + 2 and c["prepare_us_mean"] > 0     # and the window after the last row


def test_warming_up_says_how_many_rows(bundles):
    """Before the 50th row: None, warming_up, "warming up, k of 50 rows"; prepare() is False until 49 rows are
    in; from the 50th row on an output each row and "ready"."""
    with runtime.open(bundles("lstm_a")) as r, r.stream() as s:
        rows = _rows(53, F_A)
        for k, row in enumerate(rows):
            assert s.status == (f"warming up, {k} of 50 rows" if k < 50 else "ready: window of 50 rows")
            assert s.warming_up == (k < 50) and s.rows == k
            assert s.prepare() == (k >= 49)
            y = s.push(row)
            assert (y is None) == (k < 49)
        assert y.shape == (1, 1) and y.dtype == np.float32 and np.array_equal(y, r.predict(rows[-50:]))
        assert s.counters["outputs"] == 4


def test_push_before_prepare_is_still_exact_and_counted(bundles):
    """No prepare() calls: each push prepares its own window (late), the outputs are the same bits, the counters
    say so and what it cost."""
    rows = _rows(160, F_A, seed=2)
    with runtime.open(bundles("lstm_a")) as r, r.stream() as s:
        assert _replay(r, s, rows, T_A, prepare=False) == (111, 0)
        c = s.counters
        assert (c["pushes"], c["outputs"], c["prepared_ahead"], c["prepared_late"], c["late_waited"]) == \
            (160, 111, 0, 111, 0)
        assert c["late_prepare_us_total"] > 0 and c["prepares"] == 111


def test_prepare_thread_pinned_is_exact(bundles):
    """prepare="thread" pinned to a CPU this process may use: every output exact; when each push waits for the
    helper to finish its window (through the counters, not a clock), every window is prepared ahead."""
    core = sorted(os.sched_getaffinity(0))[-1]
    rows = _rows(400, F_A, seed=3)
    with runtime.open(bundles("lstm_a")) as r, r.stream(prepare="thread", core=core) as s:
        assert s.describe()["prepare"] == "thread" and s.describe()["core"] == core
        for i, row in enumerate(rows[:120]):
            if i >= T_A - 1:
                want = i - (T_A - 1) + 1                 # windows 49 .. i prepared once the helper caught up
                deadline = time.monotonic() + 60         # a hang guard, not a timing assertion
                while s.counters["prepares"] < want:
                    assert time.monotonic() < deadline
                    time.sleep(0.0005)
            y = s.push(row)
            if y is not None:
                assert np.array_equal(y, r.predict(rows[i - T_A + 1:i + 1]))
        c = s.counters
        assert (c["outputs"], c["prepared_ahead"], c["prepared_late"]) == (71, 71, 0)
        compared = differ = 0
        for i in range(120, 400):
            y = s.push(rows[i])
            compared += 1
            differ += not np.array_equal(y, r.predict(rows[i - T_A + 1:i + 1]))
        assert (compared, differ) == (280, 0)
        c = s.counters
        assert c["prepared_ahead"] + c["prepared_late"] == c["outputs"] == 351


def test_reset_starts_over(bundles):
    """After reset: warming up from 0 rows again, and the next outputs are predict of windows of rows pushed
    after the reset only."""
    a, b = _rows(70, F_A, seed=4), _rows(80, F_A, seed=5)
    with runtime.open(bundles("lstm_a")) as r, r.stream() as s:
        for row in a:
            s.push(row)
            s.prepare()
        s.reset()
        assert s.rows == 0 and s.warming_up and s.status == "warming up, 0 of 50 rows" and s.window().shape == (0, 100)
        assert _replay(r, s, b, T_A) == (31, 0)


def test_bad_rows_raise_what_predict_raises(bundles):
    """Wrong shape, dtype, a list, NaN, inf, a float64 beyond float32: the error class (and so exit code 3) predict
    raises for the same defect in a window; nothing is kept (the next outputs are still exact). A float64 row is
    cast like a float64 window: the same output as its float32 copy."""
    rows = _rows(60, F_A, seed=6)
    with runtime.open(bundles("lstm_a")) as r, r.stream() as s, r.stream() as twin:
        for row in rows[:55]:
            s.push(row)
            twin.push(row)
            s.prepare()
        win = rows[6:56].copy()
        nan_row, inf_row, big = rows[55].copy(), rows[55].copy(), rows[55].astype(np.float64)
        nan_row[3], inf_row[7], big[1] = np.nan, -np.inf, 1e300
        nan_win, inf_win, big_win = win.copy(), win.copy(), win.astype(np.float64)
        nan_win[-1], inf_win[-1], big_win[-1] = nan_row, inf_row, big
        cases = [(np.zeros(99, np.float32), np.zeros((50, 99), np.float32)),
                 (rows[:2], np.zeros((49, 100), np.float32)),
                 (rows[55].astype(np.int32), win.astype(np.int32)),
                 (list(rows[55]), win.tolist()),
                 (nan_row, nan_win), (inf_row, inf_win), (big, big_win)]
        for row, window in cases:
            with pytest.raises(InputError) as got:
                s.push(row)
            with pytest.raises(InputError) as want:
                r.predict(window)
            assert type(got.value) is type(want.value) and got.value.exit_code == want.value.exit_code == 3
            assert type(got.value) in (ShapeError, DTypeError, NonFiniteInputError)
            assert s.rows == 55
        assert "NaN" in str(pytest.raises(NonFiniteInputError, s.push, nan_row).value)
        y64 = s.push(rows[55].astype(np.float64)).copy()
        assert np.array_equal(y64, twin.push(rows[55])) and np.array_equal(y64, r.predict(rows[6:56]))
        assert np.array_equal(s.push(rows[56][None]), r.predict(rows[7:57]))        # (1, 100) is a row too


def test_heads_with_a_bias_and_with_a_softmax(bundles):
    """A Dense head with a bias tensor is computed natively (its check passed); a softmax head runs on the
    plan's own LiteRT segment. Both exact against predict on 200 seeded rows."""
    for name, head, T, F in (("lstm_bias", "native", 10, 7), ("lstm_softmax", "litert", 12, 5)):
        with runtime.open(bundles(name)) as r, r.stream() as s:
            assert s.describe()["head"] == head, s.describe()["head_check"]
            if head == "litert":
                assert "SOFTMAX" in s.describe()["head_check"]
            assert _replay(r, s, _rows(200, F, seed=7), T) == (200 - T + 1, 0), name


def test_models_and_plans_that_do_not_stream_are_refused_with_the_reason(bundles):
    """InputError (exit 3), naming why: a Flatten + Dense (the analysis' blocking op), a conv front end before
    the LSTM (the ops and the analysis' verdict), a plan that is not native (float on LiteRT); and bad
    arguments."""
    cases = ((bundles("flatten_dense", "float"), ["cannot stream", "FULLY_CONNECTED", "every output reads all"]),
             (bundles("conv_lstm"), ["before the first LSTM", "CONV_2D", "on the critical path", "LiteRT"]),
             (bundles("lstm_bias", "float"), ["the model streams", "plan 'float'", "whole on LiteRT"]))
    for path, words in cases:
        with runtime.open(path) as r:
            with pytest.raises(InputError) as e:
                r.stream()
            assert e.value.exit_code == 3 and e.value.hint
            for w in words:
                assert w in e.value.args[0], (path.name, w, e.value.args[0])
    with runtime.open(bundles("lstm_a")) as r:
        for kw, word in (({"prepare": "eager"}, "inline, thread"), ({"core": 0}, "prepare='thread'"),
                         ({"prepare": "thread", "core": 10_000}, "CPUs are 0 to"), ({"spin_us": -1}, "spin_us")):
            with pytest.raises(InputError, match=word):
                r.stream(**kw)


def test_a_closed_stream_refuses_every_call(bundles):
    """After close: push (also a push fetched before), prepare, reset, window and counters raise
    RunnerStateError; the runner still predicts."""
    with runtime.open(bundles("lstm_a")) as r:
        s = r.stream(prepare="thread")
        push = s.push
        push(_rows(1, F_A)[0])
        s.close()
        for call in (lambda: push(_rows(1, F_A)[0]), lambda: s.push(_rows(1, F_A)[0]), s.prepare, s.reset, s.window,
                     lambda: s.counters):
            with pytest.raises(RunnerStateError, match="closed"):
                call()
        assert r.predict(_rows(50, F_A)).shape == (1, 1)


def _bench(args):
    from click.testing import CliRunner
    from edgehft.cli import main
    return CliRunner().invoke(main, ["bench", *map(str, args)])


def test_bench_streaming(bundles, tmp_path):
    """edgehft bench --streaming: sliding windows of a feed are streamed as their rows (windows_slide), every tick
    timed as push then prepare; under --replay max no prepare is ever done before the next tick (it is there as
    the signal is out: the report says so and gives push + prepare); under recorded the counters and the share
    are reported; random windows are streamed by their newest rows. A bundle that does not stream: exit 3 with
    the reason; with --profile: the op-by-op split after the replay (per layer: prepare, last
    step; the head)."""
    import json
    rows = _rows(400, F_A, seed=8)
    x = np.stack([rows[i:i + T_A] for i in range(len(rows) - T_A + 1)])
    np.savez(tmp_path / "slide.npz", x=x, t_ns=np.arange(len(x), dtype=np.int64) * 2_000_000)
    np.save(tmp_path / "random.npy", np.random.default_rng(9).standard_normal((40, T_A, F_A)).astype(np.float32))
    b = bundles("lstm_a")
    res = _bench([b, "--ticks", tmp_path / "slide.npz", "--streaming", "--samples", 300, "--warmup", 20, "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output.strip().splitlines()[-1])
    assert (rep["streaming"], rep["mode"], rep["samples"], rep["windows_slide"]) == (True, "max", 300, True)
    assert rep["prepared_before_tick"] == 0.0 and rep["stream_counters"]["outputs"] == 320
    assert rep["stream"]["head"] == "native" and rep["push_prepare_us"]["p50"] > rep["latency_us"]["p50"] > 0
    res = _bench([b, "--ticks", tmp_path / "slide.npz", "--streaming", "--samples", 100, "--warmup", 0,
                  "--replay", "recorded", "--speed", 4, "--json"])
    rep = json.loads(res.output.strip().splitlines()[-1])
    assert rep["mode"] == "recorded" and 0.0 <= rep["prepared_before_tick"] <= 1.0
    assert rep["stream_counters"] == {"outputs": 100, "prepared_ahead": 100, "prepared_late": 0}
    res = _bench([b, "--ticks", tmp_path / "random.npy", "--streaming", "--samples", 50, "--warmup", 0])
    assert res.exit_code == 0 and "replay max" in res.output and "prepare cannot hide" in res.output
    assert "do not slide by one row" in res.output
    np.save(tmp_path / "small.npy", np.random.default_rng(10).standard_normal((20, 10, 7)).astype(np.float32))
    res = _bench([bundles("lstm_bias", "float"), "--ticks", tmp_path / "small.npy", "--streaming"])
    assert res.exit_code == 3 and "native plans" in res.output
    res = _bench([b, "--ticks", tmp_path / "slide.npz", "--streaming", "--profile", "--samples", 50, "--warmup", 0,
                  "--json"])
    assert res.exit_code == 0, res.output
    prof = json.loads(res.output.strip().splitlines()[-1])["profile"]
    assert [(o["phase"], o["op"].split(":")[0]) for o in prof["ops"]] == [
        ("prepare", "LSTM layer 0 (100)"), ("prepare", "LSTM layer 1 (100)"), ("critical", "LSTM layer 0 (100)"),
        ("critical", "LSTM layer 1 (100)"), ("critical", "head (FULLY_CONNECTED)")]
    assert all(o["us_per_tick"] > 0 for o in prof["ops"]) and prof["ticks"] == 2000
    assert prof["critical_us"] > 0 and prof["prepare_us"] > prof["critical_us"]   # 49 steps ahead, 1 on the tick


@pytest.mark.parametrize("quant", ["native", "native-bf16"])
def test_time_pushes_times_each_native_push_and_keeps_the_stream_exact(bundles, quant):
    """stream.time_pushes (the benchmarks' "timed in the library" row) on both executors (lstm-stack: native,
    chain: native-bf16): one ns figure per row, 0 for the T - 1 rows that warm up and for a refused NaN row, a
    positive one for every output; the stream then holds those rows, so the next push equals predict of its
    window; bad arguments get predict's error types and push keeps working."""
    rows = _rows(120, F_A, seed=9)
    rows[80, 3] = np.nan
    r = runtime.open(bundles("lstm_a", quant))
    with r, r.stream() as s:
        ns = s.time_pushes(rows)
        assert ns.dtype == np.uint64 and ns.shape == (120,)
        assert not ns[:T_A - 1].any() and ns[80] == 0
        outputs = [i for i in range(T_A - 1, 120) if i != 80]
        assert (ns[outputs] > 0).all()
        assert s.counters["bad_rows"] == 1
        clean = np.delete(rows, 80, axis=0)
        nxt = _rows(1, F_A, seed=10)[0]
        y = s.push(nxt).copy()
        assert np.array_equal(y, r.predict(np.concatenate([clean[-(T_A - 1):], nxt[None]])))
        with pytest.raises(DTypeError):
            s.time_pushes(rows.astype(np.float64))
        with pytest.raises(ShapeError):
            s.time_pushes(rows[:, :50])
        with pytest.raises(InputError, match="True or False"):
            s.time_pushes(clean[:3], prepare="no")
        assert s.time_pushes(np.zeros((0, F_A), np.float32)).shape == (0,)
        more = _rows(3, F_A, seed=12)
        assert (s.time_pushes(more[:, None, :]) > 0).all()      # (n, 1, features): push's (1, features) rows
        y = s.push(nxt).copy()
        assert np.array_equal(y, r.predict(np.concatenate([clean[-(T_A - 5):], nxt[None], more, nxt[None]])))
        low = s._native                                # the executor's own method checks what it is given too
        with pytest.raises(ShapeError, match="ns must be"):
            low.time_pushes(np.zeros((5, F_A), np.float32), np.zeros(1, np.uint64))
        with pytest.raises(ShapeError, match="rows must be"):
            low.time_pushes(np.zeros((5, F_A), np.float64), np.zeros(5, np.uint64))
    with pytest.raises(RunnerStateError):
        s.time_pushes(rows[:, :50])                    # closed is said first, whatever the arguments


@pytest.mark.parametrize("quant", ["native", "native-bf16"])
def test_native_entry_pushes_from_c_give_predicts_bits(bundles, quant):
    """stream.native_entry(): a C caller's view (here ctypes on the raw addresses, no edgehft Python in the loop):
    write the row at `row`, call push(handle), read `out`. Warming up returns 1, a NaN row -1 (not kept), then every
    output equals predict of its window bit for bit, on both executors."""
    import ctypes
    rows = _rows(70, F_A, seed=11)
    r = runtime.open(bundles("lstm_a", quant))
    with r, r.stream() as s:
        e = s.native_entry()
        assert e["row_floats"] == F_A and e["out_floats"] == 1 and e["library"].endswith(".so")
        push = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(e["push"])
        prepare = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(e["prepare"])
        row = np.ctypeslib.as_array((ctypes.c_float * e["row_floats"]).from_address(e["row"]))
        out = np.ctypeslib.as_array((ctypes.c_float * e["out_floats"]).from_address(e["out"]))
        differ = 0
        for i, x in enumerate(rows):
            row[:] = x
            rc = push(e["handle"])
            assert rc == (1 if i + 1 < T_A else 0), (i, rc)
            if rc == 0:
                differ += not np.array_equal(out.reshape(1, 1), r.predict(rows[i - T_A + 1:i + 1]))
            prepare(e["handle"])
        assert differ == 0
        row[:] = np.nan
        assert push(e["handle"]) == -1 and s.rows == 70
    # the entry keeps its stream alive: a stream the caller dropped is not freed under it
    import gc
    r = runtime.open(bundles("lstm_a", quant))
    e = r.stream().native_entry()
    gc.collect()
    push = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(e["push"])
    row = np.ctypeslib.as_array((ctypes.c_float * e["row_floats"]).from_address(e["row"]))
    for x in rows[:T_A]:
        row[:] = x
        rc = push(e["handle"])
    assert rc == 0 and e.stream.rows == T_A
    e.stream.close()
    r.close()
