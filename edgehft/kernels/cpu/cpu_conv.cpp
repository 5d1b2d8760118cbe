// edgehft native CPU CONV_2D: TFLite CONV_2D (NHWC, batch 1, dilation 1) with bf16 products and fp32 sums,
// plus the op's fused activation or a following LEAKY_RELU.
//
// Semantics: out[oy][ox][co] = act(bias[co] + sum_{i<kh, j<kw, c<C} x[oy*sh+i-ph][ox*sw+j-pw][c] * w[co][i][j][c])
// with x read as 0 outside the input (TFLite SAME/VALID padding). x and w are rounded to bfloat16 (round to
// nearest even) before the products; products and sums are fp32 (AMX TDPBF16PS, or the portable loop with
// the same rounded operands; the summation order differs between the two, by a few fp32 ulps of the sum).
//
// Layout: the input is copied, rounded to bf16, into a zero-padded buffer (ph rows above, pw columns left,
// the rest of SAME's padding and slack after), so every conv is a VALID conv on that buffer, whose padded
// width is Wp. Output pixel (oy, ox) reads, for kernel row i, one contiguous run of kw*C values at padded
// pixel (oy*sh + i)*Wp + ox*sw. Pixels along an output row are evenly spaced (sw pixels apart), so 16 of
// them are one AMX tile load at stride sw*C*2 bytes, with no im2col copy. When the whole output is evenly
// spaced (Wo == 1, Ho == 1, or sh*Wp == Wo*sw: "flat", e.g. kx1 SAME convs or 1xk VALID convs that tile
// the width) the tiles run over all Ho*Wo pixels at once; otherwise row by row (the last tile of a row
// computes a few pixels that are thrown away). kw*C is padded to a multiple of 32 with zero weights (the
// extra values read are the next pixel's, multiplied by 0; so a NaN input can also reach that pixel's
// neighbours, where TFLite would confine it to the outputs whose window holds it).
//
// Schedule (AMX): output pixels in blocks of 32 (two A tiles), output channels in pairs of 16-column tiles,
// four fp32 accumulator tiles over (kernel row, 32-deep k block); each block's tiles go to a small
// scratch that stays in L1, then the epilogue adds the bias, applies the activation and writes fp32 NHWC.
// The bf16 input buffer is one per thread, shared by all convs (see scratch()); no allocation in
// edgehft_conv_run except the first run on a thread other than the creating one, which sizes its buffer.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define EDGEHFT_AMX 1
#endif

namespace {

enum Act { kNone = 0, kRelu = 1, kRelu6 = 2, kReluN1To1 = 3, kLeaky = 4 };

struct Conv {
    int H, W, C, Co, kh, kw, sh, sw, ph, pw, Ho, Wo, Wp;
    int act;
    float alpha;
    int M, NB, KB;           // pixels, 16-col blocks, 32-deep k blocks per kernel row
    int flat, s;             // flat: one strip of M pixels, s padded pixels apart
    int Hp;                  // padded rows the outputs read
    size_t xrows;            // bf16 buffer: elements
    uint16_t* x;             // during a run: the thread's scratch (see scratch()), laid out as the header says
    uint16_t* wt;            // AMX B tiles [kh][KB][NB][16 pairs][16 cols][2]
    float* wf;               // portable: bf16-rounded weights as float [kh][kw*C][Cop]
    float* bias;             // [Co]
    float* acc;              // block scratch [32][NB*16]
    bool amx;
};

void* aalloc(size_t bytes) {
    void* p = nullptr;
    bytes = (bytes + 63) / 64 * 64;
    if (bytes == 0) bytes = 64;
    if (posix_memalign(&p, 64, bytes)) return nullptr;
    memset(p, 0, bytes);
    return p;
}

// The largest finite bfloat16 (0x7F7F). Inputs beyond it saturate there instead of rounding to inf (an
// fp32 conv of a large but finite value stays finite; a NaN stays NaN).
constexpr float kBf16Max = 3.38953139e38f;

inline uint16_t to_bf16(float f) {
    f = std::max(std::min(f, kBf16Max), -kBf16Max);
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16(uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// fp32 -> bf16, round to nearest even, saturating at +-kBf16Max.
void to_bf16_n(const float* __restrict x, uint16_t* __restrict y, size_t n) {
    size_t i = 0;
#if defined(__AVX512F__)
    const __m512 hi = _mm512_set1_ps(kBf16Max), lo = _mm512_set1_ps(-kBf16Max);
    auto clamp = [&](__m512 v) { return _mm512_max_ps(lo, _mm512_min_ps(hi, v)); };   // NaN passes through
#endif
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    for (; i + 32 <= n; i += 32) {
        __m512bh v = _mm512_cvtne2ps_pbh(clamp(_mm512_loadu_ps(x + i + 16)), clamp(_mm512_loadu_ps(x + i)));
        _mm512_storeu_si512(y + i, (__m512i)v);
    }
#elif defined(__AVX512F__)
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_castps_si512(clamp(_mm512_loadu_ps(x + i)));
        u = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
    }
#endif
    for (; i < n; ++i) y[i] = to_bf16(x[i]);
}

// Rows [p0, p1) of the output from the block scratch (row p at acc + (p - p0) * NB * 16).
template <int ACT>
void epilogue_t(const Conv* k, const float* __restrict acc, float* __restrict out, int p0, int p1) {
    const int Co = k->Co, ld = k->NB * 16;
    const float alpha = k->alpha;
    const float* __restrict bias = k->bias;
    for (int p = p0; p < p1; ++p) {
        const float* __restrict a = acc + static_cast<size_t>(p - p0) * ld;
        float* __restrict o = out + static_cast<size_t>(p) * Co;
#ifdef __AVX512F__
        for (int c = 0; c < Co; c += 16) {
            const __mmask16 m = Co - c >= 16 ? 0xffff : static_cast<__mmask16>((1u << (Co - c)) - 1);
            __m512 v = _mm512_add_ps(_mm512_load_ps(a + c), _mm512_maskz_loadu_ps(m, bias + c));
            if (ACT == kRelu) v = _mm512_max_ps(v, _mm512_setzero_ps());
            if (ACT == kRelu6) v = _mm512_min_ps(_mm512_max_ps(v, _mm512_setzero_ps()), _mm512_set1_ps(6.0f));
            if (ACT == kReluN1To1) v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-1.0f)), _mm512_set1_ps(1.0f));
            if (ACT == kLeaky) {
                const __mmask16 neg = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LE_OQ);
                v = _mm512_mask_mul_ps(v, neg, v, _mm512_set1_ps(alpha));
            }
            _mm512_mask_storeu_ps(o + c, m, v);
        }
