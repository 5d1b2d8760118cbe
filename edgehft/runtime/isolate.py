"""The first open of an untrusted model runs in a child process, so that a crash there is an error here.

:mod:`edgehft.ir.validate` refuses a structurally broken or inconsistent ``.tflite`` before any interpreter
sees it, but LiteRT's own prepare and invoke can still crash on a model that passes (a kernel that aborts on
parameters it did not expect). So the first open of a bundle on a machine, and one invoke on its golden
inputs (zeros without them), happen in a child (``python -m edgehft.runtime.isolate``) that opens it the way
the caller will. A child killed by a signal becomes a :class:`~edgehft.errors.BundleError` naming it; an error
the child raised is raised here as the same class; LiteRT's own refusals (its RuntimeError/ValueError) become
a BundleError with LiteRT's reason. Nothing of the model ever ran in this process when it fails.

A success is remembered per process and as a marker file (``$EDGEHFT_CACHE``, else
``$XDG_CACHE_HOME/edgehft``, else ``~/.cache/edgehft``, then ``opened/``) keyed by the SHA-256 of every bundle
file (the model's among them), the board, the options, the interpreter and edgehft versions: a box pays the
child once per bundle. The predict hot path is not touched.

A plan that runs on ONNX Runtime (:mod:`edgehft.runtime.ort`) is isolated the same way: its first open makes
the session and runs it once in the child, whose messages then name ONNX Runtime.

What is isolated is each backend's own declaration (:attr:`edgehft.backends.Backend.isolate`, see
:func:`isolated`): the cpu board (whole-model and native plans), a plugin whose Runner subclasses the cpu
board's, and Coral/PYNQ boards under ``emulate`` (the whole runner); on a PYNQ overlay, the LiteRT segments
of ``steps.json``. Not isolated: a Coral board's compiled model on a real Edge TPU (the delegate owns the
device; its flatbuffer is still validated) and Jetson engines (TensorRT, not LiteRT).
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from edgehft.errors import BundleError, EdgeHFTError

DEFAULT_TIMEOUT_S = 300.0
RESOLVERS = ("auto", "builtin", "reference")
_MARK = "EDGEHFT-ISOLATED-OPEN "
_HINT = ("the model file is corrupt or hostile though its hashes match the manifest: compile the bundle again "
         "from the source model, or copy it again from where it was compiled")
_passed: set = set()
LITERT, ORT = "LiteRT", "ONNX Runtime"        # the engines the messages name
_ON_CPU = "cpu"         # a steps.json step's placement (the report schema's accelerator / cpu), not a board kind


def cache_dir() -> Path:
    """Where the markers of bundles opened safely on this machine live."""
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("EDGEHFT_CACHE") or xdg / "edgehft") / "opened"


def first_open(bundle, spec, threads: int, options: dict, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Open ``bundle`` (a verified :class:`~edgehft.bundle.Bundle`) on board ``spec`` in a child process,
    unless this machine already did with the same files and options. Returns whether a child ran.

    The same holds for a plan that runs on ONNX Runtime (``ort-float``/``ort-int8``): its session is made and
    run once on the golden inputs in the child, and the messages name ONNX Runtime.

    Raises:
        BundleError: the child was killed by a signal (named) or ran past ``timeout_s`` seconds, or LiteRT
            (ONNX Runtime) refused the model; any other EdgeHFTError the child's open raised, as its own class.
        BoardUnavailableError: an ONNX Runtime plan where onnxruntime is not installed (no child is started).
    """
    request = _request(bundle, spec, threads, options)
    if request is None:
        return False
    engine = _engine(bundle)
    if engine == ORT:                       # missing here: said at once, no child started for it
        from edgehft.runtime.ort import load_onnxruntime
        load_onnxruntime()
    key = _key(bundle, request)
    marker = cache_dir() / key
    if key in _passed or marker.is_file():
        _passed.add(key)
        return False
    _raise_for(_run_child(request, timeout_s), f"bundle {bundle.path}", engine)
    _passed.add(key)
    _remember(marker, bundle)
    return True


