"""The machine fingerprint printed with every latency figure: numbers mean little without it."""
from __future__ import annotations

import os
import platform
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
