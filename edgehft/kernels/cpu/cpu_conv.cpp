// edgehft native CPU CONV_2D: TFLite CONV_2D (NHWC, batch 1, dilation 1) with bf16 products and fp32 sums,
// plus the op's fused activation or a following LEAKY_RELU.
//
// Semantics: out[oy][ox][co] = act(bias[co] + sum_{i<kh, j<kw, c<C} x[oy*sh+i-ph][ox*sw+j-pw][c] * w[co][i][j][c])
// with x read as 0 outside the input (TFLite SAME/VALID padding). x and w are rounded to bfloat16 (round to
// nearest even, saturating at the largest finite bf16) before the products; products and sums are fp32.
// A product of two bf16 values is exact in fp32 (8 x 8 significant bits), so only the order of the sums
// matters: the SIMD path sums, for each output, over kernel rows then over the kw*C run of each row, in
// that order, on every Highway target (AVX3, AVX2, NEON, scalar give the same bits); AMX's TDPBF16PS sums
// in its own order (a few fp32 ulps of the sum away).
//
// Layout: the input is copied, rounded to bf16, into a zero-padded buffer (ph rows above, pw columns left,
// the rest of SAME's padding and slack after), so every conv is a VALID conv on that buffer, whose padded
// width is Wp. Output pixel (oy, ox) reads, for kernel row i, one contiguous run of kw*C values at padded
// pixel (oy*sh + i)*Wp + ox*sw. The SIMD path keeps the rounded values as fp32 (low 16 bits zero) and the
// weights as fp32 [kh][kw*C][Cop] (Cop = Co rounded up to 16, zero columns after Co); the AMX path keeps
// both as bf16.
//
// Schedule (SIMD, Highway, the target chosen at create: cpu_dispatch.h): output channels in blocks of up
// to 4 vectors, output pixels in blocks of kPix (AVX3 6, AVX2 3), kPix x 4 accumulators in registers over
// the whole (kernel row, kw*C) loop: each weight vector load serves kPix pixels, each broadcast input value
// 4 vectors; then bias, activation and the NHWC fp32 store (masked past Co).
//
// Schedule (AVX512_BF16, AMD Zen 4 and later, Intel Cooper Lake / Sapphire Rapids and later: our own code,
// per-function target attributes): the bf16 input buffer and the AMX weight layout; 6 pixels x 4
// 16-channel blocks of fp32 accumulators, each VDPBF16PS adding one input pair's two exact products per
// lane (so each sum takes its pairs in order, the odd element of a pair first: a few fp32 ulps from the
// SIMD path's order), into the block scratch, then the AVX3 epilogue. Twice the products per instruction
// of an fp32 FMA. Subnormal bf16 inputs count as zero there (the instruction's DAZ).
//
// Schedule (AMX, Intel Sapphire Rapids and later, when CPUID and Linux's arch_prctl allow tiles): 16
// pixels along an output row are evenly spaced (sw pixels apart), so they are one tile load at stride
// sw*C*2 bytes, with no im2col copy. When the whole output is evenly spaced (Wo == 1, Ho == 1, or
// sh*Wp == Wo*sw: "flat", e.g. kx1 SAME convs or 1xk VALID convs that tile the width) the tiles run over all
// Ho*Wo pixels at once; otherwise row by row (the last tile of a row computes a few pixels that are thrown
// away). kw*C is padded to a multiple of 32 with zero weights (the extra values read are the next
// pixel's, multiplied by 0; so a NaN input can also reach that pixel's neighbours, where TFLite would
// confine it to the outputs whose window holds it). Output pixels in blocks of 32 (two A tiles), output
// channels in pairs of 16-column tiles, four fp32 accumulator tiles over (kernel row, 32-deep k block);
// each block's tiles go to a small scratch that stays in L1, then the AVX3 epilogue. The AMX code is our
// own (per-function target attributes), compiled into every x86-64 build and run only where usable.
//
// On AMX and VDPBF16PS the input is rounded to bf16 with AVX512_BF16's VCVTNE2PS2BF16 (32 values an instruction,
// the bits of the SIMD rounding except that a subnormal becomes zero, which those paths' DAZ does anyway), and
// a run of convs each reading only the one before (edgehft_conv_run_link; DeepLOB's front end) hands the output
// over as bf16 straight into the next conv's own padded buffer: no fp32 tensor between them, same bits.
//
// The input buffer is one per thread, shared by all convs (see scratch()); no allocation in
// edgehft_conv_run except the first run on a thread other than the creating one, which sizes its buffer.
#include "cpu_dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu_conv.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "cpu_simd-inl.h"

