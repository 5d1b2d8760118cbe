// edgehft native CPU stream executor (issue 21): one tick in, one signal out, for stacked Keras LSTMs that start
// every window from the zero state, followed by the last step's Dense head (the STAC-ML LSTM_A shape).
//
// A window is the T newest rows. Window w (ending at row w, rows counted from 0 since create or reset) has,
// per layer, T steps from the zero state. Steps 0 .. T-2 of window w read only rows w-T+1 .. w-1, received
// before row w: they are "prepared" ahead of the tick. When row w arrives, only step T-1 of each layer and the
// head remain (the "critical path"). The executor holds:
//   ring [T][in0]       the raw rows, by slot row % T (window() reads them back, oldest first)
//   P    [T][Np0]       layer 0's input projection x_r @ W0 + b0 of each row r, by slot: computed once when the
//                       row arrives, read by the next T-1 windows' prepares (it does not depend on the window)
//   per layer l: seq [T][Hp] (h of the window's steps), c [Hp] (the cell state after the steps run so far),
//                G [T][Np] for l >= 1 (layer l's input projection of layer l-1's h, new every window)
//   head Wt [H][Mp] (the Dense weights, k-major, zero columns after M), hb [Mp], hout [Mp]
// prepare(w) runs, per layer, G rows 0..T-2 (layers >= 1: one GEMM), steps 0..T-2 from the zero state and step
// T-1's recurrent sum R = h_{T-2} @ U (it needs no new row); push(row w) runs, per layer, step T-1's input
// projection and gates only (z = (b + x @ W) + R, lstm::Fns step_in; layer 0 also stores x @ W0 + b0 into P for
// later windows), then the head: per layer one in x 4H product on the critical path, not two.
//
// Exactness: the steps are cpu_lstm.cpp's own functions (lstm::fns: gemm, step, step_in) on the same padded
// fp32 weight layout as edgehft_lstm_create's (without recurrent_bf16: the native plan), and step_in's sums
// (with R from recurrent) have the roundings of gemm's
// row followed by step (cpu_lstm.h), so push gives the bits edgehft_lstm_run gives on the same window, on every target. The head
// sums, per output m, hb[m] then h[k] * W[m][k] for k ascending, one fused multiply-add each: the order of
// XNNPACK's f32 GEMM "broadcast" micro-kernels, which run a LiteRT FULLY_CONNECTED with one row; the Python
// side (edgehft.streaming.stream) checks it against the plan's own LiteRT head before using it.
//
// Prepare ahead of the tick, three ways (the caller's edgehft_stream_prepare when idle, a helper thread started by
// edgehft_stream_start_helper that prepares right after each push, or the late push itself), handed over by
// cpu_handoff.h's state word: nobody else touches the layer buffers while a prepare runs. The preparer's stores
// of seq/c/G/R happen before its release store of DONE; push's stores (ring, P, the buffers of its critical
// step) before its store of REQ.
//
// No allocation after create; one pushing thread at a time (the caller serialises push, prepare and reset).
#include "cpu_dispatch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu_stream.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "cpu_simd-inl.h"

#ifndef EDGEHFT_CPU_STREAM_ONCE_
#define EDGEHFT_CPU_STREAM_ONCE_
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "cpu_handoff.h"
#include "cpu_lstm.h"

namespace edgehft {
namespace stream {

// One target's head: out[m] = b[m] + sum_k h[k] * Wt[k][m] for m < Mp (a multiple of 16).
struct Fns {
    void (*head)(const float* h, int H, const float* Wt, int Mp, const float* b, float* out);
};

}  // namespace stream
}  // namespace edgehft
#endif  // EDGEHFT_CPU_STREAM_ONCE_

