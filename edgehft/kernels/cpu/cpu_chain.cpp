// edgehft native chain program (issue 21): the stream executor of a native chain with a convolution front end
// (DeepLOB's native-bf16 plan), one native call per push and per prepare.
//
// edgehft.streaming.chain builds a Plan from the bundle's chain: per tensor along time a buffer of `capacity`
// windows of rows (window row r is buffer row base + r), and per phase ("cold": every non-critical row, for the
// first window after create or reset; "prepare": the rows of the next window that do not read its newest row;
// "critical": the rows that do) a list of kernel calls, each a run of output rows [a, b) of one tensor from the
// input rows it reads: in = src.addr + (base + src.lo) * src.row_bytes (a concat: one such pointer per input in
// an array), out = out_addr + (base + a) * out_row_bytes. Then a single-layer LSTM on the projections
// (edgehft_lstm_steps: of its S steps, which may be fewer than the window's T rows, P in prepare from the zero
// state and S - P in the push) and the head kernels on whole tensors. This program is that plan as data, built
// once (edgehft_chain_create copies it), and the executor's state machine:
//   push(row):  the row (from the staging row the caller wrote) into input row base + T - 1, the critical calls,
//               the LSTM's last S - P steps (h into h_last), the head; warming up (fewer than T - 1 rows before
//               it): only the row, at input row `rows`.
//   prepare:    base one row on (when the previous window was pushed); when the buffers are full, the last
//               window (rows base - 1 .. base + T - 2 of every buffer) to their start, base = 1 (one copy of
//               every window per (capacity - 1) * T ticks); the prepare (or cold) calls; the LSTM's first P steps
//               and step P's recurrent sum; then the "warm" calls (edgehft_conv_warm on the critical path's convs:
//               their weights read back into the caches, which prepare's own work evicts them from).
// The kernels are the plan's own (function pointers of this library, the same handles), called in the plan's
// order with the plan's pointers, so a push gives the bits the Python executor gave: predict's bits.
//
// Prepare ahead of the tick, three ways (the caller's edgehft_chain_prepare, a helper thread pinned to a core
// started by edgehft_chain_start_helper, or the late push itself), handed over by cpu_handoff.h's state word
// (window id = the rows pushed before the row that completes it). What a prepare writes: the buffers, the
// kernels' state, base and `computed`. window() reads the rows of the last pushed window (win_lo), which a
// prepare running meanwhile never writes (a move copies them to rows 0 .. T-1, which lie below them).
//
// No allocation after create (the conv kernels' per-thread scratch grows on a thread's first call); one pushing
// thread at a time (the caller serialises push, prepare, reset, window).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "cpu_handoff.h"

// cpu_lstm.cpp's steps of a single-layer projected net, cpu_conv.cpp's shared tile configuration (the same library).
extern "C" int edgehft_lstm_steps(void* p, const float* g, int ldg, int s0, int n, float* h_out);
extern "C" int edgehft_lstm_steps_seq(void* p, const float* g, int ldg, int s0, int n, float* h_seq, int ldh);
extern "C" int edgehft_lstm_recur_ahead(void* p);
extern "C" void edgehft_conv_amx_scope(int open);

