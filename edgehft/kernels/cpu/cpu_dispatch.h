// edgehft native CPU kernels: which SIMD target runs, chosen at run time from one build.
//
// Every kernel source (cpu_lstm.cpp, cpu_conv.cpp, cpu_ops.cpp) is compiled once per Google Highway target
// through hwy/foreach_target.h (one copy of its SIMD code per target, in namespace N_<TARGET>), without
// -march: the library runs on any CPU of its architecture. The targets compiled (slots, best first):
//     x86-64:  AVX3 (AVX-512 F/VL/DQ/BW), AVX2 (with FMA, BMI2, F16C), and the baseline fallback
//     aarch64: NEON, and the fallback
//     other:   the fallback
// The fallback is Highway's SCALAR target (EMU128 with GCC >= 12.3): plain C++, one lane at a time.
// Two more levels above AVX3 on x86-64, used by the conv kernel only (its own code, cpu_conv.cpp; the other
// kernels run their best Highway slot there): AVX3_BF16 (AVX-512 with AVX512_BF16's VDPBF16PS: AMD Zen 4
// and later, Intel Cooper Lake and Sapphire Rapids and later) and AMX-BF16 (Intel Sapphire Rapids and later,
// Linux).
//
// Highway's own dynamic dispatch (HWY_EXPORT / HWY_DYNAMIC_DISPATCH) keeps its chosen target in libhwy's
// targets.cc, which Debian ships only as a shared library (libhwy.so.1, no static archive): using it would
// make every prebuilt kernel library need libhwy1 on the box. So the choice is ours, from the compiler's
// CPU checks (__builtin_cpu_supports: CPUID and the OS's XSAVE state), into tables built with Highway's
// HWY_CHOOSE_<TARGET> macros; the library needs nothing beyond libc, libm and libstdc++ at run time.
//
// The choice is made when a kernel is created (each kernel object keeps its target's functions), so a
// target can be forced for the kernels created after edgehft_cpu_set_target (tests, benchmarks) while
// kernels created before keep theirs.
#ifndef EDGEHFT_CPU_DISPATCH_H_
#define EDGEHFT_CPU_DISPATCH_H_

// Highway targets this library compiles (SSSE3/SSE4: every x86-64 box of the fleet has AVX2; AVX3_DL: its
// attribute string enables AVX-VNNI, which AVX-512 CPUs such as AMD Zen 4 lack, and the fp32 kernels gain
// nothing from it; SVE: not detected here, NEON covers aarch64).
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE      // the fallback too, on aarch64 (whose baseline is NEON) as on x86
#endif
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS \
    (HWY_SSSE3 | HWY_SSE4 | HWY_AVX3_DL | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

// Unrolls the loop that follows completely (up to 32 iterations): for loops over a compile-time count of
// accumulator vectors, so the accumulators stay in registers. Without it GCC -O3 peels at most 16 iterations
// and keeps a longer array of accumulators in memory: a load and a store around every fused multiply-add
// (the LSTM's recurrent sum over 25 vectors ran at half speed that way, same bits).
#if defined(__clang__)
#define EDGEHFT_UNROLL _Pragma("unroll 32")
#elif defined(__GNUC__)
#define EDGEHFT_UNROLL _Pragma("GCC unroll 32")
#else
#define EDGEHFT_UNROLL
#endif

namespace edgehft {

// Zeroed memory on a 64-byte boundary, rounded up to whole cache lines (at least one), for the kernels' weights
// and buffers; nullptr when out of memory. Freed with free().
inline void* aligned_zeroed(size_t bytes) {
    void* p = nullptr;
    bytes = (bytes + 63) / 64 * 64;
    if (bytes == 0) bytes = 64;
    if (posix_memalign(&p, 64, bytes)) return nullptr;
    memset(p, 0, bytes);
    return p;
}

// aligned_zeroed for n floats.
inline float* aligned_floats(size_t n) { return static_cast<float*>(aligned_zeroed(n * sizeof(float))); }

// The largest finite bf16 value; fp32 values beyond it are rounded to it (saturating, not to infinity).
constexpr float kBf16Max = 3.38953139e38f;

// fp32 -> bf16 bits, round to nearest even, saturating at +-kBf16Max, a NaN to the quiet NaN (the kernels' weight
// rounding, done once when a kernel is created; the SIMD paths round finite activations the same way).
inline uint16_t bf16_bits(float f) {
    if (f != f) return 0x7fc0;                                  // a NaN stays a (quiet) NaN
    f = f > kBf16Max ? kBf16Max : f < -kBf16Max ? -kBf16Max : f;
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

// bf16 bits -> their fp32 value (exact).
inline float bf16_value(uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Target slots, best first. kAmx and kAvx3Bf16 are not Highway targets: the conv kernel's AMX tiles and
// VDPBF16PS code (x86-64 only).
enum Slot { kAmx = 0, kAvx3Bf16 = 1, kAvx3 = 2, kAvx2 = 3, kNeon = 4, kFallback = 5, kSlots = 6 };

// The slot new kernels use now (the best this CPU runs, unless one was forced).
int current_slot();

// The Highway slot (kAvx3 .. kFallback) for a slot: kAmx and kAvx3Bf16 map to the best Highway slot this
// CPU runs.
int simd_slot(int slot);

// Whether this CPU (and OS) runs the slot.
bool slot_supported(int slot);

// Read one byte of every 64-byte line of [p, p + bytes): the memory back into the core's caches (prepare ends with
// the weights the tick reads, which its own work may have evicted). Changes nothing.
inline void warm_lines(const void* p, size_t bytes) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    unsigned sum = 0;
    for (size_t i = 0; i < bytes; i += 64) sum += b[i];
    __asm__ volatile("" : : "r"(sum));
}

}  // namespace edgehft

// One table entry per slot, as the kernel families' tables are laid out: NAME's per-target copy
// (&N_<TARGET>::NAME) or nullptr where that target was not compiled. Use where HWY_ONCE holds.
#define EDGEHFT_SLOT_TABLE(NAME) \
    { nullptr, nullptr, HWY_CHOOSE_AVX3(NAME), HWY_CHOOSE_AVX2(NAME), HWY_CHOOSE_NEON(NAME), HWY_CHOOSE_FALLBACK(NAME) }

#endif  // EDGEHFT_CPU_DISPATCH_H_
