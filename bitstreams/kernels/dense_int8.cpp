// edgehft dense_int8: TFLite int8 FULLY_CONNECTED (per-tensor or per-channel weights) as a Vitis HLS
// kernel, and the same source g++ builds into the host emulation's libedgehft_kernels.so.
//
// Control interface: bitstreams/kernels/interface.toml (ap_ctrl_hs on s_axilite, arguments from 0x10).
// mode 0: copy weights [n_out][n_in] and the params blob (edgehft/kernels/fpga/blob.py) into slot `slot`.
// mode 1: y[r][o] = clamp(requantize(eff_bias[o] + sum_k W[o][k] x[r][k]) + out_zp, act_min, act_max)
//         for r < rows, with the slot's weights; refused (y untouched) when the slot was never loaded
//         or n_in / n_out disagree with what was loaded.
// Arithmetic: tensorflow/lite/kernels/internal/reference/integer_ops/fully_connected.h
// (acc = bias + sum_k W[o][k] (x[k] - in_zp), int32), here as eff_bias + sum_k W[o][k] x[k] with
// eff_bias = bias - in_zp * rowsum(W) precomputed by blob.py (equal modulo 2^32, and both wrap there),
// then the requantization of the interpreter path the bundle's golden vectors come from
// (int8_ops.h requantize(): gemmlowp, ruy-x86, fp32, single or float64).
//
// Loop structure (the cost model of edgehft/partition/pynq.py): per output row, ceil(n_in / LANES)
// chunks at II=1, LANES MACs each, then the requantize pipeline.
#include <cstdint>
#include <cstring>

#include "int8_ops.h"

#ifndef DENSE_MAX_IN
#define DENSE_MAX_IN 4096  // boards/*.toml [overlay] dense_max_in (largest over the boards)
#endif
#ifndef DENSE_MAX_OUT
#define DENSE_MAX_OUT 1024  // dense_max_out
#endif
#ifndef DENSE_SLOTS
#define DENSE_SLOTS 4  // on-chip weight slots (one per FULLY_CONNECTED the overlay runs)
#endif
#ifndef DENSE_LANES
#define DENSE_LANES 32  // int8 MAC lanes (pynq-z2 dense_lanes; set per board with -DDENSE_LANES=...)
#endif

using namespace edgehft;

