"""ONNX Runtime as an engine of the cpu board: the ``ort-float`` and ``ort-int8`` plans (issue 15 item 5).

A plan of this kind is a bundle (or a sub-bundle ``plans/<plan>/``) whose ``model_file`` is ``model.onnx``:
the float32 ONNX export of the model (``ort-float``) or ONNX Runtime's own static int8 quantization of it as
a Q/DQ graph (``ort-int8``: int8 activations, per-channel 7-bit weights). ONNX Runtime is the engine: its
CPU execution provider with its default graph optimizations (``ORT_ENABLE_ALL``, which fuses a Q/DQ graph
into its int8 kernels: QLinearConv, QLinearMatMul, QGemm...), one intra-op and one inter-op thread,
sequential execution. The ``reference`` kernel path (what golden tolerances are measured against) is the
same model with every graph optimization off and Q/DQ kept as float ops (``session.disable_quant_qdq``):
the ONNX semantics, no fused kernel.

The model is untrusted input, like a ``.tflite``: before a session opens it, :func:`validate_model` checks it
with ``onnx.checker`` where the ``onnx`` package is installed (and refuses tensors kept in external files and
custom operator domains); the session is made from the verified bytes, never from a path, with external
initializers pointed at a directory that does not exist, so a model cannot make ONNX Runtime read a file
beside it or in the working directory; no custom op library is ever registered. The first open of a bundle
on a machine runs in a child process (:mod:`edgehft.runtime.isolate`), so a model that crashes ONNX Runtime
is an error there. ``onnxruntime`` missing is :class:`~edgehft.errors.BoardUnavailableError` (exit 7).

I/O: the inputs and outputs are numpy buffers made once and bound to the session as OrtValues
(``io_binding``), and each call runs the C-level ``run_with_iobinding`` with one preallocated RunOptions, so
``predict`` writes the window into the bound input, runs, and reads the bound output: no Python allocation
per call (a ``None`` RunOptions made one per call). Nothing here imports TensorFlow; it runs on boxes.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from edgehft.errors import BoardUnavailableError, BundleError

ORT_PLANS = ("ort-float", "ort-int8")
LEVELS = {"auto": "ORT_ENABLE_ALL", "builtin": "ORT_ENABLE_ALL", "reference": "ORT_DISABLE_ALL"}
MAX_MODEL_BYTES = 2 << 30                       # protobuf's own limit for one serialized model
# ONNX Runtime's built-in operator domains; a model naming any other needs a custom op library (never loaded)
BUILTIN_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc", "ai.onnx.preview.training")
# where external initializers would be looked for: a path that does not exist, so none can be read
NO_EXTERNAL_DATA = "/nonexistent/edgehft-onnx-models-carry-no-external-data"
_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(int8)": "int8",
           "tensor(uint8)": "uint8", "tensor(int16)": "int16", "tensor(int32)": "int32", "tensor(int64)": "int64",
           "tensor(float16)": "float16", "tensor(bool)": "bool"}
_HINT = ("the model file is corrupt or hostile though its hashes match the manifest: compile the bundle again "
         "from the source model")
INSTALL_HINT = ("pip install onnxruntime (into the Python that runs edgehft on this machine), or run another of "
                "the bundle's plans (--plan NAME)")


def is_ort_plan(mode: str) -> bool:
    """Whether the plan ``mode`` (a manifest's ``quantization.mode``) runs on ONNX Runtime."""
    return mode in ORT_PLANS


def load_onnxruntime():
    """``(onnxruntime module, its version)``.

    Raises:
        BoardUnavailableError: onnxruntime is not installed, or fails to import (exit 7, naming the fix).
    """
    try:
        import onnxruntime
    except ImportError as exc:
        raise BoardUnavailableError(f"ONNX Runtime is not installed here ({exc}): the ort-float and ort-int8 "
                                    "plans run on it (pip install onnxruntime)", hint=INSTALL_HINT) from None
    return onnxruntime, getattr(onnxruntime, "__version__", "?")


def engine_path(op_resolver: str = "auto") -> str:
    """The engine's name as golden vectors record it, e.g. ``onnxruntime 1.32.0 CPUExecutionProvider
    ORT_ENABLE_ALL``; ``op_resolver`` as the cpu runner's (``reference``: graph optimizations off, Q/DQ as
    float ops).

    Raises:
        BoardUnavailableError: onnxruntime is not installed.
    """
    _, ver = load_onnxruntime()
    level = LEVELS[op_resolver]
    return f"onnxruntime {ver} CPUExecutionProvider {level}" + (" (Q/DQ as float ops)" if op_resolver == "reference"
                                                                 else "")


def read_model(path: str | Path) -> bytes:
    """The bytes of the ONNX model at ``path`` (a verified bundle file).

    Raises:
        BundleError: it cannot be read, or is larger than protobuf allows (2 GiB).
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_MODEL_BYTES + 1)
    except OSError as exc:
        raise BundleError(f"{path} cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_MODEL_BYTES:
        raise BundleError(f"{path} is over {MAX_MODEL_BYTES:,} B, more than one ONNX model may be", hint=_HINT)
    return data


def validate_model(data: bytes, name: str) -> bool:
    """Check the ONNX model ``data`` before any session reads it: with the ``onnx`` package, that it parses,
    passes ``onnx.checker``, keeps every tensor inside the file (no external data) and uses only ONNX
    Runtime's built-in operator domains. Without ``onnx`` only the first open in a child process
    (:mod:`edgehft.runtime.isolate`) and ONNX Runtime's own parser check it. Returns whether ``onnx`` checked.

    Raises:
        BundleError: naming ``name`` and what is wrong (exit 6).
    """
    try:
        import onnx
    except ImportError:
        return False
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and whatever a hostile file causes
        raise BundleError(f"{name} is not an ONNX model ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})",
                          hint=_HINT) from None
    problems = _model_problems(model, onnx)
    if not problems:
        try:
            onnx.checker.check_model(model)
        except Exception as exc:  # noqa: BLE001 - ValidationError, and anything else the checker trips on
            problems.append(f"onnx.checker refuses it ({' '.join(str(exc).split())[:240]})")
    if problems:
        raise BundleError(f"{name} is refused: " + "; ".join(problems[:3]), hint=_HINT)
    return True


def _model_problems(model, onnx) -> list[str]:
    """Tensors stored outside the model file, and operator domains ONNX Runtime has no built-in kernels for,
    anywhere in ``model`` (its graph, subgraphs in node attributes, functions)."""
    domains = {o.domain for o in model.opset_import} | {f.domain for f in model.functions}
    nodes = [n for f in model.functions for n in f.node]
    graphs, tensors = [model.graph], []
    while graphs or nodes:
        if graphs:
            g = graphs.pop()
            nodes += list(g.node)
            tensors += list(g.initializer) + [s.values for s in g.sparse_initializer]
            continue
        n = nodes.pop()
        domains.add(n.domain)
        for a in n.attribute:
            tensors += ([a.t] if a.HasField("t") else []) + list(a.tensors) + [s.values for s in a.sparse_tensors]
            graphs += ([a.g] if a.HasField("g") else []) + list(a.graphs)
    external = sorted({t.name for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL or len(t.external_data)})
    problems = []
    if external:
        problems.append(f"{len(external)} tensor(s) keep their data in external files ({', '.join(external[:2])}); "
                        "a bundle's ONNX model carries all of its weights")
    foreign = sorted(d for d in domains if d not in BUILTIN_DOMAINS)
    if foreign:
        problems.append(f"it uses operator domain(s) {', '.join(repr(d) for d in foreign[:3])}, which need a custom "
                        "op library (edgehft never loads one)")
    return problems


def make_session(data: bytes, name: str, threads: int = 1, op_resolver: str = "auto", qdq: bool = False):
    """An ONNX Runtime ``InferenceSession`` on the model bytes ``data`` (validated by the caller): the CPU
    execution provider only, ``threads`` intra-op threads, one inter-op thread, sequential, the graph
    optimization level of ``op_resolver`` (:data:`LEVELS`; ``reference`` with a Q/DQ graph (``qdq``) also keeps
    every Q/DQ node as itself), errors only in ONNX Runtime's log, external initializers looked for nowhere.

    Raises:
        BoardUnavailableError: onnxruntime is not installed.
        BundleError: ONNX Runtime refuses the model (its reason, naming ``name``).
    """
    ort, _ = load_onnxruntime()
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = int(threads), 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[op_resolver])
    so.log_severity_level = 3
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", NO_EXTERNAL_DATA)
    if op_resolver == "reference" and qdq:
        so.add_session_config_entry("session.disable_quant_qdq", "1")   # else a DQ read by several nodes is copied
    try:
        return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own exception types derive from Exception only
        raise BundleError(f"{name}: ONNX Runtime cannot open the model ({type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:300]})", hint=_HINT) from None


def check_session_io(specs: list, args: list, role: str, name: str) -> None:
    """The manifest's ``specs`` (TensorSpecs, in order) against the session's ``args`` (``get_inputs()`` or
    ``get_outputs()``, in order): as many, each with the spec's static shape and dtype. The spec's ``index``
    is the position.

    Raises:
        BundleError: a count, shape or dtype that differs (naming the tensor).
    """
    if len(specs) != len(args):
        raise BundleError(f"{name}: the manifest names {len(specs)} {role}(s), the model has {len(args)}", hint=_HINT)
    for k, (s, a) in enumerate(zip(specs, args)):
        shape = tuple(d if isinstance(d, int) else None for d in a.shape)
        dtype = _DTYPES.get(a.type, a.type)
        if s.index != k or shape != tuple(s.shape) or dtype != s.dtype:
            raise BundleError(f"{name}: the manifest's {role} {s.name!r} (index {s.index}) is {s.dtype} "
                              f"{tuple(s.shape)}, the model's {role} {k} {a.name!r} is {dtype} {list(a.shape)}",
                              hint=_HINT)


class Binding:
    """A session with its inputs and outputs bound to numpy buffers made here (``inputs``/``outputs``, in the
    manifest's order, each of the spec's shape and dtype); :meth:`invoke` runs the model on what the inputs
    hold and leaves the results in the outputs. Preallocated: no Python allocation per call."""

    def __init__(self, session, in_specs: list, out_specs: list):
        from onnxruntime import OrtValue, RunOptions
        self.session = session
        self.inputs = [np.zeros(s.shape, np.dtype(s.dtype)) for s in in_specs]
        self.outputs = [np.zeros(s.shape, np.dtype(s.dtype)) for s in out_specs]
        self._io = session.io_binding()
        self._values = []                               # the OrtValues keep the numpy buffers bound
        for arg, buf in zip(session.get_inputs(), self.inputs):
            v = OrtValue.ortvalue_from_numpy(buf)
            self._io.bind_ortvalue_input(arg.name, v)
            self._values.append(v)
        for arg, buf in zip(session.get_outputs(), self.outputs):
            v = OrtValue.ortvalue_from_numpy(buf)
            self._io.bind_ortvalue_output(arg.name, v)
            self._values.append(v)
        self._options = RunOptions()
        c_session, c_binding = getattr(session, "_sess", None), getattr(self._io, "_iobinding", None)
        if c_session is not None and c_binding is not None:     # the C-level call: no wrapper work per call
            self.invoke = functools.partial(c_session.run_with_iobinding, c_binding, self._options)
        else:
            self.invoke = functools.partial(session.run_with_iobinding, self._io, self._options)

    def close(self) -> None:
        """Drop the binding and the session (the buffers stay valid numpy arrays)."""
        self.invoke = _closed
        self._io = self._values = self.session = None


def _closed() -> None:
    raise BundleError("the ONNX Runtime session is closed")


def open_plan(model_path: Path, in_specs: list, out_specs: list, threads: int = 1, op_resolver: str = "auto",
              qdq: bool = False) -> tuple[Binding, str, bool]:
    """Validate the ONNX model at ``model_path``, open it (:func:`make_session`), check its I/O against the
    manifest's specs and bind them. Returns ``(binding, engine path, whether onnx.checker validated it)``.

    Raises:
        BoardUnavailableError: onnxruntime is not installed (exit 7).
        BundleError: the model is refused by the checks, by ONNX Runtime, or has other I/O than the manifest.
    """
    name = Path(model_path).name
    load_onnxruntime()
    data = read_model(model_path)
    checked = validate_model(data, name)
    session = make_session(data, name, threads, op_resolver, qdq)
    check_session_io(in_specs, session.get_inputs(), "input", name)
    check_session_io(out_specs, session.get_outputs(), "output", name)
    return Binding(session, in_specs, out_specs), engine_path(op_resolver), checked
