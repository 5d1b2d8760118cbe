"""The native CPU kernels' run-time dispatch (edgehft/kernels/cpu/cpu_dispatch.cpp, edgehft.kernels.cpu.build):
one library for every SIMD target, the target chosen from this CPU and forceable, every target giving the
same bits, and the library built once (no host CPU flags) and preferred prebuilt.

The per-kernel accuracy against float64 on every target is in test_native_lstm.py, test_native_conv.py and
test_native_ops.py (parametrized over the same targets); here the targets are compared with each other.
"""
from __future__ import annotations

import json
import os
import platform
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgehft.errors import BoardUnavailableError, InputError
from edgehft.kernels.cpu import build
from edgehft.kernels.cpu.build import dispatch_target, force_target, set_target, targets
from edgehft.kernels.cpu.conv import NativeConv2D
from edgehft.kernels.cpu.lstm import NativeLSTM
from edgehft.kernels.cpu.ops import NativeDense, NativeMaxPool2D
from native_reference import BOUND, bf16, cpu_targets, reference_conv, reference_lstm, simd_target

pytestmark = pytest.mark.needs("g++")
SIMD = [t for t in cpu_targets() if t not in build.CONV_ONLY]   # the conv's AMX / VDPBF16PS sum in other orders
ROOT = Path(__file__).resolve().parents[2]


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def test_targets_follow_this_cpu_best_first():
    """The scalar fallback always, AVX2 where the CPU has AVX2 + FMA, AVX3 where it has AVX-512
    F/VL/DQ/BW, AVX3_BF16 where it also has AVX512_BF16 (x86-64); NEON on aarch64; the best is what kernels
    get unless forced."""
    ts, flags = targets(), _cpu_flags()
    assert ts[-1] == "scalar" and len(set(ts)) == len(ts)
    order = ["amx", "avx3_bf16", "avx3", "avx2", "neon", "scalar"]
    assert ts == sorted(ts, key=order.index)
    if platform.machine() == "x86_64":
        assert ("avx2" in ts) == ({"avx2", "fma", "bmi2", "f16c"} <= flags)
        assert ("avx3" in ts) == ({"avx2", "fma", "avx512f", "avx512vl", "avx512dq", "avx512bw"} <= flags)
        assert ("avx3_bf16" in ts) == ("avx3" in ts and "avx512_bf16" in flags)
        assert ("amx" in ts) <= ("amx_tile" in flags)
        assert "neon" not in ts
    elif platform.machine() == "aarch64":
        assert ts == ["neon", "scalar"]
    assert dispatch_target() == ts[0]
    assert build.compiled_targets()[-1] in ("SCALAR", "EMU128")


def test_forced_target_applies_to_kernels_created_under_it():
    """force_target: kernels created inside run that target (isa), those created before or after keep
    the best; the target in force is restored, also after an exception."""
    layers = [(np.ones((3, 8), np.float32), np.ones((2, 8), np.float32), np.zeros(8, np.float32))]
    before = NativeLSTM(layers, 2)
    for t in SIMD:
        with force_target(t) as got:
            assert got == t == dispatch_target()
            inside = NativeLSTM(layers, 2)
        assert inside.isa == t and before.isa == simd_target(targets()[0]) and dispatch_target() == targets()[0]
    with pytest.raises(ZeroDivisionError):
        with force_target("scalar"):
            1 / 0
    assert dispatch_target() == targets()[0]
    with force_target("scalar"):
        with force_target("best"):
            assert dispatch_target() == targets()[0]
        assert dispatch_target() == "scalar"
    assert NativeLSTM(layers, 2, portable=True).isa == "scalar"


def test_unknown_or_unsupported_target_is_refused():
    with pytest.raises(InputError, match="unknown CPU kernel target 'sse9'"):
        set_target("sse9")
    absent = [t for t in ("amx", "avx3_bf16", "avx3", "avx2", "neon") if t not in targets()]
    for t in absent:
        with pytest.raises(BoardUnavailableError, match=f"does not run the {t} kernels") as e:
            set_target(t)
        assert "scalar" in e.value.hint
    assert dispatch_target() == targets()[0]
    if "avx3" in targets():
        with force_target("avx512") as got:                # the alias
            assert got == "avx3"


