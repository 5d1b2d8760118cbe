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
#include <cstdlib>
#include <cstring>

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

}  // namespace edgehft

// One table entry per slot, as the kernel families' tables are laid out: NAME's per-target copy
// (&N_<TARGET>::NAME) or nullptr where that target was not compiled. Use where HWY_ONCE holds.
#define EDGEHFT_SLOT_TABLE(NAME) \
    { nullptr, nullptr, HWY_CHOOSE_AVX3(NAME), HWY_CHOOSE_AVX2(NAME), HWY_CHOOSE_NEON(NAME), HWY_CHOOSE_FALLBACK(NAME) }

#endif  // EDGEHFT_CPU_DISPATCH_H_
