"""What differs between the installs edgehft runs in: the Pythons of the box side (3.8 on JetPack 5, 3.10 on
JetPack 6 and PYNQ 3.x images, 3.11+) and which of its extras are installed.

``tomllib``: the standard library's TOML reader from Python 3.11; before it the ``tomli`` package it was taken
from (the same API: ``loads``, ``load``, ``TOMLDecodeError``), which edgehft's requirements install there.
On 3.8 and 3.9 pydantic reads the models' ``X | None`` / ``list[X]`` annotations through ``eval_type_backport``
(a requirement there too); the box side's own code keeps to 3.8's syntax and standard library.
:func:`require_extra`: a clear refusal, naming the extra, where a command needs a package the install lacks.
"""
from __future__ import annotations

import importlib.util
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:                                                   # pragma: no cover (3.8 - 3.10)
    import tomli as tomllib

__all__ = ["EXTRAS", "removeprefix", "removesuffix", "require_extra", "tomllib"]


def removeprefix(s: str, prefix: str) -> str:
    """``s`` without ``prefix`` where it starts with it (``str.removeprefix``, Python 3.9+)."""
    return s[len(prefix):] if prefix and s.startswith(prefix) else s


def removesuffix(s: str, suffix: str) -> str:
    """``s`` without ``suffix`` where it ends with it (``str.removesuffix``, Python 3.9+)."""
    return s[:-len(suffix)] if suffix and s.endswith(suffix) else s


# The extras of pyproject.toml and what each is for (the hint of a MissingExtraError).
EXTRAS = {"compile": "compiling Keras models (TensorFlow, tf-keras)",
          "jetson": "ONNX models and the Jetson board's report (onnx, tf2onnx)",
          "bench": "the latency PNG and the peer benchmarks (matplotlib, ONNX Runtime, tf2onnx)",
          "serve": "inotify for edgehft.serve's install dir (inotify_simple)",
          "fleet": "Ansible inventories for deploy --hosts (ansible-core)"}
# The oldest Python each extra installs on (TensorFlow 2.21 and ONNX Runtime need 3.10, ansible-core 2.14 3.9);
# an extra not listed installs wherever the box side does (3.8).
EXTRA_MIN_PYTHON = {"compile": (3, 10), "jetson": (3, 10), "bench": (3, 10), "fleet": (3, 9)}


def require_extra(module: str, extra: str, purpose: str) -> None:
    """Return when ``module`` can be imported here; else raise.

    Looks the module up without importing it (``importlib.util.find_spec``: TensorFlow takes seconds).

    Raises:
        MissingExtraError (exit 7): ``module`` is not installed; the message says that ``purpose`` needs it,
            the hint ``pip install 'edgehft[extra]'``, or, on a Python older than the extra installs on
            (EXTRA_MIN_PYTHON), that it needs a newer Python (e.g. compile on a 3.10+ host, deploy here).
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):          # a broken parent package, or a module with no spec
        found = False
    if not found:
        from edgehft.errors import MissingExtraError
        hint = f"pip install 'edgehft[{extra}]': {EXTRAS.get(extra, extra)}"
        oldest = EXTRA_MIN_PYTHON.get(extra)
        if oldest and sys.version_info[:2] < oldest:
            then = ("roll out from there" if extra == "fleet" else
                    "e.g. compile there and `edgehft deploy` the bundle to this box")
            hint = (f"edgehft[{extra}] needs Python {oldest[0]}.{oldest[1]} or later (this is "
                    f"{sys.version_info[0]}.{sys.version_info[1]}, where the box side runs): run it on a host with "
                    f"a newer Python, {then}")
        raise MissingExtraError(f"{purpose} needs the Python package {module!r}, which is not installed here "
                                f"(edgehft installs without its extras: the box side only)", hint=hint)
