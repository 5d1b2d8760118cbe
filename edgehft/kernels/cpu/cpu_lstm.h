// edgehft native CPU LSTM: the per-target functions of cpu_lstm.cpp, shared by the LSTM kernel
// (edgehft_lstm_run: the whole window) and the stream executor (cpu_stream.cpp: one tick at a time), so both
// compute every step with the same code and give the same bits on every target.
#ifndef EDGEHFT_CPU_LSTM_H_
#define EDGEHFT_CPU_LSTM_H_

#include <cstdint>

namespace edgehft {
namespace lstm {

// One Highway target's code (cpu_lstm.cpp's header comment has the numerics). All pointers 64-byte aligned
// where a row of N (a multiple of 16) floats starts; H <= N / 4.
struct Fns {
    // G[T][N] = X[T][K] @ W[K][N] + b (X row stride ldx): per element, b then k ascending, fused multiply-adds.
    void (*gemm)(const float* X, int ldx, int T, int K, const float* W, int N, const float* b, float* G);
    // One step: z = g + r with r = hprev @ U summed from zero (k ascending; hprev null: step 0, z = g), then the
    // gates: c updated (clamped to +-clip when clip > 0), h[0..H) written. z: N floats of scratch.
    void (*step)(const float* g, const float* hprev, int H, int N, const float* U, float* c, float* h, float* z,
                 float clip);
    // th[i] = tanh(x[i]), sg[i] = sigmoid(x[i]) as step computes them (the accuracy probe).
    void (*act)(const float* x, float* th, float* sg, int n);
    // One step with its own input projection: g = b + x @ W (k < K ascending; gemm's G row roundings), stored to
    // g_out when not null, z = g + s (s: the recurrent sum computed ahead by recurrent; null: z = g), then the
    // gates as step. Gives step's bits for the same row and hprev.
    void (*step_in)(const float* b, const float* x, int K, const float* W, float* g_out, const float* s, int H,
                    int N, float* c, float* h, float* z, float clip);
    // r[0..N) = hprev @ U summed from zero as step sums it (a step's recurrent sum ahead of its input).
    void (*recurrent)(const float* hprev, int H, int N, const float* U, float* r);
    // step with U as bf16 in vector pairs (cpu_lstm.cpp's BF16_PAIRS, built for this target's lanes): the bits
    // step gives with U rounded to bf16 (a widened bf16 is exact), from half the weight bytes.
    void (*step_bf16)(const float* g, const float* hprev, int H, int N, const uint32_t* U, float* c, float* h,
                      float* z, float clip);
    // The target's fp32 lanes per vector (what the BF16_PAIRS layout depends on).
    int (*lanes)();
    // recurrent with U as bf16 in vector pairs (as step_bf16 sums it).
    void (*recurrent_bf16)(const float* hprev, int H, int N, const uint32_t* U, float* r);
};

// The functions of Highway slot ``slot`` (cpu_dispatch.h: kAvx3 .. kFallback), nullptr for a slot this
// library did not compile or one out of range.
const Fns* fns(int slot);

}  // namespace lstm
}  // namespace edgehft

#endif  // EDGEHFT_CPU_LSTM_H_
