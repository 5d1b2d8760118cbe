"""``edgehft.serve`` against the real loopback box (issue 17): a process serving version A from the box's install
dir while ``edgehft deploy`` puts B there. The caller keeps calling ``predict`` from this thread; the server's
manager shadow-runs B on those calls and swaps, or refuses, between two calls."""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

import edgehft
from edgehft import runtime
from edgehft.errors import InputError
from edgehft.serving import ShadowPolicy
from deploy_box import box, bundles, cli, resign  # noqa: F401 (fixtures)

# a loaded 2-core CI host misses the board's budget in a shadow run beside the caller: budgets every run meets,
# except in the latency test
FAST = dict(calls=60, seconds=20.0, min_calls=20, prewarm=5, breach_calls=50, budget_p99_us=1e9, budget_p999_us=1e9)


def deployed(box, bundle) -> dict:
    res = cli(box, "deploy", str(bundle), "--host", "box", "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["results"][0]


@pytest.fixture(scope="module")
def windows(deeplob_windows):
    return deeplob_windows["x"][:400]


def _call_until(srv, windows, done, timeout=120.0) -> dict:
    """Call srv.predict on the windows round robin until ``done()`` or ``timeout``; what the caller saw."""
    calls, failed, served_by, t0 = 0, [], set(), time.monotonic()
    while not done() and time.monotonic() - t0 < timeout:
        served_by.add(srv.active)
        try:
            srv.predict(windows[calls % len(windows)][None])
        except Exception as exc:           # a failed call fails the test below, with what it was
            failed.append(repr(exc))
        calls += 1
    return {"calls": calls, "failed": failed, "served_by": served_by}


def _event(srv, kind, version=None):
    return next((e for e in srv.events if e["event"] == kind and (version is None or e["version"] == version)), None)


def _deploy_async(box, bundle):
    out = {}
    t = threading.Thread(target=lambda: out.update(res=cli(box, "deploy", str(bundle), "--host", "box", "--json")))
    t.start()
    return t, out


def test_swap_after_shadow_then_rollback(box, bundles, windows, tmp_path):
    """A serving, B deployed: the server shadow-runs B on the live calls (no failed call), swaps, keeps A warm;
    rollback() answers from A at once with A's outputs; the box's own rollback (current back to A) too."""
    _, _, root = box
    a = deployed(box, bundles["v1"])["version"]
    log = tmp_path / "events.jsonl"
    seen = []
    with edgehft.serve(root, policy=ShadowPolicy(**FAST), events_path=log, on_event=seen.append, poll_s=0.05) as srv:
        assert srv.active == a and srv.previous is None and srv.events[0]["event"] == "serving"
        t, out = _deploy_async(box, bundles["v2"])
        caller = _call_until(srv, windows, lambda: _event(srv, "swapped") or _event(srv, "refused"))
        t.join()
        b = json.loads(out["res"].output)["results"][0]["version"]
        assert caller["failed"] == [] and caller["calls"] > FAST["calls"]
        sh, sw = _event(srv, "shadow", b), _event(srv, "swapped", b)
        assert sh is not None and sh["ok"] and sh["live_calls"] == FAST["calls"] and sh["rel_mae"] == 0.0, sh
        assert sw is not None and sw["from_version"] == a and (srv.active, srv.previous) == (b, a)
        assert [e["event"] for e in seen] == [e["event"] for e in srv.events]
        assert [json.loads(line)["event"] for line in log.read_text().splitlines()] == [e["event"] for e in srv.events]
        with runtime.open(root / "versions" / a) as ra:
            want = ra.predict(windows[7][None]).copy()
        assert srv.rollback() == a and srv.active == a and srv.previous == b
        assert np.array_equal(srv.predict(windows[7][None]), want)
        assert _call_until(srv, windows, lambda: False, timeout=1.0)["served_by"] == {a}   # B is not retried


def test_box_rollback_swaps_back_to_the_warm_version(box, bundles, windows):
    """After a swap to B, `edgehft rollback` on the box points current back to A: the server answers from A
    (kept warm, no shadow run)."""
    _, _, root = box
    a = deployed(box, bundles["v1"])["version"]
    with edgehft.serve(root, policy=ShadowPolicy(**FAST), poll_s=0.05) as srv:
        t, out = _deploy_async(box, bundles["v2"])
        _call_until(srv, windows, lambda: _event(srv, "swapped") or _event(srv, "refused"))
        t.join()
        assert _event(srv, "swapped") is not None, srv.events
        assert cli(box, "rollback", "--host", "box").exit_code == 0
        _call_until(srv, windows, lambda: _event(srv, "rolled_back") is not None, timeout=30)   # emitted after the swap
        e = _event(srv, "rolled_back")
        assert srv.active == a and e["why"] == "the box's current link went back to it"
        assert _event(srv, "loaded", a) is None             # A was never reopened


def _scaled_output(d):
    """The bundle's output scale x 1.5: the same raw int8 values (golden vectors still match) read as outputs
    50 % larger, which is what a retrained model's drift looks like to the shadow run."""
    m = json.loads((d / "manifest.json").read_text())
    m["outputs"][0]["scale"] = [m["outputs"][0]["scale"][0] * 1.5]
    (d / "manifest.json").write_text(json.dumps(m, indent=1))


def test_a_drifting_version_is_refused_and_a_keeps_serving(box, bundles, windows, tmp_path):
    """B's outputs differ from A's by far more than the gate: the shadow refuses, A keeps answering, and B is
    not retried while current points to it."""
    _, _, root = box
    a = deployed(box, bundles["v1"])["version"]
    drift = resign(bundles["v1"], tmp_path / "drift", _scaled_output, tag="drift")
    with edgehft.serve(root, policy=ShadowPolicy(**FAST), poll_s=0.05) as srv:
        t, out = _deploy_async(box, drift)
        caller = _call_until(srv, windows, lambda: _event(srv, "refused") or _event(srv, "swapped"))
        t.join()
        assert json.loads(out["res"].output)["results"][0]["exit_code"] == 0      # the box switched current
        r = _event(srv, "refused")
        assert r is not None and "outputs differ from the active version's" in r["why"], srv.events
        assert srv.active == a and caller["failed"] == [] and caller["served_by"] == {a}
        n = len(srv.events)
        _call_until(srv, windows, lambda: False, timeout=1.0)
        assert len(srv.events) == n                           # not retried


def test_a_version_over_the_latency_budget_is_refused(box, bundles, windows):
    """A shadow budget of 1 µs p99 over 120 calls (enough to hold a p99 to the budget alone: MIN_CALLS): B is
    refused naming its p99 and the budget; A keeps serving."""
    _, _, root = box
    a = deployed(box, bundles["v1"])["version"]
    policy = ShadowPolicy(**{**FAST, "calls": 120, "min_calls": 120, "budget_p99_us": 1.0})
    with edgehft.serve(root, policy=policy, poll_s=0.05) as srv:
        t, _ = _deploy_async(box, bundles["v2"])
        _call_until(srv, windows, lambda: _event(srv, "refused") or _event(srv, "swapped"))
        t.join()
        r = _event(srv, "refused")
        assert r is not None and "p99" in r["why"] and "over the budget 1 µs" in r["why"], srv.events
        assert "active version" not in r["why"]               # held to the budget alone
        sh = _event(srv, "shadow")
        assert sh["verdicts"]["p99"]["judged"] == "against the budget (120 calls)"
        assert sh["active_latency_us"]["p99"] > 1.0           # the active version was timed beside it
        assert srv.active == a


def test_a_breach_after_the_swap_swaps_back(box, bundles, windows):
    """A 1 µs p99 budget: the shadow run's 60 calls are too few to hold a p99 to it (not judged, MIN_CALLS), so B
    swaps in; the breach watch's 100 caller calls are enough, B is over the budget and A (kept warm) answers
    again, B not retried."""
    _, _, root = box
    a = deployed(box, bundles["v1"])["version"]
    policy = ShadowPolicy(**{**FAST, "breach_calls": 100, "budget_p99_us": 1.0})
    with edgehft.serve(root, policy=policy, poll_s=0.05) as srv:
        t, out = _deploy_async(box, bundles["v2"])
        caller = _call_until(srv, windows, lambda: _event(srv, "breach") or _event(srv, "refused"))
        t.join()
        b = json.loads(out["res"].output)["results"][0]["version"]
        sh = _event(srv, "shadow", b)
        assert sh["ok"] and sh["verdicts"]["p99"]["judged"] == "not judged: 60 calls, p99 needs 100", sh
        assert _event(srv, "swapped", b) is not None
        br = _event(srv, "breach", b)
        assert br is not None and br["over"] == ["p99"] and br["latency_us"]["p99"] > 1.0, srv.events
        _call_until(srv, windows, lambda: _event(srv, "rolled_back") is not None, timeout=30)   # emitted after the swap
        rb = _event(srv, "rolled_back")
        assert srv.active == a and "breach after the swap: p99 over the budget" in rb["why"], rb
        assert caller["failed"] == [] and b in caller["served_by"]
        assert _call_until(srv, windows, lambda: False, timeout=1.0)["served_by"] == {a}   # B is not retried


def test_nothing_deployed_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="nothing is deployed") as e:
        edgehft.serve(tmp_path)
    assert e.value.exit_code == 3 and "edgehft deploy" in e.value.hint


