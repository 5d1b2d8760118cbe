"""The native stream executor (edgehft/kernels/cpu/cpu_stream.cpp via edgehft.kernels.cpu.stream, issue 21):
rows pushed one at a time give, for every window, the bits the native LSTM kernel gives on that window (the
native plan's predict runs one single-layer NativeLSTM per LSTM op, with the whole window), on every dispatch
target this CPU runs; whether the window was prepared ahead (prepare() between pushes), late (push prepares it)
or by the helper thread. The head follows a float64 Dense within fp32 rounding and is the same on every target.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from edgehft.errors import NonFiniteInputError, ShapeError
from edgehft.kernels.cpu import build
from edgehft.kernels.cpu.build import force_target
from edgehft.kernels.cpu.lstm import NativeLSTM
from edgehft.kernels.cpu.stream import NativeStream
from native_reference import cpu_targets, simd_target

pytestmark = pytest.mark.needs("g++")
TARGETS = [t for t in cpu_targets() if t not in build.CONV_ONLY]


def random_layers(rng, in_size, hidden, clips):
    """Keras-layout ``(kernel, recurrent_kernel, bias, cell_clip)`` per layer, scaled as trained LSTMs are."""
    layers = []
    for H, clip in zip(hidden, clips):
        layers.append((rng.normal(0, 1 / np.sqrt(in_size), (in_size, 4 * H)).astype(np.float32),
                       rng.normal(0, 1 / np.sqrt(H), (H, 4 * H)).astype(np.float32),
                       rng.normal(0, 0.3, 4 * H).astype(np.float32), clip))
        in_size = H
    return layers


class PlanChain:
    """What the native plan's predict runs: one single-layer NativeLSTM (return_sequences) per layer, each on
    the whole window."""

    def __init__(self, layers, T):
        self.ks = [NativeLSTM([(W, U, b)], T, True, cell_clip=clip) for W, U, b, clip in layers]

    def run(self, window):
        x = np.ascontiguousarray(window, np.float32)
        for k in self.ks:
            x = k.run(x)
        return x.copy()                         # k.out is the kernel's reused buffer


def _replay(stream, chain, rows, T, prepare_between):
    """Push every row; returns (windows compared, windows that differ) against the chain's whole-window run."""
    compared = differ = 0
    for i, r in enumerate(rows):
        if prepare_between:                    # ahead of the tick (with T = 1: the zero state only)
            stream.prepare()
        y = stream.push(r)
        if i + 1 < T:
            assert y is None
        else:
            want = chain.run(rows[i - T + 1:i + 1])
            got = y if y.ndim == 2 else y[None]
            compared += 1
            differ += not np.array_equal(got, want[-got.shape[0]:])
    return compared, differ


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(13, (37, 100), (3.0, 0.0), 30), (100, (100, 100), (10.0, 10.0), 50),
                                   (5, (130,), (0.0,), 7), (4, (9, 17, 3), (1.0, 0.0, 2.0), 1)])
def test_every_push_is_the_whole_window_bit_for_bit(target, shape):
    """Layer sizes off the 16-lane grid (37, 9, 17, 3), wider than one register pass (130: two column chunks on
    AVX-512), LSTM_A's 100 x 2 over 50 rows, a one-row window; per-layer cell clips. 260 rows: prepared ahead
    (the sequence output), then late (the last h), each window np.array_equal to the plan's kernels."""
    in_size, hidden, clips, T = shape
    rng = np.random.default_rng(sum(hidden) + T)
    layers = random_layers(rng, in_size, hidden, clips)
    rows = (rng.normal(0, 1.5, (260, in_size))).astype(np.float32)
    with force_target(target):
        chain = PlanChain(layers, T)
        seq = NativeStream(layers, T, output="sequence")
        last = NativeStream(layers, T, output="last")
    assert seq.isa == last.isa == simd_target(target) == chain.ks[0].isa
    assert _replay(seq, chain, rows, T, True) == (260 - T + 1, 0)
    assert _replay(last, chain, rows, T, False) == (260 - T + 1, 0)
    c_seq, c_last = seq.counters(), last.counters()
    assert c_seq["outputs"] == c_last["outputs"] == 260 - T + 1
    assert (c_seq["prepared_ahead"], c_seq["prepared_late"]) == (260 - T + 1, 0)
    assert (c_last["prepared_ahead"], c_last["prepared_late"]) == (0, 260 - T + 1)
    if T > 1:
        assert c_last["late_prepare_ns"] > 0
    seq.close(), last.close()


