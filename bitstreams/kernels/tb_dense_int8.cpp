// C testbench of dense_int8_top for Vitis HLS csim (hls_kernel.tcl adds it with add_files -tb) and
// for g++ (tests/emulated/test_kernel_csim.py builds and runs it, with -fsanitize=undefined).
//
//   tb_dense_int8 [VECTORS]      (default: tb_dense_int8.dat in the working directory)
//
// VECTORS is written by edgehft.kernels.fpga.csim.write_testbench_vectors from the numpy golden model
// (edgehft/kernels/fpga/reference.py). For each case: mode 1 on a slot never loaded must leave y alone;
// mode 0 loads the blob; mode 1 must reproduce the expected y bit for bit (twice in a row). Exit status:
// 0 when every case passes, 1 when one fails, 2 when the file cannot be read.
#include <cstdint>
#include <cstdio>
#include <vector>

void dense_int8_top(uint32_t mode, uint32_t rows, uint32_t n_in, uint32_t n_out, const int8_t* weights,
                    const int32_t* params, const int8_t* x, int8_t* y, uint32_t slot);

#define TB_TOP dense_int8_top
#define TB_KIND 1u
#define TB_NAME "dense_int8"
#define TB_DEFAULT_FILE "tb_dense_int8.dat"
#include "tb_common.h"
