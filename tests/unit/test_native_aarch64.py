"""The native CPU kernels on aarch64 (issue 15 item 3): the same sources cross-compiled with Debian's
g++-aarch64-linux-gnu and run under QEMU user mode (qemu-user-static) give, on NEON and on the scalar
fallback, the same bits as this machine's build on every target it runs (whose accuracy against float64 the
other native kernel tests check). Skipped where the cross compiler or QEMU is missing. QEMU says nothing
about speed on ARM.

A small C++ driver (below) calls the kernels' C API on every target its CPU runs (LSTM: two stacked layers
with a cell clip, with fp32 and with bf16 recurrent weights, whose vector-pair layout depends on the target's
lanes; CONV_2D: 2x4 stride (3, 2) VALID with LEAKY_RELU; FULLY_CONNECTED) on inputs from a fixed
LCG and prints each output's FNV-1a hash of the float bits and its first value.
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
        std::vector<float> ly(T * 100), lb(T * 100), cy(4 * 4 * 33), dy(3 * 40);
        edgehft_lstm_run(edgehft_lstm_create(2, T, IN, Hs, Ws, Us, bs, 1, 3.0f, 0), x.data(), ly.data());
        edgehft_lstm_run(edgehft_lstm_create(2, T, IN, Hs, Ws, Us, bs, 1, 3.0f, 1), x.data(), lb.data());
        edgehft_conv_run(edgehft_conv_create(dims, cw.data(), cb.data(), 4, 0.1f, 1), cx.data(), cy.data());
        edgehft_dense_run(edgehft_dense_create(3, 77, 40, dw.data(), db.data(), 0), dx.data(), dy.data());
        printf("%s lstm %016llx %.9g lstm-bf16 %016llx %.9g conv %016llx %.9g dense %016llx %.9g\n", t, fnv(ly),
               ly[0], fnv(lb), lb[0], fnv(cy), cy[0], fnv(dy), dy[0]);
    }
}
"""


def test_aarch64_build_gives_the_x86_bits(tmp_path, aarch64_library):
    x86_targets, x86 = run_here(DRIVER, tmp_path)
    arm_targets, arm = run_on_arm(DRIVER, aarch64_library, tmp_path)
    assert arm_targets == ["neon", "scalar"] and list(arm) == arm_targets
    assert set(x86) == set(x86_targets) - set(build.CONV_ONLY)
    want = x86[[t for t in x86_targets if t not in build.CONV_ONLY][0]]
    assert "nan" not in want and len(set(want.split()[1::3])) == 4        # four different, finite outputs
    for t, got in {**x86, **arm}.items():
        assert got == want, (t, got, want)