#else
        for (int c = 0; c < Co; ++c) {
            float v = a[c] + bias[c];
            if (ACT == kRelu) v = std::max(v, 0.0f);
            if (ACT == kRelu6) v = std::min(std::max(v, 0.0f), 6.0f);
            if (ACT == kReluN1To1) v = std::min(std::max(v, -1.0f), 1.0f);
            if (ACT == kLeaky) v = v > 0.0f ? v : v * alpha;
            o[c] = v;
        }
#endif
    }
}

void epilogue(const Conv* k, const float* acc, float* out, int p0, int p1) {
    switch (k->act) {
        case kRelu: epilogue_t<kRelu>(k, acc, out, p0, p1); break;
        case kRelu6: epilogue_t<kRelu6>(k, acc, out, p0, p1); break;
        case kReluN1To1: epilogue_t<kReluN1To1>(k, acc, out, p0, p1); break;
        case kLeaky: epilogue_t<kLeaky>(k, acc, out, p0, p1); break;
        default: epilogue_t<kNone>(k, acc, out, p0, p1);
    }
}

// One bf16 input buffer per thread, shared by every conv the thread runs (so a chain of convs keeps one
// such buffer in cache, not one per conv); grown, zero-filled, when a conv needs more. A run re-zeroes its
// own padding and the slack after it (another conv, or an earlier call, may have written there).
struct Scratch {
    uint16_t* p = nullptr;
    size_t n = 0;
    ~Scratch() { free(p); }
};
thread_local Scratch tls_scratch;

uint16_t* scratch(size_t n) {
    Scratch& s = tls_scratch;
    if (s.n < n) {
        void* q = aalloc(n * 2);
        if (!q) return nullptr;
        free(s.p);
        s.p = static_cast<uint16_t*>(q);
        s.n = n;
    }
    return s.p;
}

