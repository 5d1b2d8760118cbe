// edgehft lstm_int8: TFLite's int8x8_16 UNIDIRECTIONAL_SEQUENCE_LSTM (no CIFG, peephole, projection or
// layer norm; batch 1) as a Vitis HLS kernel, and the same source g++ builds into the host emulation's
// libedgehft_kernels.so.
//
// Control interface: bitstreams/kernels/interface.toml (ap_ctrl_hs on s_axilite, arguments from 0x10).
// mode 0: copy weights [4 gates][n_hidden][n_in + n_hidden] and the params blob (edgehft/kernels/fpga/blob.py)
//         into slot `slot`.
// mode 1: run x [steps][n_in] -> y [steps][n_hidden] from TFLite's initial state (h = the output state's
//         zero point, c = 0: the runtime resets LiteRT's variable tensors before every call); refused
//         (y untouched) when the slot was never loaded or n_in / n_hidden disagree with what was loaded.
// Arithmetic, step by step as tensorflow/lite/kernels/lstm_eval.cc LstmStepInteger8x8_16:
//   CalculateLstmGateInteger8x8_16: gate = sat16(MBQM(W_x x + b_x) + MBQM(W_h h + b_h)) in Q3.12
//     (portable_tensor_utils.cc MatrixBatchVectorMultiplyAccumulate, int16 output), then the gemmlowp
//     logistic (input, forget, output) or tanh with 3 integer bits (cell);
//   UpdateLstmCellInteger: c = sat16(wrap16(RDBPOT(f c, 15)) + wrap16(RDBPOT(i g, 30 + cell_scale))),
//     then CwiseClipping when a cell clip is set;
//   CalculateLstmOutputInteger8x8_16: h = sat8(MBQM(o tanh(c), M_h) + hidden_zp), tanh with
//     15 + cell_scale integer bits; h is also the step's output.
//
// Loop structure (the cost model of edgehft/partition/pynq.py): per step, the 4 gates' MACs over LANES
// lanes at II=1, then the n_hidden-element cell/hidden update pipelined at II=1.
#include <cstdint>
#include <cstring>

#include "int8_ops.h"

#ifndef LSTM_MAX_IN
#define LSTM_MAX_IN 512  // boards/*.toml [overlay] lstm_max_in (largest over the boards)
#endif
#ifndef LSTM_MAX_HIDDEN
#define LSTM_MAX_HIDDEN 256  // lstm_max_hidden
#endif
#ifndef LSTM_MAX_STEPS
#define LSTM_MAX_STEPS 512  // lstm_max_steps
#endif
#ifndef LSTM_SLOTS
#define LSTM_SLOTS 4  // on-chip weight slots (one per LSTM layer the overlay runs)
#endif
#ifndef LSTM_LANES
#define LSTM_LANES 128  // int8 MAC lanes (pynq-z2 lstm_lanes; set per board with -DLSTM_LANES=...)
#endif
#define LSTM_ROW (LSTM_MAX_IN + LSTM_MAX_HIDDEN)  // on-chip row stride: input then recurrent weights

using namespace edgehft;

