// edgehft native CPU data-movement ops for the native chain: TFLite MAX_POOL_2D (NHWC, batch 1) and
// CONCATENATION (float32, any axis), so the small ops between native convs need no LiteRT segment.
//
// MAX_POOL_2D semantics (TFLite reference kernel): out[oy][ox][c] = act(max over the filter window of
// x[oy*sh - ph + i][ox*sw - pw + j][c]) with the window clipped to the input (padding never wins), ph/pw
// the leading SAME padding (VALID: 0). Exact in fp32 (a max). Activation: 0 none, 1 relu, 2 relu_n1_to_1,
// 3 relu6 (TFLite's ActivationFunctionType numbering).
//
// CONCATENATION: inputs with equal dims except the axis, row-major; with outer = the product of the dims
// before the axis and inner_i = the product of input i's dims from the axis on, the output is, for each
// outer index, input 0's inner_0 values, then input 1's, ... (memcpy; exact).
//
// FULLY_CONNECTED (fp32): out[r][m] = act(bias[m] + sum_n x[r][n] * w[m][n]), w in TFLite's (M, N) layout;
// the sum runs over n in 16 fp32 lanes (lane n % 16, fused multiply-adds), then the lanes are added in a
// fixed tree order. The 16 lanes are one AVX-512 vector, two AVX2 ones, four NEON ones or 16 scalars: every
// target gives the same bits.
// SOFTMAX (fp32, TFLite reference kernel): out[r][i] = exp(beta * (x[r][i] - max_r)) / sum_j exp(...).
// TANH / LOGISTIC (fp32, elementwise): tanh and sigmoid exactly as the native LSTM kernel computes its gates
// (cpu_lstm.h act: the same bits on every target), so a chain's activations match its LSTM's.
// PAD (zeros): a (H, W, C) tensor with top/bottom rows and left/right columns of zeros (memcpy; exact).
//
// MAX_POOL_2D's max and the activations are comparisons (std::max's: a NaN input is not propagated
// through the max, as in TFLite's reference kernel), so pool results are the same on every target too.
// Pool and dense run on Google Highway, compiled per target (cpu_dispatch.h); the target is chosen at
// create. Concat and softmax are plain C++ (memcpy; std::exp).
#include "cpu_dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu_ops.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "cpu_simd-inl.h"
#include "cpu_lstm.h"

#ifndef EDGEHFT_CPU_OPS_ONCE_
#define EDGEHFT_CPU_OPS_ONCE_
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace edgehft {
namespace ops {

struct Pool {
    int H, W, C, Ho, Wo, fh, fw, sh, sw, ph, pw, act;
    int slot;
};

struct Dense {
    int rows, N, M, act;
    float* w;                 // (M, N), rows 64-byte aligned at stride Np, zeros after N
    float* b;                 // (M,)
    int Np;
    int slot;
};

inline float activate(float v, int act) {
    switch (act) {
        case 1: return std::max(v, 0.0f);
        case 2: return std::min(std::max(v, -1.0f), 1.0f);
        case 3: return std::min(std::max(v, 0.0f), 6.0f);
        default: return v;
    }
}

struct Fns {
    void (*pool)(const Pool& p, const float* x, float* out);
    void (*dense)(const Dense& d, const float* x, float* out);
};

}  // namespace ops
}  // namespace edgehft
#endif  // EDGEHFT_CPU_OPS_ONCE_

