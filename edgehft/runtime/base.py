"""What every backend shares: input checks, (de)quantization into preallocated buffers, the context
manager. Numerics follow the TFLite reference kernels (tensorflow/lite/kernels/internal/reference):
QUANTIZE ``q = clamp(round_half_away_from_zero(x / scale) + zero_point)`` and DEQUANTIZE
``x = (q - zero_point) * scale``.
"""
from __future__ import annotations

import math
import os
import threading

import numpy as np

from edgehft.bundle import Bundle, TensorSpec
from edgehft.errors import DTypeError, InputError, NonFiniteInputError, RunnerStateError, ShapeError

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_F32_MAX = float(np.finfo(np.float32).max)


class InputSlot:
    """One model input: validates a window and writes it into ``dest`` (the interpreter's buffer)."""

    def __init__(self, spec: TensorSpec, dest: np.ndarray):
        self.spec = spec
        self.dest = dest
        self.dtype = np.dtype(spec.dtype)
        self.shapes = {tuple(spec.shape), tuple(spec.shape[1:])} if spec.shape[:1] == [1] else {tuple(spec.shape)}
        self.quantized = spec.quantized
        if self.quantized:
            self.scale = np.float32(spec.scale[0])
            self.zero_point = np.float32(spec.zero_point[0])
            info = np.iinfo(self.dtype)
            self.qmin, self.qmax = np.float32(info.min), np.float32(info.max)
            self.scratch = np.empty(spec.shape, dtype=np.float32)
            self.sign = np.empty(spec.shape, dtype=np.float32)

    def write(self, x: np.ndarray) -> None:
        """Validate ``x`` and copy (quantizing float windows) into the interpreter input.

        Raises:
            ShapeError, DTypeError, NonFiniteInputError: naming the input, what was given and expected.
        """
        if not isinstance(x, np.ndarray):
            raise DTypeError(f"input {self.spec.name!r}: expected a numpy array, got {type(x).__name__}")
        if x.shape not in self.shapes:
            raise ShapeError(f"input {self.spec.name!r}: shape {x.shape}, expected {tuple(self.spec.shape)}"
                             + (f" or {tuple(self.spec.shape[1:])}" if len(self.shapes) > 1 else ""),
                             hint="one window per call, batch 1")
        dt = x.dtype
        if dt == self.dtype:
            if dt.kind == "f":
                self._check_finite(x)
            self.dest[...] = x.reshape(self.dest.shape)
        elif self.quantized and dt in _FLOATS:
            self._check_finite(x)
            self.quantize_into_dest(x)
        elif dt == np.float64 and self.dtype == np.float32:
            self._check_finite(x)
            self._check_float32_range(x)
            np.copyto(self.dest, x.reshape(self.dest.shape), casting="same_kind")
        else:
            accepted = [str(self.dtype)] + (["float32", "float64"] if self.quantized else
                                            ["float64"] if self.dtype == np.float32 else [])
            hint = ("pass float32 features (they are quantized with the input's scale and zero point); "
                    f"pass {self.dtype} only for windows that are already quantized") if self.quantized \
                else f"pass x.astype(np.{self.dtype})"
            raise DTypeError(f"input {self.spec.name!r}: dtype {dt}, expected one of {', '.join(accepted)}",
                             hint=hint)

    def quantize_into_dest(self, x: np.ndarray) -> None:
        """``dest = clamp(round_half_away(x / scale)) + zero_point`` (TFLite reference QUANTIZE)."""
        s = self.scratch
        np.divide(x.reshape(s.shape), self.scale, out=s)
        np.copysign(np.float32(0.5), s, out=self.sign)
        np.add(s, self.sign, out=s)
        np.trunc(s, out=s)
        np.clip(s, self.qmin - self.zero_point, self.qmax - self.zero_point, out=s)
        np.add(s, self.zero_point, out=self.dest, casting="unsafe")

    def _check_float32_range(self, x: np.ndarray) -> None:
        """A float64 window must fit float32 (the model's input): the cast would make larger values inf."""
        big = np.abs(x) > _F32_MAX
        if big.any():
            where = tuple(int(i) for i in np.argwhere(big)[0])
            raise NonFiniteInputError(f"input {self.spec.name!r}: {int(big.sum())} value(s) beyond float32's range "
                                      f"(±{_F32_MAX:.3g}), first at index {where} = {x[where]}; the float32 input "
                                      "would hold inf", hint="scale the features, or drop the tick")

    def _check_finite(self, x: np.ndarray) -> None:
        # One reduction on the hot path (NaN/inf propagate through the sum); the exact location is
        # only worked out on failure, and a sum that merely overflowed is let through.
        if math.isfinite(x.sum()):
            return
        bad = ~np.isfinite(x)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise NonFiniteInputError(f"input {self.spec.name!r}: {int(bad.sum())} non-finite value(s) "
                                      f"(NaN/inf), first at index {where} = {x[where]}",
                                      hint="drop or repair the tick before it reaches the model")