namespace {

// On-chip memory: one weight matrix and one set of per-channel parameters per slot.
int8_t w_mem[DENSE_SLOTS][DENSE_MAX_OUT][DENSE_MAX_IN];  // lane l of a chunk in bank l
int32_t bias_mem[DENSE_SLOTS][DENSE_MAX_OUT];
int32_t mult_mem[DENSE_SLOTS][DENSE_MAX_OUT];
int32_t shift_mem[DENSE_SLOTS][DENSE_MAX_OUT];
float scale32_mem[DENSE_SLOTS][DENSE_MAX_OUT];
double scale64_mem[DENSE_SLOTS][DENSE_MAX_OUT];
struct DenseSlot {
  int32_t loaded, n_in, n_out, mode, out_zp, act_min, act_max;
};
DenseSlot slots[DENSE_SLOTS];

int32_t load(uint32_t n_in, uint32_t n_out, const int8_t* weights, const int32_t* params, uint32_t slot) {
  if (n_in == 0 || n_out == 0 || n_in > DENSE_MAX_IN || n_out > DENSE_MAX_OUT) return ST_TOO_LARGE;
  const int32_t n = static_cast<int32_t>(n_out);
  const int32_t H = BLOB_HEADER_WORDS;
  if (params[H_MAGIC] != BLOB_MAGIC || params[H_VERSION] != BLOB_VERSION || params[H_KIND] != KIND_DENSE ||
      params[H_HEADER_WORDS] != H || params[H_TOTAL_WORDS] != H + 7 * n ||
      params[H_N_IN] != static_cast<int32_t>(n_in) || params[H_N_OUT] != n)
    return ST_BAD_PARAMS;
  if (params[10] < -128 || params[11] > 127 || params[10] > params[11]) return ST_BAD_PARAMS;  // int8 clamp
  const int32_t mode = params[H_ROUNDING];
  if (mode < RQ_GEMMLOWP || mode > RQ_FLOAT64) return ST_BAD_REQUANTIZE;
  DenseSlot& s = slots[slot];
  s.loaded = 0;  // a failed or partial load leaves the slot unusable
load_weights:
  for (uint32_t o = 0; o < n_out; o++) {
    for (uint32_t k = 0; k < n_in; k++) {
#pragma HLS PIPELINE II=1
      w_mem[slot][o][k] = weights[o * n_in + k];
    }
  }
load_params:
  for (int32_t o = 0; o < n; o++) {
#pragma HLS PIPELINE II=1
    bias_mem[slot][o] = params[H + o];
    mult_mem[slot][o] = params[H + n + o];
    shift_mem[slot][o] = params[H + 2 * n + o];
    uint32_t b32 = static_cast<uint32_t>(params[H + 3 * n + o]);
    uint64_t b64 = static_cast<uint64_t>(static_cast<uint32_t>(params[H + 4 * n + 2 * o])) |
                   (static_cast<uint64_t>(static_cast<uint32_t>(params[H + 4 * n + 2 * o + 1])) << 32);
    float f;
    double d;
    std::memcpy(&f, &b32, sizeof f);  // bit casts (IEEE-754 bits as blob.py stores them)
    std::memcpy(&d, &b64, sizeof d);
    scale32_mem[slot][o] = f;
    scale64_mem[slot][o] = d;
  }
  s.n_in = static_cast<int32_t>(n_in);
  s.n_out = n;
  s.mode = mode;
  s.out_zp = params[9];
  s.act_min = params[10];
  s.act_max = params[11];
  s.loaded = 1;
  return ST_OK;
}

int32_t run(uint32_t rows, uint32_t n_in, uint32_t n_out, const int8_t* x, int8_t* y, uint32_t slot) {
  const DenseSlot& s = slots[slot];
  if (!s.loaded) return ST_NOT_LOADED;
  if (static_cast<int32_t>(n_in) != s.n_in || static_cast<int32_t>(n_out) != s.n_out) return ST_SIZE_MISMATCH;
  int8_t xbuf[DENSE_MAX_IN];
#pragma HLS ARRAY_PARTITION variable=xbuf cyclic factor=DENSE_LANES
  const uint32_t chunks = (n_in + DENSE_LANES - 1) / DENSE_LANES;
rows_loop:
  for (uint32_t r = 0; r < rows; r++) {
  read_x:
    for (uint32_t k = 0; k < n_in; k++) {
#pragma HLS PIPELINE II=1
      xbuf[k] = x[r * n_in + k];
    }
  out_rows:
    for (uint32_t o = 0; o < n_out; o++) {
      int32_t acc = bias_mem[slot][o];
    chunk:
      for (uint32_t c = 0; c < chunks; c++) {
#pragma HLS PIPELINE II=1
        int32_t part = 0;
      lanes:
        for (uint32_t l = 0; l < DENSE_LANES; l++) {
#pragma HLS UNROLL
          uint32_t k = c * DENSE_LANES + l;
          if (k < n_in) part += static_cast<int32_t>(w_mem[slot][o][k]) * xbuf[k];
        }
        acc = add32_wrap(acc, part);  // |part| <= LANES * 2^14: only the running sum can wrap
      }
      int64_t q = requantize(acc, mult_mem[slot][o], shift_mem[slot][o], scale32_mem[slot][o],
                             scale64_mem[slot][o], s.mode);
      y[r * n_out + o] = static_cast<int8_t>(clamp64(q + s.out_zp, s.act_min, s.act_max));
    }
  }
  return ST_OK;
}

int32_t dense_int8(uint32_t mode, uint32_t rows, uint32_t n_in, uint32_t n_out, const int8_t* weights,
                   const int32_t* params, const int8_t* x, int8_t* y, uint32_t slot) {
  if (slot >= DENSE_SLOTS) return ST_BAD_SLOT;
  if (mode == 0) return load(n_in, n_out, weights, params, slot);
  if (mode == 1) return run(rows, n_in, n_out, x, y, slot);
  return ST_BAD_MODE;
}

}  // namespace

