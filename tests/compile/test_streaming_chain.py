"""Streaming a convolution front end (issue 21 items 1-3): ``runner.stream()`` on the ``native-bf16`` plan of the
shipped DeepLOB (and of a small Conv2D / MaxPool / concat / LSTM model), compared with ``predict`` of the same
plan on the same window.

The chain executor (:mod:`edgehft.streaming.chain`) computes per tensor only the rows the streaming analysis does
not call cached, each run of rows on the plan's own kernels with the window's edges as explicit padding, so every
push must be np.array_equal to ``predict`` of the window of the last T rows: over a whole real day of DeepLOB
rows (the newest row of each of the shipped feed's windows, fed as ticks), on every dispatch target, with pushes
that find their window unprepared, across the buffers' moves and a reset.

The shipped feature pipeline normalizes each window over its own rows, so its windows are not slides of each
other: the streamed windows here are the rows as they arrive (what a pipeline with causal per-row features gives),
and ``predict`` is called on exactly those windows.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import DEEPLOB, FEED_DAY1
from edgehft import runtime
from edgehft.cli import main
from edgehft.bundle_checks import bundle_windows
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.errors import InputError
from edgehft.kernels.cpu import build
from edgehft.kernels.cpu.build import force_target
from native_reference import cpu_targets

pytestmark = [pytest.mark.slow, pytest.mark.needs("g++")]
T = 100
TARGETS = cpu_targets()


@pytest.fixture(scope="module")
def deeplob_bf16(tmp_path_factory):
    """The shipped DeepLOB, ``--quant native-bf16``, calibrated on the shipped feed (day 1)."""
    out = tmp_path_factory.mktemp("stream_chain") / "deeplob.bf16"
    compile_model(DEEPLOB / "deeplob.keras", [FEED_DAY1], out,
                  CompileOptions(board="cpu", quant="native-bf16", calib_windows=100, drift_windows=50,
                                 golden_count=4))
    return out


@pytest.fixture(scope="module")
def day_rows(deeplob_bf16):
    """A day of DeepLOB rows: the first window's 100 rows, then the newest row of every later window of the day."""
    with runtime.open(deeplob_bf16) as r:
        x = bundle_windows(r.bundle, [FEED_DAY1], run_features=True).x
    return np.concatenate([x[0], x[1:, -1]])


def _replay(runner, stream, rows, skip_prepare_every=0, T=T):
    """Push every row (prepare() after each output unless its index is a multiple of ``skip_prepare_every``);
    returns (outputs compared with predict, outputs that differ)."""
    compared = differ = 0
    for i, row in enumerate(rows):
        y = stream.push(row)
        if i + 1 < T:
            assert y is None and stream.status == f"warming up, {i + 1} of {T} rows"
            continue
        compared += 1
        differ += not np.array_equal(y, runner.predict(rows[i - T + 1:i + 1]))
        if not (skip_prepare_every and i % skip_prepare_every == 0):
            stream.prepare()
    return compared, differ


def test_deeplob_a_day_of_ticks_every_push_equals_predict(deeplob_bf16, day_rows):
    """26,824 rows of 2024-08-08: every output equals predict of its window; every window but the first (no
    prepare() before it) was prepared ahead; the analysis' MACs per tick are the stream's."""
    n = len(day_rows)
    assert n > 20_000
    with runtime.open(deeplob_bf16) as r, r.stream() as s:
        d = s.describe()
        assert (d["executor"], d["head"], d["window"], d["row_shape"], d["layers"]) == ("chain", "native", T, [40, 1], [64])
        assert d["macs"] == {"critical": 3_149_248, "prepare": 2_734_080, "window": 39_040_192}
        # what the kernels run: off AMX each of the 8 (k,1) convs's critical rows sum their kernel rows over rows received
        # before the tick in prepare (a (4,1) conv's first three critical rows: 3, 2, 1 of 4) and none over the
        # zero padding: 641,024 of the analysis' 2,166,016 critical conv MACs leave the tick (AMX tiles sum every
        # kernel row: the analysis' figures); on every target the LSTM's first step on the tick has its recurrent
        # sum h @ U (64 x 256 = 16,384 MACs) from prepare
        split = "CONV_2D amx" not in d["isa"]
        prefixes = [c for c in s._native.plan.call_ops["prepare"] if c[0] == "conv2d prefix"]
        assert (len(prefixes), d["macs_run"]) == ((8, {"critical": 2_491_840, "prepare": 3_088_384}) if split else
                                                  (0, {"critical": 3_132_864, "prepare": 2_734_080}))
        assert _replay(r, s, day_rows) == (n - T + 1, 0)
        c = s.counters
        assert (c["outputs"], c["prepared_ahead"], c["prepared_late"], c["bad_rows"]) == (n - T + 1, n - T, 1, 0)
        advances = n - T + 1                       # one prepare after each output, each moving the window a row on
        assert s._native.counters()["moves"] == 1 + (advances - 3 * T - 1) // (3 * T)   # to the buffers' start


