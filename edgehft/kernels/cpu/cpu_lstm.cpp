// edgehft native CPU LSTM: Keras LSTM forward, fp32, batch 1, one sequence, stacked layers.
//
// Semantics (Keras / tf-keras LSTM, activation tanh, recurrent_activation sigmoid, no peepholes,
// no projection, zero initial state): per step t, with gate order i, f, c, o in the 4H columns,
//     z = x_t @ W + h_{t-1} @ U + b           W (in, 4H), U (H, 4H), b (4H,)
//     i = sigmoid(z_i)  f = sigmoid(z_f)  g = tanh(z_c)  o = sigmoid(z_o)
//     c_t = f * c_{t-1} + i * g               h_t = o * tanh(c_t)
// optionally with c_t clamped to +-cell_clip (TFLite's UNIDIRECTIONAL_SEQUENCE_LSTM cell_clip option; the
// TF converter sets 10 for a Keras LSTM, which itself never clips).
// Layer l's input is layer l-1's full h sequence. Output: the last layer's h sequence (T, H) or its
// last step (H,).
//
// Numerics: tanh is Eigen's rational approximation (odd degree-13 / even degree-6 polynomials, input
// clamped to +-7.90531110763549805, Horner steps as fused multiply-adds, a true division);
// sigmoid(x) = 0.5 + 0.5 * tanh(x / 2). Measured max |error| against float64 on [-20, 20]: tanh 3.1e-7,
// sigmoid 1.6e-7. Sums are fp32 fused multiply-adds in a fixed order: g = b + x_t @ W (k ascending) and
// r = h_{t-1} @ U (from zero, k ascending), then z = g + r (one add). Every lane of every target computes the same
// operations in the same order (the fallback target's multiply-adds are std::fma), so every target gives
// the same bits (tests/unit/test_native_dispatch.py asserts it).
//
// Layout: weights are copied at create in Keras column order (i | f | c | o, 4H columns) with zero
// columns after 4H up to Np = 16 * ceil(4H / 16), rows 64-byte aligned. With recurrent_bf16 (the native-bf16
// plan) U is rounded to bf16 (nearest even) and stored as vector pairs in 32-bit words (BF16_PAIRS below):
// widening a bf16 is exact, so the sums are the fp32 code's on the rounded U, and a step reads half the bytes.
// The recurrence reads all of U every step, from L2 once U outgrows L1 (LSTM_A's 100 x 400: 160 KB fp32), and
// that bandwidth bounds it: on an AMD Zen 4 core bf16 pairs made LSTM_A's window 270 -> 211 µs.
//
// Schedule (per Highway target, chosen at create: cpu_dispatch.h): (1) the input projection for all T
// steps is one GEMM G[T][Np] = X @ W + b, register blocked (5 rows x kGemmVecs vectors); (2) per step,
// z = G[t] + h_{t-1} @ U (the recurrent sum from zero, then one add of G[t]) with up to kMaxAcc accumulator vectors (AVX3: 28 x 16 lanes, i.e. H <= 112 in
// one pass; AVX2: 12 x 8) held in registers across the whole k loop; wider layers take several balanced
// column chunks, each a pass over h_{t-1}; (3) the gates from z a vector at a time (masked at the end),
// c kept in a buffer, h_t written to its own row of the sequence.
//
// The stream executor (cpu_stream.cpp, issue 21) calls these same per-target functions through cpu_lstm.h
// (lstm::fns): Gemm and Step for the steps it prepares ahead of a tick, Recurrent for the last step's recurrent
// sum (h_{T-2} is known before the tick), StepIn for the last step after it (only the row's projection, then the
// precomputed sum added: the roundings Gemm then Step give).
//
// No allocation in edgehft_lstm_run: every buffer comes from edgehft_lstm_create.
#include "cpu_dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu_lstm.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "cpu_simd-inl.h"

#ifndef EDGEHFT_CPU_LSTM_ONCE_
#define EDGEHFT_CPU_LSTM_ONCE_
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "cpu_lstm.h"