class OutputSlot:
    """One model output: the interpreter's buffer ``src`` and a reused float32 dequantized copy."""

    def __init__(self, spec: TensorSpec, src: np.ndarray):
        self.spec = spec
        self.src = src
        self.raw = np.empty(spec.shape, dtype=np.dtype(spec.dtype))
        self.quantized = spec.quantized
        self.value = np.empty(spec.shape, dtype=np.float32) if self.quantized else self.raw
        self.lut = None
        if self.quantized:
            self.scale = np.float32(spec.scale[0])
            self.zero_point = np.float32(spec.zero_point[0])
            if self.raw.dtype.itemsize == 1:
                # 256-entry table: lut[q mod 256] = (q - zero_point) * scale, indexed by the raw byte
                codes = np.arange(256, dtype=np.uint8).view(self.raw.dtype).astype(np.float32)
                self.lut = (codes - self.zero_point) * self.scale
                self._take = self.lut.take                 # the method: skips np.take's wrapper
                self.src_u8 = src.view(np.uint8)

    def read(self) -> np.ndarray:
        """Dequantize the interpreter's output into the reused float32 buffer (DEQUANTIZE reference)."""
        if self.lut is not None:
            self._take(self.src_u8, out=self.value, mode="wrap")  # bytes are 0..255: never wraps
        elif self.quantized:
            np.copyto(self.raw, self.src)
            np.subtract(self.raw, self.zero_point, out=self.value)
            np.multiply(self.value, self.scale, out=self.value)
        else:
            np.copyto(self.raw, self.src)
        return self.value


