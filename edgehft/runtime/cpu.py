"""The ``cpu`` backend: the bundle's TFLite model on the host CPU through LiteRT (or tflite-runtime).

The hot path is: validate + copy the window into the interpreter's own input buffer, ``Invoke``, copy
the output into a reused buffer. The input/output numpy views are taken once at open; ``Invoke`` is
called on the interpreter wrapper directly, because ``Interpreter.invoke()`` refuses to run while such
views exist (it guards against buffers moving on reallocation). We only keep the views when the
buffers provably stay put: all I/O tensors are static and their addresses are unchanged after a
warm-up ``Invoke``; otherwise every call goes through ``set_tensor``/``invoke``/``get_tensor``.
"""
from __future__ import annotations

import numpy as np

from edgehft.errors import BoardUnavailableError
from edgehft.runtime.base import InputSlot, OutputSlot, Runner as _Runner

OP_RESOLVERS = ("auto", "builtin", "reference")


def load_interpreter_module():
    """``(module, name, version)`` of the first TFLite interpreter found: ai-edge-litert, then tflite-runtime.

    Raises:
        BoardUnavailableError: neither is installed.
    """
    try:
        from ai_edge_litert import interpreter as mod
        from importlib.metadata import version
        return mod, "ai-edge-litert", version("ai-edge-litert")
    except ImportError:
        pass
    try:
        from tflite_runtime import interpreter as mod
        import tflite_runtime
        return mod, "tflite-runtime", getattr(tflite_runtime, "__version__", "?")
    except ImportError:
        raise BoardUnavailableError(
            "no TFLite interpreter is installed",
            hint="pip install ai-edge-litert (or tflite-runtime on boards pinned to numpy < 2)") from None


def interpreter_path(op_resolver: str = "auto") -> str:
    """The name of the interpreter path, as recorded with golden vectors (e.g.
    ``ai-edge-litert 2.3.0 BUILTIN+XNNPACK``)."""
    _, name, ver = load_interpreter_module()
    kind = {"auto": "BUILTIN+XNNPACK", "builtin": "BUILTIN_WITHOUT_DEFAULT_DELEGATES",
            "reference": "BUILTIN_REF"}[op_resolver]
    return f"{name} {ver} {kind}"


def make_interpreter(model_path: str, threads: int = 1, op_resolver: str = "auto"):
    """A LiteRT ``Interpreter`` with tensors allocated. ``op_resolver``: ``auto`` (optimized kernels +
    the XNNPACK delegate), ``builtin`` (optimized kernels, no delegate), ``reference`` (reference kernels)."""
    if op_resolver not in OP_RESOLVERS:
        raise ValueError(f"op_resolver must be one of {OP_RESOLVERS}, got {op_resolver!r}")
    mod, _, _ = load_interpreter_module()
    kind = {"auto": mod.OpResolverType.AUTO,
            "builtin": mod.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
            "reference": mod.OpResolverType.BUILTIN_REF}[op_resolver]
    interp = mod.Interpreter(model_path=str(model_path), num_threads=threads,
                             experimental_op_resolver_type=kind)
    interp.allocate_tensors()
    return interp


class Runner(_Runner):
    """LiteRT on the host. ``op_resolver`` as in :func:`make_interpreter`."""

    def __init__(self, bundle, board, *, threads: int = 1, affinity=None, op_resolver: str = "auto"):
        super().__init__(bundle, board, threads=threads, affinity=affinity)
        self.op_resolver = op_resolver
        self.path = interpreter_path(op_resolver)
        self.interp = make_interpreter(bundle.model_path, self.threads, op_resolver)
        m = bundle.manifest
        self._zero_copy = self._views_are_stable(m)
        if self._zero_copy:
            self.inputs = [InputSlot(s, self.interp.tensor(s.index)()) for s in m.inputs]
            self.outputs = [OutputSlot(s, self.interp.tensor(s.index)()) for s in m.outputs]
            self._invoke = self.interp._interpreter.Invoke
            self._bind_fast_paths()
        else:
            self._staging_in = [np.empty(s.shape, dtype=s.dtype) for s in m.inputs]
            self._staging_out = [np.empty(s.shape, dtype=s.dtype) for s in m.outputs]
            self.inputs = [InputSlot(s, buf) for s, buf in zip(m.inputs, self._staging_in)]
            self.outputs = [OutputSlot(s, buf) for s, buf in zip(m.outputs, self._staging_out)]

    def _views_are_stable(self, m) -> bool:
        specs = list(m.inputs) + list(m.outputs)
        details = {d["index"]: d for d in self.interp.get_input_details() + self.interp.get_output_details()}
        if any(-1 in list(details[s.index].get("shape_signature", [])) for s in specs):
            return False
        before = [self.interp.tensor(s.index)().ctypes.data for s in specs]
        self.interp.invoke()
        after = [self.interp.tensor(s.index)().ctypes.data for s in specs]
        return before == after

    def _invoke(self) -> None:  # safe path, replaced by the wrapper's Invoke when views are stable
        for s, buf in zip(self.bundle.manifest.inputs, self._staging_in):
            self.interp.set_tensor(s.index, buf)
        self.interp.invoke()
        for s, buf in zip(self.bundle.manifest.outputs, self._staging_out):
            np.copyto(buf, self.interp.get_tensor(s.index))

    def describe(self) -> dict:
        d = super().describe()
        d.update(backend="cpu", interpreter=self.path, zero_copy=self._zero_copy)
        return d

    def close(self) -> None:
        super().close()
        self.inputs, self.outputs = [], []
        self.interp = None


def delegated_ops(interp) -> dict[int, str]:
    """Which original ops a delegate (XNNPACK) took: ``{op_index: "XNNPACK"}``; absent ops run on
    LiteRT's builtin kernels.

    LiteRT appends one ``DELEGATE`` node per delegated partition and keeps the replaced nodes in its
    node list. A partition's ops are found by walking back from the delegate node's outputs to its
    inputs.
    """
    details = interp._get_ops_details()
    originals = [d for d in details if d["op_name"] != "DELEGATE"]
    producer = {}
    for d in originals:
        for t in d["outputs"]:
            producer[int(t)] = d["index"]
    by_index = {d["index"]: d for d in originals}
    taken: dict[int, str] = {}
    for d in details:
        if d["op_name"] != "DELEGATE":
            continue
        stop = {int(t) for t in d["inputs"]}
        todo = [int(t) for t in d["outputs"]]
        seen = set()
        while todo:
            t = todo.pop()
            if t in stop or t in seen or t not in producer:
                continue
            seen.add(t)
            op = producer[t]
            taken[op] = "XNNPACK"
            todo.extend(int(i) for i in by_index[op]["inputs"] if int(i) >= 0)
    return taken