def _lstm_case(rng):
    layers, n_in = [], 13
    for H in (37, 100):
        layers.append((rng.normal(0, 1 / np.sqrt(n_in), (n_in, 4 * H)).astype(np.float32),
                       rng.normal(0, 1 / np.sqrt(H), (H, 4 * H)).astype(np.float32),
                       rng.normal(0, 0.3, 4 * H).astype(np.float32)))
        n_in = H
    return layers, rng.normal(0, 1, (30, 13)).astype(np.float32)


def test_every_target_gives_the_same_bits():
    """LSTM (stacked, cell clip), CONV_2D (several geometries, leaky relu), MAX_POOL_2D and
    FULLY_CONNECTED: the outputs of every SIMD target this CPU runs are bit-identical (the kernels do the
    same fused multiply-adds in the same order on every lane), and right (against float64)."""
    if len(SIMD) < 2:
        pytest.skip(f"this CPU runs one SIMD target only ({SIMD})")
    rng = np.random.default_rng(1)
    layers, x = _lstm_case(rng)
    convs = [((100, 20, 32, 32), (4, 1), (1, 1), "SAME"), ((13, 11, 40, 33), (2, 4), (3, 2), "VALID"),
             ((28, 28, 3, 24), (3, 3), (2, 2), "SAME")]
    conv_in = [(rng.standard_normal((Co, *k, C)).astype(np.float32), rng.standard_normal(Co).astype(np.float32),
                rng.standard_normal((H, W, C)).astype(np.float32)) for (H, W, C, Co), k, _, _ in convs]
    xp = rng.standard_normal((1, 13, 11, 21)).astype(np.float32)
    wd, bd, xd = (rng.standard_normal(s).astype(np.float32) for s in ((40, 77), (40,), (3, 77)))
    outs = {}
    for t in SIMD:
        with force_target(t):
            o = [NativeLSTM(layers, 30, True, cell_clip=3.0).run(x).copy()]
            for ((H, W, C, Co), k, s, pad), (w, b, xc) in zip(convs, conv_in):
                o.append(NativeConv2D(w, b, (H, W), C, s, pad, activation="leaky_relu", alpha=0.1).run(xc).copy())
            o.append(NativeMaxPool2D((13, 11), 21, (3, 2), (2, 1), "SAME", "relu6").run(xp).copy())
            o.append(NativeDense(wd, bd, 3).run(xd).copy())
        outs[t] = o
    first = outs[SIMD[0]]
    for t in SIMD[1:]:
        for i, (a, b) in enumerate(zip(first, outs[t])):
            assert np.array_equal(a, b), (SIMD[0], t, i, np.abs(a - b).max())
    assert np.abs(first[0] - reference_lstm(layers, x, True, 3.0)).max() < BOUND
    for y, ((H, W, C, Co), k, s, pad), (w, b, xc) in zip(first[1:4], convs, conv_in):
        ref, mag = reference_conv(bf16(xc), bf16(w), b, s, pad, "leaky_relu", 0.1)
        assert (np.abs(y[0] - ref) <= 1e-6 * (mag + np.abs(b))).all()
    assert np.abs(first[5] - (xd.astype(np.float64) @ wd.T + bd)).max() < 1e-4


def _run_py(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env}, cwd=ROOT)


def test_environment_variable_picks_the_target():
    """EDGEHFT_CPU_TARGET, read when the library is first loaded: the kernels of that process run it; a
    name that is no target is a one-line InputError naming the variable, not a crash."""
    want = SIMD[-1]
    res = _run_py("from edgehft.kernels.cpu.build import dispatch_target\n"
                  "from edgehft.kernels.cpu.ops import NativeMaxPool2D\n"
                  "print(dispatch_target(), NativeMaxPool2D((4, 4), 3, (2, 2)).isa)", EDGEHFT_CPU_TARGET=want)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [want, want]
    res = _run_py("from edgehft.errors import InputError\nfrom edgehft.kernels.cpu.build import targets\n"
                  "try:\n    targets()\nexcept InputError as e:\n    print('refused:', e.args[0])",
                  EDGEHFT_CPU_TARGET="avx9000")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "refused: $EDGEHFT_CPU_TARGET: unknown CPU kernel target 'avx9000'"


