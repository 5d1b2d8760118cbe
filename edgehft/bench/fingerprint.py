"""The machine fingerprint printed with every latency figure: numbers mean little without it.

The CPU (model, flags, SIMD level) comes from py-cpuinfo and the core count and memory from psutil, both
core dependencies; a box whose venv predates them (or a PYNQ-Z2, where psutil has no armv7l wheel) gets the
same fields from ``/proc/cpuinfo`` and ``os``, and ``cpu_info_from`` says which. What is not in either library
(the frequency governor, isolated CPUs) is read from ``/sys``.
"""
from __future__ import annotations

import functools
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# The SIMD levels that decide the cpu board's plans (the native kernels' targets, the bf16 plans), best first,
# as (level, flags that make it: every one, compared without "_" and "-"). aarch64 always has NEON (ASIMD).
ISA_LEVELS = (("amx", ("amxtile", "amxbf16")), ("avx512_bf16", ("avx512bf16",)), ("avx512", ("avx512f",)),
              ("avx2", ("avx2", "fma")), ("neon", ("asimd",)), ("neon", ("neon",)))
ISA_NAMES = {"amx": "AMX-BF16", "avx512_bf16": "AVX-512 BF16", "avx512": "AVX-512", "avx2": "AVX2", "neon": "NEON",
             "none": "no SIMD level"}


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def isa_level(flags, machine: str = "") -> str:
    """The best of :data:`ISA_LEVELS` the CPU ``flags`` (any spelling: ``avx512_bf16`` or ``avx512bf16``) give, or
    ``neon`` on aarch64 / arm64, else ``none``."""
    have = {str(f).lower().replace("_", "").replace("-", "") for f in flags}
    for level, needs in ISA_LEVELS:
        if all(n in have for n in needs):
            return level
    return "neon" if machine.lower() in ("aarch64", "arm64") else "none"


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict:
    """``{"cpu_model", "flags" (sorted), "from"}`` of this CPU: py-cpuinfo's ``get_cpu_info()`` (about a second:
    it reads CPUID in a child process; cached per process), else (not installed, or its child failed and it
    found no flags) ``/proc/cpuinfo``'s ``model name`` / ``Hardware`` and ``flags`` / ``Features`` lines."""
    try:
        import cpuinfo
        info = cpuinfo.get_cpu_info()          # {} when its child process failed: then /proc
        if info.get("flags"):
            return {"cpu_model": info.get("brand_raw") or platform.processor() or "?",
                    "flags": sorted(set(info["flags"])), "from": "py-cpuinfo " + cpuinfo.CPUINFO_VERSION_STRING}
    except Exception:            # noqa: BLE001 - not installed, or it failed on an odd CPU: /proc says enough
        pass
    model, flags = None, []
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Hardware", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = value.split()
    return {"cpu_model": model or platform.processor() or "?", "flags": sorted(set(flags)),
            "from": "/proc/cpuinfo (py-cpuinfo not installed or it found no flags)"}


def _kernel_targets() -> list | None:
    """The SIMD targets edgehft's native kernel library runs here, best first (what the native plans use), or
    None where no library is built (nothing is built here)."""
    try:
        from edgehft.kernels.cpu import build
        if build.prebuilt_library() or build.library_path().is_file():
            return build.targets()
    except Exception:            # noqa: BLE001 - a library that does not load must not hide the fingerprint
        pass
    return None


def _cores_and_memory() -> dict:
    """Physical cores and total memory (MiB) from psutil; None where psutil is not installed."""
    try:
        import psutil
    except ImportError:
        return {"physical_cores": None, "memory_mib": None}
    return {"physical_cores": psutil.cpu_count(logical=False),
            "memory_mib": round(psutil.virtual_memory().total / (1 << 20))}


def machine_fingerprint() -> dict:
    """CPU model, its SIMD level (``isa``: the best of amx, avx512_bf16, avx512, avx2, neon, or none, from its
    flags; ``kernel_targets``: what edgehft's native kernels run, which also needs the OS's leave for AMX),
    logical CPUs, physical cores, memory (MiB), frequency governor, affinity, isolated CPUs, kernel and library
    versions, and where the CPU facts came from (``cpu_info_from``)."""
    cpu = cpu_info()
    flags = set(cpu["flags"])
    libs = {}
    for pkg in ("numpy", "ai-edge-litert", "tflite-runtime", "edgehft"):
        try:
            libs[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return {
        "cpu_model": cpu["cpu_model"],
        "machine": platform.machine(),
        "isa": isa_level(flags, platform.machine()),
        "kernel_targets": _kernel_targets(),
        "logical_cpus": os.cpu_count(),
        **_cores_and_memory(),
        "governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") or "n/a (no cpufreq)",
        "affinity": sorted(os.sched_getaffinity(0)),
        "isolated_cpus": _read("/sys/devices/system/cpu/isolated") or "",
        "virtualized": "hypervisor" in flags,
        "vnni": bool({"avx512_vnni", "avx512vnni", "avx_vnni", "avxvnni"} & flags),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "libraries": libs,
        "cpu_info_from": cpu["from"],
    }


def process_memory() -> dict:
    """This process's memory footprint in MiB: ``rss_mib`` resident now (psutil where installed, else Linux's
    ``/proc/self/statm``; None where neither answers), ``peak_rss_mib`` the peak resident size so far
    (``resource.getrusage``'s ``ru_maxrss``; None where there is no ``resource`` module), and ``rss_from``
    (``psutil``, ``statm`` or None)."""
    rss, how = None, None
    try:
        import psutil
        rss, how = psutil.Process().memory_info().rss, "psutil"
    except ImportError:
        try:
            with open("/proc/self/statm") as fh:
                rss, how = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"), "statm"
        except (OSError, ValueError, IndexError):
            pass
    try:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB on Linux, bytes on macOS
        peak_b = peak if sys.platform == "darwin" else peak * 1024
    except ImportError:
        peak_b = None
    if rss is not None and peak_b is not None:
        peak_b = max(peak_b, rss)        # ru_maxrss is updated lazily by the kernel: the peak is at least now
    mib = 1 << 20
    return {"rss_mib": None if rss is None else round(rss / mib, 1),
            "peak_rss_mib": None if peak_b is None else round(peak_b / mib, 1), "rss_from": how}
