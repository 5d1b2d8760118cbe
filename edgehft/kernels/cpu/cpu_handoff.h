// edgehft native stream executors: the ahead-of-tick prepare handoff that cpu_stream.cpp (LSTM nets) and
// cpu_chain.cpp (convolution front ends) share.
//
// Prepare ahead of the tick, three ways: the caller's prepare call (when idle), a helper thread that prepares
// right after each push, or the push itself when its window is not prepared ("late", counted with its cost).
// One atomic word says whose turn it is:
//   state = window id << 2 | tag, tag NONE (after reset) | REQ (push asked for window id) | RUN (a thread is
//   preparing it) | DONE (prepared).
// Whoever moves state to RUN with a compare-exchange prepares; nobody else touches what a prepare writes until it
// stores DONE (release; push reads it after an acquire load that sees DONE). Push's stores happen before its
// seq_cst store of REQ, which the helper reads with an acquire compare-exchange before it prepares. The helper
// spins (pause) for spin_us after its last work, then sleeps on a futex; push wakes it only when it said it
// sleeps (a seq_cst store of `sleeping`, then a seq_cst load of state on its side, against push's seq_cst store
// of state then load of `sleeping`: one of them sees the other). Push never takes a lock; it waits only for a
// prepare of its own window already running on the helper.
//
// An executor's state derives from Handoff and defines, in its own namespace, prepare_window(Exec*, uint64_t id)
// (the work for window id); claim_and_prepare, helper_main and start_helper call it.
#ifndef EDGEHFT_CPU_HANDOFF_H_
#define EDGEHFT_CPU_HANDOFF_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace edgehft {
namespace handoff {

enum Tag : uint64_t { kNone = 0, kReq = 1, kRun = 2, kDone = 3 };
inline uint64_t word(uint64_t id, uint64_t tag) { return id << 2 | tag; }
inline uint64_t tag_of(uint64_t w) { return w & 3; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

inline uint64_t now_ns() {
    return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Counters {                                     // written by the pushing thread
    uint64_t pushes = 0, outputs = 0, ahead = 0, late = 0, late_waited = 0, late_ns = 0, bad_rows = 0;
};

struct Handoff {
    uint64_t count = 0;                               // rows since create / reset (the pushing thread's)
    std::atomic<uint64_t> state{0};
    Counters n;
    std::atomic<uint64_t> prepares{0}, prepare_ns{0}, prepare_ns_last{0};
    std::thread helper;                               // the helper thread
    bool helper_on = false;
    int spin_us = 0;
    std::atomic<int> stop{0}, sleeping{0}, wake{0}, pinned{0};   // pinned: 0 pending, 1 ok, -1 core refused
    // op-by-op timing (bench --streaming --profile), off unless asked for: ns per slot (the executor says what
    // each slot is), and the prepares and pushes timed. Only with the helper off (prepare on the pushing thread).
    bool profiling = false;
    std::vector<uint64_t> prof;
    uint64_t prof_prepares = 0, prof_pushes = 0;
};

// A clock reading for prof_lap when profiling, else 0 (no clock read on the hot path).
inline uint64_t prof_start(const Handoff* s) { return s->profiling ? now_ns() : 0; }

// When profiling: the ns since t to slot `slot`, and t moved on to now.
inline void prof_lap(Handoff* s, size_t slot, uint64_t& t) {
    if (!s->profiling) return;
    const uint64_t n = now_ns();
    s->prof[slot] += n - t;
    t = n;
}

// Profiling on (nslots slots, zeroed) or off. Returns 0; -1 while the helper runs (its prepares would race the
// slots); -2 out of memory.
inline int profile_set(Handoff* s, size_t nslots, int on) {
    if (s->helper_on) return -1;
    s->profiling = false;
    try {
        s->prof.assign(on ? nslots : 0, 0);
    } catch (...) {
        return -2;
    }
    s->prof_prepares = s->prof_pushes = 0;
    s->profiling = on != 0;
    return 0;
}

// out[0] prepares timed, out[1] pushes timed, out[2 ..] the slots' ns (at most cap - 2 of them). Returns the
// number of slots.
inline int profile_get(const Handoff* s, uint64_t* out, int cap) {
    if (cap >= 2) { out[0] = s->prof_prepares; out[1] = s->prof_pushes; }
    for (int i = 0; i < (int)s->prof.size() && i + 2 < cap; i++) out[i + 2] = s->prof[i];
    return (int)s->prof.size();
}

// Pushes timed as a native caller sees them (edgehft_*_time_pushes): for row i < n, stage(i) puts it where the push
// reads it (untimed), then ns[i] = the push's own duration (the clock read just before and just after it) when it
// gave an output, 0 when it did not (warming up, a refused row); with prepare_between, prepare() runs after each
// push (untimed: the idle time before the next tick). push returns the executor's code; a code below -1 (a kernel
// failed) stops the loop and is returned; else the number of outputs.
template <typename Stage, typename Push, typename Prep>
int64_t time_pushes(int64_t n, Stage&& stage, Push&& push, Prep&& prepare, uint64_t* ns, bool prepare_between) {
    int64_t outputs = 0;
    for (int64_t i = 0; i < n; i++) {
        stage(i);
        const uint64_t t0 = now_ns();
        const int rc = push();
        const uint64_t t1 = now_ns();
        if (rc < -1) return rc;
        ns[i] = rc == 0 ? t1 - t0 : 0;
        outputs += rc == 0;
        if (prepare_between) prepare();
    }
    return outputs;
}

// A prepare of dt ns done (the counters edgehft_*_counters reports).
inline void record_prepare(Handoff* s, uint64_t dt) {
    s->prepares.fetch_add(1, std::memory_order_relaxed);
    s->prepare_ns.fetch_add(dt, std::memory_order_relaxed);
    s->prepare_ns_last.store(dt, std::memory_order_relaxed);
}

// The counters both executors report first, in this order: pushes, outputs, prepared ahead, prepared late, late
// pushes that waited on the helper, ns spent by late pushes on prepare, windows prepared, ns in prepare in all,
// ns of the last prepare, rows since reset, rows refused (not finite), whether the helper runs.
inline void common_counters(const Handoff* s, uint64_t* v) {
    const uint64_t c[12] = {s->n.pushes, s->n.outputs, s->n.ahead, s->n.late, s->n.late_waited, s->n.late_ns,
                            s->prepares.load(std::memory_order_relaxed), s->prepare_ns.load(std::memory_order_relaxed),
                            s->prepare_ns_last.load(std::memory_order_relaxed), s->count, s->n.bad_rows,
                            (uint64_t)s->helper_on};
    for (int i = 0; i < 12; i++) v[i] = c[i];
}

#if defined(__linux__)
inline void futex_wait(std::atomic<int>* a, int seen) {
    syscall(SYS_futex, reinterpret_cast<int*>(a), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
}
inline void futex_wake(std::atomic<int>* a) {
    syscall(SYS_futex, reinterpret_cast<int*>(a), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}
#else
inline void futex_wait(std::atomic<int>*, int) { std::this_thread::sleep_for(std::chrono::microseconds(50)); }
inline void futex_wake(std::atomic<int>*) {}
#endif

// After a push: ask for window `id` to be prepared; wake the helper if it sleeps.
inline void request(Handoff* s, uint64_t id) {
    s->state.store(word(id, kReq), std::memory_order_seq_cst);
    if (s->helper_on && s->sleeping.load(std::memory_order_seq_cst)) {
        s->wake.fetch_add(1, std::memory_order_seq_cst);
        futex_wake(&s->wake);
    }
}

// Back to NONE once no prepare runs (a prepare running on the helper finishes first); count = 0.
inline void reset_state(Handoff* s) {
    for (;;) {
        uint64_t st = s->state.load(std::memory_order_acquire);
        if (tag_of(st) == kRun) {
            cpu_relax();
            continue;
        }
        if (s->state.compare_exchange_strong(st, word(0, kNone), std::memory_order_acq_rel)) break;
    }
    s->count = 0;
}

// Make window `id` prepared: claim it (any state but RUN -> RUN) and prepare it here, or wait for the thread
// that is preparing it. Returns whether this call waited on another thread.
template <class Exec>
bool claim_and_prepare(Exec* s, uint64_t id) {
    bool waited = false;
    for (;;) {
        uint64_t st = s->state.load(std::memory_order_acquire);
        if (st == word(id, kDone)) return waited;
        if (tag_of(st) == kRun) {
            waited = true;
            cpu_relax();
            continue;
        }
        if (s->state.compare_exchange_strong(st, word(id, kRun), std::memory_order_acq_rel,
                                             std::memory_order_acquire)) {
            prepare_window(s, id);
            s->state.store(word(id, kDone), std::memory_order_release);
            return waited;
        }
    }
}

// Pin the calling thread to `core` (< 0: not pinned); tells start_helper through `pinned`. Returns whether it may
// go on.
inline bool pin_helper(Handoff* s, int core) {
#if defined(__linux__)
    if (core >= CPU_SETSIZE) {
        s->pinned.store(-1, std::memory_order_seq_cst);
        return false;
    }
    if (core >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(core, &set);
        const int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
        s->pinned.store(rc == 0 ? 1 : -1, std::memory_order_seq_cst);
        return rc == 0;
    }
    s->pinned.store(1, std::memory_order_seq_cst);
    return true;
#else
    s->pinned.store(core >= 0 ? -1 : 1, std::memory_order_seq_cst);     // no pinning here
    return core < 0;
#endif
}

// The helper thread: prepare each requested window; spin spin_us after the last one, then sleep until woken.
template <class Exec>
void helper_main(Exec* s, int core) {
    if (!pin_helper(s, core)) return;
    uint64_t last_work = now_ns(), spins = 0;
    while (!s->stop.load(std::memory_order_acquire)) {
        uint64_t st = s->state.load(std::memory_order_acquire);
        if (tag_of(st) == kReq && s->state.compare_exchange_strong(st, word(st >> 2, kRun), std::memory_order_acq_rel,
                                                                   std::memory_order_acquire)) {
            prepare_window(s, st >> 2);
            s->state.store(word(st >> 2, kDone), std::memory_order_release);
            last_work = now_ns();
            continue;
        }
        cpu_relax();
        if (++spins % 256 || now_ns() - last_work < (uint64_t)s->spin_us * 1000) continue;
        const int seen = s->wake.load(std::memory_order_seq_cst);
        s->sleeping.store(1, std::memory_order_seq_cst);
        st = s->state.load(std::memory_order_seq_cst);
        if (tag_of(st) != kReq && !s->stop.load(std::memory_order_seq_cst)) futex_wait(&s->wake, seen);
        s->sleeping.store(0, std::memory_order_seq_cst);
        last_work = now_ns();
    }
}

// Starts the helper thread (pinned to `core` when core >= 0; it spins spin_us after its last prepare, then sleeps
// until the next push). Returns 0; -1 when it already runs; -2 when no thread can be started; -3 when the core is
// refused (not one this process may run on; no thread is left running then); -4 while profiling is on (its
// slots are the pushing thread's).
template <class Exec>
int start_helper(Exec* s, int core, int spin_us) {
    if (s->helper_on) return -1;
    if (s->profiling) return -4;
    s->spin_us = spin_us < 0 ? 0 : spin_us;
    s->stop.store(0);
    s->pinned.store(0);
    try {
        s->helper = std::thread(helper_main<Exec>, s, core);
    } catch (...) {
        return -2;
    }
    int pinned;
    while ((pinned = s->pinned.load(std::memory_order_seq_cst)) == 0) std::this_thread::yield();
    if (pinned < 0) {
        s->helper.join();
        return -3;
    }
    s->helper_on = true;
    return 0;
}

inline void stop_helper(Handoff* s) {
    if (!s->helper_on) return;
    s->stop.store(1, std::memory_order_seq_cst);
    s->wake.fetch_add(1, std::memory_order_seq_cst);
    futex_wake(&s->wake);
    s->helper.join();
    s->helper_on = false;
}

}  // namespace handoff
}  // namespace edgehft

#endif  // EDGEHFT_CPU_HANDOFF_H_