namespace {

int8_t w_mem[LSTM_SLOTS][4 * LSTM_MAX_HIDDEN][LSTM_ROW];  // rows gate-major; lane l in bank l
int32_t bx_mem[LSTM_SLOTS][4][LSTM_MAX_HIDDEN];  // input effective bias
int32_t bh_mem[LSTM_SLOTS][4][LSTM_MAX_HIDDEN];  // recurrent effective bias
struct LstmSlot {
  int32_t loaded, n_in, n_h, rounding;
  int32_t in_mult[4], in_shift[4], rec_mult[4], rec_shift[4];
  int32_t h0, hidden_zp, hidden_mult, hidden_shift, cell_exp, cell_clip;
};
LstmSlot slots[LSTM_SLOTS];

int32_t load(uint32_t n_in, uint32_t n_h, const int8_t* weights, const int32_t* params, uint32_t slot) {
  if (n_in == 0 || n_h == 0 || n_in > LSTM_MAX_IN || n_h > LSTM_MAX_HIDDEN) return ST_TOO_LARGE;
  const int32_t n = static_cast<int32_t>(n_h), H = BLOB_HEADER_WORDS;
  if (params[H_MAGIC] != BLOB_MAGIC || params[H_VERSION] != BLOB_VERSION || params[H_KIND] != KIND_LSTM ||
      params[H_HEADER_WORDS] != H || params[H_TOTAL_WORDS] != H + 16 + 8 * n ||
      params[H_N_IN] != static_cast<int32_t>(n_in) || params[H_N_OUT] != n)
    return ST_BAD_PARAMS;
  const int32_t rounding = params[H_ROUNDING];
  if (rounding != RQ_GEMMLOWP && rounding != RQ_SINGLE) return ST_BAD_REQUANTIZE;
  if (params[14] < -15 || params[14] > -9) return ST_BAD_PARAMS;  // cell scale 2^-15..2^-9
  LstmSlot& s = slots[slot];
  s.loaded = 0;
  const uint32_t row = n_in + n_h;
load_weights:
  for (uint32_t r = 0; r < 4 * n_h; r++) {
    for (uint32_t k = 0; k < row; k++) {
#pragma HLS PIPELINE II=1
      w_mem[slot][r][k] = weights[r * row + k];
    }
  }
  for (int g = 0; g < 4; g++) {
    s.in_mult[g] = params[H + g];
    s.in_shift[g] = params[H + 4 + g];
    s.rec_mult[g] = params[H + 8 + g];
    s.rec_shift[g] = params[H + 12 + g];
  load_bias:
    for (int32_t j = 0; j < n; j++) {
#pragma HLS PIPELINE II=1
      bx_mem[slot][g][j] = params[H + 16 + g * n + j];
      bh_mem[slot][g][j] = params[H + 16 + 4 * n + g * n + j];
    }
  }
  s.n_in = static_cast<int32_t>(n_in);
  s.n_h = n;
  s.rounding = rounding;
  s.h0 = params[9];
  s.hidden_zp = params[10];
  s.hidden_mult = params[12];
  s.hidden_shift = params[13];
  s.cell_exp = params[14];
  s.cell_clip = params[15];
  s.loaded = 1;
  return ST_OK;
}

int32_t run(uint32_t steps, uint32_t n_in, uint32_t n_h, const int8_t* x, int8_t* y, uint32_t slot) {
  const LstmSlot& s = slots[slot];
  if (!s.loaded) return ST_NOT_LOADED;
  if (static_cast<int32_t>(n_in) != s.n_in || static_cast<int32_t>(n_h) != s.n_h) return ST_SIZE_MISMATCH;
  if (steps > LSTM_MAX_STEPS) return ST_TOO_LARGE;
  int8_t xh[LSTM_ROW];           // this step's input, then the previous hidden state
  int16_t cell[LSTM_MAX_HIDDEN];
  int16_t gate[4][LSTM_MAX_HIDDEN];
#pragma HLS ARRAY_PARTITION variable=xh cyclic factor=LSTM_LANES
#pragma HLS ARRAY_PARTITION variable=gate complete dim=1
  const uint32_t row = n_in + n_h, chunks = (row + LSTM_LANES - 1) / LSTM_LANES;
  const int32_t tanh_bits = 15 + s.cell_exp;
init_state:
  for (uint32_t j = 0; j < n_h; j++) {
#pragma HLS PIPELINE II=1
    xh[n_in + j] = static_cast<int8_t>(s.h0);
    cell[j] = 0;
  }
steps_loop:
  for (uint32_t t = 0; t < steps; t++) {
  read_x:
    for (uint32_t k = 0; k < n_in; k++) {
#pragma HLS PIPELINE II=1
      xh[k] = x[t * n_in + k];
    }
  gates:
    for (uint32_t g = 0; g < 4; g++) {
    cells:
      for (uint32_t j = 0; j < n_h; j++) {
        const uint32_t r = g * n_h + j;
        int32_t acc_x = bx_mem[slot][g][j], acc_h = bh_mem[slot][g][j];
      chunk:
        for (uint32_t c = 0; c < chunks; c++) {
#pragma HLS PIPELINE II=1
          int32_t px = 0, ph = 0;
        lanes:
          for (uint32_t l = 0; l < LSTM_LANES; l++) {
#pragma HLS UNROLL
            const uint32_t k = c * LSTM_LANES + l;
            const int32_t prod = k < row ? static_cast<int32_t>(w_mem[slot][r][k]) * xh[k] : 0;
            if (k < n_in) px += prod; else ph += prod;
          }
          acc_x = add32_wrap(acc_x, px);
          acc_h = add32_wrap(acc_h, ph);
        }
        const int32_t gx = sat16(mbqm(acc_x, s.in_mult[g], s.in_shift[g], s.rounding));
        gate[g][j] = static_cast<int16_t>(
            sat16(static_cast<int64_t>(mbqm(acc_h, s.rec_mult[g], s.rec_shift[g], s.rounding)) + gx));
      }
    }
  update:
    for (uint32_t j = 0; j < n_h; j++) {
#pragma HLS PIPELINE II=1
      const int32_t i_g = sigmoid_int16(gate[0][j]), f_g = sigmoid_int16(gate[1][j]);
      const int32_t c_g = tanh_int16(gate[2][j], 3), o_g = sigmoid_int16(gate[3][j]);
      int32_t c = sat16(static_cast<int64_t>(wrap16(rdbpot(f_g * cell[j], 15))) +
                        wrap16(rdbpot(i_g * c_g, 30 + s.cell_exp)));
      if (s.cell_clip > 0) c = static_cast<int32_t>(clamp64(c, -s.cell_clip, s.cell_clip));
      const int32_t h = sat8(static_cast<int64_t>(mbqm(o_g * tanh_int16(c, tanh_bits), s.hidden_mult,
                                                       s.hidden_shift, s.rounding)) + s.hidden_zp);
      cell[j] = static_cast<int16_t>(c);
      xh[n_in + j] = static_cast<int8_t>(h);
      y[t * n_h + j] = static_cast<int8_t>(h);
    }
  }
  return ST_OK;
}

int32_t lstm_int8(uint32_t mode, uint32_t steps, uint32_t n_in, uint32_t n_h, const int8_t* weights,
                  const int32_t* params, const int8_t* x, int8_t* y, uint32_t slot) {
  if (slot >= LSTM_SLOTS) return ST_BAD_SLOT;
  if (mode == 0) return load(n_in, n_h, weights, params, slot);
  if (mode == 1) return run(steps, n_in, n_h, x, y, slot);
  return ST_BAD_MODE;
}

}  // namespace

