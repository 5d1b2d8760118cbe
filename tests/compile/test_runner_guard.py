"""A Runner serves one call at a time and nothing after close(): a second thread entering while a call is in
progress, and any call after close (also through a ``predict`` fetched before it), raise RunnerStateError
instead of sharing the interpreter's buffers or reading freed native memory."""
import threading

import numpy as np
import pytest

from edgehft import runtime
from edgehft.compiler.pipeline import CompileOptions, compile_model
from edgehft.errors import NonFiniteInputError, RunnerStateError

pytestmark = pytest.mark.slow


class _Blocking(np.ndarray):
    """A window that stops inside the runner's input check until ``release`` is set: a call held in
    progress, deterministically (the general path reshapes the window while it holds the runner)."""

    entered: threading.Event
    release: threading.Event

    def reshape(self, *a, **k):
        self.entered.set()
        assert self.release.wait(30)
        return np.asarray(self).reshape(*a, **k)


def _held_call(runner, x):
    """Start ``runner.predict`` on a copy of ``x`` in a thread and return (thread, release event, result
    list) once that call is inside the runner."""
    blocking = np.array(x).view(_Blocking)
    blocking.entered, blocking.release = threading.Event(), threading.Event()
    result = []
    t = threading.Thread(target=lambda: result.append(runner.predict(blocking).copy()))
    t.start()
    assert blocking.entered.wait(30)
    return t, blocking.release, result


@pytest.fixture(scope="module")
def mlp_dynamic(mlp, tmp_path_factory):
    out = tmp_path_factory.mktemp("guard") / "mlp.dynamic"
    compile_model(mlp / "mlp.keras", [mlp / "x.npy"], out, CompileOptions(board="cpu", quant="dynamic"))
    return out


@pytest.fixture(scope="module")
def lstm_native(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("guard") / "lstm.native"
    compile_model(models / "k3_lstm.keras", [models / "calib.npy"], out, CompileOptions(board="cpu", quant="native"))
    return out


@pytest.mark.parametrize("plan", ["mlp_dynamic", "lstm_native", "deeplob_bundle"])
def test_second_thread_is_refused_while_a_call_runs(plan, request, rng):
    bundle = request.getfixturevalue(plan)
    with runtime.open(bundle) as r:
        spec = r.bundle.manifest.inputs[0]
        x = rng.standard_normal(spec.shape[1:]).astype(np.float32)
        y = r.predict(x).copy()
        t, release, result = _held_call(r, x)
        fast = r.predict                                    # the bound fast path, not the general one
        with pytest.raises(RunnerStateError, match="already running a call in another thread"):
            fast(x)
        with pytest.raises(RunnerStateError, match="another thread"):
            r.predict_raw(x)
        release.set()
        t.join(30)
        assert np.array_equal(result[0], y)                 # the held call finished with its own answer
        assert np.array_equal(r.predict(x), y)              # and the runner serves again


def test_close_waits_for_the_call_in_progress_then_refuses(lstm_native, rng):
    r = runtime.open(lstm_native)
    x = rng.standard_normal(r.bundle.manifest.inputs[0].shape[1:]).astype(np.float32)
    y = r.predict(x).copy()
    bound, bound_raw = r.predict, r.predict_raw               # fetched before close, as a hot loop would
    t, release, result = _held_call(r, x)
    closer = threading.Thread(target=r.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive()                                  # close waits: the native buffers are in use
    release.set()
    t.join(30), closer.join(30)
    assert np.array_equal(result[0], y)
    for call in (bound, bound_raw, r.predict):
        with pytest.raises(RunnerStateError, match="is closed"):
            call(x)
    r.close()                                                 # twice is fine


def test_float64_beyond_float32_is_refused_not_cast_to_inf(mlp_dynamic):
    with runtime.open(mlp_dynamic) as r:
        x = np.zeros(r.bundle.manifest.inputs[0].shape[1:], np.float64)
        x[5] = 1e300
        with pytest.raises(NonFiniteInputError, match=r"beyond float32's range .*first at index \(5,\)"):
            r.predict(x)
        x[5] = 0.5                                           # float64 within range: taken, same as float32
        assert np.array_equal(r.predict(x).copy(), r.predict(x.astype(np.float32)))


@pytest.mark.parametrize("kwargs,message", [({"op_resolver": "x"}, "op_resolver 'x': choose one of auto"),
                                            ({"affinity": [0.5]}, "CPU ids are integers"),
                                            ({"affinity": [2**70]}, "cannot pin to CPUs"),
                                            ({"threads": 10**6}, "this machine has")])
def test_open_options_are_checked(mlp_dynamic, kwargs, message):
    from edgehft.errors import InputError
    with pytest.raises(InputError, match=message):
        runtime.open(mlp_dynamic, **kwargs)


def test_a_manifest_that_does_not_fit_its_native_chain(lstm_native, tmp_path, monkeypatch):
    """The same files as a bundle already opened once on this machine, with a manifest whose output shape
    the chain does not make: the first-open marker must not cover it (the manifest is not in its own files
    map), so the isolated open refuses it, exit 6, instead of a ValueError in this process."""
    import json
    import shutil
    from edgehft.errors import BundleError
    monkeypatch.setenv("EDGEHFT_CACHE", str(tmp_path / "cache"))
    runtime.open(lstm_native).close()                        # the good bundle: its marker is written
    bad = shutil.copytree(lstm_native, tmp_path / "bad")
    m = json.loads((bad / "manifest.json").read_text())
    m["outputs"][0]["shape"] = [1, 1]
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="cannot be opened") as exc:
        runtime.open(bad)
    assert exc.value.exit_code == 6
