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
// clamped to +-7.90531110763549805); sigmoid(x) = 0.5 + 0.5 * tanh(x / 2). Measured max |error| against
// float64 on [-20, 20]: tanh 3.1e-7, sigmoid 1.6e-7 (AVX-512 path; the division is rcp14 + one Newton
// step). Sums are fp32 in a fixed order: z starts at x_t @ W + b (k ascending) then adds h_{t-1} @ U
// (k ascending).
//
// Layout: weights are copied at create in Keras column order (i | f | c | o, 4H columns) with zero
// columns after 4H up to Np = 16 * ceil(4H / 16), rows 64-byte aligned.
//
// Schedule: (1) the input projection for all T steps is one GEMM G[T][Np] = X @ W + b, register
// blocked (5 rows x 4 vectors of 16 columns); (2) per step, z = G[t] + h_{t-1} @ U with up to 28
// accumulator vectors (448 columns, i.e. H <= 112 in one pass) held in zmm registers across the whole
// k loop; wider layers take several balanced column chunks, each a pass over h_{t-1}; (3) the gates
// from z with masked 16-lane loads, c kept in a buffer, h_t written to its own row of the sequence.
//
// Built with -march=native: the AVX-512F path when the compiler targets it (#ifdef __AVX512F__), else a
// portable scalar path (same layout, same tanh approximation with a true division; the inner loops are
// plain loops the compiler may auto-vectorize).
//
// No allocation in edgehft_lstm_run: every buffer comes from edgehft_lstm_create.
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace {

float* falloc(size_t n) {
    void* p = nullptr;
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    if (bytes == 0) bytes = 64;
    if (posix_memalign(&p, 64, bytes)) return nullptr;
    memset(p, 0, bytes);
    return static_cast<float*>(p);
}

// Eigen's rational tanh coefficients (float).
constexpr float kClamp = 7.90531110763549805f;
constexpr float kA13 = -2.76076847742355e-16f, kA11 = 2.00018790482477e-13f, kA9 = -8.60467152213735e-11f,
                kA7 = 5.12229709037114e-08f, kA5 = 1.48572235717979e-05f, kA3 = 6.37261928875436e-04f,
                kA1 = 4.89352455891786e-03f;
constexpr float kB6 = 1.19825839466702e-06f, kB4 = 1.18534705686654e-04f, kB2 = 2.26843463243900e-03f,
                kB0 = 4.89352518554385e-03f;

inline float tanh_s(float x) {
    x = std::min(std::max(x, -kClamp), kClamp);
    float x2 = x * x;
    float p = kA13;
    p = x2 * p + kA11; p = x2 * p + kA9; p = x2 * p + kA7; p = x2 * p + kA5; p = x2 * p + kA3; p = x2 * p + kA1;
    p = x * p;
    float q = kB6;
    q = x2 * q + kB4; q = x2 * q + kB2; q = x2 * q + kB0;
    return p / q;
}
inline float sigm_s(float x) { return 0.5f + 0.5f * tanh_s(0.5f * x); }

#ifdef __AVX512F__
inline __m512 tanh16(__m512 x) {
    const __m512 lim = _mm512_set1_ps(kClamp);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_sub_ps(_mm512_setzero_ps(), lim)), lim);
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(kA13);
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(kA11));
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(kA9));
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(kA7));
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(kA5));
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(kA3));
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(kA1));
    p = _mm512_mul_ps(x, p);
    __m512 q = _mm512_set1_ps(kB6);
    q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(kB4));
    q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(kB2));
    q = _mm512_fmadd_ps(x2, q, _mm512_set1_ps(kB0));
    __m512 r = _mm512_rcp14_ps(q);                                    // 1/q: rcp14 + one Newton step
    r = _mm512_mul_ps(r, _mm512_fnmadd_ps(q, r, _mm512_set1_ps(2.0f)));
    return _mm512_mul_ps(p, r);
}
inline __m512 sigm16(__m512 x) {
    const __m512 h = _mm512_set1_ps(0.5f);
    return _mm512_fmadd_ps(h, tanh16(_mm512_mul_ps(h, x)), h);
}