def test_head_is_a_dense_on_the_last_step_and_the_same_on_every_target():
    """output='head': bias + h_last @ w.T within fp32 rounding of a float64 Dense (|error| <= 1e-6 of the sum
    of |terms|), with and without a bias, and the same bits on every target."""
    rng = np.random.default_rng(3)
    T = 20
    layers = random_layers(rng, 11, (100, 100), (10.0, 10.0))
    rows = rng.normal(0, 1, (80, 11)).astype(np.float32)
    chain = PlanChain(layers, T)
    for M, bias in ((1, None), (3, rng.normal(0, 1, 3).astype(np.float32)), (17, np.zeros(17, np.float32))):
        w = rng.normal(0, 0.3, (M, 100)).astype(np.float32)
        outs = {}
        for target in TARGETS:
            with force_target(target):
                s = NativeStream(layers, T, head=(w, bias))
            got = []
            for i, r in enumerate(rows):
                y = s.push(r)
                if y is not None:
                    got.append(y.copy())
                s.prepare()
            outs[target] = np.array(got)
            s.close()
        h = np.array([chain.run(rows[i - T + 1:i + 1])[-1] for i in range(T - 1, len(rows))], np.float64)
        want = h @ w.T.astype(np.float64) + (0 if bias is None else bias)
        mag = np.abs(h) @ np.abs(w.T.astype(np.float64)) + (0 if bias is None else np.abs(bias))
        first = outs[TARGETS[0]]
        assert first.shape == (len(rows) - T + 1, M)
        assert (np.abs(first - want) <= 1e-6 * mag + 1e-30).all()
        for target, y in outs.items():
            assert np.array_equal(y, first), target


def test_warming_up_then_one_output_per_row():
    """Before T rows: None, and prepare() has nothing to do until T-1 rows are in; rows counts them."""
    rng = np.random.default_rng(5)
    T = 6
    layers = random_layers(rng, 3, (8,), (0.0,))
    s = NativeStream(layers, T, output="last")
    seen = []
    for i in range(T + 2):
        ready = s.prepare()
        assert ready == (i >= T - 1), i
        seen.append(s.push(rng.normal(0, 1, 3).astype(np.float32)) is not None)
        assert s.rows == i + 1
    assert seen == [False] * (T - 1) + [True] * 3
    c = s.counters()
    assert (c["pushes"], c["outputs"], c["prepared_ahead"], c["prepared_late"]) == (T + 2, 3, 3, 0)


def test_reset_starts_over_and_a_bad_row_changes_nothing():
    """reset(): warming up again, and the next windows hold only rows pushed after it. A NaN or inf row raises
    NonFiniteInputError and is not kept: the windows around it are the ones without it. A row of another size
    raises ShapeError."""
    rng = np.random.default_rng(6)
    T = 5
    layers = random_layers(rng, 4, (16, 8), (0.0, 0.0))
    chain = PlanChain(layers, T)
    s = NativeStream(layers, T, output="last")
    rows = rng.normal(0, 1, (30, 4)).astype(np.float32)
    for r in rows[:12]:
        s.push(r)
    s.reset()
    assert s.rows == 0 and s.window().shape == (0, 4)
    kept = []
    for i, r in enumerate(rows[12:]):
        if i == 7:
            for bad in (np.float32("nan"), np.float32("inf")):
                poisoned = r.copy()
                poisoned[2] = bad
                with pytest.raises(NonFiniteInputError):
                    s.push(poisoned)
        y = s.push(r)
        kept.append(r)
        assert (y is None) == (len(kept) < T)
        if y is not None:
            assert np.array_equal(y, chain.run(np.array(kept[-T:]))[-1])
            assert np.array_equal(s.window(), np.array(kept[-T:]))
    assert s.counters()["bad_rows"] == 2
    with pytest.raises(ShapeError, match="takes 4"):
        s.push(np.zeros(5, np.float32))


def _wait_for(pred, what):
    deadline = time.monotonic() + 30          # a hang guard, not a timing assertion
    while not pred():
        assert time.monotonic() < deadline, f"the helper thread never {what}"
        time.sleep(0.001)


@pytest.mark.parametrize("target", TARGETS)
def test_helper_thread_prepares_after_each_push(target):
    """With the helper: every window equal to the plan's kernels; a push made after the helper finished its
    window counts as prepared ahead (waited for through the counters); back-to-back pushes are all still exact
    (prepared by the helper, waited on, or prepared by push itself)."""
    rng = np.random.default_rng(7)
    T = 12
    layers = random_layers(rng, 9, (24, 40), (10.0, 0.0))
    rows = rng.normal(0, 1, (150, 9)).astype(np.float32)
    with force_target(target):
        chain = PlanChain(layers, T)
        s = NativeStream(layers, T, output="last")
    assert s.start_helper(None, spin_us=200) == 0
    assert s.start_helper(None) == -1
    for i, r in enumerate(rows[:60]):
        y = s.push(r)
        if y is not None:
            assert np.array_equal(y, chain.run(rows[i - T + 1:i + 1])[-1])
        if i + 1 >= T - 1:
            done = i + 2 - (T - 1)                  # windows prepared once the helper caught up
            _wait_for(lambda: s.counters()["prepares"] >= done, "prepared its window")
    c = s.counters()
    assert (c["outputs"], c["prepared_ahead"], c["prepared_late"], c["helper"]) == (60 - T + 1, 60 - T + 1, 0, 1)
    assert _replay_from(s, chain, rows, 60, T) == 0
    c = s.counters()
    assert c["prepared_ahead"] + c["prepared_late"] == c["outputs"] == 150 - T + 1
    s.close()


