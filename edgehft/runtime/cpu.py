"""The ``cpu`` backend: the bundle's TFLite model on the host CPU through LiteRT (or tflite-runtime); the
``ort-float``/``ort-int8`` plans' ONNX model through ONNX Runtime (:mod:`edgehft.runtime.ort`).

The hot path is: validate + copy the window into the interpreter's own input buffer, ``Invoke``, copy
the output into a reused buffer. The input/output numpy views are taken once at open; ``Invoke`` is
called on the interpreter wrapper directly, because ``Interpreter.invoke()`` refuses to run while such
views exist (it guards against buffers moving on reallocation). We only keep the views when the
buffers provably stay put: all I/O tensors are static and their addresses are unchanged after a
warm-up ``Invoke``; otherwise every call goes through ``set_tensor``/``invoke``/``get_tensor``.
"""
from __future__ import annotations

import functools

import numpy as np

from edgehft.bundle import check_io_details
from edgehft.errors import InputError
from edgehft.runtime.base import InputSlot, OutputSlot, Runner as _Runner
from edgehft.runtime.ort import is_ort_plan
from edgehft.runtime.litert import (OP_RESOLVERS, XNNPACK_REFUSED, interpreter_path, make_interpreter,
                                    variable_tensors, xnnpack_refused)

class Runner(_Runner):
    """LiteRT on the host. ``op_resolver`` as in :func:`make_interpreter`; ``native_portable``: a native
    plan's kernels on their portable paths (no AMX, no AVX-512), what a box without those units runs.
    ``plan``/``plan_source``: the execution plan it runs and why (set by :func:`edgehft.runtime.open`; None
    for a runner made directly on a plan's bundle)."""

    plan: str | None = None
    plan_source: str | None = None

    def __init__(self, bundle, board, *, threads: int = 1, affinity=None, op_resolver: str = "auto",
                 native_portable: bool = False):
        super().__init__(bundle, board, threads=threads, affinity=affinity)
        if op_resolver not in OP_RESOLVERS:
            raise InputError(f"op_resolver {op_resolver!r}: choose one of {', '.join(OP_RESOLVERS)}")
        self.op_resolver = op_resolver
        self.native_portable = native_portable
        if is_ort_plan(bundle.manifest.quantization.mode):      # ort-float / ort-int8: ONNX Runtime runs it
            self._open_ort()
            return
        self.path = interpreter_path(op_resolver)
        if bundle.manifest.artifacts.get("native"):
            self._open_native(bundle.manifest.artifacts["native"])
            return
        self.interp = self._make_interpreter()
        ins, outs = self._io_specs()
        check_io_details(ins, self.interp.get_input_details(), "input", self._loaded_model_file())
        check_io_details(outs, self.interp.get_output_details(), "output", self._loaded_model_file())
        # Stateless models keep the recurrent state of a fused LSTM in variable tensors that Invoke
        # updates in place: without a reset, window n would start from window n-1's final state.
        self.stateful_tensors = variable_tensors(self._loaded_model_file())
        ins, outs = self._io_specs()
        self._in_specs, self._out_specs = ins, outs
        self._zero_copy = self._views_are_stable(ins + outs)
        if self._zero_copy:
            self.inputs = [InputSlot(s, self.interp.tensor(s.index)()) for s in ins]
            self.outputs = [OutputSlot(s, self.interp.tensor(s.index)()) for s in outs]
            invoke = self.interp._interpreter.Invoke
            if self.stateful_tensors:
                reset = self.interp._interpreter.ResetVariableTensors

                def invoke_from_zero_state():
                    reset()
                    invoke()
                self._invoke = invoke_from_zero_state
            else:
                self._invoke = invoke
            self._bind_fast_paths()
            self._bind_float_fast_path()
        else:
            self._staging_in = [np.empty(s.shape, dtype=s.dtype) for s in ins]
            self._staging_out = [np.empty(s.shape, dtype=s.dtype) for s in outs]
            self.inputs = [InputSlot(s, buf) for s, buf in zip(ins, self._staging_in)]
            self.outputs = [OutputSlot(s, buf) for s, buf in zip(outs, self._staging_out)]

    def _open_native(self, rel: str) -> None:
        """The native plans (:mod:`edgehft.runtime.native_chain`): LiteRT segments and native kernel calls
        chained as ``native.json`` says; I/O through staging buffers like the safe path."""
        from edgehft.runtime import native_chain
        self.interp = None
        self.stateful_tensors = []
        self._zero_copy = False
        self._chain = native_chain.Chain(self.bundle.path, rel, self.threads, self.op_resolver,
                                         portable=self.native_portable)
        self.op_kernels = self._chain.op_kernels
        self.path += self._chain.describe_path()
        ins, outs = self._io_specs()
        self._in_specs, self._out_specs = ins, outs
        self._staging_in = [np.empty(s.shape, dtype=s.dtype) for s in ins]
        self._staging_out = [np.empty(s.shape, dtype=s.dtype) for s in outs]
        self.inputs = [InputSlot(s, buf) for s, buf in zip(ins, self._staging_in)]
        self.outputs = [OutputSlot(s, buf) for s, buf in zip(outs, self._staging_out)]
        bound = native_chain.bind(self._chain, self._staging_in, self._staging_out)
        if bound is not None:
            self._invoke, self._arena, self._bound_steps = bound
        else:
            self._bound_steps = None
            self._invoke = functools.partial(native_chain.invoke, self._chain, self._staging_in, self._staging_out)
        self._bind_fast_paths()
        self._bind_float_fast_path()

    def _open_ort(self) -> None:
        """The ONNX Runtime plans (:mod:`edgehft.runtime.ort`): the bundle's ``model.onnx`` in a session whose
        inputs and outputs are bound to buffers made once; ``predict`` copies the window into the bound input,
        runs, and reads the bound output (``op_resolver`` ``reference``: graph optimizations off, Q/DQ as float
        ops)."""
        from edgehft.runtime import ort
        m = self.bundle.manifest
        ins, outs = self._io_specs()
        self._in_specs, self._out_specs = ins, outs
        self.interp, self.stateful_tensors, self.op_kernels = None, [], {}
        self._ort, self.path, self.onnx_checked = ort.open_plan(
            self.bundle.model_path, ins, outs, self.threads, self.op_resolver, qdq=m.quantization.mode == "ort-int8")
        self._zero_copy = True
        self.inputs = [InputSlot(s, buf) for s, buf in zip(ins, self._ort.inputs)]
        self.outputs = [OutputSlot(s, buf) for s, buf in zip(outs, self._ort.outputs)]
        self._invoke = self._ort.invoke
        self._bind_fast_paths()
        self._bind_float_fast_path()

    @staticmethod
    def run_step(kind: str, st, h, env: dict) -> None:
        """One step of the native chain (:func:`edgehft.runtime.native_chain.run_step`)."""
        from edgehft.runtime.native_chain import run_step
        run_step(kind, st, h, env)

    @property
    def _steps(self):
        """The native chain as ``(kind, step metadata, handle)``; None for a whole-model bundle."""
        chain = getattr(self, "_chain", None)
        return [(k, m, h) for (k, h), m in zip(chain.steps, chain.meta)] if chain else None

    @property
    def chain_input_names(self) -> list[str]:
        return list(self._chain.inputs)

    def profile_target(self) -> dict:
        """The model LiteRT runs (a whole-model plan), or the native chain's steps with the calls ``predict``
        makes (see :meth:`edgehft.runtime.base.Runner.profile_target`).

        Raises:
            BoardUnavailableError: an ONNX Runtime plan (no per-op profile of its kernels here)."""
        if getattr(self, "_ort", None) is not None:
            from edgehft.errors import BoardUnavailableError
            raise BoardUnavailableError(f"the {self.plan or self.bundle.manifest.quantization.mode} plan runs on "
                                        "ONNX Runtime, which bench --profile does not time op by op",
                                        hint="bench it without --profile, or profile another plan (--plan NAME)")
        steps = self._steps
        if steps is None:
            return {"model_file": self._loaded_model_file()}
        return {"steps": steps, "input_names": self.chain_input_names, "run_step": self.run_step,
                "bound": getattr(self, "_bound_steps", None), "staging_in": getattr(self, "_staging_in", None)}

    def stream(self, prepare: str = "inline", core: int | None = None, spin_us: int = 1000):
        """Streaming inference on this runner's native plan (issue 21): ``push(row)`` one tick at a time, the
        output of the window of the last T rows, equal to ``predict`` of that window bit for bit
        (:mod:`edgehft.streaming.stream`). ``prepare``: ``"inline"`` (call ``stream.prepare()`` between ticks)
        or ``"thread"`` (a helper thread, pinned to ``core`` when given, prepares after each push).

        Raises:
            InputError: the model or plan does not stream here (the message says why)."""
        from edgehft.streaming.stream import open_stream
        return open_stream(self, prepare=prepare, core=core, spin_us=spin_us)

    def _bind_float_fast_path(self) -> None:
        """Float plans (``--quant dynamic``/``float``, or ``auto`` choosing one): one float32 input and output.
        ``predict`` then does a type/shape check, one reduction for the finiteness check (NaN/inf propagate
        through the sum; a non-finite window takes the general path, which names the bad element), one copy
        in, the invoke and one copy out."""
        if len(self.inputs) != 1 or len(self.outputs) != 1:
            return
        slot, out = self.inputs[0], self.outputs[0]
        if slot.dtype != np.float32 or out.quantized:
            return
        import math
        invoke, dest, shapes, dtype = self._invoke, slot.dest, slot.shapes, slot.dtype
        copyto, isfinite, general, read = np.copyto, math.isfinite, self.predict, out.read
        enter, leave, busy = self._entry.acquire, self._entry.release, self._busy
        add_reduce = np.add.reduce

        def predict(*windows):
            if len(windows) == 1:
                x = windows[0]
                if x.__class__ is np.ndarray and x.dtype is dtype and x.shape in shapes \
                        and isfinite(add_reduce(x, axis=None)):
                    if not enter(False):
                        busy()
                    try:
                        copyto(dest, x)
                        invoke()
                        return read()
                    finally:
                        leave()
            return general(*windows)

        self.predict = predict

    def predict_many(self, windows) -> list:
        """Several windows now, as :meth:`edgehft.runtime.base.Runner.predict_many`: as one LiteRT batch where a
        batch of that size was measured faster than one by one here and bit-identical to ``predict``, else one
        by one (:class:`edgehft.runtime.batching.Batcher`; the first call of a size measures both, ~20 ms).

        Raises:
            InputError, ShapeError, DTypeError, NonFiniteInputError: bad windows, the message naming the index.
            RunnerStateError: closed, or another thread's call is in progress.
        """
        if self.closed:
            self._busy()
        return self._batches().predict_many(windows)

    def batching(self, sizes=None, windows=None) -> dict:
        """How :meth:`predict_many` runs each size: per size measured, µs per input batched and one by one and
        what it does (:meth:`edgehft.runtime.batching.Batcher.report`); ``sizes`` (ints 2..64) are measured first
        on ``windows`` (default: the bundle's golden inputs).

        Raises:
            InputError: a size out of range, or no windows to measure on. RunnerStateError: closed.
        """
        if self.closed:
            self._busy()
        return self._batches().report(sizes, windows)

    def _batches(self):
        from edgehft.runtime.batching import Batcher
        b = self.__dict__.get("_batcher")
        if b is None:
            b = self._batcher = Batcher(self, self._why_no_batch())
        return b

    def _why_no_batch(self) -> str | None:
        """Why this runner's engine never runs a batch (None: LiteRT on the plan's model may)."""
        if getattr(self, "_ort", None) is not None:
            return ("ONNX Runtime plan: its session's inputs and outputs are bound to batch-1 buffers, so "
                    "predict_many calls predict once per window")
        if getattr(self, "_chain", None) is not None:
            return ("native plan: the chain's native kernels (native.json) run one window per call, so "
                    "predict_many calls predict once per window")
        if type(self)._loaded_model_file is not Runner._loaded_model_file:
            return (f"board {self.board} runs a model compiled for its accelerator at batch 1, so predict_many "
                    "calls predict once per window")
        if self.stateful_tensors:
            return ("the model keeps its LSTM state in variable tensors of batch 1 (reset per call), so "
                    "predict_many calls predict once per window")
        return None

    def _make_interpreter(self):
        """The interpreter with tensors allocated (hook: the coral backend adds the Edge TPU delegate).
        With ``op_resolver="auto"``, a model that the XNNPACK delegate refuses to prepare (e.g. a
        RESIZE_BILINEAR whose output XNNPACK does not take) runs on LiteRT's builtin kernels, as its golden
        vectors were made; ``op_resolver`` and ``path`` then say so."""
        try:
            return make_interpreter(self.bundle.model_path, self.threads, self.op_resolver)
        except RuntimeError as exc:
            if self.op_resolver != "auto" or not xnnpack_refused(exc):
                raise
            refused = exc
        self.op_resolver = "builtin"
        self.path = interpreter_path("builtin") + XNNPACK_REFUSED
        self.xnnpack_error = " ".join(str(refused).split())
        return make_interpreter(self.bundle.model_path, self.threads, "builtin")

    def _loaded_model_file(self):
        """The .tflite file the interpreter runs (hook: the coral backend runs the compiled model)."""
        return self.bundle.model_path

    def _io_specs(self) -> tuple[list, list]:
        """``(inputs, outputs)`` TensorSpecs whose ``index`` is a tensor of ``self.interp`` (hook: a
        compiled model numbers its tensors differently from the bundle's ``model.tflite``)."""
        m = self.bundle.manifest
        return list(m.inputs), list(m.outputs)

    def _views_are_stable(self, specs) -> bool:
        details = {d["index"]: d for d in self.interp.get_input_details() + self.interp.get_output_details()}
        if any(-1 in list(details[s.index].get("shape_signature", [])) for s in specs):
            return False
        before = [self.interp.tensor(s.index)().ctypes.data for s in specs]
        self.interp.invoke()
        after = [self.interp.tensor(s.index)().ctypes.data for s in specs]
        return before == after

    def _invoke(self) -> None:  # safe path, replaced by the wrapper's Invoke when views are stable
        for s, buf in zip(self._in_specs, self._staging_in):
            self.interp.set_tensor(s.index, buf)
        if self.stateful_tensors:
            self.interp.reset_all_variables()
        self.interp.invoke()
        for s, buf in zip(self._out_specs, self._staging_out):
            np.copyto(buf, self.interp.get_tensor(s.index))

    def describe(self) -> dict:
        d = super().describe()
        d.update(backend="cpu", interpreter=self.path, zero_copy=self._zero_copy,
                 state_reset_per_call=len(self.stateful_tensors),
                 plan=self.plan or self.bundle.manifest.quantization.mode, plan_source=self.plan_source)
        if getattr(self, "_chain", None):
            d.update(steps=[kind for kind, _ in self._chain.steps])
        if getattr(self, "_ort", None) is not None:
            d.update(engine="onnxruntime", onnx_checker=self.onnx_checked)
        if not self.closed:
            b = self._batches()
            d.update(batching={"batches": b.report()["batches"], "why": b.why_not or b.differs,
                               "sizes_measured": sorted(b.sizes)})
        return d

    def close(self) -> None:
        super().close()
        batcher = self.__dict__.pop("_batcher", None)
        if batcher is not None:
            batcher.close()
        self.inputs, self.outputs = [], []
        self.interp = None
        session, self._ort = getattr(self, "_ort", None), None
        if session is not None:
            session.close()
        chain, self._chain = getattr(self, "_chain", None), None
        if chain is not None:
            chain.close()
