"""The stream executor (edgehft/kernels/cpu/cpu_stream.cpp, issue 21) on aarch64: the kernel library cross-compiled
with Debian's g++-aarch64-linux-gnu and run under QEMU user mode gives, on NEON and on the scalar fallback, the
same bits as this machine's build on every target it runs; and on every target of both, each push equals the
native LSTM kernel (edgehft_lstm_run) on its window and the head the same bits. Skipped where the cross compiler
or QEMU is missing (as tests/unit/test_native_aarch64.py). QEMU says nothing about speed on ARM.

The C++ driver below pushes rows from a fixed LCG through two stacked layers (37 and 100 units, cell clip 3)
with a Dense(3) head, prepared ahead on even windows and late on odd ones, and prints per target the FNV-1a
hash of every output's float bits, whether each window's last h equalled edgehft_lstm_run's, and the first
output.
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
void* edgehft_stream_create(int, int, int, const int*, const float* const*, const float* const*,
                            const float* const*, const float*, int, const float*, const float*, int);
int edgehft_stream_push(void*, const float*, float*);
int edgehft_stream_prepare(void*);
void edgehft_stream_destroy(void*);
}
static uint32_t state = 4242;
static float rnd() { state = state * 1664525u + 1013904223u; return (state >> 8) / 16777216.0f - 0.5f; }
static void fill(std::vector<float>& v, float s) { for (auto& f : v) f = s * rnd(); }
int main() {
    printf("targets %s\n", edgehft_cpu_targets());
    const int T = 12, IN = 13, N = 60, Hs[2] = {37, 100};
    std::vector<float> W0(13 * 148), U0(37 * 148), b0(148), W1(37 * 400), U1(100 * 400), b1(400), hw(3 * 100), hb(3);
    std::vector<float> rows(N * IN);
    for (auto* v : {&W0, &U0, &b0, &W1, &U1, &b1, &hw, &hb, &rows}) fill(*v, 1.0f);
    const float* Ws[2] = {W0.data(), W1.data()};
    const float* Us[2] = {U0.data(), U1.data()};
    const float* bs[2] = {b0.data(), b1.data()};
    const float clips[2] = {3.0f, 3.0f};
    for (const char* t : {"avx3", "avx2", "neon", "scalar"}) {
        if (edgehft_cpu_set_target(t) != 0) continue;
        void* net = edgehft_lstm_create(2, T, IN, Hs, Ws, Us, bs, 0, 3.0f);
        void* last = edgehft_stream_create(2, T, IN, Hs, Ws, Us, bs, clips, 0, nullptr, nullptr, 1);
        void* head = edgehft_stream_create(2, T, IN, Hs, Ws, Us, bs, clips, 3, hw.data(), hb.data(), 0);
        unsigned long long h = 1469598103934665603ull;
        int equal = 0, outputs = 0;
        float first = 0, y[100], ref[100], o[3];
        for (int i = 0; i < N; i++) {
            if (i % 2 == 0) { edgehft_stream_prepare(last); edgehft_stream_prepare(head); }
            const int rc = edgehft_stream_push(last, &rows[i * IN], y);
            edgehft_stream_push(head, &rows[i * IN], o);
            if (rc != 0) continue;
            edgehft_lstm_run(net, &rows[(i - T + 1) * IN], ref);
            equal += memcmp(y, ref, sizeof(y)) == 0;
            if (!outputs++) first = o[0];
            for (float f : o) { uint32_t u; memcpy(&u, &f, 4); h = (h ^ u) * 1099511628211ull; }
            for (float f : y) { uint32_t u; memcpy(&u, &f, 4); h = (h ^ u) * 1099511628211ull; }
        }
        printf("%s %016llx equal %d/%d first %.9g\n", t, h, equal, outputs, first);
        edgehft_stream_destroy(last);
        edgehft_stream_destroy(head);
    }
}
"""


def _results(stdout: str) -> tuple[list[str], dict[str, str]]:
    lines = stdout.strip().splitlines()
    assert lines[0].startswith("targets "), stdout
    return lines[0].split()[1].split(","), {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in lines[1:]}


def test_aarch64_stream_gives_the_x86_bits(tmp_path):
    (tmp_path / "driver.cpp").write_text(DRIVER)
    x86_lib = build.load_library()._name
    subprocess.run(["g++", "-O1", str(tmp_path / "driver.cpp"), x86_lib, f"-Wl,-rpath,{Path(x86_lib).parent}",
                    "-o", str(tmp_path / "x86")], check=True)
    x86_targets, x86 = _results(subprocess.run([str(tmp_path / "x86")], capture_output=True, text=True,
                                               check=True).stdout)
    inc = tmp_path / "include"
    inc.mkdir()
    (inc / "hwy").symlink_to(Path("/usr/include/hwy"))
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
    assert "equal 49/49" in want and "nan" not in want           # 60 rows, T = 12: 49 windows, each exact
    for t, got in {**x86, **arm}.items():
        assert got == want, (t, got, want)
