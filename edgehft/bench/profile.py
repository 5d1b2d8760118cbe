"""Per-op latency profile of a TFLite model as the cpu runtime runs it (``edgehft bench --profile``).

LiteRT's Python interpreter has no op profiler, so each op is cut out of the model as a model of its own
(:func:`edgehft.compiler.split.split`, bit-exact) and timed by itself, on the activations the preceding
ops produced for real windows. One round times every op once and then the whole model once, in the same
interpreter configuration (op resolver, threads), so contention on a shared machine hits every row
alike; the figures are medians over the rounds. An op timed alone pays one interpreter ``Invoke`` of its
own, so the ops' sum exceeds the whole model's time by roughly one ``Invoke`` overhead (~1 µs) per op:
the report gives both, and their ratio.

Partitioned boards (PYNQ: CPU segment models and FPGA kernel calls) are profiled per step of the
runner's chain (each CPU segment's invoke with its hand-over copies, each kernel call with its
flush/invalidate), on the real or the emulated board.
"""
from __future__ import annotations

import gc
import json
import time
from pathlib import Path

import numpy as np

from edgehft.runtime import litert


def _interp(mod, data: bytes, threads: int, op_resolver: str):
    kind = {"auto": mod.OpResolverType.AUTO,
            "builtin": mod.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
            "reference": mod.OpResolverType.BUILTIN_REF}[op_resolver]
    with litert.quiet_runtime_info():
        it = mod.Interpreter(model_content=data, num_threads=threads, experimental_op_resolver_type=kind)
        it.allocate_tensors()
    return it


class _Part:
    """One interpreter (a single op or the whole model) with its I/O bound by tensor name."""

    def __init__(self, it, stateful: bool):
        self.it = it
        self.ins = [(d["name"], d["index"]) for d in it.get_input_details()]
        self.outs = [(d["name"], d["index"]) for d in it.get_output_details()]
        self.invoke = it._interpreter.Invoke
        self.reset = it._interpreter.ResetVariableTensors if stateful else None

    def load(self, env: dict) -> None:
        for name, idx in self.ins:
            self.it.set_tensor(idx, env[name])
        if self.reset is not None:
            self.reset()

    def run(self, env: dict) -> None:
        self.load(env)
        self.invoke()
        for name, idx in self.outs:
            env[name] = self.it.get_tensor(idx)


def _op_groups(g) -> list[list[int]]:
    """One group per op, in order; an op that reads only constants (e.g. the DEQUANTIZE of fp16
    weights) cannot be a model of its own and is timed together with the first op that consumes it."""
    const = {t.index for t in g.tensors if t.is_constant}
    feeds: dict[int, list[int]] = {}
    consumer_of: dict[int, int] = {}
    for op in reversed(g.ops):
        for i in op.inputs:
            consumer_of[i] = op.index
    groups = []
    for op in g.ops:
        if op.inputs and all(i < 0 or i in const for i in op.inputs) and op.outputs \
                and op.outputs[0] in consumer_of:
            feeds.setdefault(consumer_of[op.outputs[0]], []).append(op.index)
            continue
        groups.append([*feeds.pop(op.index, []), op.index])
    return groups


def _us(ns: np.ndarray) -> dict:
    us = np.asarray(ns, np.float64) / 1e3
    return {"p50": float(np.median(us)), "p90": float(np.percentile(us, 90)), "mean": float(us.mean())}


