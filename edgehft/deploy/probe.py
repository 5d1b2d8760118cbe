"""What a box is: facts read on the box (:func:`probe_box`), and whether they make it a given board
(:func:`board_mismatches`, run on the host).

The facts come from the files the vendors' images write, read under ``root`` (``/`` on a box; a directory
tree in tests). Every backend reads the facts that identify its boards (:mod:`edgehft.backends`, ``facts``;
the built-ins' are in :mod:`edgehft.deploy.probe_rules`):

- PYNQ: the ``BOARD`` variable the PYNQ image sets (process environment, else ``/etc/environment``);
- Jetson: ``/etc/nv_tegra_release`` (``# R36 (release), REVISION: 4.0, …`` → L4T ``36.4.0``) and the module
  name in ``/proc/device-tree/model``;
- Coral: Edge TPUs on USB (``/sys/bus/usb/devices/*/idVendor:idProduct`` = ``1a6e:089a`` before the runtime
  loads its firmware, ``18d1:9302`` after) and on PCIe (``/dev/apex_N``, the gasket driver's nodes);
- everything: CPU architecture, Python, and the versions of edgehft and the runtime packages installed
  (read from package metadata, without importing them).
"""
from __future__ import annotations

import os
import platform
import shutil
import sys
from importlib import metadata
from pathlib import Path

from edgehft.deploy.probe_rules import read_text
from edgehft.deploy.probe_rules.jetson import parse_l4t   # public here since before the rules moved

__all__ = ["PACKAGES", "board_mismatches", "parse_l4t", "probe_box"]

PACKAGES = ("edgehft", "ai-edge-litert", "tflite-runtime", "numpy", "pynq", "tensorrt", "pycoral")


def _versions() -> dict:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _cpu_flags(root: Path) -> list[str] | None:
    text = read_text(root / "proc/cpuinfo")
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return sorted(set(line.split(":", 1)[1].split()) & {"avx512f", "amx_tile", "amx_bf16"})
    return []


def probe_box(root: str | Path = "/") -> dict:
    """Facts about the machine this runs on (JSON-able).

    Returns:
        ``{"arch", "hostname", "python", "packages": {name: version}, the backends' own facts (built-ins:
        "edgetpu": {"usb": n, "pci": n}, "pynq_board", "l4t", "device_tree_model"), "cxx" (the C++ compiler that
        builds native kernels on first open), "cpu_flags" (the native kernels' ISA flags the CPU reports:
        avx512f, amx_tile, amx_bf16), "bundle_format_version"}``; fields the box does not have are None.
    """
    from edgehft.bundle import FORMAT_VERSION
    root = Path(root)
    facts = {"arch": platform.machine(), "hostname": platform.node(), "python": sys.version.split()[0],
             "packages": _versions()}
    facts.update(_backend_facts(root))
    facts.update({"cxx": shutil.which(os.environ.get("CXX", "g++")) if root == Path("/") else None,
                  "cpu_flags": _cpu_flags(root), "bundle_format_version": FORMAT_VERSION})
    return facts


def _backend_facts(root: Path) -> dict:
    """Every installed backend's own facts (:mod:`edgehft.backends`, ``facts``). A plugin whose facts cannot
    be read adds ``facts_errors: {backend: reason}`` instead of failing the probe."""
    from edgehft import backends
    found, errors = {}, {}
    for name in backends.names():
        backend = backends.find(name)
        if backend is None or not backend.facts:
            continue
        try:
            found.update(backend.load("facts")(root))
        except Exception as exc:            # a plugin's bug must not hide the box from deploy
            errors[name] = f"{type(exc).__name__}: {exc}"
    if errors:
        found["facts_errors"] = errors
    return found


def board_mismatches(board, facts: dict, bundle_format_version: int = 1, needs_cxx: bool = False,
                     needs_amx: bool = False) -> list[str]:
    """Why the box described by ``facts`` is not ``board`` (empty when it is).

    Every box needs an edgehft that reads the bundle's format version; ``needs_cxx`` (a cpu bundle on a
    native plan, whose kernels are built on the box at first open): a C++ compiler; ``needs_amx`` (the
    native-bf16 plan): a CPU with AMX-BF16 (when the box reports its flags). What makes a box the board
    is the board's backend's own probe (:mod:`edgehft.backends`, ``probe``; the built-ins' rules are in
    :mod:`edgehft.deploy.probe_rules`: a LiteRT interpreter on every box but a Jetson, plus PYNQ's ``BOARD``,
    the Jetson's L4T release and module, an Edge TPU on the Coral board's bus).

    Raises:
        BoardUnavailableError: no backend of the board's name is installed here (listing the installed ones).
    """
    from edgehft import backends
    why = []
    pk = facts.get("packages", {})
    if facts.get("bundle_format_version", 0) < bundle_format_version:
        why.append(f"the box's edgehft {pk.get('edgehft', '?')} reads bundle format "
                   f"{facts.get('bundle_format_version')}; this bundle is format {bundle_format_version}")
    if needs_amx and facts.get("cpu_flags") is not None and not {"amx_tile", "amx_bf16"} <= set(facts["cpu_flags"]):
        why.append("the box's CPU has no AMX-BF16 (cpu flags: " + (", ".join(facts["cpu_flags"]) or "none of "
                   "avx512f/amx") + "): the bundle's native-bf16 plan would run its convs on the portable loop, "
                   "several times slower than LiteRT; compile with --quant auto on a host like the box, or "
                   "--quant native")
    if needs_cxx and not facts.get("cxx"):
        why.append("no C++ compiler (g++) on the box to build the bundle's native kernels; install g++ there, "
                   "or compile with --quant dynamic")
    probe = backends.get(board.backend).load("probe")
    return why + list(probe(board, facts))