def test_local_installs_swap_with_the_poll_watch(bundles, windows, tmp_path):
    """install_local (the box-side steps in this process) under a server that polls: each install of the same
    bundle is a new version, shadow-run and swapped in; the store's rollback swaps back to the warm one."""
    from edgehft.deploy.local import install_local
    from edgehft.deploy.store import Store
    root = tmp_path / "install"
    a = install_local(root, bundles["v1"])["version"]
    with edgehft.serve(root, policy=ShadowPolicy(**FAST), watch="poll", poll_s=0.05) as srv:
        assert srv._watch.mode == "poll"
        b = install_local(root, bundles["v1"])["version"]
        assert b != a
        caller = _call_until(srv, windows, lambda: _event(srv, "swapped", b) or _event(srv, "refused"))
        assert caller["failed"] == [] and (srv.active, srv.previous) == (b, a), srv.events
        Store(root).rollback()
        _call_until(srv, windows, lambda: _event(srv, "rolled_back") is not None, timeout=30)   # emitted after the swap
        assert srv.active == a and _event(srv, "rolled_back", a)["from_version"] == b


def _served_from(bundles, root, **kw):
    from edgehft.deploy.local import install_local
    a = install_local(root, bundles["v1"])["version"]
    return a, edgehft.serve(root, policy=ShadowPolicy(**FAST), watch="poll", poll_s=0.05, **kw)