def profile_tflite(model: str | Path | bytes, windows: list[list[np.ndarray]], *, threads: int = 1,
                   op_resolver: str = "auto", rounds: int = 200, warmup: int = 20,
                   layers: dict[int, str] | None = None) -> dict:
    """Time every op of ``model`` alone and the whole model, interleaved, over ``rounds`` rounds.

    Args:
        model: a .tflite path or its bytes.
        windows: raw model inputs, one list (per model input, batch 1) per window; cycled over rounds.
        layers: op index -> source layer name, for the table (e.g. from the bundle's report).
    Returns:
        ``{"ops": [{index, op, layer, kernel, kernel_in_model, us: {p50, p90, mean}, share}], "whole_us",
        "sum_p50_us", "sum_over_whole", "rounds", "warmup", "op_resolver", "threads",
        "chain_max_abs_diff"}``; ``share`` is the op's p50 over the sum of op p50s; ``chain_max_abs_diff``
        compares the op-by-op chain's outputs with the whole model's (0 when cutting changed nothing).
    """
    from edgehft.compiler.split import split
    from edgehft.ir import TFLiteModel
    data = Path(model).read_bytes() if not isinstance(model, (bytes, bytearray)) else bytes(model)
    mod, _, _ = litert.load_interpreter_module()
    ir = TFLiteModel(data)
    g = ir.main
    groups = _op_groups(g)
    segs = split(data, groups)
    whole_it = _interp(mod, data, threads, op_resolver)
    whole = _Part(whole_it, any(t.is_variable for t in g.tensors))
    in_model = litert.delegated_ops(whole_it)
    parts, kernels = [], []
    for seg in segs:
        it = _interp(mod, seg.data, threads, op_resolver)
        stateful = any(t.is_variable for t in TFLiteModel(seg.data).main.tensors)
        parts.append(_Part(it, stateful))
        taken = litert.delegated_ops(it)
        kernels.append("XNNPACK" if len(taken) == len(seg.ops) else "builtin" if not taken else "mixed")
    envs, worst = _chain_envs(windows, parts, whole)
    lat = _time_rounds(parts, whole, envs, rounds, warmup)
    stats = [_us(lat[:, k]) for k in range(len(parts) + 1)]
    total = sum(s["p50"] for s in stats[:-1]) or 1.0
    layers = layers or {}
    ops = []
    for k, grp in enumerate(groups):
        main = g.ops[grp[-1]]
        ops.append({"index": main.index, "op": main.name, "layer": layers.get(main.index),
                    "with_ops": [f"{g.ops[i].index}:{g.ops[i].name}" for i in grp[:-1]],
                    "kernel": kernels[k], "kernel_in_model": in_model.get(main.index, "builtin"),
                    "us": stats[k], "share": stats[k]["p50"] / total})
    return {"ops": ops, "whole_us": stats[-1], "sum_p50_us": total,
            "sum_over_whole": total / stats[-1]["p50"] if stats[-1]["p50"] else None,
            "rounds": rounds, "warmup": warmup, "op_resolver": op_resolver, "threads": threads,
            "chain_max_abs_diff": worst}


def _chain_envs(windows: list[list[np.ndarray]], parts: list[_Part], whole: _Part) -> tuple[list[dict], float]:
    """Every op's inputs per window, from the op-by-op chain ``parts``: ``(one tensor-name -> array env per
    window, the chain's largest absolute difference from ``whole``'s outputs)``."""
    in_names = [n for n, _ in whole.ins]
    out_names = [n for n, _ in whole.outs]
    envs, worst = [], 0.0
    for w in windows:
        env = dict(zip(in_names, w))
        for p in parts:
            p.run(env)
        ref = dict(zip(in_names, w))
        whole.run(ref)
        for n in out_names:
            worst = max(worst, float(np.abs(env[n].astype(np.float64) - ref[n].astype(np.float64)).max()))
        envs.append(env)
    return envs, worst


def _time_rounds(parts: list[_Part], whole: _Part, envs: list[dict], rounds: int, warmup: int) -> np.ndarray:
    """``(rounds, len(parts) + 1)`` int64 ns: each part's invoke, then the whole model's, per round (after
    ``warmup`` untimed rounds; ``envs`` cycled), with the garbage collector off."""
    n_parts = len(parts)
    lat = np.empty((rounds, n_parts + 1), dtype=np.int64)
    perf = time.perf_counter_ns
    gc_was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for r in range(-warmup, rounds):
            env = envs[r % len(envs)]
            for k, p in enumerate(parts):
                p.load(env)
                t0 = perf()
                p.invoke()
                t1 = perf()
                if r >= 0:
                    lat[r, k] = t1 - t0
            whole.load(env)
            t0 = perf()
            whole.invoke()
            t1 = perf()
            if r >= 0:
                lat[r, n_parts] = t1 - t0
    finally:
        if gc_was:
            gc.enable()
    return lat