// The HLS top. Argument order and names: interface.toml [lstm_int8].
void lstm_int8_top(uint32_t mode, uint32_t steps, uint32_t n_in, uint32_t n_hidden, const int8_t* weights,
                   const int32_t* params, const int8_t* x, int8_t* y, uint32_t slot) {
#pragma HLS INTERFACE m_axi port=weights offset=slave bundle=gmem
#pragma HLS INTERFACE m_axi port=params offset=slave bundle=gmem
#pragma HLS INTERFACE m_axi port=x offset=slave bundle=gmem
#pragma HLS INTERFACE m_axi port=y offset=slave bundle=gmem
#pragma HLS INTERFACE s_axilite port=mode bundle=control
#pragma HLS INTERFACE s_axilite port=steps bundle=control
#pragma HLS INTERFACE s_axilite port=n_in bundle=control
#pragma HLS INTERFACE s_axilite port=n_hidden bundle=control
#pragma HLS INTERFACE s_axilite port=weights bundle=control
#pragma HLS INTERFACE s_axilite port=params bundle=control
#pragma HLS INTERFACE s_axilite port=x bundle=control
#pragma HLS INTERFACE s_axilite port=y bundle=control
#pragma HLS INTERFACE s_axilite port=slot bundle=control
#pragma HLS INTERFACE s_axilite port=return bundle=control
#pragma HLS ARRAY_PARTITION variable=w_mem cyclic factor=LSTM_LANES dim=3
  lstm_int8(mode, steps, n_in, n_hidden, weights, params, x, y, slot);
}

#ifndef __SYNTHESIS__
// Host entry points of libedgehft_kernels.so (ctypes, edgehft/kernels/fpga/csim.py). Not synthesized.
extern "C" {
int32_t edgehft_lstm_int8(uint32_t mode, uint32_t steps, uint32_t n_in, uint32_t n_hidden, const int8_t* weights,
                          const int32_t* params, const int8_t* x, int8_t* y, uint32_t slot) {
  return lstm_int8(mode, steps, n_in, n_hidden, weights, params, x, y, slot);
}
void edgehft_lstm_reset(void) { std::memset(slots, 0, sizeof slots); }
int32_t edgehft_lstm_slot(uint32_t slot, int32_t* out) {  // loaded, n_in, n_hidden, rounding
  if (slot >= LSTM_SLOTS) return ST_BAD_SLOT;
  out[0] = slots[slot].loaded; out[1] = slots[slot].n_in; out[2] = slots[slot].n_h; out[3] = slots[slot].rounding;
  return ST_OK;
}
int32_t edgehft_lstm_limits(int32_t* out) {  // max_in, max_hidden, max_steps, slots, lanes
  out[0] = LSTM_MAX_IN; out[1] = LSTM_MAX_HIDDEN; out[2] = LSTM_MAX_STEPS; out[3] = LSTM_SLOTS;
  out[4] = LSTM_LANES;
  return 5;
}
}
#endif
