"""Latency-first micro-batching (issue 17 item 4): ``runner.predict_many`` on the cpu board
(edgehft/runtime/batching.py). On the example MLP compiled ``--quant float`` and ``--quant int8`` every result
equals ``predict``'s bit for bit whichever way a size runs, the decision per size is recorded with measured
figures, bad windows are named by index; a plan whose batch is not bit-identical never batches; a native LSTM
plan loops and says why; ``bench --batch`` prints and emits the table. No timing assertions: which way is faster
is whatever this machine measured; the tests check the decision follows the figures."""
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from edgehft import runtime
from edgehft.cli.common import main
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.errors import DTypeError, InputError, NonFiniteInputError, RunnerStateError, ShapeError
from edgehft.runtime.batching import MAX_BATCH, MIN_ROUNDS

pytestmark = pytest.mark.slow
FAST = dict(calib_windows=64, drift_windows=64, golden_count=8)


@pytest.fixture(scope="module")
def mlp_bundles(mlp, tmp_path_factory):
    """{"float": bundle, "int8": bundle}: the example MLP (64 -> ... -> 1) for the cpu board."""
    out = tmp_path_factory.mktemp("predict_many")
    done = {}
    for quant in ("float", "int8"):
        done[quant] = out / f"mlp.{quant}"
        compile_model(mlp / "mlp.keras", [mlp / "x.npy"], done[quant], CompileOptions(board="cpu", quant=quant, **FAST))
    return done


@pytest.fixture(scope="module")
def lstm_native(stream_runtime_bundle):
    return stream_runtime_bundle("lstm_bias", "native")


def _windows(mlp, n, start=0):
    x = np.load(mlp / "x.npy")
    return [x[start + i] for i in range(n)]


def _equal_to_predict(r, xs, got):
    assert len(got) == len(xs)
    for g, x in zip(got, xs):
        want = r.predict(x)
        assert g.dtype == np.float32 and g.shape == want.shape == (1, 1)
        assert np.array_equal(g, want)


def _check_record(rec, n):
    """A measured size: real figures, and the decision follows them and the bit-identity check."""
    assert rec["n"] == n and rec["rounds"] >= MIN_ROUNDS
    assert rec["batched_us_per_input"] > 0 and rec["one_by_one_us_per_input"] > 0
    assert rec["speedup"] == pytest.approx(rec["one_by_one_us_per_input"] / rec["batched_us_per_input"])
    assert rec["pays"] == (rec["batched_us_per_input"] < rec["one_by_one_us_per_input"])
    assert rec["batched"] == (rec["pays"] and rec["bit_identical"])
    assert ("why" in rec) == (not rec["batched"])


@pytest.mark.parametrize("quant", ["float", "int8"])
def test_predict_many_equals_predict_and_records_the_decision(mlp, mlp_bundles, quant):
    with runtime.open(mlp_bundles[quant], threads=1) as r:
        assert r.batching()["sizes"] == [] and r.batching()["engine"] == "LiteRT, batch dim resized"
        xs = _windows(mlp, 8)
        first = r.predict_many(xs)               # first use of 8: measured, then run the way chosen
        _equal_to_predict(r, xs, first)
        rep = r.batching()
        assert [s["n"] for s in rep["sizes"]] == [8] and rep["why"] is None
        rec = rep["sizes"][0]
        _check_record(rec, 8)
        assert rec["bit_identical"]              # XNNPACK's batched GEMM sums each row as its batch-1 kernel
        assert (8 in r._batcher.runs) == rec["batched"]      # a warm interpreter only for a size that batches
        kept = [a.copy() for a in first]
        again = r.predict_many(_windows(mlp, 8, start=100))  # the decided path; fresh arrays, not reused ones
        _equal_to_predict(r, _windows(mlp, 8, start=100), again)
        assert all(np.array_equal(a, b) for a, b in zip(first, kept)) and first[0] is not again[0]
        # the same shapes and dtypes predict accepts, mixed in one call: (64,), (1, 64), float64
        mixed = [xs[0], xs[1][None, :], xs[2].astype(np.float64), xs[3]]
        _equal_to_predict(r, mixed, r.predict_many(mixed))
        rep = r.batching([2, 3, 16, MAX_BATCH])   # measured up front on the golden inputs
        assert [s["n"] for s in rep["sizes"]] == [2, 3, 4, 8, 16, MAX_BATCH]
        for s in rep["sizes"]:
            _check_record(s, s["n"])
        assert rep["batches"] == any(s["batched"] for s in rep["sizes"])
        assert r.describe()["batching"] == {"batches": rep["batches"], "why": None,
                                            "sizes_measured": [2, 3, 4, 8, 16, MAX_BATCH]}
        big = _windows(mlp, MAX_BATCH + 1)        # above the limit: one by one
        _equal_to_predict(r, big, r.predict_many(big))
        assert r.predict_many([]) == [] and len(r._batcher.sizes) == 6
        _equal_to_predict(r, xs[:1], r.predict_many(xs[:1]))