def raw_windows(runner, x: np.ndarray | None, count: int = 8) -> list[list[np.ndarray]]:
    """Up to ``count`` windows as the runner's raw model inputs (quantized as ``predict`` does), or the
    bundle's golden inputs when ``x`` is None."""
    if x is None:
        ins, _ = runner.bundle.golden()
        names = [s.name for s in runner.bundle.manifest.inputs]
        n = min(count, len(ins[names[0]]))
        return [[np.ascontiguousarray(ins[k][i:i + 1]) for k in names] for i in range(n)]
    out = []
    for i in range(min(count, len(x))):
        slot = runner.inputs[0]
        slot.write(x[i])
        out.append([np.array(slot.dest).reshape(slot.spec.shape)])
    return out


def profile_runner(runner, x: np.ndarray | None, *, rounds: int = 200, warmup: int = 20) -> dict:
    """The profile of what ``runner`` runs: per op of its model (cpu board, emulated Coral) or per step of
    a chain (PYNQ; the cpu board's native plan). ``x``: float windows (or None: the golden inputs)."""
    layers = {}
    try:
        layers = {o["index"]: o.get("layer") for o in runner.bundle.report().get("ops", [])}
    except Exception:  # noqa: BLE001 - the layer column is a convenience
        pass
    target = runner.profile_target()
    if "steps" in target:
        return _profile_steps(runner, target, x, rounds, warmup)
    model_file = target["model_file"]
    res = profile_tflite(model_file, raw_windows(runner, x), threads=runner.threads,
                         op_resolver=getattr(runner, "op_resolver", "auto"), rounds=rounds, warmup=warmup,
                         layers=layers)
    res.update(model=str(model_file), segments=None)
    return res


def _profile_steps(runner, target: dict, x, rounds: int, warmup: int) -> dict:
    """A chain of steps — PYNQ (CPU segment invoke, or FPGA kernel call with its copies) or the cpu board's
    native plans (LiteRT segments, native kernel calls): time each step. Where the runner has bound its
    chain (``target["bound"]``), the calls timed are the ones ``predict`` makes (a view takes no call: 0 µs);
    otherwise each step through ``run_step``, name lookups included."""
    windows = raw_windows(runner, x)
    names, steps, run_step = target["input_names"], target["steps"], target["run_step"]
    bound, staging = target.get("bound"), target.get("staging_in")
    lat = np.zeros((rounds, len(steps)), dtype=np.int64)
    perf = time.perf_counter_ns
    for r in range(-warmup, rounds):
        window = windows[r % len(windows)]
        if bound is not None:
            for buf, w in zip(staging, window):
                np.copyto(buf, np.asarray(w).reshape(buf.shape))
            for k, call in enumerate(bound):
                if call is not None:
                    t0 = perf()
                    call()
                    if r >= 0:
                        lat[r, k] = perf() - t0
            continue
        env = dict(zip(names, window))
        for k, (kind, st, h) in enumerate(steps):
            t0 = perf()
            run_step(kind, st, h, env)
            if r >= 0:
                lat[r, k] = perf() - t0
    segs = []
    for k, (kind, st, _) in enumerate(steps):
        row = {"index": k, "placement": st["placement"], "what": st.get("kernel") or st.get("model"),
               "ops": st.get("ops"), "us": _us(lat[:, k])}
        segs.append(row)
    total = sum(s["us"]["p50"] for s in segs) or 1.0
    for s in segs:
        s["share"] = s["us"]["p50"] / total
    return {"ops": [], "segments": segs, "sum_p50_us": total, "rounds": rounds, "warmup": warmup,
            "threads": runner.threads, "emulated": runner.emulated}


def _op_ranges(ops) -> str:
    """[0, 1, 2, 5, 6] -> "0-2, 5-6" (op indices of a step)."""
    from edgehft.report import index_ranges
    return index_ranges([o for o in (ops or []) if o is not None], mark="")