def _needed(lib: Path) -> set[str]:
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line}


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory) -> Path:
    """build_all into a fresh directory, as the wheel/install step does."""
    d = tmp_path_factory.mktemp("prebuilt")
    build.build_all(d)
    return d


def test_build_all_makes_one_portable_library_with_its_manifest(prebuilt):
    """One library, built without -march (the same binary for every CPU of the architecture), needing
    nothing beyond the C/C++ runtime (no libhwy: Highway is used as headers only), with a manifest of
    what it was built from."""
    lib, man = prebuilt / "libedgehft_cpu.so", json.loads((prebuilt / "libedgehft_cpu.json").read_text())
    assert lib.is_file() and man["sources_sha256"] == build.source_digest()
    assert man["machine"] == platform.machine() and man["flags"] == [*build.CXXFLAGS, *build.NATIVE_FLAGS]
    assert not [f for f in man["flags"] if f.startswith(("-march", "-mtune", "-mavx"))]
    if platform.system() == "Linux":
        needed = _needed(lib)
        assert needed and needed <= {"libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libc.so.6",
                                     "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}, needed
    assert {p.name for p in build.sources()} >= {"cpu_dispatch.cpp", "cpu_dispatch.h", "cpu_lstm.cpp",
                                                "cpu_conv.cpp", "cpu_ops.cpp", "cpu_simd-inl.h"}


def test_a_matching_prebuilt_library_is_loaded_without_a_compiler(prebuilt, monkeypatch, tmp_path):
    """With no compiler and an empty cache, the prebuilt library is what loads and the kernels run; one
    whose manifest names other sources is not used (then the build is tried, and fails without g++)."""
    monkeypatch.setattr(build, "PREBUILT_DIR", prebuilt)
    monkeypatch.setattr(build, "_LIBS", {})
    monkeypatch.setenv("EDGEHFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    assert build.prebuilt_library() == prebuilt / "libedgehft_cpu.so"
    layers, x = _lstm_case(np.random.default_rng(2))
    k = NativeLSTM(layers, 30)
    assert k._lib._name == str(prebuilt / "libedgehft_cpu.so")
    assert np.abs(k.run(x) - reference_lstm(layers, x, False)).max() < BOUND
    assert not (tmp_path / "cache").exists()
    man = prebuilt / "libedgehft_cpu.json"
    good = man.read_text()
    try:
        man.write_text(good.replace(build.source_digest(), "0" * 64))
        monkeypatch.setattr(build, "_LIBS", {})
        assert build.prebuilt_library() is None
        with pytest.raises(BoardUnavailableError, match="no C\\+\\+ compiler"):
            build.load_library()
    finally:
        man.write_text(good)


def test_cache_key_is_sources_flags_and_compiler(monkeypatch, tmp_path):
    """The cache name depends on the sources, the flags and the compiler, and on nothing of the host CPU
    (the binary is the same everywhere)."""
    a = build.library_path(tmp_path)
    assert a.parent == tmp_path and a.name.startswith("libedgehft_cpu-") and a == build.library_path(tmp_path)
    monkeypatch.setattr(build, "NATIVE_FLAGS", (*build.NATIVE_FLAGS, "-DX=1"))
    assert build.library_path(tmp_path) != a
    monkeypatch.undo()
    monkeypatch.setenv("CXX", "c++")
    assert (build.library_path(tmp_path) != a) == (build._cxx() != __import__("shutil").which("g++"))


def test_missing_highway_headers_say_how_to_install_them(monkeypatch, tmp_path):
    """A compiler that cannot find hwy/highway.h (libhwy-dev not installed): a one-line
    BoardUnavailableError whose hint names the package, not the compiler's page of errors."""
    cxx = tmp_path / "cxx"
    cxx.write_text("#!/bin/sh\necho 'cpu_lstm.cpp:29:10: fatal error: hwy/foreach_target.h: No such file or "
                   "directory' >&2\nexit 1\n")
    cxx.chmod(cxx.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CXX", str(cxx))
    with pytest.raises(BoardUnavailableError, match="Highway's headers are missing") as e:
        build.build_all(tmp_path / "out")
    assert "libhwy-dev" in e.value.hint
    assert not list((tmp_path / "out").glob("*.so"))
