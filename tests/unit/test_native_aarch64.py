"""The native CPU kernels on aarch64 (issue 15 item 3): the same sources cross-compiled with Debian's
g++-aarch64-linux-gnu and run under QEMU user mode (qemu-user-static) give, on NEON and on the scalar
fallback, the same bits as this machine's build on every target it runs (whose accuracy against float64 the
other native kernel tests check). Skipped where the cross compiler or QEMU is missing. QEMU says nothing
about speed on ARM.

A small C++ driver (below) calls the kernels' C API on every target its CPU runs (LSTM: two stacked layers
with a cell clip; CONV_2D: 2x4 stride (3, 2) VALID with LEAKY_RELU; FULLY_CONNECTED) on inputs from a fixed
LCG and prints each output's FNV-1a hash of the float bits and its first value.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from edgehft.kernels.cpu import build

CROSS, QEMU = "aarch64-linux-gnu-g++", "qemu-aarch64-static"
SYSROOT = Path("/usr/aarch64-linux-gnu")
pytestmark = [pytest.mark.needs("g++"),
              pytest.mark.skipif(not (shutil.which(CROSS) and shutil.which(QEMU) and SYSROOT.is_dir()),
                                 reason=f"no {CROSS} / {QEMU} (apt-get install g++-aarch64-linux-gnu qemu-user-static)")]

DRIVER = r"""
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
extern "C" {
const char* edgehft_cpu_targets();
int edgehft_cpu_set_target(const char*);
void* edgehft_lstm_create(int, int, int, const int*, const float* const*, const float* const*, const float* const*,
                          int, float);
int edgehft_lstm_run(void*, const float*, float*);
void* edgehft_conv_create(const int*, const float*, const float*, int, float, int);
int edgehft_conv_run(void*, const float*, float*);
void* edgehft_dense_create(int, int, int, const float*, const float*, int);
int edgehft_dense_run(void*, const float*, float*);
}
static uint32_t state = 12345;
static float rnd() { state = state * 1664525u + 1013904223u; return (state >> 8) / 16777216.0f - 0.5f; }
static void fill(std::vector<float>& v, float s) { for (auto& f : v) f = s * rnd(); }
static unsigned long long fnv(const std::vector<float>& v) {
    unsigned long long h = 1469598103934665603ull;
    for (float f : v) { uint32_t u; memcpy(&u, &f, 4); h = (h ^ u) * 1099511628211ull; }
    return h;
}
int main() {
    printf("targets %s\n", edgehft_cpu_targets());
    const int T = 30, IN = 13, Hs[2] = {37, 100};
    std::vector<float> W0(13 * 148), U0(37 * 148), b0(148), W1(37 * 400), U1(100 * 400), b1(400), x(T * IN);
    for (auto* v : {&W0, &U0, &b0, &W1, &U1, &b1, &x}) fill(*v, 1.0f);
    const float* Ws[2] = {W0.data(), W1.data()};
    const float* Us[2] = {U0.data(), U1.data()};
    const float* bs[2] = {b0.data(), b1.data()};
    const int dims[12] = {13, 11, 40, 33, 2, 4, 3, 2, 0, 0, 4, 4};
    std::vector<float> cw(33 * 2 * 4 * 40), cb(33), cx(13 * 11 * 40), dw(40 * 77), db(40), dx(3 * 77);
    for (auto* v : {&cw, &cb, &cx, &dw, &db, &dx}) fill(*v, 4.0f);
    for (const char* t : {"avx3", "avx2", "neon", "scalar"}) {
        if (edgehft_cpu_set_target(t) != 0) continue;
        std::vector<float> ly(T * 100), cy(4 * 4 * 33), dy(3 * 40);
        edgehft_lstm_run(edgehft_lstm_create(2, T, IN, Hs, Ws, Us, bs, 1, 3.0f), x.data(), ly.data());
        edgehft_conv_run(edgehft_conv_create(dims, cw.data(), cb.data(), 4, 0.1f, 1), cx.data(), cy.data());
        edgehft_dense_run(edgehft_dense_create(3, 77, 40, dw.data(), db.data(), 0), dx.data(), dy.data());
        printf("%s lstm %016llx %.9g conv %016llx %.9g dense %016llx %.9g\n", t, fnv(ly), ly[0], fnv(cy), cy[0],
               fnv(dy), dy[0]);
    }
}
"""


def _results(stdout: str) -> tuple[list[str], dict[str, str]]:
    lines = stdout.strip().splitlines()
    assert lines[0].startswith("targets "), stdout
    return lines[0].split()[1].split(","), {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in lines[1:]}


def test_aarch64_build_gives_the_x86_bits(tmp_path):
    (tmp_path / "driver.cpp").write_text(DRIVER)
    x86_lib = build.load_library()._name
    subprocess.run(["g++", "-O1", str(tmp_path / "driver.cpp"), x86_lib, f"-Wl,-rpath,{Path(x86_lib).parent}",
                    "-o", str(tmp_path / "x86")], check=True)
    x86_targets, x86 = _results(subprocess.run([str(tmp_path / "x86")], capture_output=True, text=True,
                                               check=True).stdout)
    inc = tmp_path / "include"
    inc.mkdir()
    (inc / "hwy").symlink_to(Path("/usr/include/hwy"))          # Highway's headers are the same on every arch
    lib = tmp_path / "libedgehft_cpu.so"
    srcs = [str(p) for p in build.sources() if p.suffix == ".cpp"]
    subprocess.run([CROSS, *build.CXXFLAGS, *build.NATIVE_FLAGS, f"-I{build.HERE}", f"-I{inc}", *srcs, "-o", str(lib)],
                   check=True, capture_output=True, text=True, timeout=900)
    subprocess.run([CROSS, "-O1", str(tmp_path / "driver.cpp"), str(lib), "-o", str(tmp_path / "arm")], check=True)
    res = subprocess.run([QEMU, "-L", str(SYSROOT), "-E", f"LD_LIBRARY_PATH={tmp_path}", str(tmp_path / "arm")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    arm_targets, arm = _results(res.stdout)
    assert arm_targets == ["neon", "scalar"] and list(arm) == arm_targets
    assert set(x86) == set(x86_targets) - set(build.CONV_ONLY)
    want = x86[[t for t in x86_targets if t not in build.CONV_ONLY][0]]
    assert "nan" not in want and len(set(want.split()[1::3])) == 3        # three different, finite outputs
    for t, got in {**x86, **arm}.items():
        assert got == want, (t, got, want)