def print_profile(res: dict, console, top: int = 0) -> None:
    """The profile as tables: ops by time (``top`` > 0: only the slowest ``top``), or segments."""
    from rich.table import Table
    from edgehft.report import fill_table, printable
    if res.get("segments"):
        t = Table(title=f"time per step ({res['rounds']} rounds, median)"
                        + (" [bold](EMULATED board)[/]" if res.get("emulated") else ""), title_justify="left")
        cols = [(c, {"justify": "right" if c in ("#", "p50 µs", "p90 µs", "share") else "left"})
                for c in ("#", "placement", "what", "ops", "p50 µs", "p90 µs", "share")]
        rows = [[str(s["index"]), printable(s["placement"]), printable(str(s["what"])), _op_ranges(s.get("ops")),
                 f"{s['us']['p50']:.1f}", f"{s['us']['p90']:.1f}", f"{s['share']:.1%}"] for s in res["segments"]]
        console.print(fill_table(t, cols, rows, constant=("placement",), what="step"))
        console.print(f"sum of steps (p50): {res['sum_p50_us']:.1f} µs")
        return
    ops = sorted(res["ops"], key=lambda o: -o["us"]["p50"])
    shown = ops[:top] if top else ops
    t = Table(title=f"time per op, {res.get('model', '')} ({res['rounds']} rounds interleaved, median; "
                    f"{res['op_resolver']}, {res['threads']} thread(s))", title_justify="left")
    for c in ("#", "op", "layer", "kernel", "p50 µs", "p90 µs", "share", "cumulative"):
        t.add_column(c, justify="right" if c in ("#", "p50 µs", "p90 µs", "share", "cumulative") else "left")
    cum = 0.0
    for o in shown:
        cum += o["share"]
        kernel = o["kernel"] + ("" if o["kernel"] == o["kernel_in_model"] else f" (in model: {o['kernel_in_model']})")
        name = o["op"] + (f" + {len(o['with_ops'])} const op(s)" if o.get("with_ops") else "")
        t.add_row(str(o["index"]), name, o["layer"] or "", kernel, f"{o['us']['p50']:.1f}",
                  f"{o['us']['p90']:.1f}", f"{o['share']:.1%}", f"{cum:.1%}")
    console.print(t)
    w = res["whole_us"]
    console.print(f"whole model p50 {w['p50']:.1f} µs (p90 {w['p90']:.1f}); sum of ops p50 {res['sum_p50_us']:.1f} µs "
                  f"= {res['sum_over_whole']:.2f}x the whole (each op alone pays its own invoke); "
                  + ("op-by-op chain reproduces the whole model's outputs exactly"
                     if res["chain_max_abs_diff"] == 0 else
                     f"op-by-op chain vs whole model: max |diff| {res['chain_max_abs_diff']:.3g}"))


def profile_export_target(path) -> None:
    """Check ``--export-profile PATH`` before the profile runs: a .json file in an existing directory.

    Raises:
        click.BadParameter (exit 2): another suffix, or a directory that does not exist."""
    import click
    p = Path(path)
    if p.suffix.lower() != ".json":
        raise click.BadParameter(f"{path}: the profile is written as JSON: give a .json file",
                                 param_hint="--export-profile")
    if not p.parent.resolve().is_dir():
        raise click.BadParameter(f"{path}: directory {p.parent} does not exist", param_hint="--export-profile")


def _flat_us(stats: dict) -> dict:
    """``{"p50": 1.2, "p90": ...}`` (µs) as ``{"p50_us": 1.2, "p90_us": ...}``."""
    return {f"{k}_us": v for k, v in stats.items()}


