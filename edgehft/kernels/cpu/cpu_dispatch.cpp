// edgehft native CPU kernels: the run-time target choice (see cpu_dispatch.h) and its C API.
//
//   edgehft_cpu_targets()        the slots this CPU runs, best first, comma-separated ("avx3,avx2,scalar")
//   edgehft_cpu_set_target(name) force a slot for kernels created from now on (null or "": the best again)
//   edgehft_cpu_target()         the slot new kernels use now
//   edgehft_cpu_compiled()       the Highway targets compiled into this library ("AVX3,AVX2,SCALAR")
#include "cpu_dispatch.h"

#include <atomic>
#include <cstring>
#include <string>

#include "hwy/highway.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define EDGEHFT_X86_LINUX 1
#endif

namespace edgehft {
namespace {

const char* const kNames[kSlots] = {"amx", "avx3_bf16", "avx3", "avx2", "neon", "scalar"};
const int64_t kHwy[kSlots] = {0, 0, HWY_AVX3, HWY_AVX2, HWY_NEON, 0};

// Which Highway targets were compiled (HWY_TARGETS of this translation unit: the same in every source,
// they share cpu_dispatch.h's target set).
bool compiled(int slot) {
    if (slot == kFallback) return true;
    return kHwy[slot] != 0 && (HWY_TARGETS & kHwy[slot]) != 0;
}

#ifdef EDGEHFT_X86_LINUX
bool amx_check() {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tile = d & (1u << 24), bf16 = d & (1u << 22);
    if (!tile || !bf16) return false;
    // Linux: a process must ask for the AMX tile data state before its first tile instruction.
    const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}
#endif

// The CPU features each Highway x86 target's code may use (its HWY_TARGET_STR); the compiler's checks
// also require the OS to save the wider registers (XCR0).
bool cpu_runs(int slot) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
                      __builtin_cpu_supports("f16c") && __builtin_cpu_supports("pclmul") &&
                      __builtin_cpu_supports("aes") && __builtin_cpu_supports("sse4.2");
    const bool avx3 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
    if (slot == kAvx2) return avx2;
    if (slot == kAvx3) return avx3;
    if (slot == kAvx3Bf16) return avx3 && __builtin_cpu_supports("avx512bf16");
#ifdef EDGEHFT_X86_LINUX
    if (slot == kAmx) return avx3 && __builtin_cpu_supports("avx512bf16") && amx_check();   // its fill: VCVTNE2PS2BF16
#endif
    return slot == kFallback;
#elif defined(__aarch64__)
    return slot == kNeon || slot == kFallback;        // NEON (Advanced SIMD) is part of every AArch64 CPU
#else
    return slot == kFallback;
#endif
}

int best_slot() {
    for (int s = 0; s < kSlots; ++s)
        if (slot_supported(s)) return s;
    return kFallback;
}

std::atomic<int> g_forced{-1};

}  // namespace

bool slot_supported(int slot) {
    static const unsigned mask = [] {
        unsigned m = 0;
        for (int s = 0; s < kSlots; ++s)
            if ((s == kAmx || s == kAvx3Bf16 || compiled(s)) && cpu_runs(s)) m |= 1u << s;
        return m;
    }();
    return slot >= 0 && slot < kSlots && (mask >> slot & 1u);
}

int current_slot() {
    const int f = g_forced.load(std::memory_order_relaxed);
    return f >= 0 ? f : best_slot();
}

int simd_slot(int slot) {
    if (slot != kAmx && slot != kAvx3Bf16) return slot;
    for (int s = kAvx3; s < kSlots; ++s)
        if (slot_supported(s)) return s;
    return kFallback;
}

}  // namespace edgehft

extern "C" {

const char* edgehft_cpu_targets() {
    static const std::string list = [] {
        std::string out;
        for (int s = 0; s < edgehft::kSlots; ++s)
            if (edgehft::slot_supported(s)) out += (out.empty() ? "" : ",") + std::string(edgehft::kNames[s]);
        return out;
    }();
    return list.c_str();
}

// 0 when set; -1 for a name that is no slot; -2 for a slot this CPU (or this build) does not run.
int edgehft_cpu_set_target(const char* name) {
    if (!name || !*name) {
        edgehft::g_forced.store(-1);
        return 0;
    }
    for (int s = 0; s < edgehft::kSlots; ++s)
        if (strcmp(name, edgehft::kNames[s]) == 0) {
            if (!edgehft::slot_supported(s)) return -2;
            edgehft::g_forced.store(s);
            return 0;
        }
    return -1;
}

const char* edgehft_cpu_target() { return edgehft::kNames[edgehft::current_slot()]; }

const char* edgehft_cpu_slot_name(int slot) {
    return slot >= 0 && slot < edgehft::kSlots ? edgehft::kNames[slot] : "";
}

const char* edgehft_cpu_compiled() {
    static const std::string list = [] {
        std::string out;
        for (int s = edgehft::kAvx3; s < edgehft::kSlots; ++s)
            if (edgehft::compiled(s))
                out += (out.empty() ? "" : ",") +
                       std::string(s == edgehft::kFallback ? hwy::TargetName((HWY_TARGETS & HWY_EMU128) ? HWY_EMU128
                                                                                                  : HWY_SCALAR)
                                                           : hwy::TargetName(edgehft::kHwy[s]));
        return out;
    }();
    return list.c_str();
}

}  // extern "C"