// G[r][col0 .. col0+16C) = X[r][:K] @ W[:K][cols] + b[cols], rows r < R. X row stride ldx, W/G stride N.
template <int R, int C>
inline void gemm_block(const float* X, int ldx, const float* W, int N, int K, const float* b, float* G, int col0) {
    __m512 acc[R][C];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_load_ps(b + col0 + 16 * c);
    for (int k = 0; k < K; k++) {
        __m512 w[C];
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) w[c] = _mm512_load_ps(W + (size_t)k * N + col0 + 16 * c);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 xv = _mm512_set1_ps(X[(size_t)r * ldx + k]);
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(xv, w[c], acc[r][c]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) _mm512_store_ps(G + (size_t)r * N + col0 + 16 * c, acc[r][c]);
}

template <int C>
void gemm_cols(const float* X, int ldx, int T, int K, const float* W, int N, const float* b, float* G, int col0) {
    int t = 0;
    for (; t + 5 <= T; t += 5) gemm_block<5, C>(X + (size_t)t * ldx, ldx, W, N, K, b, G + (size_t)t * N, col0);
    switch (T - t) {
        case 4: gemm_block<4, C>(X + (size_t)t * ldx, ldx, W, N, K, b, G + (size_t)t * N, col0); break;
        case 3: gemm_block<3, C>(X + (size_t)t * ldx, ldx, W, N, K, b, G + (size_t)t * N, col0); break;
        case 2: gemm_block<2, C>(X + (size_t)t * ldx, ldx, W, N, K, b, G + (size_t)t * N, col0); break;
        case 1: gemm_block<1, C>(X + (size_t)t * ldx, ldx, W, N, K, b, G + (size_t)t * N, col0); break;
        default: break;
    }
}

// G[T][N] = X[T][K] @ W[K][N] + b; N a multiple of 16, W/b/G 64-byte aligned.
void gemm(const float* X, int ldx, int T, int K, const float* W, int N, const float* b, float* G) {
    int col0 = 0;
    for (; col0 + 64 <= N; col0 += 64) gemm_cols<4>(X, ldx, T, K, W, N, b, G, col0);
    switch ((N - col0) / 16) {
        case 3: gemm_cols<3>(X, ldx, T, K, W, N, b, G, col0); break;
        case 2: gemm_cols<2>(X, ldx, T, K, W, N, b, G, col0); break;
        case 1: gemm_cols<1>(X, ldx, T, K, W, N, b, G, col0); break;
        default: break;
    }
}

// z[v0*16 .. (v0+NV)*16) = g + hprev @ U (hprev may be null: step 0), NV accumulators in registers.
template <int NV>
inline void recur_chunk(const float* g, const float* hprev, int H, int N, const float* U, float* z, int v0) {
    __m512 acc[NV];
#pragma GCC unroll 32
    for (int v = 0; v < NV; v++) acc[v] = _mm512_load_ps(g + 16 * (v0 + v));
    if (hprev) {
        for (int k = 0; k < H; k++) {
            __m512 hv = _mm512_set1_ps(hprev[k]);
            const float* u = U + (size_t)k * N + 16 * v0;
#pragma GCC unroll 32
            for (int v = 0; v < NV; v++) acc[v] = _mm512_fmadd_ps(hv, _mm512_load_ps(u + 16 * v), acc[v]);
        }
    }
#pragma GCC unroll 32
    for (int v = 0; v < NV; v++) _mm512_store_ps(z + 16 * (v0 + v), acc[v]);
}

