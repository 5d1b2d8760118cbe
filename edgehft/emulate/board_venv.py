"""The emulated PYNQ board's virtual environment: a PYNQ image's Python stack on a machine with no board.

pynq pins numpy < 2 (pynq 4.0.0 also grpcio 1.64 / protobuf < 6), so it cannot share a venv with TensorFlow
2.21: the emulated board (:mod:`edgehft.emulate.pynq_board`) and the board-side tests run in a venv of their
own, with edgehft's box side only (no extras), as a board has. Two stacks, as the boards' images ship them:

- ``zu`` (the ZU+ boards: kv260, zcu104, ultra96; PYNQ 4.0): pynq 4.0.0, ai-edge-litert 2.3.0, numpy 1.x,
  on the Python that runs this module (or ``--python``);
- ``z2`` (the PYNQ-Z2; PYNQ 4.0 dropped Zynq-7000, its last image is PYNQ 3.1 on Python 3.10): pynq 3.1.2,
  tflite-runtime (armv7l has no ai-edge-litert wheel), numpy 1.x, pycparser < 3 (pynq 3.1's rpc module imports
  pycparser.plyparser, which pycparser 3 removed), on a Python 3.10 (``--python``, else ``python3.10`` on PATH,
  else pyenv's newest 3.10).

edgehft itself: this checkout, editable, when edgehft runs from one (so the venv runs the checkout's code),
else ``edgehft==<this version>``; ``--edgehft SPEC`` names another (a wheel file, a version).

    python -m edgehft.emulate.board_venv [--stack zu|z2] [--python PY] [--edgehft SPEC] VENV [REQUIREMENT ...]

Exit codes: 0 ready (or already up to date), 2 usage (also: VENV exists and is not a directory), 7 no Python for
the stack here (or ``--python`` is not one), 1 pip, the venv module or the check failed (their output above it).
On the z2 stack pip says that edgehft requires ai-edge-litert: expected, that venv runs tflite-runtime instead.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import List, Optional

import edgehft
from edgehft.version import VERSION


@dataclass(frozen=True)
class PynqStack:
    """One PYNQ image's Python packages: what the venv installs beside edgehft's box side."""

    pynq: str                                   # the pynq release, e.g. "4.0.0"
    interpreter: str                            # the TFLite interpreter requirement
    module: str                                 # its import name (the check imports it)
    python: Optional[str] = None                # the image's Python "3.10", or None: the running one
    extra: List[str] = field(default_factory=list)


STACKS = {
    "zu": PynqStack(pynq="4.0.0", interpreter="ai-edge-litert==2.3.0", module="ai_edge_litert"),
    "z2": PynqStack(pynq="3.1.2", interpreter="tflite-runtime>=2.13", module="tflite_runtime", python="3.10",
                    extra=["pycparser<3"]),
}
# Where scripts/board-venv.sh makes each stack's venv, in a checkout (edgehft compile's default --golden-python).
CHECKOUT_VENVS = {"zu": ".venv-board", "z2": ".venv-board-z2"}
# The interpreter packages and numpy: the stack chooses them (numpy < 2 under pynq), not edgehft's markers.
_STACK_CHOSEN = re.compile(r"(ai-edge-litert|tflite-runtime|numpy)\b", re.I)


def checkout_root() -> Optional[Path]:
    """The source checkout edgehft runs from (its pyproject.toml beside the package), or None (an installed
    wheel)."""
    root = Path(edgehft.__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "edgehft").is_dir() else None


def stack_for(board) -> Optional[str]:
    """The name of the PYNQ stack (:data:`STACKS`) whose interpreter package and Python the board file's
    ``[stack]`` names (``pynq-z2`` -> ``"z2"``), or None (not a PYNQ board, or no stack here fits it)."""
    from packaging.specifiers import SpecifierSet
    if getattr(board, "backend", None) != "pynq":
        return None
    for name, st in STACKS.items():
        package = re.split(r"[<>=!~ ]", st.interpreter, maxsplit=1)[0]
        python_ok = st.python is None or not board.stack.python or \
            SpecifierSet(board.stack.python).contains(st.python + ".0")
        if package in board.stack.interpreter and python_ok:
            return name
    return None


def checkout_venv_python(stack_name: str) -> Optional[Path]:
    """The Python of the ``stack_name`` venv that scripts/board-venv.sh makes in the checkout edgehft runs from
    (:data:`CHECKOUT_VENVS`), or None: not a checkout, or the venv is not there."""
    root = checkout_root()
    py = root / CHECKOUT_VENVS[stack_name] / "bin" / "python" if root and stack_name in CHECKOUT_VENVS else None
    return py if py is not None and py.exists() else None


def edgehft_requirement(spec: Optional[str] = None) -> List[str]:
    """pip arguments that install edgehft into the venv: ``spec`` when given, else this checkout editable
    (``-e ROOT``), else ``edgehft==<this version>``."""
    if spec:
        return [spec]
    root = checkout_root()
    return ["-e", str(root)] if root else [f"edgehft=={VERSION}"]


def box_requirements() -> List[str]:
    """edgehft's own requirements without its extras and without the ones a PYNQ stack chooses (numpy and
    the TFLite interpreter), markers kept for pip to evaluate in the venv. From the installed metadata."""
    reqs = metadata.requires("edgehft") or []
    return [r for r in reqs if "extra ==" not in r and not _STACK_CHOSEN.match(r.strip())]


def find_python(stack: PynqStack) -> Optional[str]:
    """The interpreter for ``stack``: the running one where the stack names no Python, else the first of
    ``pythonX.Y`` on PATH and pyenv's X.Y releases (``$PYENV_ROOT`` or ``~/.pyenv``, newest first) that runs and
    is X.Y (a pyenv shim for a version not selected exits 127); None when there is none."""
    if stack.python is None:
        return sys.executable
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    pyenv = sorted(glob.glob(f"{root}/versions/{stack.python}.*/bin/python3"),
                   key=lambda p: [int(x) for x in re.findall(r"\d+", Path(p).parents[1].name)], reverse=True)
    for cand in [shutil.which(f"python{stack.python}"), *pyenv]:
        if cand and python_version(cand) == stack.python:
            return cand
    return None


def python_version(python: str) -> Optional[str]:
    """``"X.Y"`` of the interpreter at ``python``, or None when it is not one that runs here."""
    try:
        got = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    out = got.stdout.strip()
    return out if got.returncode == 0 and re.fullmatch(r"\d+\.\d+", out) else None


def check_script(stack: PynqStack, pytest: bool = False) -> str:
    """Python code that exits 0 in a venv holding ``stack`` and edgehft with its HIL plugin (and pytest), else
    raises."""
    return "\n".join([
        f"import importlib.metadata, numpy, pynq, {stack.module}, edgehft" + (", pytest" if pytest else ""),
        "eps = importlib.metadata.entry_points()",
        "eps = eps.select(group='pytest11') if hasattr(eps, 'select') else eps.get('pytest11', [])",
        "assert any(e.name == 'edgehft' for e in eps), 'the HIL plugin entry point'",
        "assert numpy.__version__.split('.')[0] == '1', 'numpy ' + numpy.__version__",
        f"assert pynq.__version__ == {stack.pynq!r}, 'pynq ' + pynq.__version__",
    ])


def is_ready(venv: Path, stack: PynqStack, edgehft_from: Optional[Path] = None, pytest: bool = False) -> bool:
    """Whether ``venv`` already holds ``stack`` (and, given ``edgehft_from``, edgehft from that directory)."""
    py = venv / "bin" / "python"
    code = check_script(stack, pytest)
    if edgehft_from is not None:
        code += f"\nimport pathlib\nassert pathlib.Path(edgehft.__file__).resolve().parents[1] == pathlib.Path({str(edgehft_from)!r})"
    return py.exists() and subprocess.run([str(py), "-c", code], capture_output=True).returncode == 0


def _pip(py: Path, *args: str) -> None:
    subprocess.run([str(py), "-m", "pip", "install", "-q", *args], check=True)


def install_tflite_runtime_stack(py: Path, target: List[str], extra: tuple = ()) -> None:
    """Install edgehft (the pip arguments ``target``) into the venv of ``py`` on a board's tflite-runtime stack:
    edgehft without its dependencies, then its box-side requirements (:func:`box_requirements`) with
    tflite-runtime in place of ai-edge-litert, numpy 1.x (tflite-runtime's ABI) and ``extra``. pip then says that
    edgehft requires ai-edge-litert: expected, the venv runs tflite-runtime instead. The PYNQ-Z2's stack and
    scripts/tflite-stack.sh (tests/pythons' 3.10-tflite venv) both install this way.

    Raises:
        subprocess.CalledProcessError: pip failed."""
    _pip(py, "--no-deps", *target)
    print(f"{py}: pip will say edgehft requires ai-edge-litert: expected, this venv runs tflite-runtime instead")
    _pip(py, "numpy>=1.23,<2", "tflite-runtime>=2.13", *extra, *box_requirements())


def create(venv: Path, stack_name: str = "zu", python: Optional[str] = None, edgehft_spec: Optional[str] = None,
           extra: tuple = ()) -> Path:
    """Make (or bring up to date) the venv at ``venv`` with the ``stack_name`` PYNQ stack, edgehft's box side
    and ``extra`` requirements (e.g. ``pytest``), and check its imports.

    Returns:
        the venv's Python.
    Raises:
        KeyError: an unknown stack name.
        FileNotFoundError: no Python for the stack here (``find_python``), or ``python`` is not one.
        subprocess.CalledProcessError: the venv module, pip or the import check failed.
    """
    stack = STACKS[stack_name]
    py = venv / "bin" / "python"
    base = python or find_python(stack)
    want = stack.python or "3.8 or later"
    if python is not None:
        got = python_version(python)
        if got is None or (stack.python and got != stack.python) or \
                tuple(int(x) for x in got.split(".")) < (3, 8):
            raise FileNotFoundError(f"--python {python} is not a Python {want}" +
                                    (f" (it is {got})" if got else ""))
    if not py.exists():
        if base is None:
            raise FileNotFoundError(f"no Python {want} here for the {stack_name} stack")
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        (venv / ".gitignore").write_text("*\n")                # keep the venv out of a checkout's git status
        _pip(py, "--upgrade", "pip")
    pins = [f"pynq=={stack.pynq}", *stack.extra, *extra]
    target = edgehft_requirement(edgehft_spec)
    if stack.module == "ai_edge_litert":                        # one resolver run: edgehft's deps under numpy < 2
        _pip(py, *pins, "numpy<2", stack.interpreter, *target)
    else:                                                       # edgehft's markers pick ai-edge-litert here
        install_tflite_runtime_stack(py, target, tuple(pins))
    subprocess.run([str(py), "-c", check_script(stack, "pytest" in extra)], check=True)
    return py


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m edgehft.emulate.board_venv",
                                 description="Make a venv with a PYNQ image's stack for the emulated board.")
    ap.add_argument("venv", type=Path)
    ap.add_argument("requirements", nargs="*", help="more requirements for the venv, e.g. pytest")
    ap.add_argument("--stack", choices=sorted(STACKS), default="zu")
    ap.add_argument("--python", help="the interpreter to make the venv from (default: see the module docstring)")
    ap.add_argument("--edgehft", dest="edgehft_spec", help="what to install as edgehft (a wheel, a version)")
    a = ap.parse_args(argv)
    stack = STACKS[a.stack]
    if a.venv.exists() and not a.venv.is_dir():
        print(f"error: {a.venv} exists and is not a directory: name a new or an existing venv directory",
              file=sys.stderr)
        return 2
    root = checkout_root() if a.edgehft_spec is None else None
    if is_ready(a.venv, stack, root, "pytest" in a.requirements):
        print(f"{a.venv} is up to date ({a.stack}: pynq {stack.pynq})")
        return 0
    try:
        py = create(a.venv, a.stack, a.python, a.edgehft_spec, tuple(a.requirements))
    except FileNotFoundError as exc:
        print(f"error: {exc}; pass --python PATH to a Python {stack.python or '3.8 or later'}", file=sys.stderr)
        return 7
    except subprocess.CalledProcessError as exc:
        print(f"error: {' '.join(map(str, exc.cmd[:4]))} ... exited {exc.returncode}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{a.venv} ready ({a.stack}: pynq {stack.pynq}, {stack.interpreter}): {py}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
