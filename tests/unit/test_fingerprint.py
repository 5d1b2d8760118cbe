"""The machine fingerprint (issue 19): CPU facts from py-cpuinfo and psutil rather than hand-parsed /proc, with
the SIMD level that decides the cpu board's plans; the same fields from /proc where those packages are missing
(a box venv made before them, or armv7l without psutil)."""
from __future__ import annotations

import json
import os
import sys

import pytest
from click.testing import CliRunner

from edgehft.bench import fingerprint as fpm
from edgehft.cli import main
from tiny_bundle import write_tiny_bundle


@pytest.mark.parametrize("flags, machine, level", [
    (["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"], "x86_64", "amx"),  # SPR
    (["avx2", "fma", "avx512f", "avx512bf16", "avx512vnni"], "x86_64", "avx512_bf16"),   # Zen 4, cpuid spelling
    (["avx2", "fma", "avx512f", "avx512_vnni"], "x86_64", "avx512"),                     # Ice Lake
    (["avx2", "fma", "amx_tile"], "x86_64", "avx2"),                   # AMX tiles without AMX-BF16: not amx
    (["avx", "avx2"], "x86_64", "none"),                               # AVX2 without FMA: not the kernels' AVX2
    (["sse4_2"], "x86_64", "none"),
    (["fp", "asimd", "sve"], "aarch64", "neon"),
    ([], "aarch64", "neon"),                                           # every aarch64 has ASIMD
    (["half", "thumb", "vfpv4", "neon"], "armv7l", "neon"),            # a PYNQ-Z2's Cortex-A9
    (["half", "thumb", "vfpv3"], "armv7l", "none"),
])
def test_isa_level(flags, machine, level):
    assert fpm.isa_level(flags, machine) == level


def _proc_cpu() -> tuple[str, list[str]]:
    model, flags = "", []
    for line in open("/proc/cpuinfo"):
        k, _, v = line.partition(":")
        if k.strip() == "model name" and not model:
            model = v.strip()
        if k.strip() == "flags" and not flags:
            flags = v.split()
    return model, flags


@pytest.fixture
def fresh_cpu_info():
    fpm.cpu_info.cache_clear()
    yield
    fpm.cpu_info.cache_clear()


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo") or os.uname().machine != "x86_64",
                    reason="compares with an x86-64 Linux /proc/cpuinfo")
def test_the_fingerprint_from_the_libraries_agrees_with_proc(fresh_cpu_info):
    pytest.importorskip("cpuinfo")
    psutil = pytest.importorskip("psutil")
    model, flags = _proc_cpu()
    fp = fpm.machine_fingerprint()
    assert fp["cpu_info_from"].startswith("py-cpuinfo ") and fp["isa"] == fpm.isa_level(flags, "x86_64")
    assert fp["cpu_model"] == model and fp["virtualized"] == ("hypervisor" in flags)
    total_kib = int(next(x for x in open("/proc/meminfo") if x.startswith("MemTotal:")).split()[1])
    assert abs(fp["memory_mib"] - total_kib / 1024) <= 1 and fp["physical_cores"] == psutil.cpu_count(logical=False)
    from edgehft.kernels.cpu import build
    if build.prebuilt_library() or build.library_path().is_file():
        assert fp["kernel_targets"] == build.targets()


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="the fallback reads /proc/cpuinfo")
def test_without_py_cpuinfo_and_psutil_the_same_fields_from_proc(fresh_cpu_info, monkeypatch):
    with_libs = fpm.machine_fingerprint()
    fpm.cpu_info.cache_clear()
    monkeypatch.setitem(sys.modules, "cpuinfo", None)        # import cpuinfo / psutil raise ImportError
    monkeypatch.setitem(sys.modules, "psutil", None)
    fp = fpm.machine_fingerprint()
    assert fp["cpu_info_from"] == "/proc/cpuinfo (py-cpuinfo not installed or it found no flags)"
    assert set(fp) == set(with_libs) and (fp["physical_cores"], fp["memory_mib"]) == (None, None)
    assert (fp["isa"], fp["virtualized"], fp["vnni"]) == (with_libs["isa"], with_libs["virtualized"], with_libs["vnni"])
    mem = fpm.process_memory()
    assert mem["rss_from"] == "statm" and 10 < mem["rss_mib"] <= mem["peak_rss_mib"]


def test_bench_shows_the_isa(tmp_path):
    tiny = write_tiny_bundle(tmp_path)
    res = CliRunner().invoke(main, ["bench", str(tiny), "--samples", "10", "--json"])
    assert res.exit_code == 0, res.output
    fp = json.loads(res.output.strip().splitlines()[-1])["fingerprint"]
    assert fp["isa"] in fpm.ISA_NAMES and fp["isa"] == fpm.isa_level(fpm.cpu_info()["flags"], fp["machine"])
    res = CliRunner().invoke(main, ["bench", str(tiny), "--samples", "10"], terminal_width=200)
    assert f"CPUs, {fpm.ISA_NAMES[fp['isa']]}" in res.output, res.output


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="the fallback reads /proc/cpuinfo")
def test_py_cpuinfo_that_found_nothing_falls_back_to_proc(fresh_cpu_info, monkeypatch):
    """py-cpuinfo answers {} when its CPUID child process fails: the flags then come from /proc, not an empty
    list (which would say "none")."""
    import types
    fake = types.SimpleNamespace(get_cpu_info=lambda: {}, CPUINFO_VERSION_STRING="9.0.0")
    monkeypatch.setitem(sys.modules, "cpuinfo", fake)
    info = fpm.cpu_info()
    assert info["from"].startswith("/proc/cpuinfo") and info["flags"] == sorted(set(_proc_cpu()[1]))