@pytest.fixture(scope="module")
def mlp_int8(mlp, tmp_path_factory):
    """The example MLP (64 -> ... -> 1: one output value per window) for the cpu board, int8."""
    from edgehft.compiler.pipeline import CompileOptions, compile_model
    out = tmp_path_factory.mktemp("serve_mlp") / "mlp.int8"
    compile_model(mlp / "mlp.keras", [mlp / "x.npy"], out,
                  CompileOptions(board="cpu", quant="int8", calib_windows=64, drift_windows=64, golden_count=8))
    return out


def test_a_quiet_feed_judges_drift_on_the_golden_inputs_too(mlp, mlp_int8, tmp_path):
    """Every live window the same (a quiet or stale feed) into a model of one output value: the live outputs do not
    vary, so the shadow run also compares every golden input (whose outputs do): the same model again is swapped
    in, and B (outputs x 1.5) is refused with its relative MAE, not passed at 0 % (nor refused for a range of 0)."""
    from edgehft.deploy.local import install_local
    root = tmp_path / "install"
    a, srv = _served_from({"v1": resign(mlp_int8, tmp_path / "a", tag="a")}, root)
    one = np.repeat(np.load(mlp / "x.npy")[:1].astype(np.float32), 4, axis=0)      # (4, 64): one window
    with srv:
        same = install_local(root, resign(mlp_int8, tmp_path / "same", tag="same"))["version"]
        _call_until(srv, one, lambda: _event(srv, "refused") or _event(srv, "swapped"))
        sh = _event(srv, "shadow", same)
        assert _event(srv, "swapped", same) is not None and sh["compared"] >= sh["live_calls"] + 8 and \
            sh["rel_mae"] == 0.0, \
            srv.events
        install_local(root, resign(mlp_int8, tmp_path / "drift", _scaled_output, tag="quiet"))
        caller = _call_until(srv, one, lambda: _event(srv, "refused"))
        r = _event(srv, "refused")
        assert r is not None and "outputs differ from the active version's: relative MAE" in r["why"], srv.events
        assert srv.active == same and caller["failed"] == []


