"""Latency-first micro-batching (issue 17 item 4): ``runner.predict_many([x1, x2, ...])`` for a box that scores
several instruments per tick.

``predict_many`` is a synchronous call on the windows it is given: it never waits for a batch to fill. It returns
one result per window, each equal to what ``predict(x_i)`` returns (a float32 array, or a tuple of them for a
multi-output model), but *fresh* arrays: unlike ``predict``'s reused buffers they stay valid after the next call.

How a size N runs (:class:`Batcher`, one per cpu runner):

- one batch, through a LiteRT interpreter of the plan's model with the batch dim of every input resized to N
  (``resize_tensor_input`` + ``allocate_tensors``; one interpreter per N, kept warm; :class:`BatchRun`), **only**
  when a batch was measured faster than the same calls one by one *and* its results were bit-identical
  (``np.array_equal``) to ``predict``'s on the same windows;
- else one by one (``predict`` in a loop, each result copied).

The decision is measured in this process, lazily, at the first ``predict_many`` of each size (that call pays for
the measurement: about :data:`BUDGET_NS` of both ways interleaved, on the call's own windows) or up front with
``runner.batching(sizes, windows)`` (``edgehft bench BUNDLE --batch 2,4,8``), then cached per runner. A plan
whose batch differs from ``predict`` at any size is never batched again by that runner (the reason is kept).
The deploy's plan timing does not measure batches. Nothing here imports TensorFlow; it runs on boxes.
"""
from __future__ import annotations

import gc
import time

import numpy as np

from edgehft.errors import InputError, ShapeError
from edgehft.runtime.base import InputSlot, OutputSlot
from edgehft.runtime.many import as_calls, loop_calls, with_index

MAX_BATCH = 64                  # larger calls run one by one (one warm interpreter per size up to here)
BUDGET_NS = 20_000_000          # the time one size's measurement aims at (both ways together)
MIN_ROUNDS, MAX_ROUNDS = 10, 200
HOW = ("measured in this process at the first predict_many of each size (or runner.batching(sizes)): the whole "
       "predict_many both ways on the same windows, interleaved, p50 per call over the rounds; bit-identity "
       "checked on those windows")


class BatchUnsupported(Exception):
    """LiteRT cannot run the plan's model at a batch of N (the message says why)."""


def first_difference(a: list, b: list) -> int | None:
    """The index of the first result of ``a`` not ``np.array_equal`` to ``b``'s (every output), else None."""
    for i, (x, y) in enumerate(zip(a, b)):
        xs, ys = (x, y) if isinstance(x, tuple) else ((x,), (y,))
        if not all(np.array_equal(p, q) for p, q in zip(xs, ys)):
            return i
    return None


class BatchRun:
    """The plan's model in a LiteRT interpreter whose inputs have batch ``n``: row i of each input buffer is
    written by an :class:`~edgehft.runtime.base.InputSlot` (predict's own checks and quantization), the outputs
    are dequantized by an :class:`~edgehft.runtime.base.OutputSlot` (predict's own arithmetic)."""

    def __init__(self, model_path, threads: int, op_resolver: str, in_specs: list, out_specs: list, n: int):
        from edgehft.runtime.litert import make_interpreter, stable_views
        self.n = n
        if any(s.shape[:1] != [1] for s in in_specs):
            raise BatchUnsupported("an input has no batch dim of 1 to resize")
        interp = make_interpreter(model_path, threads, op_resolver)
        try:
            for s in in_specs:
                interp.resize_tensor_input(s.index, [n, *s.shape[1:]])
            interp.allocate_tensors()
        except (RuntimeError, ValueError) as exc:
            raise BatchUnsupported(f"LiteRT cannot resize the batch dim to {n}: {' '.join(str(exc).split())[:200]}")
        shapes = {d["index"]: list(d["shape"]) for d in interp.get_output_details()}
        for s in out_specs:
            if shapes[s.index] != [n, *s.shape[1:]]:
                raise BatchUnsupported(f"output {s.name!r} is {shapes[s.index]} at a batch of {n}, not "
                                       f"{[n, *s.shape[1:]]}: the model does not follow the batch dim")
        self.interp, self.in_specs, self.out_specs = interp, in_specs, out_specs
        views = stable_views(interp, [s.index for s in in_specs + out_specs])
        if views is not None:
            ins, outs = views[:len(in_specs)], views[len(in_specs):]
            self.invoke = interp._interpreter.Invoke
        else:
            ins = [np.empty([n, *s.shape[1:]], s.dtype) for s in in_specs]
            outs = [np.empty([n, *s.shape[1:]], s.dtype) for s in out_specs]
            self.invoke = self._invoke_staged
        self.zero_copy = views is not None
        self._ins, self._outs = ins, outs
        self.rows = [[InputSlot(s, buf[i:i + 1]) for s, buf in zip(in_specs, ins)] for i in range(n)]
        self.outputs = [OutputSlot(s.model_copy(update={"shape": [n, *s.shape[1:]]}), buf)
                        for s, buf in zip(out_specs, outs)]

    def _invoke_staged(self) -> None:
        for s, buf in zip(self.in_specs, self._ins):
            self.interp.set_tensor(s.index, buf)
        self.interp.invoke()
        for s, buf in zip(self.out_specs, self._outs):
            np.copyto(buf, self.interp.get_tensor(s.index))

    def write(self, calls: list[tuple]) -> None:
        """Check every window and write it into its row; nothing runs.

        Raises:
            ShapeError, DTypeError, NonFiniteInputError: the first bad window, its index in the message.
        """
        n = len(calls)
        for i, (c, row) in enumerate(zip(calls, self.rows)):
            try:
                if len(c) != len(row):
                    raise ShapeError(f"model takes {len(row)} input(s), got {len(c)}")
                for slot, x in zip(row, c):
                    slot.write(x)
            except InputError as exc:
                raise with_index(exc, i, n) from None

    def run(self) -> list:
        """Invoke on the rows written; one result per row: ``(1, ...)`` float32 views of fresh arrays (a tuple of
        them for several outputs)."""
        self.invoke()
        outs = [o.read().copy() for o in self.outputs]
        if len(outs) == 1:
            y = outs[0]
            return [y[i:i + 1] for i in range(self.n)]
        return [tuple(y[i:i + 1] for y in outs) for i in range(self.n)]


