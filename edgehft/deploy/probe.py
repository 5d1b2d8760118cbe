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
  (read from package metadata, without importing them);
- the cpu board's native plans: whether the box's edgehft has a kernel library it can load (the prebuilt
  one a platform wheel or an editable install ships, or one built before) and which SIMD targets it runs
  there, else whether it could build one (a C++ compiler and Google Highway's headers).
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from edgehft.deploy.probe_rules import read_text
from edgehft.deploy.probe_rules.jetson import parse_l4t   # public here since before the rules moved

__all__ = ["PACKAGES", "bf16_missing", "board_mismatches", "kernels_missing", "native_kernels", "parse_l4t",
           "probe_box", "stack_mismatch"]

PACKAGES = ("edgehft", "ai-edge-litert", "tflite-runtime", "onnxruntime", "numpy", "pynq", "tensorrt", "pycoral")


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
            return sorted(set(line.split(":", 1)[1].split()) & {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})
    return []


def _highway_headers(cxx: str) -> bool:
    """Whether ``cxx`` finds Google Highway's headers (``#include <hwy/highway.h>`` preprocesses)."""
    try:
        res = subprocess.run([cxx, "-x", "c++", "-E", "-o", os.devnull, "-"], input="#include <hwy/highway.h>\n",
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return res.returncode == 0


def native_kernels() -> dict:
    """What this machine's edgehft has for the cpu board's native plans (JSON-able; never builds anything).

    Returns:
        ``{"prebuilt": path of the prebuilt library matching these sources or None, "cached": path of one
        built here before or None, "targets": the SIMD targets the loaded library runs on this CPU, best
        first (e.g. ``["avx3", "avx2", "scalar"]``), or None when there is no library or it does not load,
        "error": why it did not load or None, "compiler": the C++ compiler on PATH or None, "highway":
        whether that compiler finds Highway's headers (None when not asked: a library is there, or no
        compiler)}``.
    """
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    found = {"prebuilt": None, "cached": None, "targets": None, "error": None, "compiler": cxx, "highway": None}
    try:
        from edgehft.kernels.cpu import build
        pre = build.prebuilt_library()
        cached = build.library_path()
        found["prebuilt"] = str(pre) if pre else None
        found["cached"] = str(cached) if cached.is_file() else None
        if pre or found["cached"]:
            found["targets"] = build.targets()
    except Exception as exc:            # a library that does not load must not hide the box from deploy
        found["error"] = str(exc).splitlines()[0][:300]
    if found["targets"] is None and cxx:
        found["highway"] = _highway_headers(cxx)
    return found


def probe_box(root: str | Path = "/") -> dict:
    """Facts about the machine this runs on (JSON-able).

    Returns:
        ``{"arch", "hostname", "python", "packages": {name: version}, the backends' own facts (built-ins:
        "edgetpu": {"usb": n, "pci": n}, "pynq_board", "l4t", "device_tree_model"), "cxx" (the C++ compiler that
        builds native kernels when no library is there), "native_kernels" (:func:`native_kernels`),
        "cpu_flags" (the native kernels' ISA flags the CPU reports: avx512f, amx_tile, amx_bf16),
        "bundle_format_version"}``; fields the box does not have are None (``cxx`` and ``native_kernels``
        are facts of this machine: None when ``root`` is not ``/``).
    """
    from edgehft.bundle import FORMAT_VERSION
    root = Path(root)
    facts = {"arch": platform.machine(), "hostname": platform.node(), "python": sys.version.split()[0],
             "packages": _versions()}
    facts.update(_backend_facts(root))
    here = root == Path("/")
    facts.update({"cxx": shutil.which(os.environ.get("CXX", "g++")) if here else None,
                  "native_kernels": native_kernels() if here else None,
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


_KERNELS_HINT = ("install edgehft there from its platform wheel (built on a host with g++ and libhwy-dev), "
                 "or install g++ and libhwy-dev on the box, or compile with --quant dynamic")


def kernels_missing(facts: dict) -> str | None:
    """Why the box in ``facts`` cannot run native kernels, or None when it can: its edgehft has a kernel
    library that loads there (``facts["native_kernels"]["targets"]``), or a C++ compiler that finds
    Highway's headers to build one at first open. A box whose edgehft predates ``native_kernels`` (it
    builds the kernels with g++ at first open) needs ``facts["cxx"]``."""
    nk = facts.get("native_kernels")
    if not isinstance(nk, dict):
        if facts.get("cxx"):
            return None
        return ("no C++ compiler (g++) on the box to build the bundle's native kernels (its edgehft "
                f"{facts.get('packages', {}).get('edgehft', '?')} builds them at first open); " + _KERNELS_HINT)
    if nk.get("targets"):
        return None
    if nk.get("compiler") and nk.get("highway"):
        return None
    lib = (f"its kernel library does not load ({nk['error']})" if nk.get("error") else
           "no prebuilt kernel library matching its sources")
    cannot = ("no C++ compiler (g++)" if not nk.get("compiler") else
              f"Google Highway's headers missing (the compiler {nk['compiler']} finds no hwy/highway.h)")
    return f"the box's edgehft has {lib} and cannot build one: {cannot}; " + _KERNELS_HINT


def bf16_missing(facts: dict) -> str | None:
    """Why the box in ``facts`` cannot run the native-bf16 plan's bf16 products in hardware, AMX-BF16 tiles or
    AVX512_BF16's VDPBF16PS (from the CPU flags it reports, and the targets its kernel library runs when it
    reports them), or None."""
    from edgehft.kernels.cpu.build import bf16_in_hardware
    flags = facts.get("cpu_flags")
    targets = (facts.get("native_kernels") or {}).get("targets")
    if targets and bf16_in_hardware(targets):     # the kernels' own CPUID check (older probes report fewer flags)
        return None
    if flags is not None and not ({"amx_tile", "amx_bf16"} <= set(flags) or "avx512_bf16" in flags):
        return ("the box's CPU has neither AMX-BF16 nor AVX512_BF16 (cpu flags: " +
                (", ".join(flags) or "none of avx2/avx512f/avx512_bf16/amx") + "): native-bf16, the plan the box "
                "would run, would have its convs on the fp32 loop instead of the bf16 products it was built for; "
                "compile with --quant auto (every plan shipped, the box times them and chooses), or --quant native")
    if targets:
        return ("the box's native kernels run no bf16 products in hardware there (they run: " + ", ".join(targets) +
                "; AMX needs Linux to grant AMX tile data): native-bf16, the plan the box would run, would have its "
                "convs on the fp32 loop; compile with --quant auto (every plan shipped, the box times them and chooses), "
                "or --quant native")
    return None


def stack_mismatch(board, facts: dict) -> str | None:
    """How the box in ``facts`` differs from the software stack ``board``'s file states (its ``[stack]``,
    :class:`edgehft.boards.Stack`): architecture, Python, TFLite interpreter, package versions; one reason
    naming every difference (e.g. ``"its software stack is not pynq-z2's (PYNQ 3.1 image ...): arch x86_64,
    the image's is armv7l; pynq 4.0.0, the image has >=3.1,<3.2"``), or None when it matches or the board
    states no stack. A fact the box did not report (no ``arch`` or ``python`` key) is not checked."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    from edgehft.runtime.litert import INTERPRETERS
    st = board.stack
    pk = facts.get("packages") or {}
    diff = []

    def outside(version, spec: str) -> bool:
        try:
            return not SpecifierSet(spec).contains(Version(str(version)), prereleases=True)
        except InvalidVersion:
            return True

    def said(version) -> str:
        try:
            Version(str(version))
            return str(version)
        except InvalidVersion:
            return f"{version!r} (not a version edgehft can read)"

    arch, python = facts.get("arch"), facts.get("python")
    if st.arch and "arch" in facts and arch not in st.arch:
        diff.append(f"arch {arch or 'unknown'}, the image's is {' or '.join(st.arch)}")
    if st.python and "python" in facts and outside(python or "0", st.python):
        diff.append(f"Python {said(python) if python else 'unknown'}, the image's is {st.python}")
    if st.interpreter and not any(name in pk for name in st.interpreter):
        have = [n for n in INTERPRETERS if n in pk]
        diff.append(f"TFLite interpreter {', '.join(have) or 'none'}, the image takes {' or '.join(st.interpreter)} "
                    f"(pip install {st.interpreter[0]})")
    for name, spec in st.packages.items():
        if name not in PACKAGES:
            diff.append(f"{name} {spec}: the box's probe does not read {name} (it reads {', '.join(PACKAGES)})")
        elif name not in pk:
            diff.append(f"{name} not installed, the image has {name} {spec}")
        elif outside(pk[name], spec):
            diff.append(f"{name} {said(pk[name])}, the image has {spec}")
    if not diff:
        return None
    image = f" ({st.image})" if st.image else ""
    return f"its software stack is not {board.name}'s{image}: " + "; ".join(diff)


def board_mismatches(board, facts: dict, bundle_format_version: int = 1, needs_kernels: bool = False,
                     needs_bf16: bool = False, needs_cxx: bool = False, stack: bool = True) -> list[str]:
    """Why the box described by ``facts`` is not ``board`` (empty when it is).

    Every box needs an edgehft that reads the bundle's format version; ``needs_kernels`` (a cpu bundle
    whose every plan the box may run is native): a native kernel library that loads there, or what builds
    one (:func:`kernels_missing`); ``needs_bf16`` (the native-bf16 plan): a CPU with AMX-BF16 or AVX512_BF16
    the kernels can use (:func:`bf16_missing`). ``needs_cxx`` is the older name of ``needs_kernels``. What makes a box the
    board is the board's backend's own probe (:mod:`edgehft.backends`, ``probe``; the built-ins' rules are in
    :mod:`edgehft.deploy.probe_rules`: a LiteRT interpreter on every box but a Jetson, plus PYNQ's ``BOARD``,
    the Jetson's L4T release and module, an Edge TPU on the Coral board's bus). Last, with ``stack``, the
    software stack the board file states (:func:`stack_mismatch`).

    Raises:
        BoardUnavailableError: no backend of the board's name is installed here (listing the installed ones).
    """
    from edgehft import backends
    why = []
    pk = facts.get("packages", {})
    if facts.get("bundle_format_version", 0) < bundle_format_version:
        why.append(f"the box's edgehft {pk.get('edgehft', '?')} reads bundle format "
                   f"{facts.get('bundle_format_version')}; this bundle is format {bundle_format_version}")
    for needed, rule in ((needs_bf16, bf16_missing), (needs_kernels or needs_cxx, kernels_missing)):
        reason = rule(facts) if needed else None
        if reason:
            why.append(reason)
    probe = backends.get(board.backend).load("probe")
    why += list(probe(board, facts))
    differs = stack_mismatch(board, facts) if stack else None
    return why + ([differs] if differs else [])