namespace edgehft {
namespace {

// Every kernel's run entry point: int run(void* handle, const void* in, float* out), 0 on success (the kernels
// declare `in` as const float* or, a concat, const float* const*: the same pointer argument on every ABI here).
typedef int (*KernelFn)(void*, const void*, float*);

// What edgehft_chain_create reads (ctypes mirrors these: every field a 64-bit integer, addresses included).
struct SpecSrc { int64_t addr, row_bytes, lo; };
struct SpecCall { int64_t fn, handle, out, out_row_bytes, a, nsrc, src0, use_ptrs; };   // srcs[src0 .. src0+nsrc)
struct SpecBuf { int64_t addr, row_bytes; };
struct SpecHead { int64_t fn, handle, x, y; };
struct SpecWarm { int64_t fn, handle; };
struct Spec {
    int64_t T, capacity, P, S, row_floats;     // window rows, windows per buffer, LSTM steps in prepare / in all,
                                               // the staging row's float32 values
    int64_t row, in, in_row_bytes;             // the staging row (row_floats float32), the input tensor's buffer
    int64_t lstm, proj, proj_ld, h_last;       // LSTM handle, its projections' buffer (rows of proj_ld floats), h
    int64_t calls[3], ncalls[3];               // SpecCall arrays: cold, prepare, critical
    int64_t srcs, nsrcs, bufs, nbufs, head, nhead;
    int64_t warm, nwarm;                       // SpecWarm array: int fn(void* handle) run at the end of a prepare
};

enum Phase { kCold = 0, kPrepare = 1, kCritical = 2 };
using namespace handoff;     // the prepare handoff (cpu_handoff.h)

struct Src { const char* addr; size_t row_bytes; int64_t lo; };
struct Call {
    KernelFn fn; void* h; char* out; size_t out_row_bytes; int64_t a;
    int nsrc; const Src* src; const void** ptrs;   // ptrs: the concat's input pointer array (nullptr: one input)
};
struct Buf { char* addr; size_t row_bytes; };
struct Head { KernelFn fn; void* h; const void* x; float* y; };
typedef int (*WarmFn)(void*);
struct Warm { WarmFn fn; void* h; };

struct Program : Handoff {
    int64_t T = 0, cap = 0, P = 0, S = 0, row_n = 0;
    float* row = nullptr;                             // the caller's staging row (edgehft_chain_time_pushes writes it)
    char* in = nullptr;
    size_t in_rb = 0;
    void* lstm = nullptr;
    const float* proj = nullptr;
    int proj_ld = 0;
    float* h_last = nullptr;
    std::vector<Call> calls[3];
    std::vector<Src> srcs;
    std::vector<const void*> ptrs;
    std::vector<Buf> bufs;
    std::vector<Head> head;
    std::vector<Warm> warm;                           // the critical path's kernels, warmed after each prepare
    // the executor's state: count (Handoff's) and win_lo are the pushing thread's; base, computed and prep_ok the
    // preparer's (handed over by `state`)
    int64_t base = 0, win_lo = 0;                     // window row 0 in buffer rows; the last pushed window's
    bool computed = false, prep_ok = true;            // a window was pushed since the last prepare; its kernels ran
    std::atomic<uint64_t> moves{0}, kernel_errors{0};
};

// Profile slots (edgehft_chain_profile): the prepare calls, the LSTM's prepared steps, the critical calls, the
// LSTM's steps on the tick, the head calls, in that order. The first slot of a phase's calls (cold: none).
size_t prof_slot(const Program* s, int phase) {
    const size_t np = s->calls[kPrepare].size(), nc = s->calls[kCritical].size();
    return phase == kPrepare ? 0 : phase == kCritical ? np + 1 : np + nc + 2;      // kCold -> the head's (unused)
}

// One phase's calls with window row 0 at buffer row `base`, the AMX convs among them on one tile configuration.
// Returns whether every kernel returned 0.
bool run_phase(Program* s, int phase, int64_t base) {
    bool ok = true;
    const bool timed = s->profiling && phase != kCold;
    size_t slot = prof_slot(s, phase);
    edgehft_conv_amx_scope(1);
    uint64_t t = prof_start(s);
    for (const Call& c : s->calls[phase]) {
        const void* in;
        if (c.ptrs) {
            for (int i = 0; i < c.nsrc; i++) c.ptrs[i] = c.src[i].addr + (base + c.src[i].lo) * c.src[i].row_bytes;
            in = c.ptrs;
        } else {
            in = c.src[0].addr + (base + c.src[0].lo) * c.src[0].row_bytes;
        }
        ok &= c.fn(c.h, in, reinterpret_cast<float*>(c.out + (base + c.a) * c.out_row_bytes)) == 0;
        if (timed) prof_lap(s, slot++, t);
    }
    edgehft_conv_amx_scope(0);
    return ok;
}

// Window `id`'s ahead-of-tick work (see the top): nothing while fewer than T - 1 rows precede it.
void prepare_window(Program* s, uint64_t id) {
    if (id + 1 < (uint64_t)s->T) return;
    const uint64_t t0 = now_ns();
    const int phase = s->computed ? kPrepare : kCold;
    if (s->computed) {
        s->base++;
        if (s->base + s->T > s->cap * s->T) {                      // the last window to the start (base 1: row 0 too)
            for (const Buf& b : s->bufs)
                memmove(b.addr, b.addr + (size_t)(s->base - 1) * b.row_bytes, (size_t)s->T * b.row_bytes);
            s->base = 1;
            s->moves.fetch_add(1, std::memory_order_relaxed);
        }
    }
    bool ok = run_phase(s, phase, s->base);
    uint64_t t = prof_start(s);
    ok &= edgehft_lstm_steps(s->lstm, s->proj + (size_t)s->base * s->proj_ld, s->proj_ld, 0, (int)s->P, nullptr) == 0;
    if (s->P > 0 && s->P < s->S) ok &= edgehft_lstm_recur_ahead(s->lstm) == 0;   // step P's h_{P-1} @ U
    if (phase == kPrepare) {
        prof_lap(s, s->calls[kPrepare].size(), t);
        s->prof_prepares += s->profiling;
    }
    if (!s->helper_on)                            // inline prepare: the tick's weights back into this core's caches
        for (const Warm& w : s->warm) w.fn(w.h);   // (a helper on another core would warm its own, not the pusher's)
    if (!ok) s->kernel_errors.fetch_add(1, std::memory_order_relaxed);
    s->prep_ok = ok;
    s->computed = false;
    record_prepare(s, now_ns() - t0);
}

bool finite_row(const float* x, int64_t n) {
    bool ok = true;
    for (int64_t i = 0; i < n; i++) ok &= std::isfinite(x[i]);
    return ok;
}

// The spec's calls of one phase, their sources into s->srcs and concat pointer arrays into s->ptrs (both sized
// beforehand: the pointers into them stay valid). Returns false on a bad index.
bool load_calls(Program* s, const Spec* sp, int phase, size_t* next_ptr) {
    const SpecCall* cs = reinterpret_cast<const SpecCall*>(sp->calls[phase]);
    for (int64_t i = 0; i < sp->ncalls[phase]; i++) {
        const SpecCall& c = cs[i];
        if (!c.fn || c.nsrc < 1 || c.src0 < 0 || c.src0 + c.nsrc > sp->nsrcs) return false;
        Call k;
        k.fn = reinterpret_cast<KernelFn>(c.fn);
        k.h = reinterpret_cast<void*>(c.handle);
        k.out = reinterpret_cast<char*>(c.out);
        k.out_row_bytes = (size_t)c.out_row_bytes;
        k.a = c.a;
        k.nsrc = (int)c.nsrc;
        k.src = s->srcs.data() + c.src0;
        k.ptrs = nullptr;
        if (c.use_ptrs) {
            k.ptrs = s->ptrs.data() + *next_ptr;
            *next_ptr += (size_t)c.nsrc;
        }
        s->calls[phase].push_back(k);
    }
    return true;
}

// The whole spec into s (copies); false on a bad spec.
bool load(Program* s, const Spec* sp) {
    if (sp->T < 1 || sp->capacity < 2 || sp->P < 0 || sp->P > sp->S || sp->S > sp->T || sp->row_floats < 1 ||
        !sp->row || !sp->in || !sp->lstm || !sp->proj || sp->proj_ld < 1 || !sp->h_last || sp->nsrcs < 0 ||
        sp->nbufs < 1 || sp->nhead < 0 || sp->nwarm < 0 || (sp->nwarm > 0 && !sp->warm))
        return false;
    s->T = sp->T; s->cap = sp->capacity; s->P = sp->P; s->S = sp->S; s->row_n = sp->row_floats;
    s->row = reinterpret_cast<float*>(sp->row);
    s->in = reinterpret_cast<char*>(sp->in);
    s->in_rb = (size_t)sp->in_row_bytes;
    s->lstm = reinterpret_cast<void*>(sp->lstm);
    s->proj = reinterpret_cast<const float*>(sp->proj);
    s->proj_ld = (int)sp->proj_ld;
    s->h_last = reinterpret_cast<float*>(sp->h_last);
    const SpecSrc* ss = reinterpret_cast<const SpecSrc*>(sp->srcs);
    for (int64_t i = 0; i < sp->nsrcs; i++)
        s->srcs.push_back({reinterpret_cast<const char*>(ss[i].addr), (size_t)ss[i].row_bytes, ss[i].lo});
    size_t nptrs = 0;
    for (int ph = 0; ph < 3; ph++) {
        const SpecCall* cs = reinterpret_cast<const SpecCall*>(sp->calls[ph]);
        for (int64_t i = 0; i < sp->ncalls[ph]; i++)
            if (cs[i].use_ptrs) nptrs += (size_t)std::max<int64_t>(cs[i].nsrc, 0);
    }
    s->ptrs.assign(nptrs, nullptr);
    size_t next_ptr = 0;
    for (int ph = 0; ph < 3; ph++)
        if (!load_calls(s, sp, ph, &next_ptr)) return false;
    const SpecBuf* bs = reinterpret_cast<const SpecBuf*>(sp->bufs);
    for (int64_t i = 0; i < sp->nbufs; i++)
        s->bufs.push_back({reinterpret_cast<char*>(bs[i].addr), (size_t)bs[i].row_bytes});
    const SpecHead* hs = reinterpret_cast<const SpecHead*>(sp->head);
    for (int64_t i = 0; i < sp->nhead; i++)
        s->head.push_back({reinterpret_cast<KernelFn>(hs[i].fn), reinterpret_cast<void*>(hs[i].handle),
                           reinterpret_cast<const void*>(hs[i].x), reinterpret_cast<float*>(hs[i].y)});
    const SpecWarm* ws = reinterpret_cast<const SpecWarm*>(sp->warm);
    for (int64_t i = 0; i < sp->nwarm; i++) {
        if (!ws[i].fn) return false;
        s->warm.push_back({reinterpret_cast<WarmFn>(ws[i].fn), reinterpret_cast<void*>(ws[i].handle)});
    }
    return true;
}

// Row id's critical path (window id prepared, base its row 0). Returns whether every kernel returned 0.
bool critical(Program* s) {
    const int64_t base = s->base, P = s->P;
    memcpy(s->in + (size_t)(base + s->T - 1) * s->in_rb, s->row, sizeof(float) * (size_t)s->row_n);
    bool ok = run_phase(s, kCritical, base);
    uint64_t t = prof_start(s);
    ok &= edgehft_lstm_steps(s->lstm, s->proj + (size_t)(base + P) * s->proj_ld, s->proj_ld, (int)P, (int)(s->S - P),
                             s->h_last) == 0;
    size_t slot = prof_slot(s, kCritical) + s->calls[kCritical].size();
    prof_lap(s, slot++, t);
    for (const Head& h : s->head) {
        ok &= h.fn(h.h, h.x, h.y) == 0;
        prof_lap(s, slot++, t);
    }
    s->prof_pushes += s->profiling;
    s->win_lo = base;
    return ok;
}

}  // namespace

extern "C" {

// A program from `spec` (a Spec, see above; the arrays it points to are copied, the buffers and kernels it names
// must outlive the program). Returns nullptr on a bad spec or out of memory.
void* edgehft_chain_create(const void* spec) {
    Program* s = new (std::nothrow) Program();
    if (!s) return nullptr;
    try {
        if (load(s, static_cast<const Spec*>(spec))) return s;
    } catch (...) {
    }
    delete s;
    return nullptr;
}

// Stops the helper thread (after a prepare in progress) and frees the program (not the kernels or buffers).
void edgehft_chain_destroy(void* p) {
    Program* s = static_cast<Program*>(p);
    if (!s) return;
    stop_helper(s);
    delete s;
}

// Push the staging row. Returns 0: the head's outputs hold the output of the window ending at this row; 1: warming
// up (fewer than T rows since create / reset: the row is kept); -1: the row holds a NaN or an infinity (nothing
// kept); -2: a kernel of this push or of its window's prepare failed (out of memory; the output is not valid).
int edgehft_chain_push(void* p) {
    Program* s = static_cast<Program*>(p);
    s->n.pushes++;
    if (!finite_row(s->row, s->row_n)) {
        s->n.bad_rows++;
        return -1;
    }
    const uint64_t id = s->count;
    if (id + 1 < (uint64_t)s->T) {                     // warming up: only the row
        memcpy(s->in + (size_t)id * s->in_rb, s->row, sizeof(float) * (size_t)s->row_n);
        s->count = id + 1;
        if (id + 2 >= (uint64_t)s->T) request(s, id + 1);   // the first window can be prepared now
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
    bool ok = critical(s) && s->prep_ok;
    if (!ok) s->kernel_errors.fetch_add(1, std::memory_order_relaxed);
    s->computed = true;
    s->count = id + 1;
    s->n.outputs++;
    request(s, id + 1);
    return ok ? 0 : -2;
}

// The ahead-of-tick work for the window the next push completes (waits if the helper is on it). Returns 0 when
// that window is prepared, 1 when it needs more rows first (fewer than T - 1 rows: nothing to prepare).
int edgehft_chain_prepare(void* p) {
    Program* s = static_cast<Program*>(p);
    if (s->count + 1 < (uint64_t)s->T) return 1;
    claim_and_prepare(s, s->count);
    return 0;
}

// n rows (row_floats float32 each, one after another) pushed in turn, each push timed inside the library (what a
// native caller sees, no Python; cpu_handoff.h's time_pushes): ns[i] the push's ns when it gave an output, else
// 0; prepare_between: edgehft_chain_prepare after each (untimed). The rows go through the staging row. Returns
// the number of outputs, or -2 when a kernel failed (the loop stops there).
int64_t edgehft_chain_time_pushes(void* p, const float* rows, int64_t n, uint64_t* ns, int prepare_between) {
    Program* s = static_cast<Program*>(p);
    const size_t row_n = (size_t)s->row_n;
    return time_pushes(
        n, [&](int64_t i) { memcpy(s->row, rows + (size_t)i * row_n, sizeof(float) * row_n); },
        [&] { return edgehft_chain_push(p); }, [&] { edgehft_chain_prepare(p); }, ns, prepare_between != 0);
}

// Forget every row (a prepare running on the helper finishes first). Counters are kept.
void edgehft_chain_reset(void* p) {
    Program* s = static_cast<Program*>(p);
    reset_state(s);
    s->base = 0;
    s->win_lo = 0;
    s->computed = false;
    s->prep_ok = true;
}

// Op-by-op timing (bench --streaming --profile) on (zeroed) or off: one slot per prepare call, the LSTM's prepared
// steps, one per critical call, the LSTM's steps on the tick, one per head call (the cold calls, run once after a
// reset, are not timed). Returns 0, -1 while the helper runs, -2 out of memory.
int edgehft_chain_profile(void* p, int on) {
    Program* s = static_cast<Program*>(p);
    return profile_set(s, s->calls[kPrepare].size() + s->calls[kCritical].size() + 2 + s->head.size(), on);
}

// out[0] prepares timed, out[1] pushes timed, then the slots' ns; returns the number of slots.
int edgehft_chain_profile_read(void* p, uint64_t* out, int cap) {
    return profile_get(static_cast<Program*>(p), out, cap);
}

// Rows since create / reset.
uint64_t edgehft_chain_rows(void* p) { return static_cast<Program*>(p)->count; }

// A stacked LSTM layer's steps as a row call of a phase (a layer whose h sequence feeds another layer's input
// projection): steps s0 .. s0+n-1 of the single-layer net `net` on n projection rows (ldg floats apart), every
// step's h to an output row (ldh floats apart), edgehft_lstm_steps_seq. Returns the call's handle (free it with
// edgehft_chain_lstm_call_destroy), nullptr out of memory or on a bad size.
// ahead: after its steps, the call also sums step s0 + n's recurrent part h @ U (edgehft_lstm_recur_ahead), which
// the next call, starting there, then adds to its projection instead of summing it (the same bits): a prepare
// call does so, and the tick's first step has only its projection and gates left.
struct LstmCall { void* net; int s0, n, ldg, ldh, ahead; };

void* edgehft_chain_lstm_call_create(void* net, int s0, int n, int ldg, int ldh, int ahead) {
    if (!net || s0 < 0 || n < 1 || ldg < 1 || ldh < 1) return nullptr;
    LstmCall* c = new (std::nothrow) LstmCall{net, s0, n, ldg, ldh, ahead ? 1 : 0};
    return c;
}

// The call (a KernelFn): in = the first projection row, out = the first h row. 0, or -1 when the steps were
// refused (out of order: the net did not end its last call at s0; or ahead with no step left after them).
int edgehft_chain_lstm_call(void* h, const void* in, float* out) {
    const LstmCall* c = static_cast<const LstmCall*>(h);
    if (edgehft_lstm_steps_seq(c->net, static_cast<const float*>(in), c->ldg, c->s0, c->n, out, c->ldh)) return -1;
    return c->ahead && edgehft_lstm_recur_ahead(c->net) ? -1 : 0;
}

void edgehft_chain_lstm_call_destroy(void* h) { delete static_cast<LstmCall*>(h); }

// Starts the helper thread (pinned to `core` when core >= 0; it spins spin_us after its last prepare, then sleeps
// until the next push). Returns 0; -1 when it already runs; -2 when no thread can be started; -3 when the core is
// refused (not one this process may run on; no thread is left running then).
int edgehft_chain_start_helper(void* p, int core, int spin_us) {
    return start_helper(static_cast<Program*>(p), core, spin_us);
}

// out[0..14): pushes (every call, refused rows too), outputs, prepared ahead, prepared late, late pushes that
// waited on the helper, ns spent by late pushes on prepare, windows prepared, ns in prepare in all, ns of the last
// prepare, rows since reset, rows refused (not finite), whether the helper runs, window moves, kernel failures.
void edgehft_chain_counters(void* p, uint64_t* out) {
    const Program* s = static_cast<Program*>(p);
    common_counters(s, out);
    out[12] = s->moves.load(std::memory_order_relaxed);
    out[13] = s->kernel_errors.load(std::memory_order_relaxed);
}

// The rows of the current window, oldest first, into out (min(rows, T) x row_floats); returns how many.
int edgehft_chain_window(void* p, float* out) {
    const Program* s = static_cast<Program*>(p);
    const int64_t n = (int64_t)std::min<uint64_t>(s->count, (uint64_t)s->T);
    const int64_t lo = s->count < (uint64_t)s->T ? 0 : s->win_lo;
    for (int64_t i = 0; i < n; i++)
        memcpy(out + (size_t)i * s->row_n, s->in + (size_t)(lo + i) * s->in_rb, sizeof(float) * (size_t)s->row_n);
    return (int)n;
}

}  // extern "C"
}  // namespace edgehft