// The HLS top. Argument order and names: interface.toml [dense_int8].
void dense_int8_top(uint32_t mode, uint32_t rows, uint32_t n_in, uint32_t n_out, const int8_t* weights,
                    const int32_t* params, const int8_t* x, int8_t* y, uint32_t slot) {
#pragma HLS INTERFACE m_axi port=weights offset=slave bundle=gmem
#pragma HLS INTERFACE m_axi port=params offset=slave bundle=gmem
#pragma HLS INTERFACE m_axi port=x offset=slave bundle=gmem
#pragma HLS INTERFACE m_axi port=y offset=slave bundle=gmem
#pragma HLS INTERFACE s_axilite port=mode bundle=control
#pragma HLS INTERFACE s_axilite port=rows bundle=control
#pragma HLS INTERFACE s_axilite port=n_in bundle=control
#pragma HLS INTERFACE s_axilite port=n_out bundle=control
#pragma HLS INTERFACE s_axilite port=weights bundle=control
#pragma HLS INTERFACE s_axilite port=params bundle=control
#pragma HLS INTERFACE s_axilite port=x bundle=control
#pragma HLS INTERFACE s_axilite port=y bundle=control
#pragma HLS INTERFACE s_axilite port=slot bundle=control
#pragma HLS INTERFACE s_axilite port=return bundle=control
#pragma HLS ARRAY_PARTITION variable=w_mem cyclic factor=DENSE_LANES dim=3
  dense_int8(mode, rows, n_in, n_out, weights, params, x, y, slot);
}

#ifndef __SYNTHESIS__
// Host entry points of libedgehft_kernels.so (ctypes, edgehft/kernels/fpga/csim.py): the same kernel with
// its status, and the fixed-point helpers for the tests. Not part of the synthesized IP.
extern "C" {
int32_t edgehft_dense_int8(uint32_t mode, uint32_t rows, uint32_t n_in, uint32_t n_out, const int8_t* weights,
                           const int32_t* params, const int8_t* x, int8_t* y, uint32_t slot) {
  return dense_int8(mode, rows, n_in, n_out, weights, params, x, y, slot);
}
void edgehft_dense_reset(void) { std::memset(slots, 0, sizeof slots); }
int32_t edgehft_dense_slot(uint32_t slot, int32_t* out) {  // loaded, n_in, n_out, rounding
  if (slot >= DENSE_SLOTS) return ST_BAD_SLOT;
  out[0] = slots[slot].loaded; out[1] = slots[slot].n_in; out[2] = slots[slot].n_out; out[3] = slots[slot].mode;
  return ST_OK;
}
int32_t edgehft_dense_limits(int32_t* out) {  // max_in, max_out, slots, lanes
  out[0] = DENSE_MAX_IN; out[1] = DENSE_MAX_OUT; out[2] = DENSE_SLOTS; out[3] = DENSE_LANES;
  return 4;
}
void edgehft_mbqm(const int32_t* x, const int32_t* m, const int32_t* shift, int32_t mode, int32_t* out, int32_t n) {
  for (int32_t i = 0; i < n; i++) out[i] = mbqm(x[i], m[i], shift[i], mode);
}
void edgehft_requantize(const int32_t* acc, int32_t m, int32_t shift, float s32, double s64, int32_t mode,
                        int64_t* out, int32_t n) {
  for (int32_t i = 0; i < n; i++) out[i] = requantize(acc[i], m, shift, s32, s64, mode);
}
void edgehft_sigmoid_int16(const int16_t* x, int16_t* out, int32_t n) {
  for (int32_t i = 0; i < n; i++) out[i] = sigmoid_int16(x[i]);
}
void edgehft_tanh_int16(const int16_t* x, int32_t integer_bits, int16_t* out, int32_t n) {
  for (int32_t i = 0; i < n; i++) out[i] = tanh_int16(x[i], integer_bits);
}
}
#endif