namespace edgehft {
namespace lstm {

// Eigen's rational tanh coefficients (float).
constexpr float kClamp = 7.90531110763549805f;
constexpr float kA13 = -2.76076847742355e-16f, kA11 = 2.00018790482477e-13f, kA9 = -8.60467152213735e-11f,
                kA7 = 5.12229709037114e-08f, kA5 = 1.48572235717979e-05f, kA3 = 6.37261928875436e-04f,
                kA1 = 4.89352455891786e-03f;
constexpr float kB6 = 1.19825839466702e-06f, kB4 = 1.18534705686654e-04f, kB2 = 2.26843463243900e-03f,
                kB0 = 4.89352518554385e-03f;

}  // namespace lstm
}  // namespace edgehft
#endif  // EDGEHFT_CPU_LSTM_ONCE_

HWY_BEFORE_NAMESPACE();
namespace edgehft {
namespace HWY_NAMESPACE {
namespace {
namespace hn = hwy::HWY_NAMESPACE;
using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_NEON
constexpr int kMaxAcc = 28, kGemmVecs = 4;     // 32 vector registers
#elif HWY_TARGET == HWY_AVX2
constexpr int kMaxAcc = 12, kGemmVecs = 2;     // 16 vector registers
#else
constexpr int kMaxAcc = 16, kGemmVecs = 4;
#endif
constexpr int kGemmRows = 5;

HWY_INLINE V Tanh(D d, V x) {
    using namespace lstm;
    x = ClampKeepNaN(x, hn::Set(d, -kClamp), hn::Set(d, kClamp));
    const V x2 = hn::Mul(x, x);
    V p = Fma(d, x2, hn::Set(d, kA13), hn::Set(d, kA11));
    p = Fma(d, x2, p, hn::Set(d, kA9));
    p = Fma(d, x2, p, hn::Set(d, kA7));
    p = Fma(d, x2, p, hn::Set(d, kA5));
    p = Fma(d, x2, p, hn::Set(d, kA3));
    p = Fma(d, x2, p, hn::Set(d, kA1));
    p = hn::Mul(x, p);
    V q = Fma(d, x2, hn::Set(d, kB6), hn::Set(d, kB4));
    q = Fma(d, x2, q, hn::Set(d, kB2));
    q = Fma(d, x2, q, hn::Set(d, kB0));
    return hn::Div(p, q);
}

HWY_INLINE V Sigmoid(D d, V x) {
    const V h = hn::Set(d, 0.5f);
    return Fma(d, h, Tanh(d, hn::Mul(h, x)), h);
}

// G[r][col0 .. col0 + C vectors) = X[r][:K] @ W[:K][cols] + b[cols], rows r < R. X row stride ldx, W/G
// stride N.
template <int R, int C>
HWY_INLINE void GemmBlock(const float* X, int ldx, const float* W, int N, int K, const float* b, float* G,
                          int col0) {
    const D d;
    const int L = static_cast<int>(hn::Lanes(d));
    V acc[R][C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = hn::Load(d, b + col0 + L * c);
    for (int k = 0; k < K; k++) {
        V w[C];
        for (int c = 0; c < C; c++) w[c] = hn::Load(d, W + (size_t)k * N + col0 + L * c);
        for (int r = 0; r < R; r++) {
            const V xv = hn::Set(d, X[(size_t)r * ldx + k]);
            for (int c = 0; c < C; c++) acc[r][c] = Fma(d, xv, w[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) hn::Store(acc[r][c], d, G + (size_t)r * N + col0 + L * c);
}

// Rows [t, T) in blocks of kGemmRows, then the 1 .. kGemmRows-1 rows left.
template <int R, int C>
HWY_INLINE void GemmRows(const float* X, int ldx, int t, int T, int K, const float* W, int N, const float* b,
                         float* G, int col0) {
    for (; t + R <= T; t += R) GemmBlock<R, C>(X + (size_t)t * ldx, ldx, W, N, K, b, G + (size_t)t * N, col0);
    if constexpr (R > 1) {
        if (t < T) GemmRows<R - 1, C>(X, ldx, t, T, K, W, N, b, G, col0);
    }
}

template <int C>
HWY_INLINE void GemmTail(int nvec, const float* X, int ldx, int T, int K, const float* W, int N, const float* b,
                         float* G, int col0) {
    if (nvec == C) GemmRows<kGemmRows, C>(X, ldx, 0, T, K, W, N, b, G, col0);
    if constexpr (C > 1) {
        if (nvec < C) GemmTail<C - 1>(nvec, X, ldx, T, K, W, N, b, G, col0);
    }
}

// G[T][N] = X[T][K] @ W[K][N] + b; N a multiple of 16 (so of the lanes), W/b/G 64-byte aligned.
void Gemm(const float* X, int ldx, int T, int K, const float* W, int N, const float* b, float* G) {
    const int L = static_cast<int>(hn::Lanes(D()));
    const int step = kGemmVecs * L;
    int col0 = 0;
    for (; col0 + step <= N; col0 += step) GemmRows<kGemmRows, kGemmVecs>(X, ldx, 0, T, K, W, N, b, G, col0);
    if (col0 < N) GemmTail<kGemmVecs - 1>((N - col0) / L, X, ldx, T, K, W, N, b, G, col0);
}

// The step's sums for the NV vectors from v0. With hprev (H values; Step, not at step 0): z = G[t] + r, G[t]
// given in b, r = hprev @ U summed from zero (k ascending, one fused multiply-add per term), one add. Else
// (StepIn): g = b + x @ W (b then k ascending: the roundings of Gemm's G row), stored to g_out when not null,
// then z = g + s with s the step's recurrent sum computed ahead (by Recurrent, as Step sums it) or z = g when
// s is null.
// So the step of a row takes the same roundings whether its recurrent sum runs in the same pass or ran ahead
// (the stream executor computes h_{T-2} @ U before the tick, only g after it).
// BF16_PAIRS: the recurrent weights of a row as bf16 in 32-bit words, vectors in pairs: for vectors 2p and
// 2p + 1 of the row's N / L vectors, L words whose low halves are vector 2p's lanes and high halves vector
// 2p + 1's (zero when N / L is odd and 2p + 1 is past the end). One load gives two vectors, each widened with
// one shift or one mask: half the bytes of fp32 weights from L2 for the same fused multiply-adds. A row is
// PairedRow(N, L) words; the layout depends on the target's lanes (lstm::Fns::lanes).
HWY_INLINE int PairedRow(int N, int L) { return L * ((N / L + 1) / 2); }

// acc[0..NV) = hprev @ U for the NV vectors from v0, summed from zero (k ascending, one fused multiply-add per
// term). U is either fp32 rows of N floats (Wt = float) or bf16 rows in pairs (Wt = uint32_t, see
// BF16_PAIRS above; v0 even): a bf16 weight widened to fp32 is exact (its 16 low bits zero), so both layouts
// give the bits of the fp32 code on the bf16-rounded weights.
template <int NV, typename Wt>
HWY_INLINE void RecurSum(const float* hprev, int H, int N, const Wt* U, int v0, V* acc) {
    const D d;
    const int L = static_cast<int>(hn::Lanes(d));
    EDGEHFT_UNROLL for (int v = 0; v < NV; v++) acc[v] = hn::Zero(d);
    if constexpr (std::is_same_v<Wt, float>) {
        for (int k = 0; k < H; k++) {
            const V hv = hn::Set(d, hprev[k]);
            const float* u = U + (size_t)k * N + L * v0;
            EDGEHFT_UNROLL for (int v = 0; v < NV; v++) acc[v] = Fma(d, hv, hn::Load(d, u + L * v), acc[v]);
        }
    } else {
        const hn::RebindToUnsigned<D> du;
        const auto hi_mask = hn::Set(du, 0xFFFF0000u);
        for (int k = 0; k < H; k++) {
            const V hv = hn::Set(d, hprev[k]);
            const uint32_t* u = U + (size_t)k * PairedRow(N, L) + L * (v0 / 2);
            EDGEHFT_UNROLL for (int p = 0; p < (NV + 1) / 2; p++) {
                const auto pair = hn::Load(du, u + L * p);
                acc[2 * p] = Fma(d, hv, hn::BitCast(d, hn::ShiftLeft<16>(pair)), acc[2 * p]);
                if (2 * p + 1 < NV) acc[2 * p + 1] = Fma(d, hv, hn::BitCast(d, hn::And(pair, hi_mask)), acc[2 * p + 1]);
            }
        }
    }
}

template <int NV, typename Wt = float>
HWY_INLINE void RecurChunk(const float* b, const float* x, int K, const float* W, float* g_out, const float* hprev,
                           const float* s, int H, int N, const Wt* U, float* z, int v0) {
    const D d;
    const int L = static_cast<int>(hn::Lanes(d));
    V acc[NV];
    if (hprev) {                                     // z = G[t] + hprev @ U: the recurrent sum first, from zero
        RecurSum<NV>(hprev, H, N, U, v0, acc);
        EDGEHFT_UNROLL for (int v = 0; v < NV; v++) acc[v] = hn::Add(hn::Load(d, b + L * (v0 + v)), acc[v]);
    } else {
        EDGEHFT_UNROLL for (int v = 0; v < NV; v++) acc[v] = hn::Load(d, b + L * (v0 + v));
        if (x) {
            for (int k = 0; k < K; k++) {
                const V xv = hn::Set(d, x[k]);
                const float* w = W + (size_t)k * N + L * v0;
                EDGEHFT_UNROLL for (int v = 0; v < NV; v++) acc[v] = Fma(d, xv, hn::Load(d, w + L * v), acc[v]);
            }
            if (g_out) {
                EDGEHFT_UNROLL for (int v = 0; v < NV; v++) hn::Store(acc[v], d, g_out + L * (v0 + v));
            }
        }
        if (s) {
            EDGEHFT_UNROLL for (int v = 0; v < NV; v++) acc[v] = hn::Add(acc[v], hn::Load(d, s + L * (v0 + v)));
        }
    }
    EDGEHFT_UNROLL for (int v = 0; v < NV; v++) hn::Store(acc[v], d, z + L * (v0 + v));
}

template <int NV, typename Wt = float>
HWY_INLINE void RecurChunkN(int nv, const float* b, const float* x, int K, const float* W, float* g_out,
                            const float* hprev, const float* s, int H, int N, const Wt* U, float* z, int v0) {
    if (nv == NV) RecurChunk<NV, Wt>(b, x, K, W, g_out, hprev, s, H, N, U, z, v0);
    if constexpr (NV > 1) {
        if (nv < NV) RecurChunkN<NV - 1, Wt>(nv, b, x, K, W, g_out, hprev, s, H, N, U, z, v0);
    }
}

// r[0..N) = hprev @ U from zero (k ascending): a step's recurrent sum, as RecurChunk computes it.
template <int NV, typename Wt>
HWY_INLINE void RecurOnly(const float* hprev, int H, int N, const Wt* U, float* r, int v0) {
    const D d;
    const int L = static_cast<int>(hn::Lanes(d));
    V rec[NV];
    RecurSum<NV>(hprev, H, N, U, v0, rec);
    EDGEHFT_UNROLL for (int v = 0; v < NV; v++) hn::Store(rec[v], d, r + L * (v0 + v));
}

template <int NV, typename Wt>
HWY_INLINE void RecurOnlyN(int nv, const float* hprev, int H, int N, const Wt* U, float* r, int v0) {
    if (nv == NV) RecurOnly<NV, Wt>(hprev, H, N, U, r, v0);
    if constexpr (NV > 1) {
        if (nv < NV) RecurOnlyN<NV - 1, Wt>(nv, hprev, H, N, U, r, v0);
    }
}

// Gates from z (Keras order, 4H contiguous): updates c (clamped to +-clip when clip > 0), writes h[0..H).
HWY_INLINE void Gates(const float* z, int H, float* c, float* h, float clip) {
    const D d;
    const int L = static_cast<int>(hn::Lanes(d));
    const V hi = hn::Set(d, clip > 0 ? clip : __builtin_huge_valf()), lo = hn::Neg(hi);
    for (int j = 0; j < H; j += L) {
        const size_t n = static_cast<size_t>(H - j);
        const V zi = LoadN(d, z + j, n), zf = LoadN(d, z + H + j, n);
        const V zc = LoadN(d, z + 2 * H + j, n), zo = LoadN(d, z + 3 * H + j, n);
        V cv = LoadN(d, c + j, n);
        cv = Fma(d, Sigmoid(d, zf), cv, hn::Mul(Sigmoid(d, zi), Tanh(d, zc)));
        cv = ClampKeepNaN(cv, lo, hi);
        StoreN(d, cv, c + j, n);
        StoreN(d, hn::Mul(Sigmoid(d, zo), Tanh(d, cv)), h + j, n);
    }
}

// The column chunks of N / L vectors: at most max_acc accumulators per pass over x or h, balanced. Paired
// (bf16 pairs): chunks of whole pairs of vectors, so every chunk starts at an even vector (max_acc even).
template <bool Paired = false, typename F>
HWY_INLINE void Chunks(int N, int max_acc, F&& f) {
    const int NVt = N / static_cast<int>(hn::Lanes(D()));
    const int unit = Paired ? 2 : 1, units = (NVt + unit - 1) / unit, per = max_acc / unit;
    const int nchunks = (units + per - 1) / per;
    int u0 = 0;
    for (int ci = 0; ci < nchunks; ci++) {
        const int nu = (units - u0) / (nchunks - ci);
        f(std::min(nu * unit, NVt - u0 * unit), u0 * unit);
        u0 += nu;
    }
}

// z = (b + x @ W) + s (see RecurChunk; s: the step's precomputed recurrent sum, or null), then the gates.
void StepIn(const float* b, const float* x, int K, const float* W, float* g, const float* s, int H, int N,
            float* c, float* h, float* z, float clip) {
    Chunks(N, kMaxAcc, [&](int nv, int v0) {
        RecurChunkN<kMaxAcc, float>(nv, b, x, K, W, g, nullptr, s, H, N, nullptr, z, v0);
    });
    Gates(z, H, c, h, clip);
}

// One step from its projected input row g (x @ W + b computed by Gemm): z = g + hprev @ U, then the gates.
// Wt: fp32 U, or bf16 pairs (BF16_PAIRS).
template <typename Wt>
void StepOn(const float* g, const float* hprev, int H, int N, const Wt* U, float* c, float* h, float* z,
            float clip) {
    Chunks<!std::is_same_v<Wt, float>>(N, kMaxAcc, [&](int nv, int v0) {
        RecurChunkN<kMaxAcc, Wt>(nv, g, nullptr, 0, nullptr, nullptr, hprev, nullptr, H, N, U, z, v0);
    });
    Gates(z, H, c, h, clip);
}

void Step(const float* g, const float* hprev, int H, int N, const float* U, float* c, float* h, float* z,
          float clip) {
    StepOn(g, hprev, H, N, U, c, h, z, clip);
}

void StepBf16(const float* g, const float* hprev, int H, int N, const uint32_t* U, float* c, float* h, float* z,
              float clip) {
    StepOn(g, hprev, H, N, U, c, h, z, clip);
}

// r = hprev @ U (a step's recurrent sum, as Step computes it), for a step whose input comes later.
void Recurrent(const float* hprev, int H, int N, const float* U, float* r) {
    Chunks(N, kMaxAcc, [&](int nv, int v0) { RecurOnlyN<kMaxAcc, float>(nv, hprev, H, N, U, r, v0); });
}

// Recurrent on bf16 pairs (BF16_PAIRS): the sums StepBf16 computes (each column's sum is its own, k ascending
// from zero, whatever the chunks).
void RecurrentBf16(const float* hprev, int H, int N, const uint32_t* U, float* r) {
    Chunks<true>(N, kMaxAcc, [&](int nv, int v0) { RecurOnlyN<kMaxAcc, uint32_t>(nv, hprev, H, N, U, r, v0); });
}

int Lanes() { return static_cast<int>(hn::Lanes(D())); }

// th[i] = tanh(x[i]), sg[i] = sigmoid(x[i]) exactly as Step computes them.
void Act(const float* x, float* th, float* sg, int n) {
    const D d;
    const int L = static_cast<int>(hn::Lanes(d));
    for (int i = 0; i < n; i += L) {
        const size_t r = static_cast<size_t>(n - i);
        const V v = LoadN(d, x + i, r);
        StoreN(d, Tanh(d, v), th + i, r);
        StoreN(d, Sigmoid(d, v), sg + i, r);
    }
}

}  // namespace

extern const lstm::Fns kLstmFns;
const lstm::Fns kLstmFns = {&Gemm, &Step, &Act, &StepIn, &Recurrent, &StepBf16, &Lanes, &RecurrentBf16};

}  // namespace HWY_NAMESPACE
}  // namespace edgehft
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace edgehft {
namespace {

const lstm::Fns* const kTable[kSlots] = EDGEHFT_SLOT_TABLE(kLstmFns);

}  // namespace

const lstm::Fns* lstm::fns(int slot) { return slot >= 0 && slot < kSlots ? kTable[slot] : nullptr; }

namespace {

struct Layer {
    int in = 0, H = 0, Hp = 0, Np = 0;                // Hp = 16*ceil(H/16), Np = 16*ceil(4H/16)
    float *W = nullptr, *U = nullptr, *b = nullptr;   // W [in][Np], U [H][Np], b [Np]: Keras columns, 0 after 4H
    uint32_t* Ub = nullptr;                           // recurrent_bf16: U as bf16 pairs (BF16_PAIRS), U unused
};

struct Net {
    int T = 0, in0 = 0, return_sequences = 0, slot = 0, steps_done = 0;   // steps_done: edgehft_lstm_steps
    int r_step = -1;                                  // the step whose recurrent sum R holds (-1: none)
    const lstm::Fns* fn = nullptr;
    float cell_clip = 0;
    Layer* L = nullptr;
    int nl = 0;
    float *G = nullptr, *c = nullptr, *z = nullptr, *seq[2] = {nullptr, nullptr};
    float* R = nullptr;                               // [Np]: edgehft_lstm_recur_ahead's sum for step r_step
};

void destroy(Net* n) {
    if (!n) return;
    for (int l = 0; l < n->nl; l++) { free(n->L[l].W); free(n->L[l].U); free(n->L[l].b); free(n->L[l].Ub); }
    delete[] n->L;
    free(n->G); free(n->c); free(n->z); free(n->seq[0]); free(n->seq[1]); free(n->R);
    delete n;
}

// Keras (rows, 4H) -> (rows, Np), zero columns after 4H.
void pad_cols(const float* src, int rows, int N, int Np, float* dst) {
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * Np, src + (size_t)r * N, sizeof(float) * N);
}

// Keras (H, 4H) -> bf16 pairs (cpu_lstm.cpp BF16_PAIRS) for a target of L lanes, Np padded columns: word
// (k, p, i) holds column (2p) L + i in its low half and (2p + 1) L + i in its high half, 0 past 4H.
uint32_t* pair_bf16(const float* src, int H, int N, int Np, int L) {
    const int nv = Np / L, row = L * ((nv + 1) / 2);
    uint32_t* dst = static_cast<uint32_t*>(aligned_zeroed(sizeof(uint32_t) * (size_t)H * row));
    if (!dst) return nullptr;
    for (int k = 0; k < H; k++)
        for (int v = 0; v < nv; v++)
            for (int i = 0; i < L; i++) {
                const int col = v * L + i;
                const uint32_t b = col < N ? bf16_bits(src[(size_t)k * N + col]) : 0u;
                dst[(size_t)k * row + (v / 2) * L + i] |= (v & 1) ? b << 16 : b;
            }
    return dst;
}

// One step of layer y (the fp32 or the bf16-pair recurrent weights).
inline void step(const Net* n, const Layer& y, const float* g, const float* hprev, float* h) {
    if (y.Ub)
        n->fn->step_bf16(g, hprev, y.H, y.Np, y.Ub, n->c, h, n->z, n->cell_clip);
    else
        n->fn->step(g, hprev, y.H, y.Np, y.U, n->c, h, n->z, n->cell_clip);
}

}  // namespace

extern "C" {

// The target slot a net runs (cpu_dispatch.h: 2 avx3, 3 avx2, 4 neon, 5 the fallback), chosen at create.
int edgehft_lstm_slot(void* p) { return static_cast<Net*>(p)->slot; }

// Copies the weights. Ws[l] (in_l, 4H_l), Us[l] (H_l, 4H_l), bs[l] (4H_l,), Keras layout, float32,
// in_0 = in0 and in_l = H_{l-1}. cell_clip > 0 clamps every c_t to [-cell_clip, cell_clip] (TFLite's
// cell_clip option; Keras has none: pass 0). recurrent_bf16: U is rounded to bf16 (nearest even) and kept
// so (BF16_PAIRS): every output is the fp32 kernel's on the rounded U, bit for bit, from half the bytes.
// Returns nullptr when out of memory or on a bad size.
void* edgehft_lstm_create(int nl, int T, int in0, const int* Hs, const float* const* Ws, const float* const* Us,
                          const float* const* bs, int return_sequences, float cell_clip, int recurrent_bf16) {
    if (nl < 1 || T < 1 || in0 < 1) return nullptr;
    Net* n = new (std::nothrow) Net();
    if (!n) return nullptr;
    n->slot = simd_slot(current_slot());
    n->fn = kTable[n->slot];
    n->T = T; n->in0 = in0; n->return_sequences = return_sequences ? 1 : 0;
    n->cell_clip = cell_clip > 0 ? cell_clip : 0;
    n->L = new (std::nothrow) Layer[nl];
    if (!n->L) { delete n; return nullptr; }
    n->nl = nl;
    int in = in0, maxN = 0, maxHp = 0;
    bool ok = true;
    for (int l = 0; l < nl && ok; l++) {
        Layer& y = n->L[l];
        if (Hs[l] < 1) { ok = false; break; }
        y.in = in; y.H = Hs[l]; y.Hp = (y.H + 15) / 16 * 16;
        const int Np = y.Np = (4 * y.H + 15) / 16 * 16;
        y.W = aligned_floats((size_t)in * Np); y.b = aligned_floats(Np);
        if (recurrent_bf16)
            y.Ub = pair_bf16(Us[l], y.H, 4 * y.H, Np, n->fn->lanes());
        else
            y.U = aligned_floats((size_t)y.H * Np);
        if (!y.W || !y.b || !(y.U || y.Ub)) { ok = false; break; }
        pad_cols(Ws[l], in, 4 * y.H, Np, y.W);
        if (y.U) pad_cols(Us[l], y.H, 4 * y.H, Np, y.U);
        pad_cols(bs[l], 1, 4 * y.H, Np, y.b);
        maxN = std::max(maxN, Np); maxHp = std::max(maxHp, y.Hp);
        in = y.H;
    }
    if (ok) {
        n->G = aligned_floats((size_t)T * maxN); n->c = aligned_floats(maxHp); n->z = aligned_floats(maxN);
        n->seq[0] = aligned_floats((size_t)T * maxHp); n->seq[1] = aligned_floats((size_t)T * maxHp);
        n->R = aligned_floats(maxN);
        ok = n->G && n->c && n->z && n->seq[0] && n->seq[1] && n->R;
    }
    if (!ok) { destroy(n); return nullptr; }
    return n;
}

void edgehft_lstm_destroy(void* p) { destroy(static_cast<Net*>(p)); }

namespace {
// Layer l's recurrence over G (already x @ W + b for every step), then the output copy when l is the last.
float* recur(Net* n, int l) {
    const Layer& y = n->L[l];
    memset(n->c, 0, sizeof(float) * y.Hp);
    float* seq = n->seq[l & 1];
    for (int t = 0; t < n->T; t++) {
        const float* hprev = t ? seq + (size_t)(t - 1) * y.Hp : nullptr;
        step(n, y, n->G + (size_t)t * y.Np, hprev, seq + (size_t)t * y.Hp);
    }
    return seq;
}

void write_out(const Net* n, const float* seq, float* out) {
    const Layer& last = n->L[n->nl - 1];
    const int T = n->T;
    if (n->return_sequences) {
        for (int t = 0; t < T; t++) memcpy(out + (size_t)t * last.H, seq + (size_t)t * last.Hp, sizeof(float) * last.H);
    } else {
        memcpy(out, seq + (size_t)(T - 1) * last.Hp, sizeof(float) * last.H);
    }
}
}  // namespace

// x: (T, in0) float32 row-major; out: (T, H_last) when return_sequences else (H_last,). Returns 0.
int edgehft_lstm_run(void* p, const float* x, float* out) {
    Net* n = static_cast<Net*>(p);
    n->r_step = -1;
    n->steps_done = 0;                                 // the state edgehft_lstm_steps would continue is overwritten
    const float* X = x;
    int ldx = n->in0;
    float* seq = nullptr;
    for (int l = 0; l < n->nl; l++) {
        const Layer& y = n->L[l];
        n->fn->gemm(X, ldx, n->T, y.in, y.W, y.Np, y.b, n->G);
        seq = recur(n, l);
        X = seq; ldx = y.Hp;
    }
    write_out(n, seq, out);
    return 0;
}

// Single-layer nets only: g (T, 4H) float32 is the input projection x_t @ W + b computed elsewhere (the
// native-bf16 plan computes it on the conv kernel); runs the recurrence on it. Returns 0, or 1 when the
// net has more than one layer.
int edgehft_lstm_run_projected(void* p, const float* g, float* out) {
    Net* n = static_cast<Net*>(p);
    if (n->nl != 1) return 1;
    n->r_step = -1;
    n->steps_done = 0;
    const Layer& y = n->L[0];
    const int N = 4 * y.H;
    for (int t = 0; t < n->T; t++) memcpy(n->G + (size_t)t * y.Np, g + (size_t)t * N, sizeof(float) * N);
    write_out(n, recur(n, 0), out);
    return 0;
}

// Single-layer nets only: steps s0 .. s0+n-1 of the recurrence on the projections g (row t - s0 of g, ldg
// floats apart, is step t's x_t @ W + b), continuing the state the previous call left (s0 == 0: from the zero
// state). h_out (H floats, or null) gets the h of the last step run. The same step function, inputs and state
// as edgehft_lstm_run_projected, so steps 0 .. T-1 run in any number of calls give its bits (the stream
// executor runs the steps a window's newest row does not feed before the tick, the rest after it). Returns
// 0, 1 when the net has more than one layer, 2 when s0 + n > T or s0 > 0 follows no call that ended at s0.
int edgehft_lstm_steps_seq(void* p, const float* g, int ldg, int s0, int n, float* h_seq, int ldh);

int edgehft_lstm_steps(void* p, const float* g, int ldg, int s0, int n, float* h_out) {
    return edgehft_lstm_steps_seq(p, g, ldg, s0, n, h_out, -1);
}

// edgehft_lstm_steps writing every step's h: row i of h_seq (ldh floats apart, ldh >= H) gets step s0 + i's h
// (a stacked layer's input rows, for the stream executor). ldh < 0: only the last step's h, to h_seq (null: none).
int edgehft_lstm_steps_seq(void* p, const float* g, int ldg, int s0, int n, float* h_seq, int ldh) {
    Net* net = static_cast<Net*>(p);
    if (net->nl != 1) return 1;
    const Layer& y = net->L[0];
    if (s0 < 0 || n < 0 || s0 + n > net->T || (s0 > 0 && net->steps_done != s0) || (ldh >= 0 && ldh < y.H))
        return 2;
    const bool summed = s0 > 0 && net->r_step == s0;  // step s0's recurrent sum ran ahead (recur_ahead)
    net->r_step = -1;
    if (s0 == 0) memset(net->c, 0, sizeof(float) * y.Hp);
    float* seq = net->seq[0];                          // h of step t at row t % 2
    for (int i = 0; i < n; i++) {
        const int t = s0 + i;
        float* G = net->G + (size_t)(t % 2) * y.Np;    // padded columns stay zero (never written)
        memcpy(G, g + (size_t)i * ldg, sizeof(float) * 4 * y.H);
        const float* hprev = t ? seq + (size_t)((t - 1) % 2) * y.Hp : nullptr;
        float* h = seq + (size_t)(t % 2) * y.Hp;
        if (i == 0 && summed)                          // z = G + R: Step's one add of the same two terms
            net->fn->step_in(G, nullptr, 0, nullptr, nullptr, net->R, y.H, y.Np, net->c, h, net->z, net->cell_clip);
        else
            step(net, y, G, hprev, h);
        if (ldh >= 0 && h_seq) memcpy(h_seq + (size_t)i * ldh, h, sizeof(float) * y.H);
    }
    net->steps_done = s0 + n;
    if (ldh < 0 && h_seq && s0 + n > 0) memcpy(h_seq, seq + (size_t)((s0 + n - 1) % 2) * y.Hp, sizeof(float) * y.H);
    return 0;
}

// Single-layer nets only: the recurrent sum h_{s-1} @ U of step s = the step the last edgehft_lstm_steps call
// ended at, ahead of its projection (the stream executor runs it before the tick: h_{s-1} needs no new row). The
// next steps call that starts at s adds it to its projection instead of summing it (the bits Step gives: the same
// sum, then one add). Returns 0; 1 when the net has more than one layer; 2 when no steps ran yet or all T did.
int edgehft_lstm_recur_ahead(void* p) {
    Net* net = static_cast<Net*>(p);
    if (net->nl != 1) return 1;
    const Layer& y = net->L[0];
    const int s = net->steps_done;
    if (s < 1 || s >= net->T) return 2;
    const float* hprev = net->seq[0] + (size_t)((s - 1) % 2) * y.Hp;
    if (y.Ub)
        net->fn->recurrent_bf16(hprev, y.H, y.Np, y.Ub, net->R);
    else
        net->fn->recurrent(hprev, y.H, y.Np, y.U, net->R);
    net->r_step = s;
    return 0;
}

// Activation probe for tests: th[i] = tanh(x[i]), sg[i] = sigmoid(x[i]) as the kernels created now compute
// them (the current target's code).
void edgehft_lstm_act_probe(const float* x, float* th, float* sg, int n) {
    kTable[simd_slot(current_slot())]->act(x, th, sg, n);
}

}  // extern "C"
}  // namespace edgehft
#endif  // HWY_ONCE