HWY_BEFORE_NAMESPACE();
namespace edgehft {
namespace HWY_NAMESPACE {
namespace {
namespace hn = hwy::HWY_NAMESPACE;
using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;

// std::max(a, b) and std::min(a, b) lane by lane: (a < b) ? b : a and (b < a) ? b : a.
HWY_INLINE V StdMax(V a, V b) { return hn::IfThenElse(hn::Lt(a, b), b, a); }
HWY_INLINE V StdMin(V a, V b) { return hn::IfThenElse(hn::Lt(b, a), b, a); }

HWY_INLINE V Activate(D d, V v, int act) {
    switch (act) {
        case 1: return StdMax(v, hn::Zero(d));
        case 2: return StdMin(StdMax(v, hn::Set(d, -1.0f)), hn::Set(d, 1.0f));
        case 3: return StdMin(StdMax(v, hn::Zero(d)), hn::Set(d, 6.0f));
        default: return v;
    }
}

// One output pixel: the max over rows [y0, y1) x columns [x0, x1) of the input, then the activation.
HWY_INLINE void PoolPixel(const ops::Pool& p, const float* HWY_RESTRICT x, float* HWY_RESTRICT o, int y0, int y1,
                          int x0, int x1) {
    const D d;
    const int L = static_cast<int>(hn::Lanes(d));
    for (int c = 0; c < p.C; c += L) {
        const size_t n = static_cast<size_t>(p.C - c);
        V acc = hn::Set(d, -__builtin_inff());
        for (int y = y0; y < y1; ++y)
            for (int xx = x0; xx < x1; ++xx)
                acc = StdMax(acc, LoadN(d, x + (static_cast<size_t>(y) * p.W + xx) * p.C + c, n));
        StoreN(d, Activate(d, acc, p.act), o + c, n);
    }
}

void Pool(const ops::Pool& p, const float* HWY_RESTRICT x, float* HWY_RESTRICT out) {
    for (int oy = 0; oy < p.Ho; ++oy) {
        const int y0 = std::max(oy * p.sh - p.ph, 0), y1 = std::min(oy * p.sh - p.ph + p.fh, p.H);
        for (int ox = 0; ox < p.Wo; ++ox) {
            const int x0 = std::max(ox * p.sw - p.pw, 0), x1 = std::min(ox * p.sw - p.pw + p.fw, p.W);
            PoolPixel(p, x, out + (static_cast<size_t>(oy) * p.Wo + ox) * p.C, y0, y1, x0, x1);
        }
    }
}

// The 16-lane sum of x[:N] * w[:N] (lane n % 16), then the fixed tree over the lanes.
HWY_INLINE float Dot16(const float* HWY_RESTRICT x, const float* HWY_RESTRICT w, int N) {
    const D d;
    constexpr int kMaxVecs = 16;                      // 16 lanes as 16 / Lanes(d) vectors (<= 16)
    const int L = static_cast<int>(hn::Lanes(d)), nv = 16 / L;
    V acc[kMaxVecs];
    for (int v = 0; v < nv; ++v) acc[v] = hn::Zero(d);
    for (int n = 0; n < N; n += 16)
        for (int v = 0; v < nv; ++v) {
            const int at = n + v * L;
            acc[v] = Fma(d, LoadN(d, x + at, static_cast<size_t>(std::max(N - at, 0))), hn::Load(d, w + at), acc[v]);
        }
    HWY_ALIGN float lanes[16];
    for (int v = 0; v < nv; ++v) hn::Store(acc[v], d, lanes + v * L);
    for (int k = 8; k >= 1; k /= 2)
        for (int i = 0; i < k; ++i) lanes[i] += lanes[i + k];
    return lanes[0];
}

void Dense(const ops::Dense& dn, const float* HWY_RESTRICT x, float* HWY_RESTRICT out) {
    for (int r = 0; r < dn.rows; ++r) {
        const float* xr = x + static_cast<size_t>(r) * dn.N;
        for (int m = 0; m < dn.M; ++m)
            out[static_cast<size_t>(r) * dn.M + m] =
                ops::activate(Dot16(xr, dn.w + static_cast<size_t>(m) * dn.Np, dn.N) + dn.b[m], dn.act);
    }
}

}  // namespace

extern const ops::Fns kOpsFns;
const ops::Fns kOpsFns = {&Pool, &Dense};

}  // namespace HWY_NAMESPACE
}  // namespace edgehft
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace edgehft {
namespace {
using ops::Dense;
using ops::Pool;

const ops::Fns* const kTable[kSlots] = EDGEHFT_SLOT_TABLE(kOpsFns);

struct Concat {
    int n, outer;
    int* inner;
};

struct Softmax {
    int rows, N;
    float beta;
};

}  // namespace

extern "C" {

// dims = {H, W, C, Ho, Wo, fh, fw, sh, sw, ph, pw}; act as in the header. Null on a bad size.
void* edgehft_pool_create(const int* d, int act) {
    for (int i = 0; i < 9; ++i)
        if (d[i] < 1) return nullptr;
    if (d[9] < 0 || d[10] < 0 || act < 0 || act > 3) return nullptr;
    Pool* p = static_cast<Pool*>(malloc(sizeof(Pool)));
    if (!p) return nullptr;
    *p = Pool{d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], act, simd_slot(current_slot())};
    return p;
}

// x: (H, W, C) float32; out: (Ho, Wo, C) float32. Returns 0.
int edgehft_pool_run(void* h, const float* __restrict x, float* __restrict out) {
    const Pool& p = *static_cast<Pool*>(h);
    kTable[p.slot]->pool(p, x, out);
    return 0;
}

// The target slot a pool (or dense) kernel runs (cpu_dispatch.h), chosen at create.
int edgehft_pool_slot(void* h) { return static_cast<Pool*>(h)->slot; }
int edgehft_dense_slot(void* h) { return static_cast<Dense*>(h)->slot; }

void edgehft_pool_destroy(void* h) { free(h); }
// n inputs; outer as in the header; inner[i] per input. Null on a bad size.
void* edgehft_concat_create(int n, int outer, const int* inner) {
    if (n < 1 || outer < 1) return nullptr;
    for (int i = 0; i < n; ++i)
        if (inner[i] < 1) return nullptr;
    Concat* c = static_cast<Concat*>(malloc(sizeof(Concat)));
    int* in = static_cast<int*>(malloc(sizeof(int) * n));
    if (!c || !in) {
        free(c);
        free(in);
        return nullptr;
    }
    memcpy(in, inner, sizeof(int) * n);
    *c = Concat{n, outer, in};
    return c;
}

// xs: n pointers to the inputs (float32, row-major); out: outer * sum(inner) float32. Returns 0.
int edgehft_concat_run(void* h, const float* const* xs, float* out) {
    const Concat& c = *static_cast<Concat*>(h);
    for (int o = 0; o < c.outer; ++o)
        for (int i = 0; i < c.n; ++i) {
            const size_t k = static_cast<size_t>(c.inner[i]);
            memcpy(out, xs[i] + o * k, k * sizeof(float));
            out += k;
        }
    return 0;
}

void edgehft_concat_destroy(void* h) {
    Concat* c = static_cast<Concat*>(h);
    if (c) free(c->inner);
    free(c);
}

// rows x N input, M outputs; w (M, N) float32; b (M,) or null; act as for the pool. Null on a bad size.
void* edgehft_dense_create(int rows, int N, int M, const float* w, const float* b, int act) {
    if (rows < 1 || N < 1 || M < 1 || act < 0 || act > 3) return nullptr;
    Dense* d = static_cast<Dense*>(malloc(sizeof(Dense)));
    if (!d) return nullptr;
    d->rows = rows; d->N = N; d->M = M; d->act = act; d->Np = (N + 15) / 16 * 16;
    d->slot = simd_slot(current_slot());
    void* pw = nullptr;
    if (posix_memalign(&pw, 64, sizeof(float) * static_cast<size_t>(M) * d->Np)) pw = nullptr;
    d->w = static_cast<float*>(pw);
    d->b = static_cast<float*>(malloc(sizeof(float) * M));
    if (!d->w || !d->b) {
        free(d->w); free(d->b); free(d);
        return nullptr;
    }
    memset(d->w, 0, sizeof(float) * static_cast<size_t>(M) * d->Np);
    for (int m = 0; m < M; ++m) {
        memcpy(d->w + static_cast<size_t>(m) * d->Np, w + static_cast<size_t>(m) * N, sizeof(float) * N);
        d->b[m] = b ? b[m] : 0.0f;
    }
    return d;
}

// x: rows x N float32; out: rows x M float32. Returns 0.
int edgehft_dense_run(void* h, const float* __restrict x, float* __restrict out) {
    const Dense& d = *static_cast<Dense*>(h);
    kTable[d.slot]->dense(d, x, out);
    return 0;
}

void edgehft_dense_destroy(void* h) {
    Dense* d = static_cast<Dense*>(h);
    if (d) { free(d->w); free(d->b); }
    free(d);
}

void* edgehft_softmax_create(int rows, int N, float beta) {
    if (rows < 1 || N < 1) return nullptr;
    Softmax* s = static_cast<Softmax*>(malloc(sizeof(Softmax)));
    if (s) *s = Softmax{rows, N, beta};
    return s;
}

// x, out: rows x N float32. Returns 0.
int edgehft_softmax_run(void* h, const float* __restrict x, float* __restrict out) {
    const Softmax& s = *static_cast<Softmax*>(h);
    for (int r = 0; r < s.rows; ++r) {
        const float* xr = x + static_cast<size_t>(r) * s.N;
        float* o = out + static_cast<size_t>(r) * s.N;
        float mx = xr[0];
        for (int i = 1; i < s.N; ++i) mx = std::max(mx, xr[i]);
        float sum = 0.0f;
        for (int i = 0; i < s.N; ++i) sum += (o[i] = std::exp((xr[i] - mx) * s.beta));
        const float inv = 1.0f / sum;
        for (int i = 0; i < s.N; ++i) o[i] *= inv;
    }
    return 0;
}

void edgehft_softmax_destroy(void* h) { free(h); }

// Elementwise tanh (kind 0) or logistic (kind 1) of n floats, on the LSTM kernel's activation code of the target
// in force at create. Null on a bad size or no memory.
struct Act {
    int n, kind;
    const lstm::Fns* fn;
    float* other;             // the activation not asked for (act computes both)
};

void* edgehft_act_create(int n, int kind) {
    if (n < 1 || kind < 0 || kind > 1) return nullptr;
    Act* a = static_cast<Act*>(malloc(sizeof(Act)));
    if (!a) return nullptr;
    a->n = n; a->kind = kind; a->fn = lstm::fns(simd_slot(current_slot()));
    a->other = static_cast<float*>(malloc(sizeof(float) * static_cast<size_t>(n)));
    if (!a->fn || !a->other) {
        free(a->other); free(a);
        return nullptr;
    }
    return a;
}

// x, out: n float32 (out may not alias x). Returns 0.
int edgehft_act_run(void* h, const float* __restrict x, float* __restrict out) {
    const Act& a = *static_cast<Act*>(h);
    if (a.kind == 0) a.fn->act(x, out, a.other, a.n);
    else a.fn->act(x, a.other, out, a.n);
    return 0;
}

void edgehft_act_destroy(void* h) {
    Act* a = static_cast<Act*>(h);
    if (a) free(a->other);
    free(a);
}

// Zero padding: d = {H, W, C, top, bottom, left, right}; H may be 0 (an output of padding only). Null on a
// bad size.
struct Pad {
    int H, W, C, t, b, l, r;
};

void* edgehft_pad_create(const int* d) {
    if (d[0] < 0 || d[1] < 1 || d[2] < 1 || d[3] < 0 || d[4] < 0 || d[5] < 0 || d[6] < 0) return nullptr;
    Pad* p = static_cast<Pad*>(malloc(sizeof(Pad)));
    if (p) *p = Pad{d[0], d[1], d[2], d[3], d[4], d[5], d[6]};
    return p;
}

// x: (H, W, C) float32; out: (H + top + bottom, W + left + right, C). Returns 0.
int edgehft_pad_run(void* h, const float* __restrict x, float* __restrict out) {
    const Pad& p = *static_cast<Pad*>(h);
    const size_t C = p.C, orow = static_cast<size_t>(p.W + p.l + p.r) * C, row = static_cast<size_t>(p.W) * C;
    memset(out, 0, sizeof(float) * p.t * orow);
    float* o = out + p.t * orow;
    for (int y = 0; y < p.H; ++y, o += orow) {
        memset(o, 0, sizeof(float) * p.l * C);
        memcpy(o + p.l * C, x + y * row, sizeof(float) * row);
        memset(o + p.l * C + row, 0, sizeof(float) * p.r * C);
    }
    memset(o, 0, sizeof(float) * p.b * orow);
    return 0;
}

void edgehft_pad_destroy(void* h) { free(h); }

}  // extern "C"
}  // namespace edgehft
#endif  // HWY_ONCE
