// edgehft int8 kernels: the fixed-point helpers of TFLite's int8 arithmetic, shared by dense_int8.cpp
// and lstm_int8.cpp (Vitis HLS) and by the host emulation's libedgehft_kernels.so (g++).
//
// Bit-exact with the numpy golden model edgehft/kernels/fpga/reference.py, which is bit-exact with LiteRT
// 2.3.0. Followed (written from the published algorithms, not copied):
//   gemmlowp fixedpoint/fixedpoint.h: SaturatingRoundingDoublingHighMul, RoundingDivideByPOT,
//     SaturatingRoundingMultiplyByPOT, exp_on_interval_between_negative_one_quarter_and_0_excl,
//     exp_on_negative_values, one_over_one_plus_x_for_x_in_0_1 (Newton-Raphson), logistic, tanh;
//   tensorflow/lite/kernels/internal/common.cc: MultiplyByQuantizedMultiplier (both roundings);
//   ruy kernel_avx512.cc (the x86 multiplier application LiteRT 2.3.0's FULLY_CONNECTED runs);
//   XNNPACK's fp32 requantization (float32 product, round to nearest even).
//
// Care taken so g++ and HLS agree with numpy's int64 arithmetic:
//   - no signed overflow and no left shift of a negative value (undefined in C++14): left shifts and
//     wrapping adds go through uint32_t, narrowing goes through explicit wrap16/wrap32;
//   - right shifts of negative values are arithmetic (g++ and Vitis HLS define them so; C++20 mandates
//     it), matching numpy's >> on int64; divisions truncate toward zero as gemmlowp's do;
//   - int64_t holds every intermediate that numpy computes in int64 (sums of an int32 and an int16,
//     the 32x32 products of the high multiply, the rounding offsets of the ruy and single shifts).
#ifndef EDGEHFT_INT8_OPS_H
#define EDGEHFT_INT8_OPS_H

#include <cmath>
#include <cstdint>

namespace edgehft {

// Requantization modes (params word 7 of the blob, edgehft/kernels/fpga/blob.py REQUANTIZE).
enum Requantize : int32_t {
  RQ_GEMMLOWP = 0,  // RoundingDivideByPOT(SRDHM(x << left, M), right): TFLite common.cc, double rounding
  RQ_RUY_X86 = 1,   // SRDHM without saturation, then a shift rounding ties toward +inf (ruy x86)
  RQ_FP32 = 2,      // rint_even(float(acc) * float scale) (XNNPACK, LiteRT's AUTO path)
  RQ_SINGLE = 3,    // (x * M + 2^(30 - shift)) >> (31 - shift) (TFLITE_SINGLE_ROUNDING)
  RQ_FLOAT64 = 4,   // round_half_away(double(acc) * double scale) (LiteRT's BUILTIN_REF path)
};

// Kernel status codes (returned by the host entry points; the HLS top just returns).
enum Status : int32_t {
  ST_OK = 0, ST_BAD_MODE = 1, ST_BAD_SLOT = 2, ST_TOO_LARGE = 3, ST_BAD_PARAMS = 4,
  ST_NOT_LOADED = 5, ST_SIZE_MISMATCH = 6, ST_BAD_REQUANTIZE = 7,
};

// Blob header (edgehft/kernels/fpga/blob.py): words common to both kernels.
static const int32_t BLOB_MAGIC = 0x54464845;  // "EHFT" little-endian
static const int32_t BLOB_VERSION = 1;
static const int32_t BLOB_HEADER_WORDS = 32;
static const int32_t KIND_DENSE = 1, KIND_LSTM = 2;
enum HeaderWord { H_MAGIC = 0, H_VERSION = 1, H_KIND = 2, H_HEADER_WORDS = 3, H_TOTAL_WORDS = 4,
                  H_N_IN = 5, H_N_OUT = 6, H_ROUNDING = 7 };

// ---- saturating / wrapping casts ----------------------------------------------------------------

inline int32_t wrap32(int64_t v) {  // C++ conversion to int32: keep the low 32 bits
  uint32_t u = static_cast<uint32_t>(static_cast<uint64_t>(v));
  return u >= 0x80000000u ? static_cast<int32_t>(static_cast<int64_t>(u) - 0x100000000ll)
                          : static_cast<int32_t>(u);
}
inline int32_t wrap16(int64_t v) {  // gemmlowp int16 arithmetic: promoted to int, narrowed back
  int32_t w = static_cast<int32_t>(static_cast<uint64_t>(v) & 0xFFFFu);
  return w >= 0x8000 ? w - 0x10000 : w;
}
inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }
inline int32_t sat16(int64_t v) { return static_cast<int32_t>(clamp64(v, -32768, 32767)); }
inline int32_t sat8(int64_t v) { return static_cast<int32_t>(clamp64(v, -128, 127)); }
inline int32_t add32_wrap(int32_t a, int32_t b) {  // int32 accumulation that wraps like the kernels
  return wrap32(static_cast<int64_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b)));
}
inline int32_t shl32_wrap(int32_t x, int32_t left) {  // x * 2^left wrapped to int32 (left >= 0)
  return left >= 32 ? 0 : wrap32(static_cast<int64_t>(static_cast<uint32_t>(x) << left));
}

