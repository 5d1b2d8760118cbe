"""Words for the HIL check results: one line of figures per result dict (the same for a local and a
remote target, since both return the dicts of :mod:`edgehft.hil.checks`), and the summary table."""
from __future__ import annotations

import io
from pathlib import Path

from edgehft.bundle_checks import golden_compare


def _us(v: float) -> str:
    return f"{v:,.1f} µs" if abs(v) >= 1 else f"{v:.3g} µs"


def _mib(b: float) -> str:
    return f"{b / 2**20:+.2f} MiB"


def numbers(result: dict) -> list[tuple[str, float]]:
    """A check result's figures as ``(name, number)`` pairs for JUnit XML properties that CI systems can chart:
    ``golden_matched``, ``golden_count``, ``golden_max_diff``; for the timed checks ``<check>_p50_us``,
    ``<check>_p99_us``, ``<check>_p99.9_us``, ``<check>_max_us`` (``latency_us``; streaming's push), and the soak's
    ``soak_p99_drift`` and ``soak_rss_growth_bytes``. Keys a result lacks are left out."""
    kind, out = result["check"], []
    for key in ("matched", "count", "max_diff", "samples", "p99_drift", "rss_growth_bytes", "failed_calls", "swapped"):
        v = result.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((f"{kind}_{key}", v))
    lat = result.get("latency_us")
    if isinstance(lat, dict):
        out += [(f"{kind}_{k}_us", round(float(lat[k]), 3)) for k in ("p50", "p99", "p99.9", "max") if k in lat]
    return out


def timing(result: dict, unit: str = "calls") -> str:
    """Where the replayed calls (``unit``: or ticks) and their timing came from, e.g. ``2,000 calls at
    recorded inter-arrival times from btcusd.gz``."""
    src = result["source"]
    files = ", ".join(Path(f).name for f in src["files"])
    n = f"{result['samples']:,} {unit}" if "samples" in result else f"{result['calls']:,} {unit}"
    speed = f" ÷ {result['speed']:g}" if result.get("speed") not in (None, 1.0) else ""
    if src["timing"] == "recorded":
        text = f"{n} at recorded inter-arrival times{speed} from {files}"
    elif src["kind"] == "golden":
        text = f"{n} back to back over the bundle's {src['windows']} golden inputs; NOT the feed's timing"
    else:
        text = f"{n} back to back over {files} (no timestamps in it)"
    return ("EMULATED board; " if result.get("emulated") else "") + text


def headline(result: dict) -> str:
    """One line of figures for a check result (pass or fail); a timed check run under pytest-xdist beside other
    tests ends with the note that says so (``result["xdist"]["note"]``, put there by the plugin)."""
    note = (result.get("xdist") or {}).get("note")
    return _figures(result) + (f"; {note}" if note else "")


def _figures(result: dict) -> str:
    kind = result["check"]
    if kind == "golden":
        what = golden_compare(result)
        if result["ok"]:
            text = f"{result['matched']}/{result['count']} golden vectors {what} on {result['path']}"
        else:
            text = (f"{result['count'] - result['matched']} of {result['count']} golden vectors differ "
                    f"(max diff {result['max_diff']:g}{' LSB' if result['compare'] == 'exact' else ''}; "
                    f"want {what}); ran on {result['path']}, made on {result['expected_path']}")
        return ("EMULATED board; " if result.get("emulated") else "") + text
    if kind == "latency":
        text = _percentiles(result) + f" (p50 {_us(result['latency_us']['p50'])}; {timing(result)})"
        if result["not_judged"]:
            text += f"; not judged: {result['not_judged']}"
        return text
    if kind == "streaming":
        return streaming_line(result)
    if kind == "soak":
        rows = result["intervals"]
        p99 = " → ".join(_us(r["p99_us"]) if r["p99_us"] is not None else "—" for r in (rows[0], rows[-1]))
        drift = "n/a" if result["p99_drift"] is None else f"{result['p99_drift']:+.1%}"
        text = (f"{len(rows)} intervals over {result['seconds']:.1f} s: p99 {p99} (drift {drift}, max "
                f"{result['max_p99_drift']:+.0%}), RSS {_mib(result['rss_growth_bytes'])} (max "
                f"{result['max_rss_growth_mb']:g} MiB; {timing(result)})")
        few = min(r["calls"] for r in rows)
        if few < 100:
            text += f"; intervals of as few as {few} calls: their p99 is close to their maximum"
        if result["failures"]:
            text = "; ".join(result["failures"]) + " — " + text
        return text
    return str(result)