#ifndef EDGEHFT_CPU_CONV_ONCE_
#define EDGEHFT_CPU_CONV_ONCE_
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace edgehft {
namespace conv {

enum Act { kNone = 0, kRelu = 1, kRelu6 = 2, kReluN1To1 = 3, kLeaky = 4 };

struct Conv {
    int H, W, C, Co, kh, kw, sh, sw, ph, pw, Ho, Wo, Wp;
    int act;
    float alpha;
    int M, NB, KB;           // pixels, 16-col blocks, 32-deep k blocks per kernel row
    int flat, s;             // flat: one strip of M pixels, s padded pixels apart (AMX)
    int Hp;                  // padded rows the outputs read
    size_t xrows;            // input buffer: elements
    void* x;                 // during a run: the thread's scratch (see scratch()): fp32 (SIMD) or bf16 (AMX)
    uint16_t* wt;            // AMX B tiles [kh][KB][NB][16 pairs][16 cols][2]
    float* wf;               // SIMD: bf16-rounded weights as float [kh][kw*C][Cop]
    float* bias;             // [Cop], zeros after Co
    float* acc;              // AMX block scratch [32][NB*16]
    uint16_t* own;           // bf16 input buffer of its own (AMX / VDPBF16PS), written by the conv linked before it
    float* tmp;              // linked output: the epilogue's fp32 rows [32][Co] before they are rounded
    Conv* next;              // during a linked run: the conv whose own buffer takes the output
    bool amx;                // runs on AMX tiles
    bool dpbf16;             // runs on AVX512_BF16's VDPBF16PS
    int slot;                // the Highway target slot (cpu_dispatch.h) of the SIMD code and epilogue
    int role;                // kWhole, or a tap split (edgehft_conv_split): kPrefix / kSuffix
    int split;               // a split's j0: output row oy's first j0 - oy kernel rows are the prefix's
    const float* part;       // kSuffix: the prefix's raw sums [split * Wo][Cop] (rows oy < split start from them)
};

enum Role { kWhole = 0, kPrefix = 1, kSuffix = 2 };

// The kernel rows [*i0, *i1) output row oy sums (SIMD and VDPBF16PS paths): the rows that read the input, not its
// zero padding (a product with a padding zero adds +-0 to a sum that starts at +0 and, rounding to nearest, is
// never -0: skipping it leaves every bit alone), and of a split only its part: the prefix takes rows below
// split - oy, the suffix the rest. Empty (*i0 == *i1) when nothing is left.
inline void tap_range(const Conv& k, int oy, int* i0, int* i1) {
    int lo = std::max(0, k.ph - oy * k.sh), hi = std::min(k.kh, k.H + k.ph - oy * k.sh);
    if (k.role == kPrefix) hi = std::min(hi, k.split - oy);
    if (k.role == kSuffix) lo = std::max(lo, k.split - oy);
    *i0 = lo;
    *i1 = std::max(lo, hi);
}

// The end of the run of output rows from oy0 that sum the same kernel rows (and all or none start from a prefix).
inline int row_group_end(const Conv& k, int oy0) {
    int a0, a1, b0, b1;
    tap_range(k, oy0, &a0, &a1);
    const bool init = k.role == kSuffix && oy0 < k.split;
    int oy = oy0 + 1;
    for (; oy < k.Ho; ++oy) {
        tap_range(k, oy, &b0, &b1);
        if (b0 != a0 || b1 != a1 || init || (k.role == kSuffix && oy < k.split)) break;
    }
    return oy;
}

// The largest finite bfloat16 (0x7F7F, cpu_dispatch.h). Inputs beyond it saturate there instead of rounding
// to inf (an fp32 conv of a large but finite value stays finite; a NaN stays NaN).
using ::edgehft::kBf16Max;

struct Fns {
    void (*round_f32)(const float* x, float* y, size_t n);        // y = bf16(x) as fp32
    void (*round_bf16)(const float* x, uint16_t* y, size_t n);    // y = bf16(x)
    void (*run)(const Conv& k, float* out);                      // the SIMD conv on the fp32 buffer k.x
    void (*epilogue)(const Conv& k, const float* acc, int ld, float* out, int p0, int p1);
};

}  // namespace conv
}  // namespace edgehft
#endif  // EDGEHFT_CPU_CONV_ONCE_

HWY_BEFORE_NAMESPACE();
namespace edgehft {
namespace HWY_NAMESPACE {
namespace {
namespace hn = hwy::HWY_NAMESPACE;
using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;
using conv::Conv;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_NEON
constexpr int kPix = 6;          // 6 x 4 accumulators of 32 vector registers
#elif HWY_TARGET == HWY_AVX2
constexpr int kPix = 3;          // 3 x 4 of 16
#else
constexpr int kPix = 4;
#endif
constexpr int kVecs = 4;

// fp32 -> the bf16 bit pattern (round to nearest even, saturating at +-kBf16Max, NaN kept) in 32 bits.
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> Bf16Bits(D d, V v) {
    const hn::RebindToUnsigned<D> du;
    v = ClampKeepNaN(v, hn::Set(d, -conv::kBf16Max), hn::Set(d, conv::kBf16Max));
    const auto u = hn::BitCast(du, v);
    return hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u))));
}

void RoundF32(const float* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t n) {
    const D d;
    const hn::RebindToUnsigned<D> du;
    const size_t L = hn::Lanes(d);
    for (size_t i = 0; i < n; i += L) {
        const auto b = hn::And(Bf16Bits(d, LoadN(d, x + i, n - i)), hn::Set(du, 0xffff0000u));
        StoreN(d, hn::BitCast(d, b), y + i, n - i);
    }
}

void RoundBf16(const float* HWY_RESTRICT x, uint16_t* HWY_RESTRICT y, size_t n) {
    const D d;
    const hn::RebindToSigned<D> di;
    const hn::Rebind<uint16_t, D> d16;
    const size_t L = hn::Lanes(d);
    size_t i = 0;
    for (; i + L <= n; i += L) {
        const auto hi = hn::BitCast(di, hn::ShiftRight<16>(Bf16Bits(d, hn::LoadU(d, x + i))));
        hn::StoreU(hn::DemoteTo(d16, hi), d16, y + i);             // values < 2^16: no saturation
    }
    for (; i < n; ++i) {
        const auto hi = hn::BitCast(di, hn::ShiftRight<16>(Bf16Bits(d, hn::Set(d, x[i]))));
        y[i] = static_cast<uint16_t>(hn::GetLane(hi));
    }
}