def _replay_from(s, chain, rows, start, T):
    differ = 0
    for i in range(start, len(rows)):
        y = s.push(rows[i])
        differ += not np.array_equal(y, chain.run(rows[i - T + 1:i + 1])[-1])
    return differ


def test_helper_sleeps_and_wakes_and_reset_waits_for_it():
    """spin_us=0: the helper sleeps (futex) between pushes and every push still gets its window (prepared,
    waited on, or prepared by push); reset while it works, then the next windows are exact; close joins it."""
    rng = np.random.default_rng(8)
    T = 8
    layers = random_layers(rng, 5, (32,), (0.0,))
    chain = PlanChain(layers, T)
    s = NativeStream(layers, T, output="last")
    assert s.start_helper(None, spin_us=0) == 0
    rows = rng.normal(0, 1, (60, 5)).astype(np.float32)
    for i, r in enumerate(rows[:30]):
        y = s.push(r)
        if y is not None:
            assert np.array_equal(y, chain.run(rows[i - T + 1:i + 1])[-1])
        time.sleep(0.0005 * (i % 3))
    s.reset()
    for i, r in enumerate(rows[30:]):
        y = s.push(r)
        assert (y is None) == (i + 1 < T)
        if y is not None:
            assert np.array_equal(y, chain.run(rows[30 + i - T + 1:30 + i + 1])[-1])
    c = s.counters()
    assert c["prepared_ahead"] + c["prepared_late"] == c["outputs"] == (30 - T + 1) + (30 - T + 1)
    s.close()


def test_helper_pinned_to_a_core_or_refused():
    """A core this process may run on: pinned, 0. One it may not (beyond the CPU set): -3 and no thread left."""
    import os
    rng = np.random.default_rng(9)
    s = NativeStream(random_layers(rng, 2, (4,), (0.0,)), 3, output="last")
    assert s.start_helper(100_000) == -3
    assert s.counters()["helper"] == 0
    core = sorted(os.sched_getaffinity(0))[-1]
    assert s.start_helper(core) == 0 and s.helper_core == core and s.counters()["helper"] == 1
    s.close()


def test_bad_weights_are_refused():
    rng = np.random.default_rng(10)
    good = random_layers(rng, 3, (4, 5), (0.0, 0.0))
    with pytest.raises(ShapeError, match="previous layer gives 4"):
        NativeStream([good[0], random_layers(rng, 3, (5,), (0.0,))[0]], 4, output="last")
    with pytest.raises(ShapeError, match="cell_clip"):
        NativeStream([(*good[0][:3], -1.0)], 4, output="last")
    with pytest.raises(ShapeError, match="head weights"):
        NativeStream(good, 4, head=(np.zeros((1, 4), np.float32), None))
    with pytest.raises(ShapeError, match="exactly when"):
        NativeStream(good, 4, output="head")
    with pytest.raises(ShapeError, match="timesteps"):
        NativeStream(good, 0, output="last")


def test_profile_splits_prepare_and_push_per_layer_and_changes_no_output():
    """Op-by-op timing (bench --streaming --profile): off by default; on, each prepare and push adds to one slot
    per layer's prepare, per layer's last step and the head; a stream profiled gives the same outputs as one not;
    off again, there is nothing to read; refused while the helper thread runs."""
    from edgehft.errors import InputError
    rng = np.random.default_rng(12)
    T = 9
    layers = random_layers(rng, 5, (12, 7), (0.0, 3.0))
    head = (rng.normal(0, 1, (2, 7)).astype(np.float32), None)
    plain, timed = NativeStream(layers, T, head), NativeStream(layers, T, head)
    timed.profile(True)
    rows = rng.normal(0, 1, (T + 20, 5)).astype(np.float32)
    for r in rows:
        plain.prepare(), timed.prepare()
        a, b = plain.push(r), timed.push(r)
        assert (a is None) == (b is None) and (a is None or np.array_equal(a, b))
    ops = timed.profile_ops()
    assert [o["phase"] for o in ops] == ["prepare"] * 2 + ["critical"] * 3
    assert ops[0]["op"].startswith("LSTM layer 0 (12): steps 0-7") and ops[4]["op"] == "head (FULLY_CONNECTED)"
    assert all(o["us_per_tick"] > 0 for o in ops)
    assert abs(sum(o["share"] for o in ops if o["phase"] == "critical") - 1) < 1e-9
    timed.profile(False)
    timed.push(rows[0])
    assert timed.profile_ops() == []                                       # off: no slots, nothing timed
    assert timed.start_helper() == 0
    with pytest.raises(InputError, match="helper thread"):
        timed.profile(True)
    for s in (plain, timed):
        s.close()


def test_the_helper_thread_does_not_start_while_profiling():
    """Profiling slots are the pushing thread's: start_helper refuses (-4) while profiling is on, starts after."""
    rng = np.random.default_rng(13)
    s = NativeStream(random_layers(rng, 4, (6,), (0.0,)), 5, output="last")
    s.profile(True)
    assert s.start_helper() == -4 and s.counters()["helper"] == 0
    s.profile(False)
    assert s.start_helper() == 0 and s.counters()["helper"] == 1
    s.close()
