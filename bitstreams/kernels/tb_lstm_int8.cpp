// C testbench of lstm_int8_top for Vitis HLS csim (hls_kernel.tcl adds it with add_files -tb) and
// for g++ (tests/emulated/test_kernel_csim.py builds and runs it, with -fsanitize=undefined).
//
//   tb_lstm_int8 [VECTORS]       (default: tb_lstm_int8.dat in the working directory)
//
// VECTORS is written by edgehft.kernels.fpga.csim.write_testbench_vectors from the numpy golden model
// (edgehft/kernels/fpga/reference.py): per case one window (steps x n_in) and its expected output
// (steps x n_hidden), from TFLite's initial state. For each case: mode 1 on a slot never loaded must
// leave y alone; mode 0 loads the blob; mode 1 must reproduce y bit for bit (twice in a row: the state
// restarts on every call). Exit status: 0 when every case passes, 1 when one fails, 2 when the file cannot
// be read.
#include <cstdint>
#include <cstdio>
#include <vector>

void lstm_int8_top(uint32_t mode, uint32_t steps, uint32_t n_in, uint32_t n_hidden, const int8_t* weights,
                   const int32_t* params, const int8_t* x, int8_t* y, uint32_t slot);

#define TB_TOP lstm_int8_top
#define TB_KIND 2u
#define TB_NAME "lstm_int8"
#define TB_DEFAULT_FILE "tb_lstm_int8.dat"
#include "tb_common.h"