// Gates from z (Keras order, 4H contiguous): updates c (clamped to +-clip when clip > 0), writes h[0..H).
inline void gates(const float* z, int H, float* c, float* h, float clip) {
    const __m512 hi = _mm512_set1_ps(clip > 0 ? clip : __builtin_huge_valf());
    const __m512 lo = _mm512_sub_ps(_mm512_setzero_ps(), hi);
    for (int j = 0; j < H; j += 16) {
        __mmask16 m = (H - j >= 16) ? (__mmask16)0xFFFF : (__mmask16)((1u << (H - j)) - 1);
        __m512 zi = _mm512_maskz_loadu_ps(m, z + j), zf = _mm512_maskz_loadu_ps(m, z + H + j);
        __m512 zc = _mm512_maskz_loadu_ps(m, z + 2 * H + j), zo = _mm512_maskz_loadu_ps(m, z + 3 * H + j);
        __m512 cv = _mm512_maskz_loadu_ps(m, c + j);
        cv = _mm512_fmadd_ps(sigm16(zf), cv, _mm512_mul_ps(sigm16(zi), tanh16(zc)));
        cv = _mm512_min_ps(_mm512_max_ps(cv, lo), hi);
        _mm512_mask_storeu_ps(c + j, m, cv);
        _mm512_mask_storeu_ps(h + j, m, _mm512_mul_ps(sigm16(zo), tanh16(cv)));
    }
}

#define EDGEHFT_CHUNK(n) case n: recur_chunk<n>(g, hprev, H, N, U, z, v0); break;
inline void step(const float* g, const float* hprev, int H, int N, const float* U, float* c, float* h, float* z,
                 float clip) {
    const int NVt = N / 16;
    const int nchunks = (NVt + 27) / 28;               // <= 28 accumulators per pass over h
    int v0 = 0;
    for (int ci = 0; ci < nchunks; ci++) {
        int nv = (NVt - v0) / (nchunks - ci);           // balanced chunks
        switch (nv) {
            EDGEHFT_CHUNK(28) EDGEHFT_CHUNK(27) EDGEHFT_CHUNK(26) EDGEHFT_CHUNK(25) EDGEHFT_CHUNK(24)
            EDGEHFT_CHUNK(23) EDGEHFT_CHUNK(22) EDGEHFT_CHUNK(21) EDGEHFT_CHUNK(20) EDGEHFT_CHUNK(19)
            EDGEHFT_CHUNK(18) EDGEHFT_CHUNK(17) EDGEHFT_CHUNK(16) EDGEHFT_CHUNK(15) EDGEHFT_CHUNK(14)
            EDGEHFT_CHUNK(13) EDGEHFT_CHUNK(12) EDGEHFT_CHUNK(11) EDGEHFT_CHUNK(10) EDGEHFT_CHUNK(9)
            EDGEHFT_CHUNK(8) EDGEHFT_CHUNK(7) EDGEHFT_CHUNK(6) EDGEHFT_CHUNK(5) EDGEHFT_CHUNK(4)
            EDGEHFT_CHUNK(3) EDGEHFT_CHUNK(2) EDGEHFT_CHUNK(1)
            default: break;
        }
        v0 += nv;
    }
    gates(z, H, c, h, clip);
}
#undef EDGEHFT_CHUNK
constexpr int kIsa = 1;
#else
// Portable path: same layout and order of sums, scalar activations.
void gemm(const float* X, int ldx, int T, int K, const float* W, int N, const float* b, float* G) {
    for (int t = 0; t < T; t++) {
        float* gr = G + (size_t)t * N;
        const float* xr = X + (size_t)t * ldx;
        for (int n = 0; n < N; n++) gr[n] = b[n];
        for (int k = 0; k < K; k++) {
            const float xv = xr[k];
            const float* w = W + (size_t)k * N;
            for (int n = 0; n < N; n++) gr[n] += xv * w[n];
        }
    }
}

inline void step(const float* g, const float* hprev, int H, int N, const float* U, float* c, float* h, float* z,
                 float clip) {
    for (int n = 0; n < N; n++) z[n] = g[n];
    if (hprev) {
        for (int k = 0; k < H; k++) {
            const float hv = hprev[k];
            const float* u = U + (size_t)k * N;
            for (int n = 0; n < N; n++) z[n] += hv * u[n];
        }
    }
    for (int j = 0; j < H; j++) {
        float cv = sigm_s(z[H + j]) * c[j] + sigm_s(z[j]) * tanh_s(z[2 * H + j]);
        if (clip > 0) cv = std::min(std::max(cv, -clip), clip);
        c[j] = cv;
        h[j] = sigm_s(z[3 * H + j]) * tanh_s(cv);
    }
}
constexpr int kIsa = 0;
#endif