HWY_BEFORE_NAMESPACE();
namespace edgehft {
namespace HWY_NAMESPACE {
namespace {
namespace hn = hwy::HWY_NAMESPACE;
using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;

// One accumulator lane per output, b then k ascending, one fused multiply-add per term (Fma: the same rounding
// on every target).
void Head(const float* h, int H, const float* Wt, int Mp, const float* b, float* out) {
    const D d;
    const int L = static_cast<int>(hn::Lanes(d));
    for (int m0 = 0; m0 < Mp; m0 += L) {
        V acc = hn::Load(d, b + m0);
        for (int k = 0; k < H; k++) acc = Fma(d, hn::Set(d, h[k]), hn::Load(d, Wt + (size_t)k * Mp + m0), acc);
        hn::Store(acc, d, out + m0);
    }
}

}  // namespace

extern const stream::Fns kStreamFns;
const stream::Fns kStreamFns = {&Head};

}  // namespace HWY_NAMESPACE
}  // namespace edgehft
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace edgehft {
namespace {

const stream::Fns* const kHeadTable[kSlots] = EDGEHFT_SLOT_TABLE(kStreamFns);

using namespace handoff;     // the prepare handoff (cpu_handoff.h)

enum Out { kHeadOut = 0, kLastH = 1, kSequence = 2 };

struct Layer {
    int in = 0, H = 0, Hp = 0, Np = 0;                // Hp = 16*ceil(H/16), Np = 16*ceil(4H/16) (as cpu_lstm.cpp)
    float clip = 0;
    float *W = nullptr, *U = nullptr, *b = nullptr;   // W [in][Np], U [H][Np], b [Np]: Keras columns, 0 after 4H
    float *seq = nullptr, *c = nullptr, *G = nullptr; // seq [T][Hp], c [Hp], G [T][Np] (layers >= 1)
    float* R = nullptr;                               // [Np]: step T-1's recurrent sum h_{T-2} @ U, from prepare
};

struct Stream : Handoff {
    int T = 0, in0 = 0, nl = 0, slot = 0, M = 0, Mp = 0, out_mode = 0;
    const float* staged = nullptr;                    // edgehft_stream_stage: the row and output buffers a caller
    float* staged_out = nullptr;                      // lent for edgehft_stream_push_staged
    const lstm::Fns* fn = nullptr;
    const stream::Fns* hf = nullptr;
    Layer* L = nullptr;
    float *ring = nullptr, *P = nullptr, *zp = nullptr, *zc = nullptr, *Wt = nullptr, *hb = nullptr, *hout = nullptr;
};

void destroy(Stream* s);

// Keras (rows, 4H) -> (rows, Np), zero columns after 4H.
void pad_cols(const float* src, int rows, int N, int Np, float* dst) {
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * Np, src + (size_t)r * N, sizeof(float) * N);
}

bool alloc_layer(Layer& y, int in, int H, int T, bool projected_here, const float* W, const float* U,
                 const float* b, float clip) {
    y.in = in; y.H = H; y.Hp = (H + 15) / 16 * 16; y.Np = (4 * H + 15) / 16 * 16;
    y.clip = clip > 0 ? clip : 0;
    y.W = aligned_floats((size_t)in * y.Np); y.U = aligned_floats((size_t)H * y.Np); y.b = aligned_floats(y.Np);
    y.seq = aligned_floats((size_t)T * y.Hp); y.c = aligned_floats(y.Hp); y.R = aligned_floats(y.Np);
    if (projected_here) y.G = aligned_floats((size_t)T * y.Np);
    if (!y.W || !y.U || !y.b || !y.seq || !y.c || !y.R || (projected_here && !y.G)) return false;
    pad_cols(W, in, 4 * H, y.Np, y.W);
    pad_cols(U, H, 4 * H, y.Np, y.U);
    pad_cols(b, 1, 4 * H, y.Np, y.b);
    return true;
}

// Window `id`'s steps 0 .. T-2 of every layer from the zero state (rows id-T+1 .. id-1): the work that does
// not need row id (with T = 1 only the zero state). Nothing to do while fewer than T-1 rows precede it.
void prepare_window(Stream* s, uint64_t id) {
    const int T = s->T, n = T - 1;
    if (id + 1 < (uint64_t)T) return;
    const uint64_t t_start = now_ns();
    const uint64_t first = id + 1 - (uint64_t)T;
    uint64_t t_prof = prof_start(s);
    for (int l = 0; l < s->nl; l++) {
        Layer& y = s->L[l];
        memset(y.c, 0, sizeof(float) * y.Hp);
        if (l > 0) {
            const Layer& p = s->L[l - 1];
            s->fn->gemm(p.seq, p.Hp, n, y.in, y.W, y.Np, y.b, y.G);
        }
        for (int t = 0; t < n; t++) {
            const float* g = l == 0 ? s->P + (size_t)((first + t) % T) * y.Np : y.G + (size_t)t * y.Np;
            const float* hprev = t ? y.seq + (size_t)(t - 1) * y.Hp : nullptr;
            s->fn->step(g, hprev, y.H, y.Np, y.U, y.c, y.seq + (size_t)t * y.Hp, s->zp, y.clip);
        }
        if (n > 0) s->fn->recurrent(y.seq + (size_t)(n - 1) * y.Hp, y.H, y.Np, y.U, y.R);   // step T-1's h @ U
        prof_lap(s, (size_t)l, t_prof);                                  // profile slot l: layer l's prepare
    }
    if (!s->helper_on)        // inline prepare: the tick's x @ W0 weights (prepare never reads them) into this core's caches
        warm_lines(s->L[0].W, sizeof(float) * (size_t)s->L[0].in * s->L[0].Np);
    s->prof_prepares += s->profiling;
    record_prepare(s, now_ns() - t_start);
}

void destroy(Stream* s) {
    if (!s) return;
    stop_helper(s);
    if (s->L) {
        for (int l = 0; l < s->nl; l++) {
            Layer& y = s->L[l];
            free(y.W); free(y.U); free(y.b); free(y.seq); free(y.c); free(y.G); free(y.R);
        }
    }
    delete[] s->L;
    free(s->ring); free(s->P); free(s->zp); free(s->zc); free(s->Wt); free(s->hb); free(s->hout);
    delete s;
}

bool finite_row(const float* x, int n) {
    bool ok = true;
    for (int i = 0; i < n; i++) ok &= std::isfinite(x[i]);
    return ok;
}

// Row id's critical path (window id prepared): per layer step T-1 with its projection fused in, the output.
void critical(Stream* s, uint64_t id, float* out) {
    const int T = s->T;
    const size_t last = (size_t)T - 1, slot = (size_t)(id % (uint64_t)T);
    const float* x = s->ring + slot * s->in0;
    uint64_t t_prof = prof_start(s);
    for (int l = 0; l < s->nl; l++) {
        Layer& y = s->L[l];
        float* g = l == 0 ? s->P + slot * y.Np : nullptr;
        s->fn->step_in(y.b, x, y.in, y.W, g, T > 1 ? y.R : nullptr, y.H, y.Np, y.c, y.seq + last * y.Hp, s->zc,
                       y.clip);
        x = y.seq + last * y.Hp;
        prof_lap(s, (size_t)(s->nl + l), t_prof);                        // slot nl + l: layer l's last step
    }
    const Layer& z = s->L[s->nl - 1];
    if (s->out_mode == kHeadOut) {
        s->hf->head(x, z.H, s->Wt, s->Mp, s->hb, s->hout);
        memcpy(out, s->hout, sizeof(float) * s->M);
    } else if (s->out_mode == kLastH) {
        memcpy(out, x, sizeof(float) * z.H);
    } else {
        for (int t = 0; t < T; t++) memcpy(out + (size_t)t * z.H, z.seq + (size_t)t * z.Hp, sizeof(float) * z.H);
    }
    prof_lap(s, (size_t)(2 * s->nl), t_prof);                            // slot 2 nl: the head (or the copy out)
    s->prof_pushes += s->profiling;
}

}  // namespace