def time_both(batched, one_by_one, n: int) -> dict:
    """Both ways of running one size, interleaved (the order swapped every round), the garbage collector off:
    enough rounds to take about :data:`BUDGET_NS` (:data:`MIN_ROUNDS` to :data:`MAX_ROUNDS`).

    Returns:
        ``{"batched_us_per_input", "one_by_one_us_per_input"}`` (p50 of a call, divided by ``n``), ``"speedup"``
        (one by one / batched) and ``"rounds"``.
    """
    perf = time.perf_counter_ns
    gc_was = gc.isenabled()
    gc.disable()
    try:
        warm = []
        for _ in range(3):                      # warm-up; the fastest of them sizes the rounds
            t0 = perf()
            batched()
            one_by_one()
            warm.append(perf() - t0)
        rounds = int(min(MAX_ROUNDS, max(MIN_ROUNDS, BUDGET_NS // max(1, min(warm)))))
        ns = np.empty((2, rounds), np.int64)
        for r in range(rounds):
            for k in ((0, 1) if r % 2 else (1, 0)):
                t0 = perf()
                (batched if k == 0 else one_by_one)()
                ns[k, r] = perf() - t0
    finally:
        if gc_was:
            gc.enable()
    b, o = (float(np.median(ns[k])) / 1e3 / n for k in (0, 1))
    return {"batched_us_per_input": b, "one_by_one_us_per_input": o, "speedup": o / b, "rounds": rounds}


class Batcher:
    """``predict_many`` and its batching decisions for one cpu runner (see the module docstring).

    ``why_not``: why this runner never batches (its engine cannot: native chain, ONNX Runtime, an accelerator's
    model, LSTM state), None when LiteRT may run a resized batch.
    """

    def __init__(self, runner, why_not: str | None):
        self.runner = runner
        self.why_not = why_not
        self.differs: str | None = None            # set when a batch was not bit-identical to predict
        self.sizes: dict[int, dict] = {}
        self.runs: dict[int, BatchRun] = {}

    def predict_many(self, windows) -> list:
        """One result per window, each equal to ``predict(*window)`` (fresh arrays); see the module docstring.

        Raises:
            InputError: ``windows`` is not a list. ShapeError, DTypeError, NonFiniteInputError: a bad window,
                its index in the message. RunnerStateError: closed, or another thread's call is in progress.
        """
        calls = as_calls(windows)
        n = len(calls)
        if self.why_not or self.differs or not 2 <= n <= MAX_BATCH:
            return loop_calls(self.runner.predict, calls)
        if n not in self.sizes:
            self.measure(calls)
        if self.sizes[n]["batched"]:
            return self._batched(self.runs[n], calls)
        return loop_calls(self.runner.predict, calls)

    def _batched(self, run: BatchRun, calls: list[tuple]) -> list:
        r = self.runner
        if not r._entry.acquire(False):
            r._busy()
        try:
            run.write(calls)
            return run.run()
        finally:
            r._entry.release()

    def _run_for(self, n: int) -> BatchRun:
        run = self.runs.get(n)
        if run is None:
            r = self.runner
            run = self.runs[n] = BatchRun(r.bundle.model_path, r.threads, r.op_resolver, r._in_specs,
                                          r._out_specs, n)
        return run

    def measure(self, calls: list[tuple]) -> dict:
        """Decide how ``len(calls)`` windows run: a batch when it is bit-identical to ``predict`` on ``calls`` and
        its p50 is below one by one's (:func:`time_both`). Recorded in ``self.sizes``; a batch that differs
        turns batching off for every size of this runner.

        Raises:
            ShapeError, DTypeError, NonFiniteInputError: a bad window (index in the message); nothing recorded.
        """
        n = len(calls)
        try:
            run = self._run_for(n)
        except BatchUnsupported as exc:
            self.sizes[n] = {"n": n, "batched": False, "why": str(exc)}
            return self.sizes[n]
        batched = self._batched(run, calls)
        singles = loop_calls(self.runner.predict, calls)
        diff = first_difference(batched, singles)
        rec = {"n": n, **time_both(lambda: self._batched(run, calls),
                                   lambda: loop_calls(self.runner.predict, calls), n),
               "bit_identical": diff is None}
        rec["pays"] = rec["batched_us_per_input"] < rec["one_by_one_us_per_input"]
        rec["batched"] = rec["pays"] and diff is None and self.differs is None
        if diff is not None:
            rec["why"] = f"not bit-identical to predict (input {diff} differs)"
            self.differs = self.differs or (f"a batch of {n} is not bit-identical to predict (input {diff} differs) on "
                            f"{self.runner.path}: its kernels sum in another order at batch > 1, so this runner "
                            "never batches")
        elif self.differs:
            rec["why"] = "this runner never batches (another size was not bit-identical)"
        elif not rec["pays"]:
            rec["why"] = "one by one was faster"
        if self.differs:
            self.runs.clear()
        elif not rec["batched"]:
            self.runs.pop(n, None)
        self.sizes[n] = rec
        return rec

    def report(self, sizes=None, windows=None) -> dict:
        """What ``runner.batching()`` returns; with ``sizes`` (ints 2..:data:`MAX_BATCH`), each size not measured
        yet is measured first on ``windows`` (a list as ``predict_many`` takes, cycled to fill the size; default
        the bundle's golden inputs).

        Returns:
            ``{"batches": bool (some size runs as one batch), "why": str | None (why none ever does),
            "engine", "max_batch", "how", "sizes": [{"n", "batched", "why"?, "batched_us_per_input",
            "one_by_one_us_per_input", "speedup", "rounds", "bit_identical", "pays"}]}`` (µs per input).
        Raises:
            InputError: a size out of range, no windows and no golden inputs, or bad windows.
        """
        for n in sizes or ():
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 2 <= n <= MAX_BATCH:
                raise InputError(f"batch size {n!r}: sizes are integers 2 to {MAX_BATCH}",
                                 hint="e.g. --batch 2,4,8 (a size above the limit runs one by one)")
        todo = [int(n) for n in sizes or () if int(n) not in self.sizes]
        if todo and not self.why_not:
            calls = as_calls(windows) if windows is not None else self._golden_calls()
            if not calls:
                raise InputError("no windows to measure batches on", hint="pass windows (bench --ticks FILE)")
            for n in todo:
                self.measure([calls[i % len(calls)] for i in range(n)])
        why = self.why_not or self.differs
        return {"batches": any(s["batched"] for s in self.sizes.values()) and why is None, "why": why,
                "engine": None if self.why_not else "LiteRT, batch dim resized", "max_batch": MAX_BATCH,
                "how": None if self.why_not else HOW, "sizes": [self.sizes[n] for n in sorted(self.sizes)]}

    def _golden_calls(self) -> list[tuple]:
        from edgehft.runtime.plans import timing_windows
        self.runner.bundle.require_golden()
        return as_calls(timing_windows([self.runner.bundle]))

    def close(self) -> None:
        self.runs.clear()


def batching_table(report: dict, title: str):
    """``report`` (``runner.batching()``) as a rich Table under 80 columns: per size, µs per input batched and one
    by one, the speedup, bit-identity and what ``predict_many`` does."""
    from rich.table import Table
    t = Table(title=title, title_justify="left")
    for c, j in (("N", "right"), ("batched µs/in", "right"), ("1-by-1 µs/in", "right"), ("speedup", "right"),
                 ("identical", "center"), ("predict_many", "left")):
        t.add_column(c, justify=j)
    for s in report["sizes"]:
        fig = "batched_us_per_input" in s
        t.add_row(str(s["n"]), f"{s['batched_us_per_input']:.2f}" if fig else "-",
                  f"{s['one_by_one_us_per_input']:.2f}" if fig else "-", f"x{s['speedup']:.2f}" if fig else "-",
                  ("yes" if s["bit_identical"] else "NO") if fig else "-",
                  "one batch" if s["batched"] else "one by one")
    return t
