"""Run the TensorFlow converter worker in its own process: a crash (segfault, abort) or a hang becomes a
:class:`~edgehft.errors.ConverterError` naming the step it happened in, never a dead CLI or a core dump."""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from edgehft import errors


def _no_core_dump() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_worker(request: dict, workdir: Path, timeout_s: float = 1800.0,
               on_stage: Callable[[str], None] | None = None) -> dict:
    """Run ``edgehft.compiler.worker`` on ``request`` (its ``out`` set to ``workdir``).

    Returns the worker's ``info.json``. ``on_stage`` is called with each step name as it starts.
    Raises:
        ConverterError: the worker crashed (with the signal), hung past ``timeout_s`` (it is killed),
            or reported a conversion failure; InputError/LoweringError as reported by the worker.
        MissingExtraError: TensorFlow is not installed here (``pip install 'edgehft[compile]'``).
    """
    from edgehft.compat import require_extra
    require_extra("tensorflow", "compile", "compiling a model (the TensorFlow converter)")
    workdir.mkdir(parents=True, exist_ok=True)
    request = {**request, "out": str(workdir)}
    req_path = workdir / "request.json"
    req_path.write_text(json.dumps(request))
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONFAULTHANDLER": "1", "CUDA_VISIBLE_DEVICES": "-1"}
    log_path = workdir / "worker.log"
    stage_path = workdir / "stage"
    stage = "start"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "edgehft.compiler.worker", str(req_path)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True, preexec_fn=_no_core_dump)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                rc = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if stage_path.exists():
                new = stage_path.read_text().strip()
                if new and new != stage:
                    stage = new
                    if on_stage:
                        on_stage(stage)
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise errors.ConverterError(
                    f"the TensorFlow converter did not finish within {timeout_s:.0f} s "
                    f"(stuck in step '{stage}'); it was stopped",
                    hint="raise --timeout for very large models; the worker log is " + str(log_path))
    if stage_path.exists():
        stage = stage_path.read_text().strip() or stage
    if rc < 0:
        sig = signal.Signals(-rc).name
        raise errors.ConverterError(
            f"the TensorFlow converter crashed ({sig}) during step '{stage}'",
            hint=_crash_hint(request, stage) + f"; worker log: {log_path}\n" + _tail(log_path))
    if rc != 0:
        err_path = workdir / "error.json"
        if err_path.exists():
            err = json.loads(err_path.read_text())
            cls = getattr(errors, err.get("type", ""), errors.ConverterError)
            if not (isinstance(cls, type) and issubclass(cls, errors.EdgeHFTError)):
                cls = errors.ConverterError
            raise cls(err["message"], hint=err.get("hint"))
        raise errors.ConverterError(f"the converter worker exited with status {rc} during step '{stage}'",
                                    hint=f"worker log: {log_path}\n" + _tail(log_path))
    return json.loads((workdir / "info.json").read_text())


def _crash_hint(request: dict, stage: str) -> str:
    if request.get("lowering") == "native" and stage.startswith("convert"):
        return ("the graph went to the converter as is (--lowering native); without it edgehft "
                "refuses recurrent layers that crash the int8 converter and says what to change")
    return "try --quant dynamic or float to see whether quantization is the trigger"


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    keep = [l for l in text if "WARNING" not in l and "oneDNN" not in l][-lines:]
    return "\n".join("    " + l for l in keep)
