"""LiteRT (or tflite-runtime) helpers shared by every backend that runs TFLite models on a host CPU: the cpu
board, the CPU ops of a Coral board, the LiteRT segments of a PYNQ overlay's chain and of the native plans.
Which interpreter package is installed, the op-resolver paths, opening a validated model, the buffers
that stay put, which ops XNNPACK took, and the variable (state) tensors. Knows no backend.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from pathlib import Path

from edgehft.errors import BoardUnavailableError

OP_RESOLVERS = ("auto", "builtin", "reference")
INTERPRETERS = ("ai-edge-litert", "tflite-runtime")     # the TFLite interpreter distributions, in the order taken


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


def check_model_file(model_path) -> None:
    """Validate the ``.tflite`` at ``model_path`` before LiteRT reads it (:mod:`edgehft.ir.validate`: its
    flatbuffer structure, indices, constant buffer sizes, quantization parameters).

    Raises:
        BundleError: it is not a valid TFLite model, or cannot be read; the message names the file and why.
    """
    from edgehft.errors import BundleError, InputError
    from edgehft.ir import TFLiteModel
    try:
        TFLiteModel.from_file(model_path)
    except InputError as exc:
        raise BundleError(exc.args[0], hint=exc.hint) from None
    except OSError as exc:
        raise BundleError(f"{model_path} cannot be read: {exc.strerror or exc}") from None


# What the LiteRT C++ runtime writes to stderr when an interpreter is made that says nothing to a user: it came
# on every command (issue 19). Whole lines, compared without their line ending.
QUIET_LINES = (b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",)
_QUIET_LOCK = threading.Lock()     # fd 2 is the process's: one redirect at a time


@contextlib.contextmanager
def quiet_runtime_info():
    """Around making a LiteRT interpreter (its constructor and ``allocate_tensors``, where the runtime logs):
    file descriptor 2 goes to a temporary file, and when the block ends everything written there goes back to
    stderr except the lines in :data:`QUIET_LINES`. Errors and warnings of the runtime (and anything else
    written meanwhile) still reach the user, after the block; nothing outside the block is touched. Where fd 2
    cannot be duplicated (closed), the block runs as is."""
    with _QUIET_LOCK:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):
            yield
            return
        try:
            with tempfile.TemporaryFile() as tmp:
                os.dup2(tmp.fileno(), 2)
                try:
                    yield
                finally:
                    with contextlib.suppress(OSError, ValueError, AttributeError):
                        sys.stderr.flush()
                    os.dup2(saved, 2)
                    tmp.seek(0)
                    _write_fd2(b"".join(line for line in tmp.read().splitlines(keepends=True)
                                        if line.rstrip(b"\r\n") not in QUIET_LINES))
        finally:
            os.close(saved)


def _write_fd2(data: bytes) -> None:
    """All of ``data`` to file descriptor 2 (a short write goes on from where it stopped)."""
    view = memoryview(data)
    while view:
        view = view[os.write(2, view):]


def make_interpreter(model_path: str, threads: int = 1, op_resolver: str = "auto"):
    """A LiteRT ``Interpreter`` with tensors allocated. ``op_resolver``: ``auto`` (optimized kernels +
    the XNNPACK delegate), ``builtin`` (optimized kernels, no delegate), ``reference`` (reference kernels).
    The model file is validated first (:func:`check_model_file`).

    Raises:
        BundleError: ``model_path`` is not a valid TFLite model; it is an Edge TPU compiled model
            (``edgetpu-custom-op``) or holds another custom op this interpreter has no kernel for
            (:func:`unresolved_custom_op`).
        BoardUnavailableError: no TFLite interpreter is installed.
    """
    if op_resolver not in OP_RESOLVERS:
        raise ValueError(f"op_resolver must be one of {OP_RESOLVERS}, got {op_resolver!r}")
    mod, _, _ = load_interpreter_module()
    check_model_file(model_path)
    kind = {"auto": mod.OpResolverType.AUTO,
            "builtin": mod.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
            "reference": mod.OpResolverType.BUILTIN_REF}[op_resolver]
    try:
        with quiet_runtime_info():
            interp = mod.Interpreter(model_path=str(model_path), num_threads=threads,
                                     experimental_op_resolver_type=kind)
            interp.allocate_tensors()
    except (RuntimeError, ValueError) as exc:
        err = unresolved_custom_op(exc, model_path)
        if err is None:
            raise
        raise err from exc
    return interp


def stable_views(interp, indices: list[int]):
    """numpy views of these tensors' buffers when they provably stay put (static shapes, addresses
    unchanged by an Invoke), else None. The caller then invokes through ``interp._interpreter.Invoke``
    (``Interpreter.invoke()`` refuses to run while views exist)."""
    details = {d["index"]: d for d in interp.get_input_details() + interp.get_output_details()}
    if any(-1 in list(details[i].get("shape_signature", [])) for i in indices):
        return None
    before = [interp.tensor(i)().ctypes.data for i in indices]
    interp.invoke()
    if [interp.tensor(i)().ctypes.data for i in indices] != before:
        return None
    return [interp.tensor(i)() for i in indices]


XNNPACK_REFUSED = " (XNNPACK refused to prepare the model)"


def xnnpack_refused(exc: BaseException) -> bool:
    """Whether an interpreter error is the XNNPACK delegate failing to prepare (LiteRT's text: "Node
    number N (TfLiteXNNPackDelegate) failed to prepare"); the model's builtin kernels may still run it."""
    text = str(exc)
    return "TfLiteXNNPackDelegate" in text and "failed to prepare" in text


def variable_tensors(model_file) -> list[str]:
    """Names of the model's variable tensors (e.g. an int8 LSTM's hidden and cell state), which the
    runner resets to their initial value (TFLite: zero point for int8, zero otherwise) before each call."""
    from edgehft.ir import TFLiteModel
    m = TFLiteModel.from_file(model_file)
    return [t.name for g in m.subgraphs for t in g.tensors if t.is_variable]


def delegated_ops(interp) -> dict[int, str]:
    """Which original ops a delegate (XNNPACK) took: ``{op_index: "XNNPACK"}``; absent ops run on
    LiteRT's builtin kernels.

    LiteRT appends one ``DELEGATE`` node per delegated partition and keeps the replaced nodes in its
    node list. A partition's ops are found by walking back from the delegate node's outputs to its
    inputs.
    """
    if interp is None:          # the native plan's chain: no whole-model interpreter
        return {}
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


def unresolved_custom_op(exc: BaseException, model_path=None):
    """The BundleError for LiteRT's "Encountered unresolved custom op: edgetpu-custom-op" (an Edge TPU
    compiled model opened without its delegate), or None for any other interpreter error (another custom op
    included: LiteRT's RuntimeError then reaches the caller, whose fallbacks handle it)."""
    import re
    from edgehft.errors import BundleError
    m = re.search(r"unresolved custom op: ([\w-]+(?:\.[\w-]+)*)", str(exc))
    if m is None:
        return None
    name, op = (Path(str(model_path)).name if model_path else "the model"), m.group(1)
    if op == "edgetpu-custom-op":
        cpu_model = (name[: -len("_edgetpu.tflite")] + ".tflite" if name.endswith("_edgetpu.tflite")
                     else "(the int8 model the converter wrote, not the edgetpu_compiler output)")
        return BundleError(f"{name} is compiled for the Edge TPU (it holds edgetpu-custom-op) and was opened "
                           "without the Edge TPU delegate",
                           hint=f"open it with board coral-* (Edge TPU delegate) or use the CPU model {cpu_model}")
    return None     # another custom op: the caller's own fallbacks handle LiteRT's error (golden vectors do)