class Runner:
    """A model opened on a board. Subclasses set ``inputs``/``outputs`` slots and ``_invoke``.

    ``predict(*windows)`` returns float32 outputs (dequantized) and ``predict_raw`` the raw output
    tensors; both return *reused* buffers: copy what you keep across calls. Single-output models
    return an array, multi-output ones a tuple.

    One call at a time: a call that enters while another thread's call is in progress raises
    :class:`~edgehft.errors.RunnerStateError` instead of sharing the interpreter's buffers (open one runner
    per thread). ``close()`` waits for a call in progress; every call after it (also through a
    ``predict`` fetched before) raises RunnerStateError. The guard is one uncontended lock acquire and
    release per call (~0.1 µs).
    """

    board: str = "?"
    emulated: bool = False

    # A backend's Runner is constructed by :func:`edgehft.runtime.open` as ``Runner(bundle, board, threads=,
    # affinity=, **options)``: ``bundle`` a verified :class:`~edgehft.bundle.Bundle`, ``board`` its
    # :class:`~edgehft.boards.Board`; ``options`` are the keyword-only parameters its ``__init__`` declares
    # (e.g. cpu ``op_resolver``, coral ``device``/``emulate``, pynq ``overlay``/``emulate``; one it does not
    # declare is refused, exit 3). It sets ``inputs``/``outputs`` (InputSlot/OutputSlot on its buffers),
    # implements ``_invoke`` and, for ``bench --profile``, :meth:`profile_target`.

    def __init__(self, bundle: Bundle, board, *, threads: int = 1, affinity: list[int] | None = None):
        self.bundle = bundle
        self.board_spec = board
        self.board = board.name
        cores = os.cpu_count() or 1
        if not isinstance(threads, (int, np.integer)) or not 1 <= threads <= cores:
            raise InputError(f"threads {threads!r}: this machine has {cores} CPU(s), so 1 to {cores} interpreter "
                             "threads", hint="1 gives the lowest jitter; more only helps a large model on idle cores")
        self.threads = int(threads)
        self.affinity = None
        if affinity:
            if any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) for c in affinity):
                raise InputError(f"affinity {list(affinity)!r}: CPU ids are integers",
                                 hint=f"allowed CPUs here: {sorted(os.sched_getaffinity(0))}")
            try:
                os.sched_setaffinity(0, set(int(c) for c in affinity))
            except (OSError, ValueError, OverflowError) as exc:
                raise InputError(f"cannot pin to CPUs {list(affinity)}: {exc}",
                                 hint=f"allowed CPUs here: {sorted(os.sched_getaffinity(0))}") from exc
            self.affinity = sorted(os.sched_getaffinity(0))
        self.inputs: list[InputSlot] = []
        self.outputs: list[OutputSlot] = []
        self.closed = False
        self._entry = threading.Lock()     # held by the call in progress; held for good once closed

    def _busy(self):
        """Raise why a call could not enter: the runner is closed, or another thread's call is running.

        Raises:
            RunnerStateError: always.
        """
        if self.closed:
            raise RunnerStateError(f"runner for {self.bundle.path} is closed",
                                   hint="open the bundle again (edgehft.runtime.open) to keep predicting")
        raise RunnerStateError(f"runner for {self.bundle.path} is already running a call in another thread",
                               hint="a runner serves one call at a time: open one runner per thread, or "
                                    "serialize the calls")

    def _invoke(self) -> None:
        raise NotImplementedError

    def profile_target(self) -> dict:
        """What ``bench --profile`` times (:func:`edgehft.bench.profile.profile_runner`), one of:

        - ``{"model_file": Path}``: a TFLite model LiteRT runs whole (timed op by op in a profiling
          interpreter of its own, on the same threads and op resolver);
        - ``{"steps": [(kind, step, handle), ...], "input_names": [str], "run_step": fn(kind, step, handle,
          env)}`` for a chain of steps (PYNQ segments and kernels, the cpu board's native plans), each step
          timed through ``run_step``; with ``"bound": [callable or None]`` and ``"staging_in": [ndarray]``
          the calls ``predict`` itself makes (reading the inputs from ``staging_in``; None: a view, 0 µs).

        Raises:
            BoardUnavailableError: the board's runner exposes nothing to profile (the base's answer).
        """
        from edgehft.errors import BoardUnavailableError
        raise BoardUnavailableError(f"board {self.board}'s runner has no per-op profile",
                                    hint="bench it without --profile")

    def _bind_fast_paths(self) -> None:
        """For one input and one output whose buffers are the interpreter's own, replace ``predict`` and
        ``predict_raw`` with closures that do only: a shape and dtype check, one copy in, the invoke,
        and (``predict``) one table lookup out. Anything else takes the general path."""
        if len(self.inputs) != 1 or len(self.outputs) != 1:
            return
        slot, out = self.inputs[0], self.outputs[0]
        invoke, dest, src, shapes, dtype = self._invoke, slot.dest, out.src, slot.shapes, slot.dtype
        copyto, general_raw, general = np.copyto, self.predict_raw, self.predict
        enter, leave, busy = self._entry.acquire, self._entry.release, self._busy
        direct = dtype.kind in "iu"                 # integer windows need no finiteness check
        # The fast check is written out in both closures on purpose: a shared helper would add a
        # Python call (~60 ns) to every prediction.

        def predict_raw(*windows):
            if len(windows) == 1:
                x = windows[0]
                if direct and x.__class__ is np.ndarray and x.dtype is dtype and x.shape in shapes:
                    if not enter(False):
                        busy()
                    try:
                        copyto(dest, x)
                        invoke()
                        return src
                    finally:
                        leave()
            return general_raw(*windows)

        read = out.read

        def predict(*windows):
            if len(windows) == 1:
                x = windows[0]
                if direct and x.__class__ is np.ndarray and x.dtype is dtype and x.shape in shapes:
                    if not enter(False):
                        busy()
                    try:
                        copyto(dest, x)
                        invoke()
                        return read()
                    finally:
                        leave()
            return general(*windows)

        self.predict_raw, self.predict = predict_raw, predict

    def _run(self, windows) -> None:
        """Check and write ``windows`` into the inputs and invoke; the caller holds ``_entry``."""
        if len(windows) != len(self.inputs):
            raise ShapeError(f"model takes {len(self.inputs)} input(s), got {len(windows)}")
        for slot, x in zip(self.inputs, windows):
            slot.write(x)
        self._invoke()

    def predict(self, *windows: np.ndarray):
        """Run one window (per input). Returns float32 output(s) with the output's shape (batch 1).

        Raises:
            ShapeError, DTypeError, NonFiniteInputError: bad window; nothing is run.
            RunnerStateError: the runner is closed, or another thread's call is in progress.
        """
        if not self._entry.acquire(False):
            self._busy()
        try:
            self._run(windows)
            if len(self.outputs) == 1:
                return self.outputs[0].read()
            return tuple(o.read() for o in self.outputs)
        finally:
            self._entry.release()

    def predict_raw(self, *windows: np.ndarray):
        """As :meth:`predict`, but the outputs in the model's own dtype (int8 for int8 bundles). The
        arrays may be the interpreter's own output buffers: the next call overwrites them."""
        if not self._entry.acquire(False):
            self._busy()
        try:
            self._run(windows)
            outs = tuple(o.src for o in self.outputs)
        finally:
            self._entry.release()
        return outs[0] if len(outs) == 1 else outs

    def predict_many(self, windows) -> list:
        """Run several windows (e.g. one per instrument) now: one result per window, each equal to
        ``predict(*window)`` (float32 ``(1, ...)``, a tuple for several outputs) but a fresh array, not a reused
        buffer. ``windows``: a list of arrays (one-input model) or of tuples of arrays (one per input). Here
        (every board whose runner does not batch) it calls ``predict`` once per window; the cpu board's runner
        runs one batch where that is measured faster and bit-identical (:mod:`edgehft.runtime.batching`).

        Raises:
            InputError: ``windows`` is not a list. ShapeError, DTypeError, NonFiniteInputError: a bad window,
                the message naming its index. RunnerStateError: as :meth:`predict`.
        """
        from edgehft.runtime.many import as_calls, loop_calls
        return loop_calls(self.predict, as_calls(windows))

    def batching(self, sizes=None, windows=None) -> dict:
        """How :meth:`predict_many` runs (the cpu runner's answer: :meth:`edgehft.runtime.batching.Batcher.report`).
        Here: one by one at every size, nothing measured (``sizes``/``windows`` are ignored)."""
        return {"batches": False, "why": f"board {self.board}'s runner runs one window per call: predict_many "
                "calls predict once per window", "engine": None, "max_batch": 1, "how": None, "sizes": []}

    def describe(self) -> dict:
        """What this runner runs on: board, backend details, threads, affinity, emulated or not."""
        return {"board": self.board, "emulated": self.emulated, "threads": self.threads,
                "affinity": self.affinity, "bundle": str(self.bundle.path)}

    def close(self) -> None:
        """Wait for a call in progress, then refuse every later call (RunnerStateError). Subclasses free
        their interpreter after this. Closing twice is a no-op here."""
        if not self.closed:
            self._entry.acquire()                     # never released: later calls cannot enter
            self.closed = True
        self.__dict__.pop("predict", None)                # back to the checked general path
        self.__dict__.pop("predict_raw", None)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