// ---- gemmlowp fixedpoint.h primitives ------------------------------------------------------------

// SaturatingRoundingDoublingHighMul on int32 (VQRDMULH): round(a * b / 2^31), ties toward +inf via a
// sign-dependent nudge and truncating division; INT32_MIN * INT32_MIN saturates.
inline int32_t srdhm32(int32_t a, int32_t b) {
  if (a == INT32_MIN && b == INT32_MIN) return INT32_MAX;
  int64_t ab = static_cast<int64_t>(a) * b;
  int64_t nudge = ab >= 0 ? (1ll << 30) : (1 - (1ll << 30));
  return wrap32((ab + nudge) / (1ll << 31));
}

// The same on int16 raw values (FixedPoint<int16> operator*).
inline int32_t srdhm16(int32_t a, int32_t b) {
  if (a == -32768 && b == -32768) return 32767;
  int32_t ab = a * b;
  int32_t nudge = ab >= 0 ? (1 << 14) : (1 - (1 << 14));
  return wrap16((ab + nudge) / (1 << 15));
}

// RoundingDivideByPOT: arithmetic shift right by exponent (0..62), ties away from zero.
inline int64_t rdbpot(int64_t x, int32_t exponent) {
  int64_t mask = (1ll << exponent) - 1;
  int64_t remainder = x & mask;
  int64_t threshold = (mask >> 1) + (x < 0 ? 1 : 0);
  return (x >> exponent) + (remainder > threshold ? 1 : 0);
}

// MultiplyByQuantizedMultiplier(int32 x, int32 M, int shift) -> int32 in one of the integer modes
// (shift > 0 is a left shift). Matches reference.multiply_by_quantized_multiplier.
// Shifts outside QuantizeMultiplier's range (-31..30 single, any left shift otherwise) are clamped
// where that cannot change the result (a right shift by 32..62 of an int32 gives 0 either way) or
// where numpy's result is itself meaningless (single rounding, shift > 30): never undefined behaviour.
inline int32_t mbqm(int32_t x, int32_t m, int32_t shift, int32_t mode) {
  int32_t left = shift > 0 ? shift : 0;
  int32_t right = shift > 0 ? 0 : (shift < -62 ? 62 : -shift);
  if (mode == RQ_SINGLE) {
    int32_t total = 31 - shift;
    total = total < 1 ? 1 : (total > 62 ? 62 : total);
    return wrap32((static_cast<int64_t>(x) * m + (1ll << (total - 1))) >> total);
  }
  int32_t xl = shl32_wrap(x, left);
  if (mode == RQ_RUY_X86) {
    int64_t v = (static_cast<int64_t>(xl) * m + (1ll << 30)) >> 31;
    int64_t round = right > 0 ? (1ll << (right - 1)) : 0;
    return wrap32((v + round) >> right);
  }
  return static_cast<int32_t>(rdbpot(srdhm32(xl, m), right));  // RQ_GEMMLOWP
}

// ---- FixedPoint<int16, IntegerBits>: raw int16 values held in int32_t ---------------------------

inline int32_t add16(int32_t a, int32_t b) { return wrap16(static_cast<int64_t>(a) + b); }
inline int32_t mul16(int32_t a, int32_t b) { return srdhm16(a, b); }
// GEMMLOWP_CHECKED_FIXEDPOINT_CONSTANT for int16: the int32 constant rounded to its top 16 bits.
inline int32_t const16(int32_t raw32) { return wrap16(rdbpot(raw32, 16)); }

// SaturatingRoundingMultiplyByPOT<exponent> on int16.
inline int32_t sat_mul_pot16(int32_t x, int32_t exponent) {
  if (exponent == 0) return x;
  if (exponent < 0) return static_cast<int32_t>(rdbpot(x, -exponent));
  int32_t threshold = (1 << (15 - exponent)) - 1;
  if (x > threshold) return 32767;
  if (x < -threshold) return -32768;
  return wrap16(static_cast<int64_t>(static_cast<uint32_t>(x) << exponent));
}

inline int32_t rounding_half_sum16(int32_t a, int32_t b) {
  int32_t s = a + b;
  return wrap16((s + (s >= 0 ? 1 : -1)) / 2);
}

// exp_on_interval_between_negative_one_quarter_and_0_excl (Q0.15 in and out).
inline int32_t exp_quarter16(int32_t a) {
  const int32_t constant_term = const16(1895147668), one_third = const16(715827883);
  int32_t x = add16(a, 1 << 12);  // a + 1/8
  int32_t x2 = mul16(x, x);
  int32_t x3 = mul16(x2, x);
  int32_t x4 = mul16(x2, x2);
  int32_t x4_over_4 = static_cast<int32_t>(rdbpot(x4, 2));
  int32_t poly = static_cast<int32_t>(rdbpot(add16(mul16(add16(x4_over_4, x3), one_third), x2), 1));
  return sat16(static_cast<int64_t>(constant_term) + mul16(constant_term, add16(x, poly)));
}