def check_models(paths: list, threads: int = 1, resolvers=RESOLVERS, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict:
    """Open each ``.tflite`` in ``paths`` with each LiteRT kernel path in ``resolvers`` and invoke it once on
    zeros, in a child process. Returns ``{"refusals": ["auto: <LiteRT's reason>", ...], "io": [...]}``: LiteRT's
    refusals are not raised (the caller's own code handles them), and ``io`` lists the inputs and outputs whose
    static shape or dtype in the flatbuffer differs from what LiteRT made of them. Only a crash or a hang is
    an error.

    Raises:
        BundleError: the child was killed by a signal or ran past ``timeout_s`` seconds (naming the model and
            the kernel path it had reached).
    """
    request = {"mode": "models", "models": [str(Path(p).resolve()) for p in paths], "threads": int(threads),
               "resolvers": list(resolvers)}
    result = _run_child(request, timeout_s)
    _raise_for(result, ", ".join(Path(p).name for p in paths))
    return {"refusals": result.get("refusals", []), "io": result.get("io", [])}


def isolated(backend) -> tuple:
    """What the first open on ``backend`` (:class:`edgehft.backends.Backend`) isolates: its ``isolate``, or,
    when it declares none, ``("runner",)`` if its ``Runner`` subclasses the cpu board's (it runs LiteRT here)
    and ``()`` otherwise.

    Raises:
        BoardUnavailableError: its runtime module cannot be imported (only asked when ``isolate`` is None).
    """
    if backend.isolate is not None:
        return tuple(backend.isolate)
    from edgehft.runtime.cpu import Runner as CpuRunner
    runner = getattr(backend.load("runtime"), "Runner", None)
    return ("runner",) if isinstance(runner, type) and issubclass(runner, CpuRunner) else ()


def _request(bundle, spec, threads: int, options: dict) -> dict | None:
    from edgehft import backends
    what = isolated(backends.get(spec.backend))
    if "runner" in what or ("emulated" in what and options.get("emulate")):
        return {"mode": "runner", "bundle": str(Path(bundle.path).resolve()), "board": spec.model_dump(mode="json"),
                "threads": int(threads), "options": {k: _plain(v) for k, v in sorted(options.items())}}
    if "cpu_steps" in what and bundle.manifest.artifacts.get("steps"):
        try:
            graph = json.loads(bundle.resolve(bundle.manifest.artifacts["steps"]).read_text())
            models = [str(bundle.resolve(st["model"])) for st in graph["steps"] if st["placement"] == _ON_CPU]
        except (EdgeHFTError, OSError, ValueError, KeyError, TypeError):
            return None                     # a damaged steps.json: the runner refuses it with its own message
        return {"mode": "models", "models": models, "threads": int(threads), "resolvers": ["auto"]} if models else None
    return None


def _engine(bundle) -> str:
    """The engine that runs ``bundle``'s model, as the messages name it."""
    from edgehft.runtime.ort import is_ort_plan
    return ORT if is_ort_plan(bundle.manifest.quantization.mode) else LITERT


def _engine_versions(bundle) -> dict:
    """The versions of what runs ``bundle`` here, for the marker's key (a new engine must be tried again)."""
    from edgehft.errors import BoardUnavailableError
    from edgehft.runtime.litert import load_interpreter_module
    out = {}
    try:
        _, name, version = load_interpreter_module()
        out["interpreter"] = f"{name} {version}"
    except BoardUnavailableError:
        out["interpreter"] = "none"
    if _engine(bundle) == ORT:
        from edgehft.runtime.ort import load_onnxruntime
        out["onnxruntime"] = load_onnxruntime()[1]
    return out


def _plain(value):
    return str(value) if isinstance(value, Path) else value


def _key(bundle, request: dict) -> str:
    from edgehft.version import VERSION as __version__
    # the manifest too: it is not in its own files map, and a hostile one beside known-good files must be tried
    ident = {"files": dict(sorted(bundle.manifest.files.items())), "request": {**request, "bundle": None},
             "manifest": hashlib.sha256(bundle.manifest.model_dump_json().encode()).hexdigest(),
             **_engine_versions(bundle), "edgehft": __version__, "python": sys.version.split()[0]}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def _remember(marker: Path, bundle) -> None:
    """Write the marker atomically; a cache that cannot be written leaves the per-process memory only."""
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_name(f".{marker.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"bundle": str(bundle.path), "files": bundle.manifest.files}) + "\n")
        os.replace(tmp, marker)
    except OSError:
        pass


def _child_env() -> dict:
    """This process's environment, with the directory this edgehft is imported from first on PYTHONPATH."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else ""), "PYTHONSAFEPATH": "1"}


def _run_child(request: dict, timeout_s: float) -> dict:
    """Run the child on ``request``; its result dict, or ``{"signal": name}`` / ``{"timeout": s}`` /
    ``{"failed": rc, "tail": stderr}``."""
    cmd = [sys.executable, "-m", "edgehft.runtime.isolate", json.dumps(request)]
    try:
        # cwd "/" and PYTHONSAFEPATH: `-m` puts the working directory first on sys.path, and a bundle directory
        # there (`cd bundle && edgehft run .`) would shadow the standard library with the bundle's files
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout_s,
                           stdin=subprocess.DEVNULL, env=_child_env(), cwd="/")
    except subprocess.TimeoutExpired as exc:          # killed; its last line says how far it got
        return {**(_last_result(exc.stdout) or {}), "timeout": timeout_s}
    result = _last_result(p.stdout)
    if p.returncode < 0:
        result = {**(result or {}), "signal": _signal_name(-p.returncode)}
    elif result is None:
        result = {"failed": p.returncode, "tail": " | ".join(p.stderr.strip().splitlines()[-3:])[-400:]}
    return result


def _last_result(stdout) -> dict | None:
    """The child's last result line (its progress, or its outcome), or None."""
    if isinstance(stdout, bytes):
        stdout = stdout.decode("utf-8", "replace")
    lines = [ln for ln in (stdout or "").splitlines() if ln.startswith(_MARK)]
    return json.loads(lines[-1][len(_MARK):]) if lines else None


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _raise_for(result: dict, what: str, engine: str = "LiteRT") -> None:
    step = f" while {result['step']}" if result.get("step") else ""
    if "signal" in result:
        raise BundleError(f"{what}: {engine} crashed ({result['signal']}){step}, in an isolated child process; "
                          "nothing of the model ran here", hint=_HINT)
    if "timeout" in result:
        raise BundleError(f"{what}: the model did not open and run once within {result['timeout']:.0f} s{step} "
                          "(an isolated child process, now stopped)", hint=_HINT)
    if "failed" in result:
        raise BundleError(f"{what}: the isolated first open failed (exit status {result['failed']}): "
                          f"{result['tail']}", hint="check that edgehft imports in `python -m edgehft.runtime.isolate`")
    if "error" in result:
        raise _rebuild(result, what, engine)


def _rebuild(result: dict, what: str, engine: str = "LiteRT") -> BaseException:
    """The child's exception as one of this process: the same EdgeHFTError class and message; LiteRT's own
    refusals and any other exception as a BundleError."""
    import builtins
    import importlib
    message, hint = result.get("message", ""), result.get("hint")
    if result.get("litert"):
        return BundleError(f"{what}: {engine} cannot open the model ({result['error']}: {message})".replace("\n", " "),
                           hint=_HINT)
    try:
        cls = getattr(importlib.import_module(result.get("module", "")), result["error"])
    except (ImportError, AttributeError, KeyError, ValueError):
        cls = getattr(builtins, result.get("error", ""), None)
    if isinstance(cls, type) and issubclass(cls, EdgeHFTError):
        exc = cls.__new__(cls)
        EdgeHFTError.__init__(exc, message, hint)
        return exc
    # Anything else (KeyError, ValueError, MemoryError, ... from a plan or manifest that does not fit the
    # model) is the bundle's fault at open: exit 6 with the reason, never a traceback in the caller.
    return BundleError(f"{what}: the bundle cannot be opened: {result.get('error')}: {message}".replace("\n", " "),
                       hint=_HINT)


# -- the child --------------------------------------------------------------------------------------------
def _open_runner(request: dict, progress: dict) -> None:
    """Open the bundle as :func:`edgehft.runtime.open` would (without the isolation) and run it on its golden
    inputs, or on zeros where it has none."""
    import numpy as np

    from edgehft.boards import Board
    from edgehft.bundle import load_bundle
    b = load_bundle(request["bundle"], verify=True)
    spec = Board.model_validate(request["board"])          # as the caller loaded it (its catalog may differ)
    from edgehft import backends
    module = backends.get(spec.backend).load("runtime")     # a plugin's runtime module too
    progress["step"] = "opening it"
    runner = module.Runner(b, spec, threads=request["threads"], **request["options"])
    try:
        progress["step"] = "running it once"
        runner.predict_raw(*(np.zeros(s.spec.shape, s.dtype) for s in runner.inputs))
        windows = _golden_inputs(b)
        progress["step"] = "running it on its golden inputs"
        for n in range(len(windows[0]) if windows else 0):
            runner.predict_raw(*(w[n:n + 1] for w in windows))
    finally:
        runner.close()
    progress.pop("step", None)


def _golden_inputs(b) -> list:
    try:
        ins, _ = b.golden()
    except EdgeHFTError:                # no or damaged golden vectors: their own checks say so, not this one
        return []
    return [ins[s.name] for s in b.manifest.inputs]


def _open_models(request: dict, progress: dict) -> None:
    import numpy as np

    from edgehft.runtime.litert import make_interpreter
    refusals, io = progress.setdefault("refusals", []), progress.setdefault("io", [])
    for path in request["models"]:
        checked = False
        for resolver in request["resolvers"]:
            progress["step"] = f"opening {Path(path).name} on LiteRT's {resolver} kernels"
            try:
                it = make_interpreter(path, request["threads"], resolver)
                if not checked:                 # the I/O LiteRT made of the model, on the first path that opens it
                    io.extend(_io_mismatches(path, it))
                    checked = True
                for d in it.get_input_details():
                    it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
                progress["step"] = f"running {Path(path).name} on LiteRT's {resolver} kernels"
                it.invoke()
            except (RuntimeError, ValueError) as exc:
                refusals.append(f"{resolver}: {' '.join(str(exc).split())[:300]}")
            it = None
    progress.pop("step", None)


def _io_mismatches(path: str, it) -> list:
    """The graph inputs and outputs of static shape whose shape or dtype LiteRT sees otherwise than the
    flatbuffer declares (e.g. an output declared (1, 131) that its op makes (1, 3))."""
    import numpy as np

    from edgehft.ir import TFLiteModel
    g = TFLiteModel.from_file(path).main
    out = []
    for role, details in (("input", it.get_input_details()), ("output", it.get_output_details())):
        for d in details:
            t = g.tensors[int(d["index"])]
            shape = tuple(int(x) for x in d["shape"])
            if -1 not in t.shape_signature and (shape != t.shape or np.dtype(d["dtype"]).name != t.dtype):
                out.append(f"{role} {t.name!r} is declared {t.dtype} {t.shape}, LiteRT makes it "
                           f"{np.dtype(d['dtype']).name} {shape}")
    return out


def _from_interpreter(exc: BaseException) -> bool:
    """Whether LiteRT (or tflite-runtime) raised ``exc`` itself: its innermost frame is in their package."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = tb.tb_frame.f_code.co_filename if tb is not None else ""
    return any(f"{os.sep}{pkg}{os.sep}" in where for pkg in ("ai_edge_litert", "tflite_runtime", "onnxruntime"))


def main(argv: list) -> int:
    """The child: ``python -m edgehft.runtime.isolate REQUEST_JSON``; prints one result line, exit 0."""
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))            # a crash leaves no core dump
    request = json.loads(argv[0])

    def report(result: dict) -> None:                           # the last line tells the parent how far it got
        sys.stdout.write(_MARK + json.dumps(result) + "\n")
        sys.stdout.flush()
    progress = _Reporting(report)
    try:
        (_open_runner if request["mode"] == "runner" else _open_models)(request, progress)
        report({"ok": True, **progress})
    except EdgeHFTError as exc:
        report({**progress, "error": type(exc).__name__, "module": type(exc).__module__,
                "message": exc.args[0] if exc.args else "", "hint": exc.hint})
    except Exception as exc:  # noqa: BLE001 - every failure goes back to the parent
        report({**progress, "error": type(exc).__name__, "module": type(exc).__module__, "message": str(exc),
                "litert": _from_interpreter(exc)})
    return 0


class _Reporting(dict):
    """The child's progress dict: every ``step`` set is printed at once, so a crash still says where."""

    def __init__(self, report):
        super().__init__()
        self._report = report

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if key == "step":
            self._report(dict(self))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
