"""``edgehft.serve(..., stream=True)`` (issue 17 with issue 21): ``push(row)`` from the active version's stream,
and swaps that keep every stream's window right: versions installed with install_local under a serving process
that keeps pushing a seeded row sequence; every output must equal ``predict`` of the window of the last T rows,
before, across and after a swap and a rollback."""
from __future__ import annotations

import numpy as np
import pytest

import edgehft
from edgehft import runtime
from edgehft.deploy.local import install_local
from edgehft.errors import InputError
from edgehft.serving import ShadowPolicy

pytestmark = [pytest.mark.needs("g++")]
POLICY = ShadowPolicy(calls=80, seconds=20.0, min_calls=30, prewarm=5, budget_p99_us=1e9, budget_p999_us=1e9)


@pytest.fixture(scope="module")
def lstm_bundle(stream_runtime_bundle):
    """tests/make_stream_runtime_models.py's lstm_bias (LSTM(12) -> LSTM(9) -> Dense(2), 10 x 7 rows), --quant native."""
    return stream_runtime_bundle("lstm_bias", "native")


class Feeder:
    """Pushes a seeded row sequence through the server (prepare between pushes), each output checked against
    predict of the window of its last T rows."""

    def __init__(self, srv, bundle, T=10, F=7):
        import collections
        self.srv, self.T, self.F, self.rng = srv, T, F, np.random.default_rng(5)
        self.ref, self.i, self.outputs, self.differ, self.served_by = runtime.open(bundle), 0, 0, 0, set()
        self.window = collections.deque(maxlen=T)

    def run(self, until, timeout=90.0):
        import time
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if until():
                return
            row = self.rng.standard_normal(self.F).astype(np.float32)
            self.window.append(row)
            y = self.srv.push(row)
            self.served_by.add(id(self.srv._lane.stream))
            if y is not None:
                self.outputs += 1
                self.differ += not np.array_equal(y, self.ref.predict(np.stack(self.window)))
            self.i += 1
            self.srv.prepare()
        raise AssertionError(f"not reached in {timeout:g} s ({self.i} pushes): {self.srv.events}")


def _event(srv, kind, version=None):
    return next((e for e in srv.events if e["event"] == kind and (version is None or e["version"] == version)), None)


def test_push_across_a_swap_and_a_rollback_equals_predict(lstm_bundle, tmp_path):
    root = tmp_path / "install"
    a = install_local(root, lstm_bundle)["version"]
    with edgehft.serve(root, stream=True, policy=POLICY, watch="poll", poll_s=0.02) as srv:
        f = Feeder(srv, lstm_bundle)
        f.run(lambda: f.i >= 200)
        first = srv._lane.stream
        b = install_local(root, lstm_bundle)["version"]
        f.run(lambda: srv._lane.stream is not first and srv._lane.handoff is None)
        sh = _event(srv, "shadow", b)
        assert sh["ok"] and sh["live_calls"] >= POLICY.calls and sh["rel_mae"] == 0.0, sh
        assert (srv.active, srv.previous) == (b, a)
        f.run(lambda: srv._prev_feed is not None)                 # A's stream handed back to the manager ...
        target = srv._lane.log.next_seq
        f.run(lambda: srv._prev_feed.seq >= target)               # ... which feeds it the rows pushed since
        assert srv.rollback() == a
        f.run(lambda: srv._lane.stream is first and srv._lane.handoff is None)
        f.run(lambda: f.i >= 4000)
        assert srv.active == a and _event(srv, "rolled_back", a)["from_version"] == b
        assert f.differ == 0 and f.outputs == f.i - f.T + 1 and len(f.served_by) == 2


def test_push_needs_stream_mode_and_a_streaming_plan(lstm_bundle, mlp, tmp_path):
    root = tmp_path / "install"
    install_local(root, lstm_bundle)
    with edgehft.serve(root, watch="poll") as srv:
        with pytest.raises(InputError, match="stream=True"):
            srv.push(np.zeros(7, np.float32))
