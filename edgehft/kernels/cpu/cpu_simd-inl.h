// edgehft native CPU kernels: SIMD helpers shared by the kernel sources, compiled once per Highway target
// (include it inside the foreach_target.h re-inclusion, after hwy/highway.h; Highway's -inl.h idiom).
#if defined(EDGEHFT_CPU_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef EDGEHFT_CPU_SIMD_INL_H_
#undef EDGEHFT_CPU_SIMD_INL_H_
#else
#define EDGEHFT_CPU_SIMD_INL_H_
#endif

#include <cmath>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace edgehft {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// a * b + c rounded once, on every target: Highway's MulAdd is a true FMA on AVX2, AVX3 and AArch64 NEON,
// but a separate multiply and add on the SCALAR / EMU128 fallbacks, which here compute each lane with
// std::fma instead. So every target gives the same bits for the same order of operations.
template <class D, class V>
HWY_INLINE V Fma(D d, V a, V b, V c) {
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
    HWY_ALIGN float A[4], B[4], C[4];
    hn::Store(a, d, A);
    hn::Store(b, d, B);
    hn::Store(c, d, C);
    for (size_t i = 0; i < hn::Lanes(d); ++i) A[i] = std::fma(A[i], B[i], C[i]);
    return hn::Load(d, A);
#else
    (void)d;
    return hn::MulAdd(a, b, c);
#endif
}

// v clamped to [lo, hi] with comparisons, so a NaN passes through unchanged on every target (Highway's
// Min/Max return the other operand for a NaN on some targets and the NaN on others).
template <class V>
HWY_INLINE V ClampKeepNaN(V v, V lo, V hi) {
    v = hn::IfThenElse(hn::Gt(v, hi), hi, v);
    return hn::IfThenElse(hn::Lt(v, lo), lo, v);
}

// The first n lanes at p (n >= the lane count: a whole vector; fewer: the rest zero), and their store (only
// those lanes written). A whole vector takes a plain load or store: AVX2's masked store (VMASKMOVPS) costs
// ~10x a store on AMD Zen, so the masked forms are kept for a row's last, partial vector.
template <class D>
HWY_INLINE hn::Vec<D> LoadN(D d, const float* HWY_RESTRICT p, size_t n) {
    return n >= hn::Lanes(d) ? hn::LoadU(d, p) : hn::MaskedLoad(hn::FirstN(d, n), d, p);
}

template <class D>
HWY_INLINE void StoreN(D d, hn::Vec<D> v, float* HWY_RESTRICT p, size_t n) {
    if (n >= hn::Lanes(d)) hn::StoreU(v, d, p);
    else hn::BlendedStore(v, hn::FirstN(d, n), d, p);
}

}  // namespace HWY_NAMESPACE
}  // namespace edgehft
HWY_AFTER_NAMESPACE();

#endif  // EDGEHFT_CPU_SIMD_INL_H_