// act(v) as TFLite's reference kernels: std::max / std::min comparisons, LEAKY_RELU v > 0 ? v : alpha*v.
HWY_INLINE V Activate(D d, V v, int act, float alpha) {
    const V zero = hn::Zero(d);
    switch (act) {
        case conv::kRelu: return hn::IfThenElse(hn::Lt(v, zero), zero, v);
        case conv::kRelu6: {
            v = hn::IfThenElse(hn::Lt(v, zero), zero, v);
            return hn::IfThenElse(hn::Lt(hn::Set(d, 6.0f), v), hn::Set(d, 6.0f), v);
        }
        case conv::kReluN1To1: {
            v = hn::IfThenElse(hn::Lt(v, hn::Set(d, -1.0f)), hn::Set(d, -1.0f), v);
            return hn::IfThenElse(hn::Lt(hn::Set(d, 1.0f), v), hn::Set(d, 1.0f), v);
        }
        case conv::kLeaky: return hn::IfThenElse(hn::Gt(v, zero), v, hn::Mul(v, hn::Set(d, alpha)));
        default: return v;
    }
}

// out[p][c .. c + L) = act(a + bias[c ..]) for one vector of one pixel, masked past Co.
HWY_INLINE void StoreOut(const Conv& k, D d, V a, int c, float* HWY_RESTRICT o) {
    const int L = static_cast<int>(hn::Lanes(d));
    const V v = Activate(d, hn::Add(a, hn::Load(d, k.bias + c)), k.act, k.alpha);
    if (k.Co - c >= L) hn::StoreU(v, d, o + c);
    else hn::BlendedStore(v, hn::FirstN(d, static_cast<size_t>(k.Co - c)), d, o + c);
}

// Rows [p0, p1) of the output from a block scratch (row p at acc + (p - p0) * ld), all Co channels, for one
// activation (a template argument, so the per-vector switch and the Conv fields leave the loop).
template <int kAct>
HWY_INLINE void EpilogueAct(const Conv& k, const float* HWY_RESTRICT acc, int ld, float* HWY_RESTRICT out, int p0,
                            int p1) {
    const D d;
    const int L = static_cast<int>(hn::Lanes(d)), Co = k.Co, full = Co / L * L;
    const float* HWY_RESTRICT bias = k.bias;
    const float alpha = k.alpha;
    const auto tail = hn::FirstN(d, static_cast<size_t>(Co - full));
    for (int p = p0; p < p1; ++p) {
        const float* HWY_RESTRICT a = acc + static_cast<size_t>(p - p0) * ld;
        float* HWY_RESTRICT o = out + static_cast<size_t>(p) * Co;
        int c = 0;
        for (; c < full; c += L)
            hn::StoreU(Activate(d, hn::Add(hn::LoadU(d, a + c), hn::Load(d, bias + c)), kAct, alpha), d, o + c);
        if (c < Co)
            hn::BlendedStore(Activate(d, hn::Add(hn::LoadU(d, a + c), hn::Load(d, bias + c)), kAct, alpha), tail, d,
                             o + c);
    }
}

void Epilogue(const Conv& k, const float* HWY_RESTRICT acc, int ld, float* HWY_RESTRICT out, int p0, int p1) {
    switch (k.act) {
        case conv::kRelu: return EpilogueAct<conv::kRelu>(k, acc, ld, out, p0, p1);
        case conv::kRelu6: return EpilogueAct<conv::kRelu6>(k, acc, ld, out, p0, p1);
        case conv::kReluN1To1: return EpilogueAct<conv::kReluN1To1>(k, acc, ld, out, p0, p1);
        case conv::kLeaky: return EpilogueAct<conv::kLeaky>(k, acc, ld, out, p0, p1);
        default: return EpilogueAct<conv::kNone>(k, acc, ld, out, p0, p1);
    }
}

// Where a block's sums start and which kernel rows they take (one row group: tap_range, row_group_end).
struct Taps {
    int i0, i1;                          // kernel rows [i0, i1)
    const float* init;                   // a suffix's prefix sums [pixel][Cop] from pixel 0, or null: from +0
};

