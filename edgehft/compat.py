"""What differs between the installs edgehft runs in: the Pythons of the box side (3.10 on JetPack 6 and
PYNQ 3.x images, 3.11+) and which of its extras are installed.

``tomllib``: the standard library's TOML reader from Python 3.11; on 3.10 the ``tomli`` package it was taken
from (the same API: ``loads``, ``load``, ``TOMLDecodeError``), which edgehft's requirements install there.
:func:`require_extra`: a clear refusal, naming the extra, where a command needs a package the install lacks.
"""
from __future__ import annotations

import importlib.util
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:                                                   # pragma: no cover (3.10)
    import tomli as tomllib

__all__ = ["EXTRAS", "require_extra", "tomllib"]

# The extras of pyproject.toml and what each is for (the hint of a MissingExtraError).
EXTRAS = {"compile": "compiling Keras models (TensorFlow, tf-keras)",
          "jetson": "ONNX models and the Jetson board's report (onnx, tf2onnx)",
          "bench": "the latency PNG and the peer benchmarks (matplotlib, ONNX Runtime, tf2onnx)",
          "serve": "inotify for edgehft.serve's install dir (inotify_simple)",
          "fleet": "Ansible inventories for deploy --hosts (ansible-core)"}


def require_extra(module: str, extra: str, purpose: str) -> None:
    """Return when ``module`` can be imported here; else raise.

    Looks the module up without importing it (``importlib.util.find_spec``: TensorFlow takes seconds).

    Raises:
        MissingExtraError (exit 7): ``module`` is not installed; the message says that ``purpose`` needs it,
            the hint ``pip install 'edgehft[extra]'``.
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):          # a broken parent package, or a module with no spec
        found = False
    if not found:
        from edgehft.errors import MissingExtraError
        raise MissingExtraError(f"{purpose} needs the Python package {module!r}, which is not installed here "
                                f"(edgehft installs without its extras: the box side only)",
                                hint=f"pip install 'edgehft[{extra}]': {EXTRAS.get(extra, extra)}")
