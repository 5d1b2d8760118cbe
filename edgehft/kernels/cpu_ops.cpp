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
#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace {

struct Pool {
    int H, W, C, Ho, Wo, fh, fw, sh, sw, ph, pw, act;
};

struct Concat {
    int n, outer;
    int* inner;
};

inline float activate(float v, int act) {
    switch (act) {
        case 1: return std::max(v, 0.0f);
        case 2: return std::min(std::max(v, -1.0f), 1.0f);
        case 3: return std::min(std::max(v, 0.0f), 6.0f);
        default: return v;
    }
}

}  // namespace

extern "C" {

// dims = {H, W, C, Ho, Wo, fh, fw, sh, sw, ph, pw}; act as in the header. Null on a bad size.
void* edgehft_pool_create(const int* d, int act) {
    for (int i = 0; i < 9; ++i)
        if (d[i] < 1) return nullptr;
    if (d[9] < 0 || d[10] < 0 || act < 0 || act > 3) return nullptr;
    Pool* p = static_cast<Pool*>(malloc(sizeof(Pool)));
    if (!p) return nullptr;
    *p = Pool{d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], act};
    return p;
}

// x: (H, W, C) float32; out: (Ho, Wo, C) float32. Returns 0.
int edgehft_pool_run(void* h, const float* __restrict x, float* __restrict out) {
    const Pool& p = *static_cast<Pool*>(h);
    const int C = p.C;
    for (int oy = 0; oy < p.Ho; ++oy) {
        const int y0 = std::max(oy * p.sh - p.ph, 0), y1 = std::min(oy * p.sh - p.ph + p.fh, p.H);
        for (int ox = 0; ox < p.Wo; ++ox) {
            const int x0 = std::max(ox * p.sw - p.pw, 0), x1 = std::min(ox * p.sw - p.pw + p.fw, p.W);
            float* o = out + (static_cast<size_t>(oy) * p.Wo + ox) * C;
            for (int c = 0; c < C; ++c) o[c] = -__builtin_inff();
            for (int y = y0; y < y1; ++y)
                for (int xx = x0; xx < x1; ++xx) {
                    const float* r = x + (static_cast<size_t>(y) * p.W + xx) * C;
                    for (int c = 0; c < C; ++c) o[c] = std::max(o[c], r[c]);
                }
            if (p.act)
                for (int c = 0; c < C; ++c) o[c] = activate(o[c], p.act);
        }
    }
    return 0;
}

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

}  // extern "C"