def _percentiles(result: dict) -> str:
    """``p99 X µs ≤ budget Y µs, p99.9 ...`` (or the bare figures where there is no verdict)."""
    lat, parts = result["latency_us"], []
    for key, pct in (("p99", "p99"), ("p999", "p99.9")):
        v = result["verdicts"].get(key)
        if v is None:
            parts.append(f"{pct} {_us(lat[pct])}")
        else:
            parts.append(f"{pct} {_us(v['value_us'])} {'≤' if v['ok'] else '>'} budget {_us(v['budget_us'])}")
    return ", ".join(parts)


def streaming_line(result: dict) -> str:
    """The streaming check's figures: the outputs compared with predict, push p99 / p99.9 against the budget,
    the inline prepare between ticks, where the ticks came from; or why the bundle does not stream."""
    if result.get("skipped"):
        return f"does not stream: {result['skipped']}"
    n, bad = result["compared"], result["mismatches"]
    exact = (f"{n}/{n} outputs bit-identical to predict of the same window" if not bad else
             f"{bad} of {n} outputs differ from predict of the same window (first at output "
             f"{result['first_mismatch']}, max |diff| {result['max_abs_diff']})")
    lat = result["latency_us"]
    text = (f"{exact}; push {_percentiles(result)} (p50 {_us(lat['p50'])}); inline prepare "
            f"{_us(result['prepare_us_mean'])} mean, {result['prepared_ahead']:.0%} of windows prepared ahead")
    if result["mode"] == "max":
        text += (f"; back to back, so the prepare cannot hide before the next tick: push + prepare p99 "
                 f"{_us(result['push_prepare_us']['p99'])}")
    else:
        text += f", {result['prepared_before_tick']:.0%} before the next tick"
    rows = "" if result["rows_from"] == "sliding" else ", each a window's newest row"
    text += f" ({timing(result, 'ticks')}{rows}; {result['stream']['head']} head, {result['stream']['isa']})"
    if result["not_judged"]:
        text += f"; not judged: {result['not_judged']}"
    return text


def verdict(result: dict) -> str:
    """``passed``, ``FAILED``, ``skipped`` (a result that says why it did not run) or ``not judged``."""
    if result["ok"] is None and result.get("skipped"):
        return "skipped"
    return {True: "passed", False: "FAILED", None: "not judged"}[result["ok"]]


def summary_table(results: dict[str, dict], title: str, markup: bool, width: int) -> str:
    """A rich table (check, result, figures), rendered to text for the pytest terminal."""
    from rich.console import Console
    from rich.table import Table
    t = Table(title=title, title_justify="left", show_lines=False)
    t.add_column("check")
    t.add_column("result")
    t.add_column("figures", overflow="fold")
    for name, res in results.items():
        v = verdict(res)
        style = {"passed": "green", "FAILED": "bold red"}.get(v, "yellow")
        t.add_row(name, f"[{style}]{v}[/]", headline(res))
    buf = io.StringIO()
    Console(file=buf, width=max(width, 80), force_terminal=markup, no_color=not markup,
            highlight=False).print(t)
    return buf.getvalue()


def soak_table(result: dict, markup: bool, width: int) -> str:
    """Per-interval figures of a soak result."""
    from rich.console import Console
    from rich.table import Table
    t = Table(title="soak intervals", title_justify="left")
    for c in ("interval", "calls", "p50 µs", "p99 µs", "RSS MiB"):
        t.add_column(c, justify="right")
    for r in result["intervals"]:
        t.add_row(str(r["index"]), f"{r['calls']:,}", "—" if r["p50_us"] is None else f"{r['p50_us']:,.1f}",
                  "—" if r["p99_us"] is None else f"{r['p99_us']:,.1f}", f"{r['rss_bytes'] / 2**20:,.2f}")
    buf = io.StringIO()
    Console(file=buf, width=max(width, 60), force_terminal=markup, no_color=not markup,
            highlight=False).print(t)
    return buf.getvalue()