@pytest.mark.parametrize("target", TARGETS)
def test_deeplob_on_every_target_with_late_pushes_and_a_reset(deeplob_bf16, day_rows, target):
    """600 rows on each dispatch target (the runner's kernels and the stream's forced alike), every 5th window
    left unprepared (the push prepares it: counted), then a reset and 300 more rows: all equal predict."""
    rows = day_rows[5000:5600]
    with force_target(target):
        r = runtime.open(deeplob_bf16)
        s = r.stream()
    with r, s:
        isa = s.describe()["isa"]
        assert f"CONV_2D {target}" in isa if target in build.CONV_ONLY else f"LSTM {target}" in isa, isa
        assert _replay(r, s, rows, skip_prepare_every=5) == (501, 0)
        c = s.counters
        late = 1 + sum(1 for i in range(T - 1, 599) if i % 5 == 0)    # the first window, and after these outputs
        assert (c["prepared_late"], c["prepared_ahead"]) == (late, 501 - late)
        s.reset()
        assert s.warming_up and s.push(rows[0]) is None
        s.reset()
        assert _replay(r, s, day_rows[9000:9300]) == (201, 0)


def test_deeplob_window_and_refusals(deeplob_bf16, day_rows):
    """window() is the last T rows pushed (also right after prepare)."""
    with runtime.open(deeplob_bf16) as r:
        with r.stream() as s:
            for i, row in enumerate(day_rows[:450]):
                s.push(row)
                if i % 3:
                    s.prepare()
                if i >= T - 1 and i % 50 == 0:
                    assert np.array_equal(s.window(), day_rows[i - T + 1:i + 1])


def test_small_conv_pool_concat_lstm_model(models, tmp_path):
    """tests/make_models.py's k3_cnn_lstm (Conv2D 1x2/2 + LeakyReLU, Conv2D 4x1 SAME + LeakyReLU, MaxPool along
    time, two Conv2D concatenated, LSTM(16), Dense softmax), native-bf16: 400 seeded rows, every push equals
    predict."""
    out = tmp_path / "cnn.bf16"
    compile_model(models / "k3_cnn_lstm.keras", [models / "calib.npy"], out,
                  CompileOptions(board="cpu", quant="native-bf16", calib_windows=12, drift_windows=8, golden_count=2))
    with runtime.open(out) as r, r.stream() as s:
        shape = tuple(r.bundle.manifest.inputs[0].shape)
        assert s.describe()["executor"] == "chain"
        rows = np.random.default_rng(3).standard_normal((400, *shape[2:])).astype(np.float32)
        assert _replay(r, s, rows, T=shape[1]) == (400 - shape[1] + 1, 0)


@pytest.fixture(scope="module")
def chain_models(tmp_path_factory):
    """tests/make_stream_chain_models.py's models compiled --quant native-bf16 (once per module)."""
    from conftest import ROOT, run_maker
    src = run_maker(ROOT / "tests" / "make_stream_chain_models.py", tmp_path_factory.mktemp("chain_models"))
    out = tmp_path_factory.mktemp("chain_bundles")
    done = {}

    def get(name):
        if name not in done:
            done[name] = out / f"{name}.bf16"
            compile_model(src / f"{name}.keras", [src / f"{name}.npy"], done[name],
                          CompileOptions(board="cpu", quant="native-bf16", calib_windows=12, drift_windows=8,
                                         golden_count=2))
        return done[name]
    return get