#ifdef EDGEHFT_AMX
bool amx_usable() {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    bool tile = d & (1u << 24), bf16 = d & (1u << 22);
    if (!tile || !bf16) return false;
    // Linux: a process must ask for the AMX tile data state before its first tile instruction.
    const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

struct TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

// Pixels p0 .. p0+rows-1 (rows <= 32) of the output, whose first input run starts at base and the next
// ones s padded pixels apart: all output channels into the block scratch, then the epilogue.
__attribute__((target("amx-tile,amx-bf16"))) void amx_block(Conv* k, const uint16_t* base, int s, int p0,
                                                            int rows, float* out) {
    const int C = k->C, NB = k->NB, KB = k->KB, ldc = NB * 16 * 4;
    const long astride = static_cast<long>(s) * C * 2;
    const size_t tile = 16 * 32;                   // bf16 elements per B tile
    for (int nb = 0; nb < NB; nb += 2) {
        const bool two = nb + 1 < NB;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int i = 0; i < k->kh; ++i) {
            const uint16_t* a = base + static_cast<size_t>(i) * k->Wp * C;
            for (int kb = 0; kb < KB; ++kb) {
                const uint16_t* b = k->wt + ((static_cast<size_t>(i) * KB + kb) * NB + nb) * tile;
                _tile_loadd(4, a + kb * 32, astride);
                _tile_loadd(5, a + kb * 32 + static_cast<size_t>(16) * s * C, astride);
                _tile_loadd(6, b, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(2, 5, 6);
                if (two) {
                    _tile_loadd(7, b + tile, 64);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(3, 5, 7);
                }
            }
        }
        float* o = k->acc + nb * 16;
        _tile_stored(0, o, ldc);
        _tile_stored(2, o + 16 * NB * 16, ldc);
        if (two) {
            _tile_stored(1, o + 16, ldc);
            _tile_stored(3, o + 16 * NB * 16 + 16, ldc);
        }
    }
    epilogue(k, k->acc, out, p0, p0 + rows);
}

__attribute__((target("amx-tile,amx-bf16"))) void run_amx(Conv* k, float* out) {
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    const size_t C = k->C;
    if (k->flat) {
        for (int m0 = 0; m0 < k->M; m0 += 32)
            amx_block(k, k->x + static_cast<size_t>(m0) * k->s * C, k->s, m0, std::min(32, k->M - m0), out);
    } else {
        for (int oy = 0; oy < k->Ho; ++oy)
            for (int ox = 0; ox < k->Wo; ox += 32)
                amx_block(k, k->x + (static_cast<size_t>(oy) * k->sh * k->Wp + static_cast<size_t>(ox) * k->sw) * C,
                          k->sw, oy * k->Wo + ox, std::min(32, k->Wo - ox), out);
    }
    _tile_release();
}
#endif

void run_portable(Conv* k, float* out) {
    const int C = k->C, Cop = k->NB * 16, kwc = k->kw * C;
    for (int m0 = 0; m0 < k->M; m0 += 32) {
        const int m1 = std::min(m0 + 32, k->M);
        for (int p = m0; p < m1; ++p) {
            const int oy = p / k->Wo, ox = p % k->Wo;
            float* o = k->acc + static_cast<size_t>(p - m0) * Cop;
            for (int co = 0; co < Cop; ++co) o[co] = 0.0f;
            for (int i = 0; i < k->kh; ++i) {
                const uint16_t* a = k->x + ((static_cast<size_t>(oy) * k->sh + i) * k->Wp +
                                            static_cast<size_t>(ox) * k->sw) * C;
                const float* w = k->wf + static_cast<size_t>(i) * kwc * Cop;
                for (int q = 0; q < kwc; ++q) {
                    const float v = from_bf16(a[q]);
                    const float* wr = w + static_cast<size_t>(q) * Cop;
                    for (int co = 0; co < Cop; ++co) o[co] += v * wr[co];
                }
            }
        }
        epilogue(k, k->acc, out, m0, m1);
    }
}

}  // namespace

