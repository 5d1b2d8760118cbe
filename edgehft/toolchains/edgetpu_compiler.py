"""Coral's ``edgetpu_compiler``: find it, run it isolated with a timeout, parse its stdout and ``.log``.

The compiler is an x86-64 Debian/Ubuntu binary from Coral's apt repository (package
``edgetpu-compiler``); it is not on PyPI. Its operation log (``X_edgetpu.log``, and the table ``-s``
prints) is fixed width: op name in 31 columns, count in 11, then the status; one row per (op, status),
not in graph order.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from edgehft.errors import ConverterError

EXECUTABLE = "edgetpu_compiler"
INSTALL_HINT = ("edgetpu_compiler comes from Coral's apt repository (x86-64 Debian/Ubuntu only): add "
                "'deb https://packages.cloud.google.com/apt coral-edgetpu-stable main' and "
                "`apt-get install edgetpu-compiler`")
_ROW = re.compile(r"^(?P<op>[A-Z][A-Z0-9_]*(?::\S+)?)\s+(?P<count>\d+)\s+(?P<status>\S.*?)\s*$")
_FIELDS = {
    "version": re.compile(r"Edge TPU Compiler version (\S+)"),
    "compile_ms": re.compile(r"Model compiled successfully in (\d+) ms"),
    "input_model": re.compile(r"^Input(?: model)?: (.+)$", re.M),
    "output_model": re.compile(r"^Output(?: model)?: (.+)$", re.M),
    "on_chip_used": re.compile(r"On-chip memory used for caching model parameters: (\S+)"),
    "on_chip_remaining": re.compile(r"On-chip memory remaining for caching model parameters: (\S+)"),
    "off_chip_used": re.compile(r"Off-chip memory used for streaming uncached model parameters: (\S+)"),
    "subgraphs": re.compile(r"Number of Edge TPU subgraphs: (\d+)"),
    "total_ops": re.compile(r"Total number of operations: (\d+)"),
    "tpu_ops": re.compile(r"Number of operations that will run on Edge TPU: (\d+)"),
    "cpu_ops": re.compile(r"Number of operations that will run on CPU: (\d+)"),
    "log_file": re.compile(r"Operation log: (.+)$", re.M),
}
_INTS = {"compile_ms", "subgraphs", "total_ops", "tpu_ops", "cpu_ops"}
_ERRORS = (re.compile(r"^(ERROR: .+)$", re.M), re.compile(r"^(Internal compiler error.*)$", re.M),
           re.compile(r"^(Model not quantized.*)$", re.M), re.compile(r"^(Invalid model.*)$", re.M),
           re.compile(r"^(Compilation failed.*)$", re.M), re.compile(r"^(Model could not be parsed.*)$", re.M))


@dataclass
class CompilerOutput:
    """What one compiler run (or one ``.log``) says."""

    version: str | None = None
    compile_ms: int | None = None
    input_model: str | None = None
    output_model: str | None = None
    on_chip_used: str | None = None
    on_chip_remaining: str | None = None
    off_chip_used: str | None = None
    subgraphs: int | None = None
    total_ops: int | None = None
    tpu_ops: int | None = None
    cpu_ops: int | None = None
    log_file: str | None = None
    rows: list[tuple[str, int, str]] = field(default_factory=list)    # (op, count, status)
    errors: list[str] = field(default_factory=list)

    @property
    def mapped(self) -> int:
        return sum(n for _, n, s in self.rows if s == "Mapped to Edge TPU")


def parse_output(text: str) -> CompilerOutput:
    """Parse the compiler's stdout or its ``.log`` (same header and table format).

    Rows are read after the ``Operator  Count  Status`` header; each row is ``(op, count, status)``.
    """
    out = CompilerOutput()
    for key, rx in _FIELDS.items():
        m = rx.search(text)
        if m:
            setattr(out, key, int(m.group(1)) if key in _INTS else m.group(1).strip())
    in_table = False
    for line in text.splitlines():
        if re.match(r"^Operator\s+Count\s+Status\s*$", line):
            in_table = True
            continue
        if in_table:
            m = _ROW.match(line)
            if m:
                out.rows.append((m["op"], int(m["count"]), m["status"]))
            elif line.strip() and out.rows:
                in_table = False
    for rx in _ERRORS:
        out.errors += [m.group(1).strip() for m in rx.finditer(text)]
    return out


def find_compiler() -> str | None:
    """Path of ``edgetpu_compiler`` on PATH, or None."""
    return shutil.which(EXECUTABLE)


@dataclass
class CompilerRun:
    executable: str
    argv: list[str]
    returncode: int
    stdout: str
    output: CompilerOutput
    log: CompilerOutput | None
    compiled_model: Path | None


def run_compiler(model: Path, out_dir: Path, flags: list[str], *, executable: str | None = None,
                 timeout_s: float = 300.0) -> CompilerRun:
    """Run ``edgetpu_compiler -s -o OUT_DIR FLAGS MODEL`` in its own process group.

    Returns:
        the run with parsed stdout, the parsed ``.log`` and the compiled model path.
    Raises:
        ConverterError: compiler missing, timed out (process group killed), killed by a signal, exit
            status non-zero, or no compiled model written -- with the compiler's own error lines.
    """
    exe = executable or find_compiler()
    if not exe:
        raise ConverterError(f"{EXECUTABLE} is not on PATH", hint=INSTALL_HINT)
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [exe, "-s", "-o", str(out_dir), *flags, str(model)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=out_dir)
    try:
        text, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise ConverterError(f"{EXECUTABLE} did not finish in {timeout_s:g} s and was killed",
                             hint="raise --timeout, or split the model with -i") from None
    parsed = parse_output(text)
    if proc.returncode < 0:
        raise ConverterError(f"{EXECUTABLE} crashed ({signal.Signals(-proc.returncode).name}) on {model.name}",
                             hint="report it to Coral with the model; the prediction in the report still "
                                  "applies")
    if proc.returncode != 0:
        why = "; ".join(parsed.errors) or text.strip().splitlines()[-1:] or ["no output"]
        raise ConverterError(f"{EXECUTABLE} failed (exit {proc.returncode}): {why if isinstance(why, str) else why[0]}",
                             hint="see the prediction table for ops the compiler cannot parse or map")
    compiled = out_dir / f"{model.stem}_edgetpu.tflite"
    log_path = out_dir / f"{model.stem}_edgetpu.log"
    log = parse_output(log_path.read_text()) if log_path.exists() else None
    if not compiled.exists():
        raise ConverterError(f"{EXECUTABLE} exited 0 but wrote no {compiled.name}",
                             hint="; ".join(parsed.errors) or "run it by hand with -s to see why")
    return CompilerRun(exe, argv, proc.returncode, text, parsed, log, compiled)