@pytest.mark.parametrize("name", ["conv1d_family", "conv1d_sigmoid"])
def test_conv1d_models_stream_exactly(chain_models, name):
    """Conv1D with same, valid and causal padding (a PAD before a valid conv), tanh / sigmoid activations, a
    MaxPool1D along time, a per-timestep Dense, an LSTM over the shrunk time axis and a Dense head: every op runs
    on a native kernel, and 400 seeded rows (every 4th window left unprepared) equal predict bit for bit."""
    import json
    bundle = chain_models(name)
    kinds = [st["kind"] for st in json.loads((bundle / "native.json").read_text())["steps"]]
    assert "litert" not in kinds
    if name == "conv1d_family":
        assert {"pad", "act", "maxpool", "fc"} <= set(kinds)
    with runtime.open(bundle) as r, r.stream() as s:
        T = r.bundle.manifest.inputs[0].shape[1]
        rows = np.random.default_rng(11).standard_normal((400, *r.bundle.manifest.inputs[0].shape[2:])).astype(np.float32)
        assert s.describe()["executor"] == "chain"
        assert _replay(r, s, rows, skip_prepare_every=4, T=T) == (400 - T + 1, 0)
        assert s.counters["prepared_late"] > 50


def test_a_stride_along_time_is_refused_with_the_op(chain_models):
    """Conv1D(strides=2): InputError (exit 3) naming the op and the stride along time (the analysis refuses it)."""
    with runtime.open(chain_models("strided")) as r:
        with pytest.raises(InputError) as e:
            r.stream()
    assert e.value.exit_code == 3 and "stride 2 along the time axis" in e.value.args[0], e.value.args[0]


def _threads() -> set:
    """This process' thread ids."""
    return {int(t) for t in os.listdir("/proc/self/task")}


def _wait_prepares(stream, n: int) -> None:
    """Until the stream's executor has prepared n windows (the helper thread's work), at most 20 s."""
    deadline = time.monotonic() + 20
    while stream._native.counters()["prepares"] < n:
        assert time.monotonic() < deadline, f"the helper prepared {stream._native.counters()['prepares']} of {n}"
        time.sleep(0.0002)


def test_deeplob_prepare_thread_pinned(deeplob_bf16, day_rows):
    """prepare='thread' with the helper pinned to a core (the one thread the open starts, on exactly that core):
    300 rows each pushed once the helper prepared its window (every output prepared ahead, none late), then a
    reset and 300 rows back to back (the pushes race the helper: a late one prepares its window or waits for the
    helper); every output equals predict of its window, window() is the last T rows; close stops the helper."""
    core = max(os.sched_getaffinity(0))
    rows, burst = day_rows[7000:7300], day_rows[12000:12300]
    with runtime.open(deeplob_bf16) as r:
        before = _threads()
        with r.stream(prepare="thread", core=core, spin_us=200) as s:
            helper = _threads() - before
            assert [os.sched_getaffinity(t) for t in helper] == [{core}]
            assert (s.describe()["prepare"], s.describe()["core"]) == ("thread", core)
            assert s._native.counters()["helper"] == 1
            differ = 0
            for i, row in enumerate(rows):
                y = s.push(row)
                if i + 1 >= T:
                    differ += not np.array_equal(y, r.predict(rows[i - T + 1:i + 1]))
                if i + 1 >= T - 1:
                    _wait_prepares(s, i - T + 3)      # the window the next push completes
            assert differ == 0 and np.array_equal(s.window(), rows[-T:])
            c = s.counters
            assert (c["outputs"], c["prepared_ahead"], c["prepared_late"], c["late_waited"]) == (201, 201, 0, 0)
            assert c["prepares"] == 202 and c["bad_rows"] == 0
            s.reset()
            outs = [s.push(row) for row in burst[:T - 1]] + [s.push(row).copy() for row in burst[T - 1:]]
            assert outs[:T - 1] == [None] * (T - 1)
            assert all(np.array_equal(outs[i], r.predict(burst[i - T + 1:i + 1])) for i in range(T - 1, len(burst)))
            c = s.counters
            assert c["outputs"] == 402 and c["prepared_ahead"] + c["prepared_late"] == 402
        assert not helper & _threads()              # close stopped it