// exp_on_negative_values: exp(a) for a <= 0 in Q<integer_bits>, result Q0.15.
inline int32_t exp_on_negative_values16(int32_t a, int32_t integer_bits) {
  static const int32_t barrel_exp[7] = {-2, -1, 0, 1, 2, 3, 4};
  static const int32_t barrel_mul[7] = {1672461947, 1302514674, 790015084, 290630308, 39332535, 720401, 242};
  const int32_t frac = 15 - integer_bits;
  const int32_t one_quarter = 1 << (frac - 2);
  int32_t a_mod = add16(a & (one_quarter - 1), -one_quarter);
  int32_t result = exp_quarter16(sat_mul_pot16(a_mod, integer_bits));
  int32_t remainder = add16(a_mod, -a);
  for (int k = 0; k < 7; k++) {
#pragma HLS UNROLL
    if (integer_bits > barrel_exp[k] && (remainder & (1 << (frac + barrel_exp[k]))) != 0)
      result = mul16(result, const16(barrel_mul[k]));
  }
  if (integer_bits > 5 && a < const16(-(1 << (36 - integer_bits)))) result = 0;
  return a == 0 ? 32767 : result;
}

// The Newton-Raphson loop of one_over_one_plus_x_for_x_in_0_1 / one_minus_x_over_one_plus_x_...:
// x ~= 1 / half_denominator in Q2.13.
inline int32_t newton_reciprocal16(int32_t half_denominator) {
  const int32_t one_q2 = 1 << 13;
  int32_t x = add16(const16(1515870810), mul16(half_denominator, const16(-1010580540)));  // 48/17 - 32/17 d
  for (int i = 0; i < 3; i++) {
#pragma HLS UNROLL
    int32_t one_minus = add16(one_q2, -mul16(half_denominator, x));
    x = add16(x, sat_mul_pot16(mul16(x, one_minus), 2));
  }
  return x;
}

// gemmlowp logistic of a Q3.12 int16, Q0.15 int16 result (PortableApplySigmoid).
inline int16_t sigmoid_int16(int32_t a) {
  if (a == 0) return static_cast<int16_t>(const16(1 << 30));
  bool positive = a > 0;
  int32_t abs_in = positive ? a : wrap16(-static_cast<int64_t>(a));
  int32_t e = exp_on_negative_values16(wrap16(-static_cast<int64_t>(abs_in)), 3);
  int32_t r_pos = sat_mul_pot16(newton_reciprocal16(rounding_half_sum16(e, 32767)), 1);
  return static_cast<int16_t>(positive ? r_pos : add16(32767, -r_pos));
}

// gemmlowp tanh of a Q<integer_bits> int16 (0..6), Q0.15 int16 result (PortableApplyTanh).
inline int16_t tanh_int16(int32_t a, int32_t integer_bits) {
  if (a == 0) return 0;
  bool negative = a < 0;
  int32_t n = negative ? a : wrap16(-static_cast<int64_t>(a));
  int32_t e = exp_on_negative_values16(n, integer_bits + 1);  // exp(2n): ExactMulByPot<1>
  int32_t t = sat_mul_pot16(add16(newton_reciprocal16(rounding_half_sum16(e, 32767)), -(1 << 13)), 2);
  return static_cast<int16_t>(negative ? wrap16(-static_cast<int64_t>(t)) : t);
}

// ---- FULLY_CONNECTED output stage ------------------------------------------------------------------

// acc (int32) -> requantized value before the output zero point, in any mode. The float modes clamp
// in float before converting (the result is clamped to int8 afterwards, so +-2^20 loses nothing and
// keeps the conversion defined); std::rint rounds half to even under the default rounding mode, as
// numpy's rint does, std::round half away from zero as C round() does.
inline int64_t requantize(int32_t acc, int32_t m, int32_t shift, float scale32, double scale64, int32_t mode) {
  if (mode == RQ_FP32) {
    float r = std::rint(static_cast<float>(acc) * scale32);
    r = r < -1048576.0f ? -1048576.0f : (r > 1048576.0f ? 1048576.0f : r);
    return static_cast<int64_t>(r);
  }
  if (mode == RQ_FLOAT64) {
    double r = std::round(static_cast<double>(acc) * scale64);
    r = r < -1048576.0 ? -1048576.0 : (r > 1048576.0 ? 1048576.0 : r);
    return static_cast<int64_t>(r);
  }
  return mbqm(acc, m, shift, mode);
}

}  // namespace edgehft

#endif  // EDGEHFT_INT8_OPS_H