// P pixels (from m0) x NV vectors of output channels (from c0): sums over kernel rows [t.i0, t.i1) and the kw*C
// run of each, in that order, then the epilogue (a prefix: the raw sums to out [pixel][Cop]).
template <int P, int NV>
HWY_INLINE void Block(const Conv& k, int m0, int c0, float* HWY_RESTRICT out, const Taps& t) {
    const D d;
    const int L = static_cast<int>(hn::Lanes(d));
    const int kwc = k.kw * k.C, Cop = k.NB * 16;
    const size_t C = k.C, row = static_cast<size_t>(k.Wp) * C;
    const float* px[P];
    EDGEHFT_UNROLL for (int p = 0; p < P; ++p) {
        const int oy = (m0 + p) / k.Wo, ox = (m0 + p) % k.Wo;
        px[p] = static_cast<const float*>(k.x) + (static_cast<size_t>(oy) * k.sh * k.Wp + static_cast<size_t>(ox) * k.sw) * C;
    }
    // Every loop over p and v is unrolled (compile-time bounds only), so the P x NV accumulators live in registers
    // across the whole sum: a loop the compiler cannot unroll keeps acc an array in memory and stores it back on
    // every step of the k loop (24 stores per 24 multiply-adds).
    V acc[P][NV];
    EDGEHFT_UNROLL for (int p = 0; p < P; ++p)
        EDGEHFT_UNROLL for (int v = 0; v < NV; ++v)
            acc[p][v] = t.init ? hn::LoadU(d, t.init + static_cast<size_t>(m0 + p) * Cop + c0 + v * L) : hn::Zero(d);
    for (int i = t.i0; i < t.i1; ++i) {
        const float* HWY_RESTRICT w = k.wf + static_cast<size_t>(i) * kwc * Cop + c0;
        const size_t xo = i * row;
        for (int q = 0; q < kwc; ++q) {
            V wv[NV];
            EDGEHFT_UNROLL for (int v = 0; v < NV; ++v) wv[v] = hn::Load(d, w + static_cast<size_t>(q) * Cop + v * L);
            EDGEHFT_UNROLL for (int p = 0; p < P; ++p) {
                const V xv = hn::Set(d, px[p][xo + q]);
                EDGEHFT_UNROLL for (int v = 0; v < NV; ++v) acc[p][v] = hn::MulAdd(xv, wv[v], acc[p][v]);   // exact products
            }
        }
    }
    if (k.role == conv::kPrefix) {
        EDGEHFT_UNROLL for (int p = 0; p < P; ++p)
            EDGEHFT_UNROLL for (int v = 0; v < NV; ++v)
                hn::StoreU(acc[p][v], d, out + static_cast<size_t>(m0 + p) * Cop + c0 + v * L);
        return;
    }
    EDGEHFT_UNROLL for (int p = 0; p < P; ++p)
        EDGEHFT_UNROLL for (int v = 0; v < NV; ++v)
            if (c0 + v * L < k.Co) StoreOut(k, d, acc[p][v], c0 + v * L, out + static_cast<size_t>(m0 + p) * k.Co);
}

template <int P, int NV>
HWY_INLINE void BlockP(int np, const Conv& k, int m0, int c0, float* out, const Taps& t) {
    if (np == P) Block<P, NV>(k, m0, c0, out, t);
    if constexpr (P > 1) {
        if (np < P) BlockP<P - 1, NV>(np, k, m0, c0, out, t);
    }
}

// Pixels [m0, m1) (one row group) for the channel block at c0 of NV vectors.
template <int NV>
HWY_INLINE void Pixels(int nv, const Conv& k, int c0, float* out, int m0, int m1, const Taps& t) {
    if (nv == NV) {
        for (int m = m0; m < m1; m += kPix) BlockP<kPix, NV>(std::min(kPix, m1 - m), k, m, c0, out, t);
    }
    if constexpr (NV > 1) {
        if (nv < NV) Pixels<NV - 1>(nv, k, c0, out, m0, m1, t);
    }
}

void Run(const Conv& k, float* HWY_RESTRICT out) {
    const int L = static_cast<int>(hn::Lanes(D()));
    const int nvt = k.NB * 16 / L;
    for (int oy0 = 0, oy1; oy0 < k.Ho; oy0 = oy1) {
        oy1 = conv::row_group_end(k, oy0);
        Taps t;
        conv::tap_range(k, oy0, &t.i0, &t.i1);
        t.init = k.role == conv::kSuffix && oy0 < k.split ? k.part : nullptr;
        for (int v0 = 0; v0 < nvt; v0 += kVecs)
            Pixels<kVecs>(std::min(kVecs, nvt - v0), k, v0 * L, out, oy0 * k.Wo, oy1 * k.Wo, t);
    }
}

}  // namespace

extern const conv::Fns kConvFns;
const conv::Fns kConvFns = {&RoundF32, &RoundBf16, &Run, &Epilogue};

}  // namespace HWY_NAMESPACE
}  // namespace edgehft
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define EDGEHFT_AMX 1
#endif

