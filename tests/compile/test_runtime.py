"""The runtime API on the compiled DeepLOB: checks on every bad input, buffer reuse, isolation from TF."""
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from conftest import SHARED
from edgehft import runtime
from edgehft.errors import BundleError, DTypeError, InputError, NonFiniteInputError, ShapeError

pytestmark = pytest.mark.slow


@pytest.fixture
def runner(deeplob_bundle):
    with runtime.open(deeplob_bundle, threads=1) as r:
        yield r


def test_wrong_shape(runner):
    with pytest.raises(ShapeError, match=r"input 'lob': shape \(100, 40\), expected \(1, 100, 40, 1\)"):
        runner.predict(np.zeros((100, 40), np.float32))


def test_wrong_dtype(runner):
    with pytest.raises(DTypeError, match="dtype int32, expected one of int8, float32, float64") as exc:
        runner.predict(np.zeros((100, 40, 1), np.int32))
    assert "pass float32 features" in exc.value.hint


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input(runner, deeplob_windows, bad):
    x = deeplob_windows["x"][0].copy()
    x[7, 3, 0] = bad
    with pytest.raises(NonFiniteInputError, match=r"first at index \(7, 3, 0\)"):
        runner.predict(x)


def test_float_and_prequantized_inputs_agree(runner, deeplob_windows):
    x = deeplob_windows["x"][123]
    p_float = runner.predict_raw(x).copy()
    q = runner.inputs[0].dest.copy()
    assert q.dtype == np.int8
    assert np.array_equal(runner.predict_raw(q), p_float)
    # quantization follows TFLite's reference QUANTIZE: round half away from zero, then clamp
    s, zp = runner.inputs[0].scale, runner.inputs[0].zero_point
    ref = np.clip(np.trunc(x / s + np.copysign(0.5, x / s)) + zp, -128, 127).astype(np.int8)
    assert np.array_equal(q.reshape(x.shape), ref)


def test_outputs_are_reused_buffers_and_dequantized(runner, deeplob_windows):
    a = runner.predict(deeplob_windows["x"][0])
    b = runner.predict(deeplob_windows["x"][1])
    assert a is b and a.dtype == np.float32 and a.shape == (1, 3)
    raw = runner.predict_raw(deeplob_windows["x"][1])
    assert np.allclose(b, (raw.astype(np.float32) + 128) / 256)


def test_predict_does_not_allocate_per_call(runner, deeplob_windows):
    xs = [deeplob_windows["x"][i] for i in range(50)]
    for x in xs:
        runner.predict(x)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for _ in range(4):
        for x in xs:
            runner.predict(x)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename") if s.size_diff > 0)
    assert grown < 2048, f"predict grew Python memory by {grown} bytes over 200 calls"


def test_describe_threads_affinity(deeplob_bundle):
    cpu = sorted(os.sched_getaffinity(0))
    try:
        with runtime.open(deeplob_bundle, threads=1, affinity=[cpu[-1]]) as r:
            d = r.describe()
            assert d["affinity"] == [cpu[-1]] and d["threads"] == 1 and d["emulated"] is False
            assert d["zero_copy"] is True and "BUILTIN+XNNPACK" in d["interpreter"]
    finally:
        os.sched_setaffinity(0, cpu)


def test_bad_affinity_is_an_input_error(deeplob_bundle):
    with pytest.raises(InputError, match=r"cannot pin to CPUs \[4096\]"):
        runtime.open(deeplob_bundle, affinity=[4096])


def test_an_option_the_boards_runner_does_not_take_is_an_input_error(deeplob_bundle):
    """runtime.open passes board options to the backend's Runner: one it does not take (a PYNQ overlay for a
    cpu bundle) is exit 3 naming what the board takes, not a TypeError reported as a corrupt model."""
    with pytest.raises(InputError, match="option overlay does not apply to board cpu") as e:
        runtime.open(deeplob_bundle, overlay="x.bit")
    assert e.value.exit_code == 3 and "op_resolver" in e.value.hint
    with runtime.open(deeplob_bundle, overlay=None) as r:          # an option not given is no option
        assert r.describe()["board"] == "cpu"


def test_closed_runner_refuses(deeplob_bundle, deeplob_windows):
    r = runtime.open(deeplob_bundle)
    r.close()
    with pytest.raises(RuntimeError, match="closed"):
        r.predict(deeplob_windows["x"][0])


def test_board_mismatch_and_unknown_board(deeplob_bundle):
    with pytest.raises(InputError, match="unknown board 'nope'"):
        runtime.open(deeplob_bundle, "nope")


def test_missing_model_file(deeplob_bundle, tmp_path):
    import shutil
    copy = tmp_path / "b"
    shutil.copytree(deeplob_bundle, copy)
    (copy / "model.tflite").unlink()
    with pytest.raises(BundleError, match="missing model.tflite"):
        runtime.open(copy)


def test_runtime_imports_without_tensorflow(deeplob_bundle):
    code = (
        "import sys\n"
        "for m in ('tensorflow', 'tf_keras', 'keras'): sys.modules[m] = None  # any import of them fails\n"
        "import numpy as np\n"
        "from edgehft import runtime\n"
        f"r = runtime.open({str(deeplob_bundle)!r})\n"
        "from edgehft.bundle_checks import check_golden\n"
        "print(check_golden(r)['ok'])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("True")


@pytest.mark.needs("edgetpu-pairs")
def test_lstm_state_does_not_leak_between_windows(tmp_path):
    """A fused int8 LSTM keeps its state in variable tensors that Invoke updates in place; every
    predict must start from the initial state, as a fresh interpreter does."""
    from ai_edge_litert.interpreter import Interpreter
    from edgehft import runtime
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    src = SHARED / "edgetpu_pairs" / "google-coral__test_data" / "keras_lstm_mnist_ptq.tflite"
    compile_model(src, [], tmp_path / "b", CompileOptions(board="cpu"))
    xs = (np.random.default_rng(1).random((12, 1, 28, 28)) * 60).astype(np.uint8)
    fresh = []
    for x in xs:
        it = Interpreter(model_path=str(src))
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        fresh.append(it.get_tensor(it.get_output_details()[0]["index"]).copy())
    # Without the reset a single interpreter drifts away from fresh ones after the first window.
    carried = Interpreter(model_path=str(src))
    carried.allocate_tensors()
    drifted = 0
    for x, f in zip(xs, fresh):
        carried.set_tensor(carried.get_input_details()[0]["index"], x)
        carried.invoke()
        drifted += int(not np.array_equal(carried.get_tensor(carried.get_output_details()[0]["index"]), f))
    assert drifted > 0
    with runtime.open(tmp_path / "b") as r:
        assert r.describe()["state_reset_per_call"] == 2
        got = [r.predict_raw(x).copy() for x in xs]
    assert all(np.array_equal(g, f) for g, f in zip(got, fresh))
