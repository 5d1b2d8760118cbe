"""The shadow run's and the breach watch's rule for a percentile over its budget from too few calls
(edgehft.serving.server.hold_few_calls): not judged, and saying so."""
from edgehft.serving.server import MIN_CALLS, hold_few_calls


def verdict(value, budget=100.0):
    return {"value_us": value, "budget_us": budget, "ok": value <= budget}


def test_enough_calls_hold_to_the_budget():
    v = verdict(120.0)
    hold_few_calls(v, "p99", MIN_CALLS["p99"])
    assert v == {"value_us": 120.0, "budget_us": 100.0, "ok": False, "judged": "against the budget (100 calls)"}
    v = verdict(120.0)
    hold_few_calls(v, "p999", 1000)
    assert v["ok"] is False


def test_within_budget_is_ok_whatever_the_count():
    v = verdict(90.0)
    hold_few_calls(v, "p999", 10)
    assert v["ok"] is True and v["judged"] == "against the budget (10 calls)"


def test_too_few_calls_are_not_judged():
    """300 calls (the default shadow run): a p99.9 over the budget is its slowest call, not a p99.9."""
    v = verdict(5000.0)
    hold_few_calls(v, "p999", 300)
    assert v["ok"] is True and v["judged"] == "not judged: 300 calls, p99.9 needs 1000"
    v = verdict(5000.0)
    hold_few_calls(v, "p99", 99)
    assert v["ok"] is True and v["judged"] == "not judged: 99 calls, p99 needs 100"


def test_the_counts_are_one_over_the_tail():
    assert MIN_CALLS == {"p99": 100, "p999": 1000}
