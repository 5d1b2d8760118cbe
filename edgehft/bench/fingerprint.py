"""The machine fingerprint printed with every latency figure: numbers mean little without it."""
from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def machine_fingerprint() -> dict:
    """CPU model, core count, frequency governor, affinity, isolated CPUs, kernel and library versions."""
    cpu_model, flags = platform.processor() or "?", ""
    info = _read("/proc/cpuinfo") or ""
    for line in info.splitlines():
        if line.startswith("model name") and cpu_model in ("?", "", platform.machine()):
            cpu_model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = line.split(":", 1)[1]
    libs = {}
    for pkg in ("numpy", "ai-edge-litert", "tflite-runtime", "edgehft"):
        try:
            libs[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return {
        "cpu_model": cpu_model,
        "machine": platform.machine(),
        "logical_cpus": os.cpu_count(),
        "governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") or "n/a (no cpufreq)",
        "affinity": sorted(os.sched_getaffinity(0)),
        "isolated_cpus": _read("/sys/devices/system/cpu/isolated") or "",
        "virtualized": " hypervisor" in f" {flags} ",
        "vnni": "avx512_vnni" in flags or "avx_vnni" in flags,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "libraries": libs,
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