namespace edgehft {
namespace {
using conv::Conv;

const conv::Fns* const kTable[kSlots] = EDGEHFT_SLOT_TABLE(kConvFns);


// One input buffer per thread, shared by every conv the thread runs (so a chain of convs keeps one such
// buffer in cache, not one per conv); grown, zero-filled, when a conv needs more. A run re-zeroes its own
// padding and the slack after it (another conv, or an earlier call, may have written there).
struct Scratch {
    void* p = nullptr;
    size_t n = 0;
    ~Scratch() { free(p); }
};
thread_local Scratch tls_scratch;

void* scratch(size_t bytes) {
    Scratch& s = tls_scratch;
    if (s.n < bytes) {
        void* q = aligned_zeroed(bytes);
        if (!q) return nullptr;
        free(s.p);
        s.p = q;
        s.n = bytes;
    }
    return s.p;
}

// The padded input buffer (elements of type T) from x: zeros around, rounded values inside.
template <typename T>
void fill(const Conv* k, const float* x, T* base, void (*round)(const float*, T*, size_t)) {
    const size_t C = k->C, row = static_cast<size_t>(k->W) * C, prow = static_cast<size_t>(k->Wp) * C;
    memset(base, 0, k->ph * prow * sizeof(T));                                   // rows above
    T* dst = base + k->ph * prow + k->pw * C;
    if (k->Wp == k->W) round(x, dst, k->H * row);
    else
        for (int r = 0; r < k->H; ++r) {
            T* d = dst + r * prow;
            memset(d - k->pw * C, 0, k->pw * C * sizeof(T));                      // columns left
            round(x + r * row, d, row);
            memset(d + row, 0, (prow - row - k->pw * C) * sizeof(T));             // columns right
        }
    memset(base + (k->ph + k->H) * prow, 0, (k->Hp - k->ph - k->H) * prow * sizeof(T));  // rows below
    // and, for the bf16 paths (AMX, VDPBF16PS), everything after them that their tails and k-block padding read
    // (times zero weights, or into outputs that are thrown away): zeros, so no value from another conv or an
    // earlier call can reach an output (0 * inf would). The fp32 SIMD path reads only rows < Hp.
    if (sizeof(T) == sizeof(uint16_t)) memset(base + k->Hp * prow, 0, (k->xrows - k->Hp * prow) * sizeof(T));
}

#ifdef EDGEHFT_AMX
// y = bf16(x), the bits RoundBf16 gives for every normal, zero or infinite x (round to nearest even, clamped to
// +-kBf16Max first; a NaN stays a NaN), 32 values per VCVTNE2PS2BF16 (AVX512_BF16, which every AMX CPU has); the
// last n % 32 values through RoundBf16. A subnormal x becomes zero in the 32-wide part where RoundBf16 keeps a
// subnormal bf16, so the buffer's bits depend on where a value falls; the AMX and VDPBF16PS paths, the only users,
// treat subnormal bf16 operands as zero (the instructions' DAZ), so their outputs are the same either way.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void round_bf16_cvt(const float* x, uint16_t* y, size_t n) {
    const __m512 hi = _mm512_set1_ps(conv::kBf16Max), lo = _mm512_set1_ps(-conv::kBf16Max);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {       // min(c, v) and max(c, v) return v when v is NaN
        const __m512 a = _mm512_max_ps(lo, _mm512_min_ps(hi, _mm512_loadu_ps(x + i)));
        const __m512 b = _mm512_max_ps(lo, _mm512_min_ps(hi, _mm512_loadu_ps(x + i + 16)));
        _mm512_storeu_si512(y + i, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
    if (i < n) kTable[kAvx3]->round_bf16(x + i, y + i, n - i);
}

struct TileConfig {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

// Output pixels [p0, p1) from a block scratch (row p at acc + (p - p0) * NB * 16): act(acc + bias) to out as
// fp32 (the epilogue), or, in a linked run, rounded to bf16 (round_bf16_cvt: the bits the next conv's own fill
// would give) straight into the next conv's padded input buffer (pixel (oy, ox) at row ph + oy, column pw + ox).
void emit(Conv* k, const float* acc, float* out, int p0, int p1) {
    const int ld = k->NB * 16;
    Conv* n = k->next;
    if (!n) {
        kTable[kAvx3]->epilogue(*k, acc, ld, out, p0, p1);
        return;
    }
    kTable[kAvx3]->epilogue(*k, acc, ld, k->tmp, 0, p1 - p0);
    const size_t Co = k->Co;
    const bool rows_touch = n->pw == 0 && n->Wp == n->W;    // the next buffer's rows have no padding between
    for (int p = p0; p < p1;) {                             // runs of pixels contiguous in the next buffer
        const int oy = p / k->Wo, ox = p % k->Wo;
        const int q = rows_touch ? p1 : std::min(p1, (oy + 1) * k->Wo);
        round_bf16_cvt(k->tmp + (p - p0) * Co,
                       n->own + ((static_cast<size_t>(n->ph) + oy) * n->Wp + n->pw + ox) * Co, (q - p) * Co);
        p = q;
    }
}

// Pixels p0 .. p0+rows-1 (rows <= 32) of the output, whose first input run starts at base and the next
// ones s padded pixels apart: all output channels' sums into the block scratch acc (the caller emits them).
// rows <= 16: the first A tile only (half the tile products: a row run of a stream, a conv's last block);
// each output's sum is the same either way (a tile row is one pixel, summed over the same k blocks).
__attribute__((target("amx-tile,amx-bf16"))) void amx_block(Conv* k, const uint16_t* base, int s, float* acc,
                                                          int rows) {
    const int C = k->C, NB = k->NB, KB = k->KB, ldc = NB * 16 * 4;
    const long astride = static_cast<long>(s) * C * 2;
    const size_t tile = 16 * 32;                   // bf16 elements per B tile
    const bool low = rows > 16;                    // pixels 16..31: the second A tile
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
                _tile_loadd(6, b, 64);
                _tile_dpbf16ps(0, 4, 6);
                if (low) {
                    _tile_loadd(5, a + kb * 32 + static_cast<size_t>(16) * s * C, astride);
                    _tile_dpbf16ps(2, 5, 6);
                }
                if (two) {
                    _tile_loadd(7, b + tile, 64);
                    _tile_dpbf16ps(1, 4, 7);
                    if (low) _tile_dpbf16ps(3, 5, 7);
                }
            }
        }
        float* o = acc + nb * 16;
        _tile_stored(0, o, ldc);
        if (low) _tile_stored(2, o + 16 * NB * 16, ldc);
        if (two) {
            _tile_stored(1, o + 16, ldc);
            if (low) _tile_stored(3, o + 16 * NB * 16 + 16, ldc);
        }
    }
}

// AVX512_BF16: P pixels x NV 16-channel blocks (from block nb0) into the block scratch (row p - m0 at
// k->acc + (p - m0) * NB * 16). Per output lane VDPBF16PS adds one bf16 pair's two exact products (the odd
// element's first) to the fp32 sum, pairs in ascending order of kernel row (rows [i0, i1): tap_range) then kw*C
// position; the B vectors are the AMX B tiles' rows (16 channels x one pair), the A value one input pair
// broadcast. The sums start at +0, or at a suffix's prefix sums (init: [pixel][NB * 16] from pixel 0).
template <int P, int NV>
__attribute__((target("avx512f,avx512bf16"))) void dp_block(const Conv* k, int m0, int nb0, int i0, int i1,
                                                           const float* init) {
    const size_t C = k->C, row = static_cast<size_t>(k->Wp) * C, tile = 16 * 32;
    const int KB = k->KB, NB = k->NB, pairs = (k->kw * k->C + 1) / 2;
    const uint16_t* px[P];
    for (int p = 0; p < P; ++p) {
        const int oy = (m0 + p) / k->Wo, ox = (m0 + p) % k->Wo;
        px[p] = static_cast<const uint16_t*>(k->x) +
                (static_cast<size_t>(oy) * k->sh * k->Wp + static_cast<size_t>(ox) * k->sw) * C;
    }
    __m512 acc[P][NV];
    for (int p = 0; p < P; ++p)
        for (int v = 0; v < NV; ++v)
            acc[p][v] = init ? _mm512_loadu_ps(init + (static_cast<size_t>(m0 + p) * NB + nb0 + v) * 16)
                             : _mm512_setzero_ps();
    for (int i = i0; i < i1; ++i) {
        const uint16_t* w = k->wt + static_cast<size_t>(i) * KB * NB * tile;
        for (int j = 0; j < pairs; ++j) {
            const uint16_t* wj = w + (static_cast<size_t>(j / 16) * NB + nb0) * tile + (j % 16) * 32;
            __m512i b[NV];
            for (int v = 0; v < NV; ++v) b[v] = _mm512_load_si512(wj + v * tile);
            for (int p = 0; p < P; ++p) {
                uint32_t pair;
                memcpy(&pair, px[p] + i * row + 2 * j, 4);
                const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
                for (int v = 0; v < NV; ++v) acc[p][v] = _mm512_dpbf16_ps(acc[p][v], a, (__m512bh)b[v]);
            }
        }
    }
    for (int p = 0; p < P; ++p)
        for (int v = 0; v < NV; ++v) _mm512_store_ps(k->acc + static_cast<size_t>(p) * NB * 16 + (nb0 + v) * 16, acc[p][v]);
}

template <int P, int NV>
void dp_blocks(int np, int nv, const Conv* k, int m0, int nb0, int i0, int i1, const float* init) {
    if (nv < NV) {
        if constexpr (NV > 1) dp_blocks<P, NV - 1>(np, nv, k, m0, nb0, i0, i1, init);
    } else if (np < P) {
        if constexpr (P > 1) dp_blocks<P - 1, NV>(np, nv, k, m0, nb0, i0, i1, init);
    } else {
        dp_block<P, NV>(k, m0, nb0, i0, i1, init);
    }
}

// One or two pixels (a row on the tick, e.g. an LSTM's input projection of the newest row): four channel blocks at a
// time would leave each sum's chain of dependent VDPBF16PS waiting on the last (four chains in flight); take up to
// 16 blocks (one pixel) or 8 (two) at a time, balanced, instead. Each output's sum is the same sequence of pairs.
void dp_few(int np, const Conv* k, int m0, int i0, int i1, const float* init) {
    const int most = np == 1 ? 16 : 8, groups = (k->NB + most - 1) / most;
    for (int g = 0, nb0 = 0; g < groups; ++g) {
        const int nv = (k->NB - nb0) / (groups - g);
        if (np == 1) dp_blocks<1, 16>(1, nv, k, m0, nb0, i0, i1, init);
        else dp_blocks<2, 8>(2, nv, k, m0, nb0, i0, i1, init);
        nb0 += nv;
    }
}

// The whole conv on VDPBF16PS: per row group (row_group_end), pixel blocks of 6 (6 x 4 accumulators), all channel
// blocks (4 at a time) into the scratch, then the AVX3 epilogue (a prefix: the raw sums to out [pixel][NB * 16]).
void run_dp(Conv* k, float* out) {
    constexpr int kP = 6;
    const size_t ld = static_cast<size_t>(k->NB) * 16;
    for (int oy0 = 0, oy1; oy0 < k->Ho; oy0 = oy1) {
        oy1 = conv::row_group_end(*k, oy0);
        int i0, i1;
        conv::tap_range(*k, oy0, &i0, &i1);
        const float* init = k->role == conv::kSuffix && oy0 < k->split ? k->part : nullptr;
        for (int m0 = oy0 * k->Wo, m1 = oy1 * k->Wo; m0 < m1; m0 += kP) {
            const int np = std::min(kP, m1 - m0);
            if (np <= 2) {
                dp_few(np, k, m0, i0, i1, init);
            } else {
                for (int nb0 = 0; nb0 < k->NB; nb0 += 4)
                    dp_blocks<kP, 4>(np, std::min(4, k->NB - nb0), k, m0, nb0, i0, i1, init);
            }
            if (k->role == conv::kPrefix) memcpy(out + m0 * ld, k->acc, np * ld * sizeof(float));
            else emit(k, k->acc, out, m0, m0 + np);
        }
    }
}

// A run of conv calls on one thread sharing one tile configuration (edgehft_conv_amx_scope): the first AMX conv
// in it loads the configuration, the scope's end releases the tiles; outside a scope every AMX conv loads and
// releases its own (LDTILECFG + TILERELEASE cost ~60 ns a call on a Sapphire Rapids core). Every AMX conv uses
// the same configuration (8 tiles of 16 rows x 64 bytes), so sharing it changes no result.
struct AmxScope {
    bool open = false, configured = false;
};
thread_local AmxScope tls_amx;

__attribute__((target("amx-tile,amx-bf16"))) void amx_configure() {
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile,amx-bf16"))) void amx_release() { _tile_release(); }

__attribute__((target("amx-tile,amx-bf16"))) void run_amx(Conv* k, float* out) {
    const uint16_t* xb = static_cast<const uint16_t*>(k->x);
    const bool scoped = tls_amx.open;
    if (!scoped || !tls_amx.configured) amx_configure();
    if (scoped) tls_amx.configured = true;
    const size_t C = k->C;
    if (k->flat) {
        for (int m0 = 0; m0 < k->M; m0 += 32) {
            amx_block(k, xb + static_cast<size_t>(m0) * k->s * C, k->s, k->acc, std::min(32, k->M - m0));
            emit(k, k->acc, out, m0, std::min(k->M, m0 + 32));
        }
    } else {
        for (int oy = 0; oy < k->Ho; ++oy)
            for (int ox = 0; ox < k->Wo; ox += 32) {
                amx_block(k, xb + (static_cast<size_t>(oy) * k->sh * k->Wp + static_cast<size_t>(ox) * k->sw) * C,
                          k->sw, k->acc, std::min(32, k->Wo - ox));
                emit(k, k->acc, out, oy * k->Wo + ox, oy * k->Wo + std::min(k->Wo, ox + 32));
            }
    }
    if (!scoped) _tile_release();
}
#endif

}  // namespace

extern "C" {

// 1 when this process can run AMX-BF16 tiles (CPU flags and the kernel's permission), else 0.
int edgehft_conv_amx() { return slot_supported(kAmx) ? 1 : 0; }

// open 1: the conv calls on this thread until edgehft_conv_amx_scope(0) share one tile configuration (loaded by
// the first AMX conv among them); open 0: the end of that run (the tiles released if one was loaded). For a caller
// that runs many small convs back to back with no other AMX code between them (the stream executor's phases).
void edgehft_conv_amx_scope(int open) {
#ifdef EDGEHFT_AMX
    if (tls_amx.configured) amx_release();
    tls_amx.open = open != 0;
    tls_amx.configured = false;
#else
    (void)open;
#endif
}

// Create a conv. dims = {H, W, C, Co, kh, kw, sh, sw, ph, pw, Ho, Wo} (ph, pw: the leading SAME padding;
// VALID: 0); weights OHWI (Co, kh, kw, C) float32; bias (Co,) float32 or null; act: 0 none, 1 relu,
// 2 relu6, 3 relu_n1_to_1, 4 leaky (alpha). portable: 1 never uses AMX or VDPBF16PS (the Highway SIMD path
// of the target in force). The target in force at create (cpu_dispatch.h) is the one the conv runs. Returns null on an
// inconsistent geometry or no memory.
void* edgehft_conv_create(const int* dims, const float* weights, const float* bias, int act, float alpha,
                          int portable) {
    Conv* k = static_cast<Conv*>(aligned_zeroed(sizeof(Conv)));
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
    k->wt = static_cast<uint16_t*>(aligned_zeroed(static_cast<size_t>(k->kh) * k->KB * Cop * 32 * 2));
    k->wf = static_cast<float*>(aligned_zeroed(static_cast<size_t>(k->kh) * kwc * Cop * 4));
    k->bias = static_cast<float*>(aligned_zeroed(static_cast<size_t>(Cop) * 4));
    k->acc = static_cast<float*>(aligned_zeroed(static_cast<size_t>(32) * Cop * 4));
    k->tmp = static_cast<float*>(aligned_zeroed(static_cast<size_t>(32) * Cop * 4));
    if (!scratch(k->xrows * sizeof(float)) || !k->wt || !k->wf || !k->bias || !k->acc || !k->tmp) {
        free(k->wt); free(k->wf); free(k->bias); free(k->acc); free(k->tmp); free(k);
        return nullptr;
    }
    for (int co = 0; co < k->Co; ++co) {
        k->bias[co] = bias ? bias[co] : 0.0f;
        for (int i = 0; i < k->kh; ++i)
            for (int q = 0; q < kwc; ++q) {
                const uint16_t b = bf16_bits(weights[((static_cast<size_t>(co) * k->kh + i) * k->kw) * k->C + q]);
                k->wf[(static_cast<size_t>(i) * kwc + q) * Cop + co] = bf16_value(b);
                const int kb = q / 32, kp = (q % 32) / 2, e = q % 2, nb = co / 16, n = co % 16;
                k->wt[((((static_cast<size_t>(i) * k->KB + kb) * k->NB + nb) * 16 + kp) * 16 + n) * 2 + e] = b;
            }
    }
    const int slot = current_slot();
    k->amx = !portable && slot == kAmx;
    k->dpbf16 = !portable && slot == kAvx3Bf16;
    k->slot = simd_slot(slot);
    return k;
}

// x: (H, W, C) float32 NHWC; out: (Ho, Wo, Co) float32. The caller keeps x finite. Returns 0, or -1 when
// this thread's scratch could not grow (out of memory).
int edgehft_conv_run(void* h, const float* x, float* out) {
    Conv* k = static_cast<Conv*>(h);
    k->x = scratch(k->xrows * sizeof(float));
    if (!k->x) return -1;
    const conv::Fns* fn = kTable[k->slot];
#ifdef EDGEHFT_AMX
    if (k->amx || k->dpbf16) {
        fill<uint16_t>(k, x, static_cast<uint16_t*>(k->x), &round_bf16_cvt);
        if (k->amx) run_amx(k, out);
        else run_dp(k, out);
        return 0;
    }
#endif
    fill<float>(k, x, static_cast<float*>(k->x), fn->round_f32);
    fn->run(*k, out);
    return 0;
}

// Split the conv's sums by kernel rows (the stream executor, issue 21: the part of a sum that reads only rows
// received before the tick is computed ahead of it). Output row oy's kernel rows below split - oy are the prefix's,
// the rest the suffix's. role 1 (prefix): edgehft_conv_run writes the raw sums of the prefix rows (no bias, no
// activation) to out as [Ho * Wo][Cop] float32 (Cop = Co rounded up to 16); every output row must lie in the split
// (Ho <= split). role 2 (suffix): rows oy < split start from part (a prefix's output, [split * Wo][Cop], read at
// every run) and add the rest, then bias and activation as usual (split <= Ho). Each sum then takes its kernel rows
// in the order the whole conv takes them, from the same start: a prefix then its suffix give the whole conv's bits.
// Returns 0; -1 on a bad role, split or part; -2 on an AMX conv (its tiles sum in their own order: not split).
int edgehft_conv_split(void* h, int role, int split, const float* part) {
    Conv* k = static_cast<Conv*>(h);
    if (k->amx) return -2;
    if (role == conv::kPrefix && split >= k->Ho && split >= 1) {
        k->role = role; k->split = split; k->part = nullptr;
        return 0;
    }
    if (role == conv::kSuffix && split >= 1 && split <= k->Ho && part) {
        k->role = role; k->split = split; k->part = part;
        return 0;
    }
    return -1;
}

// Give the conv its own bf16 input buffer (once), for edgehft_conv_run_link: zeroed, and only its interior is
// ever written, so its padding stays zero. Returns 0, -1 out of memory, -2 on a conv not on AMX or VDPBF16PS.
int edgehft_conv_own_buffer(void* h) {
    Conv* k = static_cast<Conv*>(h);
    if (!(k->amx || k->dpbf16)) return -2;
    if (!k->own) k->own = static_cast<uint16_t*>(aligned_zeroed(k->xrows * sizeof(uint16_t)));
    return k->own ? 0 : -1;
}

// A run of two or more convs in a row, each reading only the one before it (DeepLOB's front end), without the
// fp32 tensor between them: the conv h, reading x (or, when x is null, its own bf16 buffer, which the conv linked
// before it filled), writes its output rounded to bf16 into next's own buffer (next null: to out, fp32). The
// bits are those of edgehft_conv_run on each conv in turn (the rounding the next conv's fill would do, done in
// the epilogue), so a linked chain and an unlinked one give the same outputs. Both convs must run on AMX or
// VDPBF16PS (the bf16 buffer), next must read h's output shape and have its buffer (edgehft_conv_own_buffer).
// Returns 0; -1 when this thread's scratch could not grow (out of memory); -2 when the link is not possible
// (another path or shape, next without its buffer, or x null on a conv without one), with nothing run.
int edgehft_conv_run_link(void* h, const float* x, float* out, void* nxt) {
    Conv* k = static_cast<Conv*>(h);
    Conv* n = static_cast<Conv*>(nxt);
#ifdef EDGEHFT_AMX
    if (!(k->amx || k->dpbf16) || (!x && !k->own) || k->role != conv::kWhole) return -2;
    if (n && (!(n->amx || n->dpbf16) || n->H != k->Ho || n->W != k->Wo || n->C != k->Co)) return -2;
    if (n && !n->own) return -2;
    if (x) {
        k->x = scratch(k->xrows * sizeof(float));
        if (!k->x) return -1;
        fill<uint16_t>(k, x, static_cast<uint16_t*>(k->x), &round_bf16_cvt);
    } else {
        k->x = k->own;
    }
    k->next = n;
    if (k->amx) run_amx(k, out);
    else run_dp(k, out);
    k->next = nullptr;
    return 0;
#else
    (void)k; (void)n; (void)x; (void)out;
    return -2;
#endif
}

// Read every cache line of the weights and bias this conv's path reads (the bf16 tiles on AMX and VDPBF16PS, the
// fp32 rows on the SIMD path), so a call that follows soon finds them in the core's caches: the stream executor
// warms the convs of the tick's critical path at the end of prepare (issue 21), after prepare's own work may have
// pushed them out. Changes nothing. Returns 0.
int edgehft_conv_warm(void* h) {
    const Conv* k = static_cast<const Conv*>(h);
    const size_t Cop = static_cast<size_t>(k->NB) * 16;
    const char* w = (k->amx || k->dpbf16) ? reinterpret_cast<const char*>(k->wt) : reinterpret_cast<const char*>(k->wf);
    const size_t n = (k->amx || k->dpbf16) ? static_cast<size_t>(k->kh) * k->KB * Cop * 32 * 2
                                           : static_cast<size_t>(k->kh) * k->kw * k->C * Cop * sizeof(float);
    warm_lines(w, n);
    warm_lines(k->bias, Cop * sizeof(float));
    return 0;
}

// The target slot this conv runs (cpu_dispatch.h: 0 amx, 1 avx3_bf16, 2 avx3, 3 avx2, 4 neon, 5 the fallback).
int edgehft_conv_slot(void* h) {
    const Conv* k = static_cast<Conv*>(h);
    return k->amx ? kAmx : k->dpbf16 ? kAvx3Bf16 : k->slot;
}

// 1 when this conv runs on AMX tiles, 0 on the SIMD path.
int edgehft_conv_isa(void* h) { return static_cast<Conv*>(h)->amx ? 1 : 0; }

void edgehft_conv_destroy(void* h) {
    Conv* k = static_cast<Conv*>(h);
    if (!k) return;
    free(k->wt); free(k->wf); free(k->bias); free(k->acc); free(k->tmp); free(k->own); free(k);
}

}  // extern "C"
}  // namespace edgehft
#endif  // HWY_ONCE