def test_a_native_json_whose_shapes_do_not_fit_is_refused_not_read_past(deeplob_bf16, tmp_path):
    """A hostile bundle: native.json says a conv reads 40-wide rows where its input tensor's rows are 20 wide
    (re-hashed, so the manifest verifies). runner.stream() refuses it with InputError naming the tensor; no kernel
    reads past a buffer."""
    import json
    from deploy_box import resign

    def widen(d):
        g = json.loads((d / "native.json").read_text())
        st = next(s for s in g["steps"] if s["kind"] == "conv2d" and s["in_hw"] == [100, 20])
        st["in_hw"] = [100, 40]
        (d / "native.json").write_text(json.dumps(g))
    bad = resign(deeplob_bf16, tmp_path / "bad", widen, tag="wide")
    try:
        r = runtime.open(bad)
    except Exception as exc:            # refused at open is fine too: it must be an edgehft error, not a crash
        from edgehft.errors import EdgeHFTError
        assert isinstance(exc, EdgeHFTError), exc
        return
    with r:
        with pytest.raises(InputError, match="do not fit the kernel input"):
            r.stream()


def test_deeplob_profile_splits_the_critical_path_and_the_prepare_per_call(deeplob_bf16, day_rows):
    """bench --streaming --profile's split: one row per prepare call (its rows), the LSTM's prepared steps, one per
    critical call, the LSTM's steps on the tick, the head; the critical convs compute the bottom rows and every row
    was timed (> 0); outputs while profiling equal predict's; the CLI prints the split (and --json has it); a
    stream whose prepare runs on the helper thread refuses it."""
    from edgehft.bench.profile import profile_stream
    rows = day_rows[3000:3000 + T + 60]
    with runtime.open(deeplob_bf16) as r:
        with r.stream() as s:
            prof = profile_stream(s, rows, T, ticks=40)
            plan = s._native.plan
            n_pre, n_crit = len(plan.call_ops["prepare"]), len(plan.call_ops["critical"])
            ops = prof["ops"]
            assert len(ops) == n_pre + 1 + n_crit + 1 + len(plan.head_ops) and prof["ticks"] == 40
            assert [o["phase"] for o in ops] == ["prepare"] * (n_pre + 1) + ["critical"] * (n_crit + 1 + 2)
            assert ops[n_pre]["op"].startswith("LSTM steps 0-") and ops[n_pre + 1 + n_crit]["op"].endswith(f"-{T - 1}")
            assert ops[n_pre + 1]["op"] == f"conv2d (op 0, 1) rows {T - 1}-{T - 1}"
            assert [o["op"].split(" ")[0] for o in ops[-2:]] == ["fc", "softmax"]
            assert all(o["us_per_tick"] > 0 for o in ops), [o for o in ops if not o["us_per_tick"] > 0]
            assert prof["critical_us"] > 0 and prof["prepare_us"] > 0
            s.profile(True)
            for i, row in enumerate(rows):
                y = s.push(row)
                s.prepare()
                if i + 1 >= T:
                    assert np.array_equal(y, r.predict(rows[i - T + 1:i + 1]))
            assert len(s.profile_ops()) == len(ops)
        with r.stream(prepare="thread") as s:
            with pytest.raises(InputError, match="helper thread"):
                s.profile(True)
    res = CliRunner().invoke(main, ["bench", str(deeplob_bf16), "--ticks", str(FEED_DAY1), "--run-features", "--streaming",
                                    "--profile", "--samples", "30", "--warmup", "5"], terminal_width=80,
                             env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "streaming, op by op" in res.output and "LSTM steps" in res.output and "critical path" in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