extern "C" {

// Copies the weights. Ws[l] (in_l, 4H_l), Us[l] (H_l, 4H_l), bs[l] (4H_l,): Keras layout, float32, in_0 = in0 and
// in_l = H_{l-1}; clips[l] > 0 clamps layer l's c_t to +-clips[l] (TFLite's cell_clip; 0: none). out_mode 0: the
// head's M outputs, head_w (M, H_last) (TFLite FULLY_CONNECTED layout), head_b (M,) or null (zeros); 1: the
// last layer's last h (H_last,); 2: the last layer's whole h sequence (T, H_last). The SIMD target is the one in
// force (cpu_dispatch.h). Returns nullptr when out of memory or on a bad size.
void* edgehft_stream_create(int nl, int T, int in0, const int* Hs, const float* const* Ws, const float* const* Us,
                            const float* const* bs, const float* clips, int M, const float* head_w,
                            const float* head_b, int out_mode) {
    if (nl < 1 || T < 1 || in0 < 1 || out_mode < 0 || out_mode > 2 || (out_mode == kHeadOut && (M < 1 || !head_w)))
        return nullptr;
    Stream* s = new (std::nothrow) Stream();
    if (!s) return nullptr;
    s->slot = simd_slot(current_slot());
    s->fn = lstm::fns(s->slot);
    s->hf = kHeadTable[s->slot];
    s->T = T; s->in0 = in0; s->out_mode = out_mode;
    s->L = new (std::nothrow) Layer[nl];
    bool ok = s->L != nullptr && s->fn && s->hf;
    if (ok) s->nl = nl;
    int in = in0, maxN = 0;
    for (int l = 0; l < nl && ok; l++) {
        ok = Hs[l] >= 1 && alloc_layer(s->L[l], in, Hs[l], T, l > 0, Ws[l], Us[l], bs[l], clips ? clips[l] : 0.f);
        if (ok) { maxN = std::max(maxN, s->L[l].Np); in = Hs[l]; }
    }
    if (ok) {
        s->ring = aligned_floats((size_t)T * in0); s->P = aligned_floats((size_t)T * s->L[0].Np);
        s->zp = aligned_floats(maxN); s->zc = aligned_floats(maxN);
        ok = s->ring && s->P && s->zp && s->zc;
    }
    if (ok && out_mode == kHeadOut) {
        const int H = s->L[nl - 1].H;
        s->M = M; s->Mp = (M + 15) / 16 * 16;
        s->Wt = aligned_floats((size_t)H * s->Mp); s->hb = aligned_floats(s->Mp); s->hout = aligned_floats(s->Mp);
        ok = s->Wt && s->hb && s->hout;
        for (int m = 0; ok && m < M; m++) {
            for (int k = 0; k < H; k++) s->Wt[(size_t)k * s->Mp + m] = head_w[(size_t)m * H + k];
            s->hb[m] = head_b ? head_b[m] : 0.f;
        }
    }
    if (!ok) { destroy(s); return nullptr; }
    return s;
}

void edgehft_stream_destroy(void* p) { destroy(static_cast<Stream*>(p)); }

// The target slot the stream runs (cpu_dispatch.h), chosen at create.
int edgehft_stream_slot(void* p) { return static_cast<Stream*>(p)->slot; }

// One row (in0 float32). Returns 0: the output of the window ending at this row written to out; 1: warming up
// (fewer than T rows since create / reset: the row is kept, nothing written); -1: the row holds a NaN or an
// infinity (nothing kept, nothing written).
int edgehft_stream_push(void* p, const float* row, float* out) {
    Stream* s = static_cast<Stream*>(p);
    if (!finite_row(row, s->in0)) {
        s->n.bad_rows++;
        return -1;
    }
    const uint64_t id = s->count;
    const size_t slot = (size_t)(id % (uint64_t)s->T);
    memcpy(s->ring + slot * s->in0, row, sizeof(float) * s->in0);
    s->n.pushes++;
    if (id + 1 < (uint64_t)s->T) {                     // warming up: only the row's projection, for later windows
        const Layer& y = s->L[0];
        s->fn->gemm(row, s->in0, 1, y.in, y.W, y.Np, y.b, s->P + slot * y.Np);
        s->count = id + 1;
        if (id + 2 >= (uint64_t)s->T) request(s, id + 1);   // the next window can be prepared now
        return 1;
    }
    if (s->state.load(std::memory_order_acquire) == word(id, kDone)) {
        s->n.ahead++;
    } else {
        const uint64_t t0 = now_ns();
        if (claim_and_prepare(s, id)) s->n.late_waited++;
        s->n.late++;
        s->n.late_ns += now_ns() - t0;
    }
    critical(s, id, out);
    s->count = id + 1;
    s->n.outputs++;
    request(s, id + 1);
    return 0;
}

// Lend the stream a staging row (in0 float32) and an output buffer for edgehft_stream_push_staged (the calling
// convention of edgehft_chain_push: a caller writes the row, then pushes with the handle alone). They must stay
// valid while the stream is pushed that way.
void edgehft_stream_stage(void* p, const float* row, float* out) {
    Stream* s = static_cast<Stream*>(p);
    s->staged = row;
    s->staged_out = out;
}

// edgehft_stream_push on the staged row and output (edgehft_stream_stage; -3 when none was staged).
int edgehft_stream_push_staged(void* p) {
    Stream* s = static_cast<Stream*>(p);
    if (!s->staged || !s->staged_out) return -3;
    return edgehft_stream_push(p, s->staged, s->staged_out);
}

// The ahead-of-tick work for the window the next push completes (waits if the helper is on it). Returns 0 when
// that window is prepared, 1 when it needs more rows first (warming up: nothing to prepare).
int edgehft_stream_prepare(void* p) {
    Stream* s = static_cast<Stream*>(p);
    if (s->count + 1 < (uint64_t)s->T) return 1;
    claim_and_prepare(s, s->count);
    return 0;
}

// n rows (in0 float32 each, one after another) pushed in turn, each push timed inside the library (what a native
// caller sees, no Python; cpu_handoff.h's time_pushes), outputs to out: ns[i] the push's ns when it gave an
// output, else 0; prepare_between: edgehft_stream_prepare after each (untimed). Returns the number of outputs.
int64_t edgehft_stream_time_pushes(void* p, const float* rows, int64_t n, float* out, uint64_t* ns,
                                   int prepare_between) {
    const size_t in0 = (size_t)static_cast<Stream*>(p)->in0;
    const float* row = rows;
    return time_pushes(
        n, [&](int64_t i) { row = rows + (size_t)i * in0; }, [&] { return edgehft_stream_push(p, row, out); },
        [&] { edgehft_stream_prepare(p); }, ns, prepare_between != 0);
}

// Forget every row (a prepare running on the helper finishes first). Counters are kept.
void edgehft_stream_reset(void* p) {
    reset_state(static_cast<Stream*>(p));
}

// Op-by-op timing (bench --streaming --profile) on (zeroed) or off: slots l < nl: layer l's prepare (its steps
// 0 .. T-2 and step T-1's recurrent sum), nl + l: layer l's last step on the tick, 2 nl: the head. Returns 0, -1
// while the helper runs, -2 out of memory.
int edgehft_stream_profile(void* p, int on) {
    Stream* s = static_cast<Stream*>(p);
    return profile_set(s, (size_t)(2 * s->nl + 1), on);
}

// out[0] prepares timed, out[1] pushes timed, then the slots' ns; returns the number of slots.
int edgehft_stream_profile_read(void* p, uint64_t* out, int cap) {
    return profile_get(static_cast<Stream*>(p), out, cap);
}

// Rows since create / reset.
uint64_t edgehft_stream_rows(void* p) { return static_cast<Stream*>(p)->count; }

// Starts the helper thread (pinned to `core` when core >= 0; it spins spin_us after its last prepare, then
// sleeps until the next push). Returns 0; -1 when it already runs; -2 when no thread can be started; -3 when the
// core is refused (not one this process may run on; no thread is left running then).
int edgehft_stream_start_helper(void* p, int core, int spin_us) {
    return start_helper(static_cast<Stream*>(p), core, spin_us);
}

// out[0..12): pushes, outputs, prepared ahead, prepared late, late pushes that waited on the helper, ns spent
// by late pushes on prepare, windows prepared, ns in prepare in all, ns of the last prepare, rows since reset,
// rows refused (not finite), whether the helper runs.
void edgehft_stream_counters(void* p, uint64_t* out) {
    common_counters(static_cast<Stream*>(p), out);
}

// The head alone on h (H_last floats) into out (M floats), exactly as push computes it (to check it against the
// plan's own head). Returns 0, or 1 for a stream without a head.
int edgehft_stream_head(void* p, const float* h, float* out) {
    Stream* s = static_cast<Stream*>(p);
    if (s->out_mode != kHeadOut) return 1;
    s->hf->head(h, s->L[s->nl - 1].H, s->Wt, s->Mp, s->hb, s->hout);
    memcpy(out, s->hout, sizeof(float) * s->M);
    return 0;
}

// The rows of the current window, oldest first, into out (min(rows, T) x in0); returns how many.
int edgehft_stream_window(void* p, float* out) {
    const Stream* s = static_cast<Stream*>(p);
    const uint64_t n = std::min<uint64_t>(s->count, (uint64_t)s->T);
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t row = s->count - n + i;
        memcpy(out + i * s->in0, s->ring + (size_t)(row % s->T) * s->in0, sizeof(float) * s->in0);
    }
    return (int)n;
}

}  // extern "C"
}  // namespace edgehft
#endif  // HWY_ONCE