extern "C" {

// 1 when this process can run AMX-BF16 tiles (CPU flags and the kernel's permission), else 0.
int edgehft_conv_amx() {
#ifdef EDGEHFT_AMX
    static int ok = amx_usable() ? 1 : 0;
    return ok;
#else
    return 0;
#endif
}

// Create a conv. dims = {H, W, C, Co, kh, kw, sh, sw, ph, pw, Ho, Wo} (ph, pw: the leading SAME padding;
// VALID: 0); weights OHWI (Co, kh, kw, C) float32; bias (Co,) float32 or null; act: 0 none, 1 relu,
// 2 relu6, 3 relu_n1_to_1, 4 leaky (alpha). portable: 1 forces the portable loop. Returns null on an
// inconsistent geometry or no memory.
void* edgehft_conv_create(const int* dims, const float* weights, const float* bias, int act, float alpha,
                          int portable) {
    Conv* k = static_cast<Conv*>(aalloc(sizeof(Conv)));
    if (!k) return nullptr;
    k->H = dims[0]; k->W = dims[1]; k->C = dims[2]; k->Co = dims[3]; k->kh = dims[4]; k->kw = dims[5];
    k->sh = dims[6]; k->sw = dims[7]; k->ph = dims[8]; k->pw = dims[9]; k->Ho = dims[10]; k->Wo = dims[11];
    k->act = act;
    k->alpha = alpha;
    const int Hp = k->Hp = std::max(k->ph + k->H, (k->Ho - 1) * k->sh + k->kh);   // rows the outputs reach
    k->Wp = std::max(k->pw + k->W, (k->Wo - 1) * k->sw + k->kw);
    if (k->Ho < 1 || k->Wo < 1 || k->C < 1 || k->Co < 1 || k->kh < 1 || k->kw < 1 || k->sh < 1 || k->sw < 1 ||
        k->ph < 0 || k->pw < 0 || k->ph >= k->kh || k->pw >= k->kw) {
        free(k);
        return nullptr;
    }
    k->M = k->Ho * k->Wo;
    if (k->Wo == 1) { k->flat = 1; k->s = k->sh * k->Wp; }
    else if (k->Ho == 1 || k->sh * k->Wp == k->Wo * k->sw) { k->flat = 1; k->s = k->sw; }
    else { k->flat = 0; k->s = k->sw; }
    k->NB = (k->Co + 15) / 16;
    const int kwc = k->kw * k->C;
    k->KB = (kwc + 31) / 32;
    const int Cop = k->NB * 16;
    // Slack after the padded input: the last block's 32 tile rows, s or sw pixels apart, plus a k block.
    const size_t C = k->C, step = static_cast<size_t>(std::max(k->s, k->sw));
    k->xrows = (static_cast<size_t>(Hp) + k->kh) * k->Wp * C + (32 * step + 2) * C + 64;
    k->x = nullptr;
    k->wt = static_cast<uint16_t*>(aalloc(static_cast<size_t>(k->kh) * k->KB * Cop * 32 * 2));
    k->wf = static_cast<float*>(aalloc(static_cast<size_t>(k->kh) * kwc * Cop * 4));
    k->bias = static_cast<float*>(aalloc(static_cast<size_t>(k->Co) * 4));
    k->acc = static_cast<float*>(aalloc(static_cast<size_t>(32) * Cop * 4));
    if (!scratch(k->xrows) || !k->wt || !k->wf || !k->bias || !k->acc) {
        free(k->wt); free(k->wf); free(k->bias); free(k->acc); free(k);
        return nullptr;
    }
    for (int co = 0; co < k->Co; ++co) {
        k->bias[co] = bias ? bias[co] : 0.0f;
        for (int i = 0; i < k->kh; ++i)
            for (int q = 0; q < kwc; ++q) {
                const uint16_t b = to_bf16(weights[((static_cast<size_t>(co) * k->kh + i) * k->kw) * k->C + q]);
                k->wf[(static_cast<size_t>(i) * kwc + q) * Cop + co] = from_bf16(b);
                const int kb = q / 32, kp = (q % 32) / 2, e = q % 2, nb = co / 16, n = co % 16;
                k->wt[((((static_cast<size_t>(i) * k->KB + kb) * k->NB + nb) * 16 + kp) * 16 + n) * 2 + e] = b;
            }
    }
    k->amx = !portable && edgehft_conv_amx();
    return k;
}

// x: (H, W, C) float32 NHWC; out: (Ho, Wo, Co) float32. The caller keeps x finite. Returns 0, or -1 when
// this thread's scratch could not grow (out of memory).
int edgehft_conv_run(void* h, const float* x, float* out) {
    Conv* k = static_cast<Conv*>(h);
    k->x = scratch(k->xrows);
    if (!k->x) return -1;
    const size_t C = k->C, row = static_cast<size_t>(k->W) * C, prow = static_cast<size_t>(k->Wp) * C;
    uint16_t* base = k->x;
    memset(base, 0, k->ph * prow * 2);                                        // rows above
    uint16_t* dst = base + k->ph * prow + k->pw * C;
    if (k->Wp == k->W) to_bf16_n(x, dst, k->H * row);
    else
        for (int r = 0; r < k->H; ++r) {
            uint16_t* d = dst + r * prow;
            memset(d - k->pw * C, 0, k->pw * C * 2);                           // columns left
            to_bf16_n(x + r * row, d, row);
            memset(d + row, 0, (prow - row - k->pw * C) * 2);                  // columns right
        }
    memset(base + (k->ph + k->H) * prow, 0, (k->Hp - k->ph - k->H) * prow * 2);  // rows below
    // and everything after them that tails and k-block padding read (times zero weights, or into outputs
    // that are thrown away): zeros, so no value from another conv or an earlier call can reach an output
    // (0 * inf would).
    memset(base + k->Hp * prow, 0, (k->xrows - k->Hp * prow) * 2);
#ifdef EDGEHFT_AMX
    if (k->amx) run_amx(k, out);
    else run_portable(k, out);
#else
    run_portable(k, out);
#endif
    return 0;
}

// 1 when this conv runs on AMX tiles, 0 on the portable loop.
int edgehft_conv_isa(void* h) { return static_cast<Conv*>(h)->amx ? 1 : 0; }

void edgehft_conv_destroy(void* h) {
    Conv* k = static_cast<Conv*>(h);
    if (!k) return;
    free(k->wt); free(k->wf); free(k->bias); free(k->acc); free(k);
}

}  // extern "C"