def _renamed_output(d):
    """The output renamed in the manifest and the golden vectors: the same model behind another interface."""
    m = json.loads((d / "manifest.json").read_text())
    old = m["outputs"][0]["name"]
    m["outputs"][0]["name"] = old + "_renamed"
    (d / "manifest.json").write_text(json.dumps(m, indent=1))
    with np.load(d / "golden.npz") as z:
        arrays = {k.replace(f"outputs/{old}", f"outputs/{old}_renamed"): z[k].copy() for k in z.files}
    np.savez(d / "golden.npz", **arrays)


def test_a_version_with_other_shapes_is_refused_other_names_are_not(bundles, windows, mlp_int8, tmp_path):
    """B takes and gives other shapes (the MLP where DeepLOB serves): a caller written for A would break on B, so B
    is refused before its shadow run, naming the shapes, and A keeps serving. C is A with its output renamed (Keras
    numbers default layer names): predict is positional, so C is shadow-run and swapped in."""
    from edgehft.deploy.local import install_local
    root = tmp_path / "install"
    a, srv = _served_from(bundles, root)
    with srv:
        b = install_local(root, resign(mlp_int8, tmp_path / "mlp", tag="mlp"))["version"]
        _call_until(srv, windows, lambda: _event(srv, "refused") or _event(srv, "swapped"))
        r = _event(srv, "refused", b)
        assert r is not None and r["why"].startswith("its inputs' shapes [[1, 64]] (the active version's "
                                                     "[[1, 100, 40, 1]]) and outputs' shapes [[1, 1]]"), srv.events
        assert _event(srv, "shadow") is None and srv.active == a
        c = install_local(root, resign(bundles["v1"], tmp_path / "renamed", _renamed_output, tag="renamed"))["version"]
        _call_until(srv, windows, lambda: _event(srv, "swapped", c) or _event(srv, "refused", c))
        assert srv.active == c, srv.events


def test_a_late_swap_back_never_undoes_a_rollback(bundles, windows, tmp_path):
    """The manager's swap back (a breach, or current going back) is for the version it judged: after the caller's
    rollback() made A active again, a swap back meant for B does nothing; a closed server refuses rollback()."""
    from edgehft.deploy.local import install_local
    from edgehft.errors import RunnerStateError
    root = tmp_path / "install"
    a, srv = _served_from(bundles, root)
    with srv:
        b = install_local(root, bundles["v1"])["version"]
        _call_until(srv, windows, lambda: _event(srv, "swapped", b) or _event(srv, "refused"))
        assert srv.active == b and srv.rollback() == a
        assert srv._swap_back("breach after the swap: p99 over the budget", refuse_out=True, expect_active=b) is False
        assert (srv.active, srv.previous) == (a, b)
    with pytest.raises(RunnerStateError, match="closed"):
        srv.rollback()


def test_predict_many_follows_the_swaps(bundles, windows, tmp_path):
    """Server.predict_many: one result per window, equal to predict of each, from the active version (after a swap,
    the new one); its windows feed the shadow run like predict's."""
    from edgehft.deploy.local import install_local
    root = tmp_path / "install"
    a, srv = _served_from(bundles, root)
    with srv:
        ws = [windows[i][None] for i in range(3)]
        assert all(np.array_equal(y, srv.predict(w)) for y, w in zip(srv.predict_many(ws), ws))
        b = install_local(root, bundles["v1"])["version"]
        t0 = time.monotonic()
        while not (_event(srv, "swapped", b) or _event(srv, "refused")) and time.monotonic() - t0 < 120:
            srv.predict_many(ws)
        sh = _event(srv, "shadow", b)
        assert sh is not None and sh["live_calls"] == FAST["calls"] and srv.active == b, srv.events
        assert all(np.array_equal(y, srv.predict(w)) for y, w in zip(srv.predict_many(ws), ws))
