"""``edgehft run`` (predictions, golden vectors) and ``edgehft bench`` (latency percentiles, per-op profile)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import click
import numpy as np
from rich.table import Table

from edgehft.bundle_checks import bundle_windows, check_golden, golden_compare, golden_mismatch
from edgehft.report import printable

from edgehft.bench.replay import MAX_TIMED as MAX_CALLS     # timed calls a bench keeps (8 bytes each: 800 MB)
from edgehft.bench.replay import WARMUP
from edgehft.cli.common import (err, handles_errors, json_opt, main, out, run_features_opt, runner_opts,
                                ticks_opt, open_runner)

@main.command("run")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@ticks_opt
@run_features_opt
@click.option("--golden", is_flag=True, help="Run the bundle's golden vectors and compare (exit 8 on mismatch).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=0),
              help="Predictions to print (0: all).")
@runner_opts
@json_opt
@handles_errors
def run_cmd(bundle, ticks, run_features, golden, limit, board, threads, affinity, emulate, device, overlay,
            as_json):
    """Print predictions for TICKS, or check the golden vectors with --golden.

    \b
    Examples:
      edgehft run build/deeplob.cpu --golden
      edgehft run build/deeplob.cpu --run-features --ticks FEED.gz --limit 5"""
    if not ticks and not golden:
        raise click.UsageError("give --ticks FILE or --golden")
    if golden:                       # a bundle without golden vectors says so before any runtime opens it
        from edgehft.bundle import load_bundle
        load_bundle(bundle, verify=False).require_golden()
    with open_runner(bundle, board, threads, affinity, emulate, device, overlay, as_json) as r:
        if golden:
            result = check_golden(r)
            result.update(board=r.board, emulated=r.emulated, plan=_plan_of(r),
                          plan_source=getattr(r, "plan_source", None))
            if as_json:
                click.echo(json.dumps(result))
            else:
                out.print(("[bold magenta]EMULATED[/] " if r.emulated else "") +
                          f"golden vectors: {result['matched']}/{result['count']} reproduced "
                          f"({golden_compare(result)}) on {result['path']}, plan {result['plan']}"
                          + (" [green]OK[/]" if result["ok"] else " [red]MISMATCH[/]"), highlight=False)
            if not result["ok"]:
                raise golden_mismatch(result, r.describe().get("backend", ""))
            return
        w = bundle_windows(r.bundle, ticks, run_features=run_features)
        n = len(w) if limit == 0 else min(limit, len(w))
        names = [o.name for o in r.bundle.manifest.outputs]
        rows = []
        for i in range(n):
            y = r.predict(w.x[i])
            ys = y if isinstance(y, tuple) else (y,)
            rows.append({"window": i, "t_ns": int(w.t_ns[i]) if w.t_ns is not None else None,
                         **{nm: v[0].tolist() for nm, v in zip(names, ys)}})
        if as_json:
            click.echo(json.dumps({"board": r.board, "emulated": r.emulated, "plan": _plan_of(r), "windows": len(w),
                                   "predictions": rows}))
            return
        t = Table(title=f"{printable(r.bundle.path.name)} on {r.board}, plan {_plan_of(r)}: {n} of {len(w)} windows",
                  title_justify="left")
        t.add_column("window", justify="right")
        t.add_column("tick time (ns)", justify="right")
        for nm in names:
            t.add_column(printable(nm))
        for row in rows:
            t.add_row(str(row["window"]), "" if row["t_ns"] is None else str(row["t_ns"]),
                      *(np.array2string(np.asarray(row[nm]), precision=4, separator=" ") for nm in names))
        out.print(t)


@main.command("bench")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@ticks_opt
@run_features_opt
@click.option("--replay", "mode", type=click.Choice(["max", "recorded", "burst"]), default="max",
              show_default=True, help="Back to back, at the recorded inter-arrival times, or in bursts.")
@click.option("--warmup", default=None, type=click.IntRange(min=0, max=MAX_CALLS), metavar="N",
              help=f"Untimed calls before timing starts (default {WARMUP}, as the pytest plugin's --edgehft-warmup "
                   "and deploy's latency gate; with --profile, untimed rounds of every op, at most 50).")
@click.option("--warmup-s", "warmup_s", default=None, type=click.FloatRange(min=0, min_open=True, max=3600),
              metavar="SECONDS", callback=lambda c, p, v: _finite(p, v),
              help="Warm up for this long instead of --warmup calls.")
@click.option("--samples", default=0, type=click.IntRange(min=0, max=MAX_CALLS),
              help="Timed calls (default: one per window, cycling if needed).")
@click.option("--duration", "duration_s", default=None, type=click.FloatRange(min=0.001, max=86400),
              metavar="SECONDS", callback=lambda c, p, v: _finite(p, v),
              help="Time calls for this long instead of --samples calls.")
@click.option("--speed", default=1.0, show_default=True, type=click.FloatRange(min=0.001, max=1e6),
              callback=lambda c, p, v: _finite(p, v),
              help="recorded: replay this many times faster.")
@click.option("--burst-size", default=32, show_default=True, type=click.IntRange(min=1),
              help="burst: calls per burst.")
@click.option("--burst-gap-us", default=1000.0, show_default=True, type=click.FloatRange(min=0, max=1e7),
              callback=lambda c, p, v: _finite(p, v),
              help="burst: idle time between bursts.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write a latency histogram PNG.")
@click.option("--percentile", "percentiles", default="50,90,99,99.9", show_default=True, metavar="P1,P2,...",
              help="Latency percentiles to report (as trtexec's --percentile); each is marked when there are too few "
                   "samples to tell it from the slowest call (p99.9 needs 1000).")
@click.option("--export-times", type=click.Path(dir_okay=False), default=None, metavar="FILE.csv|FILE.json",
              help="Write every timed call's latency (ns, and its start behind the recorded tick time with "
                   "--replay recorded) to a CSV or JSON file.")
@click.option("--profile", is_flag=True,
              help="Time per op (per step for partitioned boards) instead of replaying: each op alone and the "
                   "whole model, interleaved; --samples rounds (default 200); without --ticks, the golden inputs. "
                   "With --streaming: after the replay, the critical path and the prepare split op by op.")
@click.option("--export-profile", type=click.Path(dir_okay=False), default=None, metavar="FILE.json",
              help="Write --profile's per-op (per-step) times to a JSON file, µs in the key names (implies "
                   "--profile).")
@click.option("--top", default=0, type=click.IntRange(min=0), help="--profile: show only the N slowest ops.")
@click.option("--streaming", is_flag=True,
              help="Feed the ticks one row at a time through runner.stream() (cpu native LSTM and native-bf16 plans): tick-to-signal "
                   "latency of push, the prepare after each push (inline), and the share of ticks whose prepare "
                   "was done before they arrived.")
@click.option("--batch", "batch", default=None, metavar="N1,N2,...",
              help="Time runner.predict_many at these batch sizes (2 to 64): µs per input as one batch and one by "
                   "one, and which predict_many runs; without --ticks, the golden inputs.")
@click.option("--soak", default=None, metavar="DURATION",
              help="Serve BUNDLE with edgehft.serve for DURATION (90s, 10m) while installing it again every "
                   "--swap-every seconds (each install shadow-run and swapped): p99 per interval, p99.9 near swaps "
                   "vs away, the swaps' shadow figures, failed calls, RSS growth; without --ticks, the golden "
                   "inputs. --affinity C1,C2: the caller on C1, the server's manager on C2.")
@click.option("--swap-every", default=None, type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="--soak: seconds between installs.")
@runner_opts
@json_opt
@handles_errors
def bench_cmd(bundle, ticks, run_features, mode, warmup, warmup_s, samples, duration_s, speed, burst_size,
              burst_gap_us, plot, percentiles, export_times, profile, export_profile, top, streaming, batch, soak,
              swap_every, board, threads, affinity, emulate, device, overlay, as_json):
    """Replay real ticks through BUNDLE and print latency percentiles in µs (or, with --profile, time per op; with
    --streaming, one row per tick through the streaming runtime). Without --ticks, the bundle's golden inputs back
    to back (said in the output).

    \b
    Examples:
      edgehft bench build/deeplob.cpu --ticks FEED.gz --run-features --samples 5000 --affinity 0
      edgehft bench build/deeplob.cpu --warmup-s 0.2 --duration 10 --percentile 50,99,99.9 --export-times t.csv"""
    runner_args = (board, threads, affinity, emulate, device, overlay, as_json)
    _check_run_length(warmup, warmup_s, samples, duration_s,
                      other=soak is not None or swap_every is not None or profile or streaming or batch is not None)
    warmup = WARMUP if warmup is None else warmup
    if export_profile is not None:
        if streaming or batch is not None or soak is not None or swap_every is not None:
            raise click.UsageError("--export-profile writes the per-op profile of --profile: drop --streaming, "
                                   "--batch and --soak")
        from edgehft.bench.profile import profile_export_target
        profile_export_target(export_profile)
        profile = True
    if soak is not None or swap_every is not None:
        if profile or streaming or plot or batch is not None or samples or mode == "burst":
            raise click.UsageError("--soak serves the bundle on its own: drop --profile, --streaming, --plot, --batch, "
                                   "--samples and --replay burst")
        return _bench_soak(bundle, ticks, run_features, mode, warmup, speed, soak, swap_every, runner_args)
    if plot:
        from edgehft.bench.replay import check_plot_target
        check_plot_target(plot)
    if batch is not None:
        if profile or streaming or plot:
            raise click.UsageError("--batch times predict_many on its own: drop --profile, --streaming and --plot")
        return _bench_batch(bundle, ticks, run_features, _batch_sizes(batch), runner_args)
    if streaming:
        if not ticks:
            raise click.UsageError("give --ticks FILE")
        return _bench_streaming(bundle, ticks, run_features, dict(mode=mode, warmup=warmup, samples=samples or None,
                                speed=speed, burst_size=burst_size, burst_gap_us=burst_gap_us), plot,
                                runner_args, profile)
    if profile:
        if plot or export_times:
            raise click.UsageError("--profile (and --export-profile) time each op instead of the replay: drop --plot "
                                   "and --export-times, or run them as a second bench")
        return _profile(bundle, ticks, run_features, warmup, samples, top, export_profile, *runner_args)
    replay_kw = dict(mode=mode, warmup=warmup, samples=samples or None, speed=speed, burst_size=burst_size,
                     burst_gap_us=burst_gap_us, warmup_s=warmup_s, duration_s=duration_s, max_samples=MAX_CALLS)
    _bench_replay(bundle, ticks, run_features, replay_kw, _percentile_list(percentiles), export_times, plot,
                  runner_args)


def _finite(param, value):
    """A float option's value when it is a finite number (click's FloatRange lets nan and inf through its bounds).

    Raises:
        click.BadParameter (exit 2): nan or inf."""
    import math
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number", param=param)
    return value


def _check_run_length(warmup, warmup_s, samples, duration_s, other: bool) -> None:
    """A bench's warm-up and timed run each by count or by time, not both; by time only for the replay.

    Raises:
        click.UsageError (exit 2): naming the two options given together, or the mode that takes no time."""
    if warmup is not None and warmup_s is not None:
        raise click.UsageError("--warmup N and --warmup-s SECONDS both set the warm-up: give one")
    if samples and duration_s is not None:
        raise click.UsageError("--samples N and --duration SECONDS both set how long to time: give one")
    if other and (warmup_s is not None or duration_s is not None):
        raise click.UsageError("--warmup-s and --duration time the replay: with --profile, --streaming, --batch or "
                               "--soak give --warmup N and --samples N")


def _bench_replay(bundle, ticks, run_features, replay_kw: dict, pcts: list[float], export_times, plot,
                  runner_args) -> None:
    """``bench`` (the replay): :func:`edgehft.bench.replay.replay` on the tick windows (else the golden inputs),
    with the export, plot and report (a table, or JSON with ``--json``). Beside the steady state it reports
    ``open_ms`` (opening the bundle: ``runtime.open``, the runner made ready), ``first_call_us`` (the first
    ``predict`` after that, a warm-up call unless ``--warmup 0``) and ``memory`` (:func:`process_memory`, MiB,
    after the replay)."""
    from edgehft.bench.fingerprint import machine_fingerprint, process_memory
    from edgehft.bench.replay import export_latencies, export_target, histogram_png, percentile_report, replay
    from edgehft.hil.checks import predict_fn, replay_source
    if export_times:
        export_target(export_times)
    t_open = time.perf_counter_ns()
    with open_runner(bundle, *runner_args) as r:
        open_ms = (time.perf_counter_ns() - t_open) / 1e6
        xs, t_ns, source = replay_source(r, list(ticks) or None, run_features=run_features)
        if source["kind"] == "ticks":
            xs = np.ascontiguousarray(xs, dtype=np.float32)
        predict, x = predict_fn(r, xs)
        res = replay(predict, x, t_ns, **replay_kw)
        report = {"bundle": str(r.bundle.path), "runner": r.describe(), "plan": _plan_of(r),
                  "plan_source": getattr(r, "plan_source", None), **res.summary(),
                  **percentile_report(res, pcts), "source": source, "budget_us": dict(r.board_spec.latency_budget_us),
                  "speed": replay_kw["speed"] if replay_kw["mode"] == "recorded" else None,
                  "open_ms": open_ms, "first_call_us": res.first_call_ns / 1e3, "memory": process_memory(),
                  "fingerprint": machine_fingerprint()}
    if export_times:
        report["export_times"] = export_latencies(res, export_times)
    if plot:
        histogram_png(res, plot, f"{Path(bundle).name} on {report['runner']['board']}, replay {replay_kw['mode']}, "
                                 f"{len(res.latency_ns)} calls", pcts)
        report["plot"] = plot
    if runner_args[-1]:
        click.echo(json.dumps(report))
        return
    print_bench(report)


def _profile(bundle, ticks, run_features, warmup, samples, top, export_to, board, threads, affinity, emulate, device,
             overlay, as_json):
    """``bench --profile``: :func:`edgehft.bench.profile.profile_runner` (``samples`` rounds, default 200, after at
    most 50 warm-up), as a table or JSON, and to ``export_to`` (:func:`edgehft.bench.profile.export_profile`)."""
    from edgehft.bench.fingerprint import machine_fingerprint
    from edgehft.bench.profile import export_profile, print_profile, profile_runner
    with open_runner(bundle, board, threads, affinity, emulate, device, overlay, as_json) as r:
        x = (np.ascontiguousarray(bundle_windows(r.bundle, ticks, run_features=run_features).x, dtype=np.float32)
             if ticks else None)
        res = profile_runner(r, x, rounds=samples or 200, warmup=min(warmup, 50))
        res.update(bundle=str(r.bundle.path), runner=r.describe(), fingerprint=machine_fingerprint())
    if export_to:
        res["export_profile"] = export_profile(res, export_to)
    if as_json:
        click.echo(json.dumps(res))
        return
    print_profile(res, out, top)
    if export_to:
        out.print(f"profile (µs per op): {printable(res['export_profile'])}", highlight=False)


def _us(v: float) -> str:
    """µs as the bench tables show them: one decimal below 1,000, none above."""
    return f"{v:,.1f}" if v < 1000 else f"{v:,.0f}"


def _isa(fp: dict) -> str:
    """The fingerprint's SIMD level as people name it (``AVX-512 BF16``), the native kernels' best target after
    it where that differs (``AMX-BF16 (kernels: avx3_bf16)``: e.g. Linux did not grant AMX)."""
    from edgehft.bench.fingerprint import ISA_NAMES
    isa, targets = fp.get("isa", "none"), fp.get("kernel_targets") or []
    best = {"amx": "amx", "avx512_bf16": "avx3_bf16", "avx512": "avx3", "avx2": "avx2", "neon": "neon"}.get(isa)
    return ISA_NAMES.get(isa, isa) + (f" (kernels: {targets[0]})" if targets and best and targets[0] != best else "")


def _mib(v) -> str:
    """MiB as the bench tables show them (``n/a`` where the platform did not say)."""
    return "n/a" if v is None else f"{v:,.1f} MiB"


def _percentile_list(text: str) -> list[float]:
    """``--percentile 50,99,99.9`` as [50.0, 99.0, 99.9] (click.BadParameter, exit 2, unless numbers in (0, 100))."""
    try:
        ps = [float(p) for p in text.split(",")]
    except ValueError:
        ps = []
    if not ps or any(not 0 < p < 100 for p in ps):
        raise click.BadParameter(f"{text!r}: give percentiles between 0 and 100, comma-separated (e.g. 50,99,99.9); "
                                 "the slowest call is the max column", param_hint="--percentile")
    return sorted(set(ps))


def _batch_sizes(text: str) -> list[int]:
    """``--batch 2,4,8`` as [2, 4, 8] (click.BadParameter, exit 2, for anything but integers 2 to 64)."""
    from edgehft.runtime.batching import MAX_BATCH
    try:
        sizes = [int(p) for p in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(not 2 <= n <= MAX_BATCH for n in sizes):
        raise click.BadParameter(f"{text!r}: give batch sizes 2 to {MAX_BATCH}, comma-separated (e.g. 2,4,8)",
                                 param_hint="--batch")
    return sorted(set(sizes))


def _bench_batch(bundle, ticks, run_features, sizes: list[int], runner_args) -> None:
    """``bench --batch``: :meth:`runner.batching(sizes, windows) <edgehft.runtime.cpu.Runner.batching>` on the tick
    windows (else the golden inputs), as a table or JSON."""
    from edgehft.bench.fingerprint import machine_fingerprint
    from edgehft.runtime.batching import batching_table
    with open_runner(bundle, *runner_args) as r:
        windows = list(np.ascontiguousarray(bundle_windows(r.bundle, ticks, run_features=run_features).x,
                                            dtype=np.float32)) if ticks else None
        rep = r.batching(sizes, windows)
        report = {"bundle": str(r.bundle.path), "runner": r.describe(), "plan": _plan_of(r), "batching": rep,
                  "fingerprint": machine_fingerprint()}
    if runner_args[-1]:
        click.echo(json.dumps(report))
        return
    if rep["sizes"]:
        out.print(batching_table(rep, f"predict_many, µs per input — plan {report['plan']} on {r.board}"))
    out.print(("predict_many never batches here: " + rep["why"]) if rep["why"] else rep["how"], highlight=False)


def _bench_soak(bundle, ticks, run_features, mode, warmup, speed, soak, swap_every, runner_args) -> None:
    """``bench --soak D --swap-every S``: :func:`edgehft.serving.soak.soak_swaps` in this process, as tables or
    JSON (the figures are reported, not judged: exit 0 whatever they are)."""
    from edgehft.bench.fingerprint import machine_fingerprint
    from edgehft.bundle import load_bundle
    from edgehft.cli.common import parse_affinity
    from edgehft.errors import InputError
    from edgehft.serving.soak import parse_duration, print_soak, soak_swaps
    board, threads, affinity, emulate, device, overlay, as_json = runner_args
    if soak is None or swap_every is None:
        raise click.UsageError("--soak DURATION and --swap-every SECONDS go together")
    try:
        seconds = parse_duration(soak)
    except InputError as exc:
        raise click.BadParameter(exc.args[0], param_hint="--soak") from None
    ctx = click.get_current_context()
    if emulate or device or overlay or ctx.meta.get("edgehft.plan"):
        raise click.UsageError("--soak serves the bundle as a box does (its board's runtime, the plan it picks): "
                               "drop --emulate, --device, --overlay and --plan")
    own = load_bundle(bundle, verify=False).manifest.board
    if board and board != own:
        raise click.UsageError(f"--soak serves the bundle on its own board ({own}): drop --board {board}")
    cores = parse_affinity(affinity) or []
    report = soak_swaps(bundle, seconds / 60.0, swap_every, ticks=list(ticks) or None, warmup=warmup, speed=speed,
                        recorded=mode == "recorded", caller_core=cores[0] if cores else None,
                        shadow_core=cores[1] if len(cores) > 1 else None, threads=threads,
                        require_signature=ctx.meta.get("edgehft.require_signature"), run_features=run_features)
    report["fingerprint"] = machine_fingerprint()
    if as_json:
        click.echo(json.dumps(report))
        return
    print_soak(report, out)
    fp = report["fingerprint"]
    out.print(f"machine: {fp['cpu_model']} ({fp['logical_cpus']} CPUs, {_isa(fp)}, governor {fp['governor']})",
              highlight=False)


def _bench_streaming(bundle, ticks, run_features, replay_kw: dict, plot, runner_args, profile: bool = False) -> None:
    """``bench --streaming``: the windows' rows through ``runner.stream()`` (:func:`edgehft.bench.replay.replay_stream`);
    with ``profile``, then the op-by-op split of push and prepare (:func:`edgehft.bench.profile.profile_stream`).

    Raises:
        InputError: a runner without a streaming runtime, or a model/plan it does not stream (the reason)."""
    from edgehft.bench.fingerprint import machine_fingerprint
    from edgehft.bench.replay import histogram_png, replay_stream, stream_rows
    from edgehft.errors import InputError
    as_json = runner_args[-1]
    with open_runner(bundle, *runner_args) as r:
        if not callable(getattr(r, "stream", None)):
            raise InputError(f"board {r.board} has no streaming runtime (the cpu board's native plans stream)",
                             hint="bench it without --streaming")
        w = bundle_windows(r.bundle, ticks, run_features=run_features)
        rows, sliding = stream_rows(w.x)
        with r.stream() as s:
            res = replay_stream(s, rows, int(r.bundle.manifest.inputs[0].shape[1]), w.t_ns, **replay_kw)
            report = {"bundle": str(r.bundle.path), "runner": r.describe(), "plan": _plan_of(r),
                      "plan_source": getattr(r, "plan_source", None), "streaming": True, "stream": s.describe(),
                      "windows_slide": sliding, **res.summary(), "budget_us": dict(r.board_spec.latency_budget_us),
                      "speed": replay_kw["speed"] if replay_kw["mode"] == "recorded" else None,
                      "fingerprint": machine_fingerprint()}
            if profile:
                from edgehft.bench.profile import profile_stream
                report["profile"] = profile_stream(s, rows, int(r.bundle.manifest.inputs[0].shape[1]))
    if plot:
        histogram_png(res, plot, f"{Path(bundle).name} on {report['runner']['board']}, stream push, replay "
                                 f"{replay_kw['mode']}, {len(res.latency_ns)} ticks", what="push")
        report["plot"] = plot
    if as_json:
        click.echo(json.dumps(report))
        return
    print_stream_bench(report)
    if profile:
        from edgehft.bench.profile import print_stream_profile
        print_stream_profile(report["profile"], out)


def print_stream_bench(report: dict) -> None:
    """The streaming bench as people read it: push, prepare and push + prepare percentiles, the share of ticks
    whose prepare was done before they arrived, what the figure includes."""
    t = Table(title=f"streaming (stream.push, prepare inline) µs — {report['samples']} ticks after {report['warmup']} "
                    f"warm-up, replay {report['mode']}", title_justify="left")
    t.add_column("")
    for c in ("p50", "p90", "p99", "p99.9", "max", "mean"):
        t.add_column(c, justify="right")
    for name, key in (("tick to signal (push)", "latency_us"), ("prepare after the push", "prepare_us"),
                      ("push + prepare", "push_prepare_us"), ("push start behind its tick", "start_delay_us")):
        t.add_row(name, *(f"{report[key][k]:.1f}" for k in ("p50", "p90", "p99", "p99.9", "max", "mean")))
    out.print(t)
    st, share = report["stream"], report["prepared_before_tick"]
    if report["mode"] == "max":
        out.print("replay max: ticks back to back, so the prepare cannot hide before the next tick: each tick costs "
                  f"push + prepare, p50 {report['push_prepare_us']['p50']:.1f} µs, p99 "
                  f"{report['push_prepare_us']['p99']:.1f} µs", highlight=False)
    else:
        out.print(f"prepare done before the next tick arrived: {share:.1%} of ticks", highlight=False)
    macs = st.get("macs") or {}
    out.print(f"stream: kernels {st['isa']}, head {st['head']}, window {st['window']} rows"
              + (f", MACs per tick {macs['critical']:,} critical / {macs['prepare']:,} prepare / {macs['window']:,} "
                 "whole window" if macs else "")
              + ("" if report["windows_slide"] else "; the tick file's windows do not slide by one row: their "
                 "newest rows were streamed"), highlight=False)
    out.print("tick to signal here: a row in memory handed to push until its output is in memory, in this process "
              "(Python's push included)", highlight=False)
    fp, r = report["fingerprint"], report["runner"]
    out.print(f"machine: {fp['cpu_model']} ({fp['logical_cpus']} CPUs, {_isa(fp)}, governor {fp['governor']}, affinity "
              f"{fp['affinity']}); {r.get('interpreter', r['board'])}, plan {report['plan']}", highlight=False)


def _plan_of(runner) -> str:
    """The execution plan ``runner`` runs (what :func:`edgehft.runtime.open` chose, else its bundle's mode)."""
    return getattr(runner, "plan", None) or runner.bundle.manifest.quantization.mode


def _run_length(report: dict) -> str:
    """``50 samples after 100 warm-up``, or by time ``21,034 samples in 2 s after 0.2 s warm-up (1,650 calls)``."""
    timed = f"{report['samples']:,} samples" + (f" in {report['duration_s']:g} s" if report.get("duration_s") else "")
    warm = (f"{report['warmup_s']:g} s warm-up ({report['warmup']:,} calls)" if report.get("warmup_s")
            else f"{report['warmup']:,} warm-up")
    return f"{timed} after {warm}"


def print_bench(report: dict) -> None:
    """The replay bench as people read it (80 columns): the percentiles table, min / mean / std / calls/s, the
    notes (thin percentiles, golden inputs, exports, budget, gaps, start delay) and the machine."""
    lat = report["latency_us"]
    from rich import box
    t = Table(title=f"latency of predict, µs — {_run_length(report)}, replay {report['mode']}"
                    + (" [bold](EMULATED board)[/]" if report["runner"]["emulated"] else ""),
              title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))        # 80 columns: 7 percentiles
    pct, thin = report["percentiles_us"], {f"p{x['p']:g}" for x in report["thin_percentiles"]}
    cols = [(f"{k}*" if k in thin else k, v) for k, v in pct.items()] + [("max", lat["max"])]
    for c, _ in cols:
        t.add_column(c, justify="right")
    t.add_row(*(_us(v) for _, v in cols))
    out.print(t)
    out.print(f"min {_us(report['min_us'])}, mean {_us(lat['mean'])}, std {_us(lat['std'])} µs; "
              f"{report['throughput_per_s']:,.0f} calls/s back to back (1 / mean)", highlight=False)
    if "open_ms" in report:
        mem = report["memory"]
        out.print(f"open {report['open_ms']:,.1f} ms, first call {_us(report['first_call_us'])} µs; memory: RSS "
                  f"{_mib(mem['rss_mib'])}, peak {_mib(mem['peak_rss_mib'])}", highlight=False)
    for x in report["thin_percentiles"]:
        out.print(f"*: p{x['p']:g} from {report['samples']:,} samples (it needs {x['needs']:,}): about the slowest "
                  "call, not a percentile; give --samples", highlight=False)
    src = report.get("source") or {}
    if src.get("kind") == "golden":
        out.print(f"windows: {src['note']}", highlight=False)
    if report.get("export_times"):
        out.print(f"every call's latency: {printable(report['export_times'])}", highlight=False)
    budget = report.get("budget_us") or {}
    if budget and report["runner"]["emulated"]:
        out.print(f"board budget ({report['runner']['board']}): n/a — emulated, the device's timing is not measured")
    elif budget:
        verdicts = []
        for key, got in (("p99", lat["p99"]), ("p999", lat["p99.9"])):
            if key in budget:
                ok = got <= budget[key]
                verdicts.append(f"{key} {got:.0f} vs {budget[key]:.0f} µs " + ("[green]within[/]" if ok else "[red]OVER[/]"))
        out.print(f"board budget ({report['runner']['board']}): " + "; ".join(verdicts))
    if report.get("gaps_capped"):
        g = report["gaps_capped"]
        out.print(f"note: {g['count']} recorded gap(s) longer than {g['cap_s']:g} s (the longest {g['largest_s']:,.3g} s) "
                  f"were replayed as {g['cap_s']:g} s")
    if report.get("start_delay_us"):
        d = report["start_delay_us"]
        out.print(f"start delay behind the recorded tick time: p50 {d['p50']:.1f} µs, p99 {d['p99']:.1f} µs")
        if d["p50"] > lat["p50"]:
            err.print(f"[bold yellow]warning:[/] the replay fell behind the recorded tick rate (x{report['speed']:g}): "
                      "calls ran back to back; lower --speed to replay the capture's real gaps")
    fp = report["fingerprint"]
    r = report["runner"]
    out.print(f"machine: {fp['cpu_model']} ({fp['logical_cpus']} CPUs, {_isa(fp)}, governor {fp['governor']}, "
              f"affinity {fp['affinity']}{', virtualized' if fp['virtualized'] else ''}); "
              f"{r.get('interpreter', r['board'])}, threads {r['threads']}"
              + (f", plan {report['plan']} ({report.get('plan_source') or 'its only plan'})" if report.get("plan") else "")
              + "; libraries "
              + ", ".join(f"{k} {v}" for k, v in fp["libraries"].items()))
    if report.get("plot"):
        out.print(f"histogram: {printable(report['plot'])}", highlight=False)
