"""Hatchling build hook: build edgehft's native CPU kernel library when the wheel is built, so a box that
installs the wheel opens native bundles without a compiler (issue 15 item 2).

What it does, by wheel version (``[tool.hatch.build.targets.wheel.hooks.custom]`` in pyproject.toml):

* standard wheel (``pip wheel .``, ``python -m build``, ``pip install .``): builds ``libedgehft_cpu.so`` and
  its manifest ``libedgehft_cpu.json`` (:func:`edgehft.kernels.cpu.build.build_all`) into a temporary
  directory and ships them as ``edgehft/kernels/cpu/prebuilt/``; the wheel is then platform-specific,
  tagged ``py3-none-linux_<arch>`` (the library is loaded with ctypes, so any CPython 3 on that OS and
  architecture takes it; no manylinux claim is made without auditwheel);
* editable install (``pip install -e .``): builds them into the source tree's
  ``edgehft/kernels/cpu/prebuilt/`` (git-ignored), unless a library matching the sources is already there.

When the library cannot be built (no ``g++``, no Highway headers, a compile error), a standard wheel's build
stops with the reason and what to do: a wheel without the library would need g++ and libhwy-dev on every box
that opens a native bundle. ``EDGEHFT_SKIP_NATIVE_KERNELS=1`` builds it anyway without the library (a pure
``py3-none-any`` wheel, with a warning): native bundles then build the library on first open, which needs
g++ and libhwy-dev on the box (without them that open is exit 7 saying so), and ``edgehft deploy`` refuses
them on a box that has neither. An editable install goes on with a warning instead (``pip install -v``
shows it): a checkout is a development tree, whose first native open builds the library as before or
says what is missing.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SKIP_ENV = "EDGEHFT_SKIP_NATIVE_KERNELS"
PREBUILT = "edgehft/kernels/cpu/prebuilt"
FILES = ("libedgehft_cpu.so", "libedgehft_cpu.json")

# Run in a child interpreter (-I: no PYTHONPATH, no user site) with the source tree first on sys.path, so
# the build uses this tree's edgehft.kernels.cpu.build whatever edgehft the build environment may have.
_BUILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
from edgehft.errors import EdgeHFTError
from edgehft.kernels.cpu.build import build_all, prebuilt_library
if sys.argv[3] == "if-stale" and prebuilt_library(sys.argv[2]) is not None:
    print("up to date")
    raise SystemExit(0)
try:
    build_all(sys.argv[2])
except EdgeHFTError as exc:
    print(exc.args[0] + ("; " + exc.hint if exc.hint else ""), file=sys.stderr)
    raise SystemExit(1)
print("built")
"""


def platform_tag() -> str:
    """This build host's wheel platform tag, e.g. ``linux_x86_64`` (``sysconfig.get_platform()`` with
    ``-`` and ``.`` as ``_``)."""
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


def build_kernels(root: Path | str, dest: Path | str, only_if_stale: bool = False) -> str:
    """Build the kernel library of the source tree ``root`` into the directory ``dest`` (created) in a child
    interpreter. Returns ``"built"``, or ``"up to date"`` when ``only_if_stale`` and ``dest`` already holds
    a library matching the sources.

    Raises:
        RuntimeError: the build failed; its message is the one-line reason (e.g. no g++ on PATH, Highway's
            headers missing) or the compiler's output.
    """
    Path(dest).mkdir(parents=True, exist_ok=True)
    res = subprocess.run([sys.executable, "-I", "-c", _BUILD, str(root), str(dest),
                          "if-stale" if only_if_stale else "always"], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError((res.stderr.strip() or res.stdout.strip() or f"exit {res.returncode}")[-4000:])
    return res.stdout.strip().splitlines()[-1]


def failure_message(reason: str) -> str:
    """What the build says when the kernel library cannot be built: ``reason`` and the ways on."""
    return (f"edgehft: the native CPU kernel library (libedgehft_cpu.so) cannot be built here: {reason}\n"
            "A wheel without it would need g++ and Highway's headers on every box that opens a native "
            "bundle, so the build stops. Build where g++ and libhwy-dev are installed (Debian: apt-get install "
            f"g++ libhwy-dev), or set {SKIP_ENV}=1 to build without the library (a pure wheel: native bundles "
            "then build it on first open, which needs g++ and libhwy-dev on the box).")


class CustomBuildHook(BuildHookInterface):
    """Builds the native kernel library into the wheel (standard) or the source tree (editable)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        """Before the wheel is built: build the library and ship it (see the module docstring). Aborts a
        standard wheel's build (exit 1, the reason on stderr) when it cannot be built and
        ``EDGEHFT_SKIP_NATIVE_KERNELS`` is not set; an editable one goes on with a warning."""
        if self.target_name != "wheel":
            return
        if os.environ.get(SKIP_ENV, "").strip() not in ("", "0"):
            self.app.display_warning(f"edgehft: {SKIP_ENV} set: building without the native CPU kernel library; "
                                     "native bundles will need g++ and libhwy-dev on the box")
            return
        editable = version == "editable"
        self._tmp = None if editable else tempfile.mkdtemp(prefix="edgehft-kernels-")
        dest = Path(self.root) / PREBUILT if editable else Path(self._tmp)
        self.app.display_info(f"edgehft: building the native CPU kernel library into {dest}" + (
            " (unless the one there matches the sources)" if editable else ""))
        try:
            said = build_kernels(self.root, dest, only_if_stale=editable)
        except RuntimeError as exc:
            self._cleanup()
            if editable:              # a checkout: its first native open builds the library, or says why not
                self.app.display_warning(f"edgehft: the native CPU kernel library was not built: {exc}; native "
                                         "bundles opened from this checkout build it at first open (g++ and "
                                         "libhwy-dev needed then)")
                return
            self.app.abort(failure_message(str(exc)))
            return
        self.app.display_info(f"edgehft: native CPU kernel library {said} ({dest / FILES[0]})")
        if not editable:
            for name in FILES:
                build_data["force_include"][str(dest / name)] = f"{PREBUILT}/{name}"
            build_data["pure_python"] = False
            build_data["tag"] = f"py3-none-{platform_tag()}"

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        """After the wheel is written: remove the temporary build directory."""
        self._cleanup()

    def _cleanup(self) -> None:
        tmp, self._tmp = getattr(self, "_tmp", None), None
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