@pytest.mark.parametrize("quant", ["float", "int8"])
def test_bad_windows_are_named_by_index(mlp, mlp_bundles, quant):
    with runtime.open(mlp_bundles[quant], threads=1) as r:
        xs = _windows(mlp, 8)
        for measured in (False, True):
            bad = list(xs)
            bad[5] = bad[5].copy()
            bad[5][3] = np.nan
            with pytest.raises(NonFiniteInputError, match=r"predict_many input 5 of 8: input 'features': 1 "
                                                           r"non-finite value\(s\) \(NaN/inf\), first at index \(3,\)"):
                r.predict_many(bad)
            assert (8 in r._batcher.sizes) == measured    # a bad first call records no decision
            bad = list(xs)
            bad[2] = bad[2][:63]
            with pytest.raises(ShapeError, match=r"predict_many input 2 of 8: input 'features': shape \(63,\)"):
                r.predict_many(bad)
            bad = list(xs)
            bad[6] = bad[6].astype(np.int32)
            with pytest.raises(DTypeError, match=r"predict_many input 6 of 8: input 'features': dtype int32"):
                r.predict_many(bad)
            with pytest.raises(ShapeError, match=r"predict_many input 1 of 8: model takes 1 input\(s\), got 2"):
                r.predict_many([xs[0], (xs[1], xs[2])] + xs[2:])
            r.predict_many(xs)                    # now 8 is measured: the same errors on the decided path
        with pytest.raises(InputError, match="predict_many takes a list of windows, got ndarray"):
            r.predict_many(xs[0])
        with pytest.raises(InputError, match="batch size 1: sizes are integers 2 to 64"):
            r.batching([1])
    with pytest.raises(RunnerStateError, match="is closed"):
        r.predict_many(xs)


def test_a_batch_that_is_not_bit_identical_never_batches(mlp, mlp_bundles):
    """LiteRT's builtin float kernels (no XNNPACK) take another summation order at a batch > 1 (ai-edge-litert
    2.3: some rows of a batch differ from predict in the last bits): that plan never batches, and says why."""
    with runtime.open(mlp_bundles["float"], threads=1, op_resolver="builtin") as r:
        rep = r.batching([2, 4])
        assert rep["sizes"][0]["bit_identical"] is False and not rep["batches"]
        assert re.match(r"a batch of 2 is not bit-identical to predict \(input \d differs\) on ai-edge-litert "
                        r"\S+ BUILTIN_WITHOUT_DEFAULT_DELEGATES: .* so this runner never batches$", rep["why"])
        for s in rep["sizes"]:
            _check_record(s, s["n"])
            assert not s["batched"]
        assert r._batcher.runs == {}
        xs = _windows(mlp, 8)
        _equal_to_predict(r, xs, r.predict_many(xs))
        assert 8 not in r._batcher.sizes          # once off, a new size is not even measured


def test_native_lstm_plan_loops_and_says_why(lstm_native):
    with runtime.open(lstm_native, threads=1) as r:
        assert r.describe()["plan"] == "native"
        xs = list(np.random.default_rng(3).standard_normal((6, 10, 7)).astype(np.float32))
        got = r.predict_many(xs)
        for g, x in zip(got, xs):
            want = r.predict(x)
            assert g.shape == want.shape == (1, 2) and np.array_equal(g, want)
        rep = r.batching([2, 4])
        assert rep["batches"] is False and rep["sizes"] == [] and rep["engine"] is None
        assert rep["why"].startswith("native plan: the chain's native kernels (native.json) run one window per call")
        assert r.describe()["batching"]["why"] == rep["why"]
        bad = list(xs)
        bad[4] = bad[4].copy()
        bad[4][2, 1] = np.inf
        with pytest.raises(NonFiniteInputError, match=r"predict_many input 4 of 6: .*first at index \(2, 1\)"):
            r.predict_many(bad)


def test_bench_batch_prints_the_table_and_json(mlp, mlp_bundles, lstm_native):
    res = CliRunner().invoke(main, ["bench", str(mlp_bundles["int8"]), "--batch", "4,2"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert max(len(s) for s in lines) <= 80
    rows = [s for s in lines if s.startswith("│")]
    assert [s.split("│")[1].strip() for s in rows] == ["2", "4"]
    assert all(("one batch" in s) != ("one by one" in s) for s in rows)
    res = CliRunner().invoke(main, ["bench", str(mlp_bundles["float"]), "--batch", "2,8", "--ticks",
                                    str(mlp / "x.npy"), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["plan"] == "float" and [s["n"] for s in rep["batching"]["sizes"]] == [2, 8]
    for s in rep["batching"]["sizes"]:
        _check_record(s, s["n"])
    res = CliRunner().invoke(main, ["bench", str(lstm_native), "--batch", "4"])
    assert res.exit_code == 0 and "predict_many never batches here: native plan" in res.output
    res = CliRunner().invoke(main, ["bench", str(mlp_bundles["float"]), "--batch", "1,4"])
    assert res.exit_code == 2 and "give batch sizes 2 to 64" in res.output
