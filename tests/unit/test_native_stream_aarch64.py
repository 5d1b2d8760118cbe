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

from aarch64_kernels import NEEDS, aarch64_library, run_here, run_on_arm  # noqa: F401  (aarch64_library: a fixture)
from edgehft.kernels.cpu import build

pytestmark = NEEDS

DRIVER = r"""
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
extern "C" {
const char* edgehft_cpu_targets();
int edgehft_cpu_set_target(const char*);
void* edgehft_lstm_create(int, int, int, const int*, const float* const*, const float* const*, const float* const*,
                          int, float, int);
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
        void* net = edgehft_lstm_create(2, T, IN, Hs, Ws, Us, bs, 0, 3.0f, 0);
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


def test_aarch64_stream_gives_the_x86_bits(tmp_path, aarch64_library):
    x86_targets, x86 = run_here(DRIVER, tmp_path)
    arm_targets, arm = run_on_arm(DRIVER, aarch64_library, tmp_path)
    assert arm_targets == ["neon", "scalar"] and list(arm) == arm_targets
    assert set(x86) == set(x86_targets) - set(build.CONV_ONLY)
    want = x86[[t for t in x86_targets if t not in build.CONV_ONLY][0]]
    assert "equal 49/49" in want and "nan" not in want           # 60 rows, T = 12: 49 windows, each exact
    for t, got in {**x86, **arm}.items():
        assert got == want, (t, got, want)