struct Layer {
    int in = 0, H = 0, Hp = 0, Np = 0;                // Hp = 16*ceil(H/16), Np = 16*ceil(4H/16)
    float *W = nullptr, *U = nullptr, *b = nullptr;   // W [in][Np], U [H][Np], b [Np]: Keras columns, 0 after 4H
};

struct Net {
    int T = 0, in0 = 0, return_sequences = 0;
    float cell_clip = 0;
    Layer* L = nullptr;
    int nl = 0;
    float *G = nullptr, *c = nullptr, *z = nullptr, *seq[2] = {nullptr, nullptr};
};

void destroy(Net* n) {
    if (!n) return;
    for (int l = 0; l < n->nl; l++) { free(n->L[l].W); free(n->L[l].U); free(n->L[l].b); }
    delete[] n->L;
    free(n->G); free(n->c); free(n->z); free(n->seq[0]); free(n->seq[1]);
    delete n;
}

// Keras (rows, 4H) -> (rows, Np), zero columns after 4H.
void pad_cols(const float* src, int rows, int N, int Np, float* dst) {
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * Np, src + (size_t)r * N, sizeof(float) * N);
}

}  // namespace

extern "C" {

// 1 when built with the AVX-512F path, 0 for the portable path.
int edgehft_lstm_isa() { return kIsa; }

// Copies the weights. Ws[l] (in_l, 4H_l), Us[l] (H_l, 4H_l), bs[l] (4H_l,), Keras layout, float32,
// in_0 = in0 and in_l = H_{l-1}. cell_clip > 0 clamps every c_t to [-cell_clip, cell_clip] (TFLite's
// cell_clip option; Keras has none: pass 0). Returns nullptr when out of memory or on a bad size.
void* edgehft_lstm_create(int nl, int T, int in0, const int* Hs, const float* const* Ws, const float* const* Us,
                          const float* const* bs, int return_sequences, float cell_clip) {
    if (nl < 1 || T < 1 || in0 < 1) return nullptr;
    Net* n = new (std::nothrow) Net();
    if (!n) return nullptr;
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
        y.W = falloc((size_t)in * Np); y.U = falloc((size_t)y.H * Np); y.b = falloc(Np);
        if (!y.W || !y.U || !y.b) { ok = false; break; }
        pad_cols(Ws[l], in, 4 * y.H, Np, y.W);
        pad_cols(Us[l], y.H, 4 * y.H, Np, y.U);
        pad_cols(bs[l], 1, 4 * y.H, Np, y.b);
        maxN = std::max(maxN, Np); maxHp = std::max(maxHp, y.Hp);
        in = y.H;
    }
    if (ok) {
        n->G = falloc((size_t)T * maxN); n->c = falloc(maxHp); n->z = falloc(maxN);
        n->seq[0] = falloc((size_t)T * maxHp); n->seq[1] = falloc((size_t)T * maxHp);
        ok = n->G && n->c && n->z && n->seq[0] && n->seq[1];
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
        step(n->G + (size_t)t * y.Np, hprev, y.H, y.Np, y.U, n->c, seq + (size_t)t * y.Hp, n->z, n->cell_clip);
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
    const float* X = x;
    int ldx = n->in0;
    float* seq = nullptr;
    for (int l = 0; l < n->nl; l++) {
        const Layer& y = n->L[l];
        gemm(X, ldx, n->T, y.in, y.W, y.Np, y.b, n->G);
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
    const Layer& y = n->L[0];
    const int N = 4 * y.H;
    for (int t = 0; t < n->T; t++) memcpy(n->G + (size_t)t * y.Np, g + (size_t)t * N, sizeof(float) * N);
    write_out(n, recur(n, 0), out);
    return 0;
}

// Activation probe for tests: th[i] = tanh(x[i]), sg[i] = sigmoid(x[i]) as the kernel computes them.
void edgehft_lstm_act_probe(const float* x, float* th, float* sg, int n) {
    int i = 0;
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        _mm512_storeu_ps(th + i, tanh16(v));
        _mm512_storeu_ps(sg + i, sigm16(v));
    }
#endif
    for (; i < n; i++) { th[i] = tanh_s(x[i]); sg[i] = sigm_s(x[i]); }
}

}  // extern "C"