def export_profile(res: dict, path) -> str:
    """The profile ``res`` (:func:`profile_runner`, with the ``bench`` fields: bundle, runner, fingerprint) to
    ``path`` as JSON, every time's unit in its key: ``{"kind": "ops" | "steps", "bundle", "board", "plan",
    "model", "rounds", "warmup", "threads", "op_resolver", "ops": [{"index", "op", "layer", "with_ops",
    "kernel", "kernel_in_model", "p50_us", "p90_us", "mean_us", "share"}] (per op, graph order), "steps":
    [{"index", "placement", "what", "ops", "p50_us", "p90_us", "mean_us", "share"}] (per step of a chain),
    "whole_p50_us", "whole_p90_us", "whole_mean_us" (the whole model; None for a chain), "sum_p50_us",
    "sum_over_whole", "chain_max_abs_diff", "emulated", "fingerprint"}``. ``share``: the row's p50 over
    ``sum_p50_us``. Returns the path written."""
    ops = [{**{k: v for k, v in o.items() if k != "us"}, **_flat_us(o["us"])} for o in res.get("ops") or []]
    steps = [{**{k: v for k, v in s.items() if k != "us"}, **_flat_us(s["us"])} for s in res.get("segments") or []]
    whole = _flat_us(res["whole_us"]) if res.get("whole_us") else {}
    runner = res.get("runner") or {}
    doc = {"kind": "steps" if steps else "ops", "bundle": res.get("bundle"), "board": runner.get("board"),
           "plan": runner.get("plan"), "model": res.get("model"), "rounds": res["rounds"], "warmup": res["warmup"],
           "threads": res.get("threads"), "op_resolver": res.get("op_resolver"), "ops": ops, "steps": steps,
           **{f"whole_{k}": whole.get(k) for k in ("p50_us", "p90_us", "mean_us")},
           "sum_p50_us": res.get("sum_p50_us"), "sum_over_whole": res.get("sum_over_whole"),
           "chain_max_abs_diff": res.get("chain_max_abs_diff"), "emulated": runner.get("emulated"),
           "fingerprint": res.get("fingerprint")}
    Path(path).write_text(json.dumps(doc, indent=1))
    return str(path)


def profile_stream(stream, rows, window: int, ticks: int = 2000) -> dict:
    """Op by op, the streaming runtime's split (``bench --streaming --profile``): after the latency replay, the
    stream's own timing turned on (:meth:`edgehft.streaming.stream.Stream.profile`: a clock read around each
    kernel call inside the native push and prepare; a stream still warming up gets its first rows untimed),
    ``ticks`` more rows pushed with an inline prepare after
    each (cycling over ``rows[window - 1:]``), then off again. Returns ``{"ticks", "ops": [...]}`` with the
    stream's :meth:`~edgehft.streaming.stream.Stream.profile_ops` rows (µs per tick, mean) and per phase the
    sum (``prepare_us``, ``critical_us``).

    Raises:
        InputError: a stream whose prepare runs on its helper thread."""
    feed = rows[window - 1:] if len(rows) >= window else rows
    for i in range(max(0, window - 1 - stream.rows)):        # a stream still warming up: fill its window first
        stream.push(rows[i % len(rows)])
        stream.prepare()
    stream.profile(True)
    try:
        for i in range(ticks):
            stream.push(feed[i % len(feed)])
            stream.prepare()
        ops = stream.profile_ops()
    finally:
        stream.profile(False)
    return {"ticks": int(ticks), "ops": ops,
            "prepare_us": sum(o["us_per_tick"] for o in ops if o["phase"] == "prepare"),
            "critical_us": sum(o["us_per_tick"] for o in ops if o["phase"] == "critical")}


def print_stream_profile(prof: dict, console) -> None:
    """The streaming split as a table: phase, op, mean µs per tick, share of its phase."""
    from rich.table import Table
    t = Table(title=f"streaming, op by op ({prof['ticks']} ticks, mean µs per tick; clock reads inside the "
                    "native push/prepare)", title_justify="left")
    for c in ("phase", "op", "µs", "share"):
        t.add_column(c, justify="right" if c in ("µs", "share") else "left")
    for o in prof["ops"]:
        t.add_row(o["phase"], o["op"], f"{o['us_per_tick']:.2f}", f"{o['share']:.1%}")
    console.print(t)
    console.print(f"critical path {prof['critical_us']:.1f} µs per tick, prepare {prof['prepare_us']:.1f} µs per "
                  "tick (sums of the ops; push's own entry, row copy and ctypes call are outside)", highlight=False)
