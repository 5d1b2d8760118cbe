// edgehft native CPU LSTM: the per-target functions of cpu_lstm.cpp, shared by the LSTM kernel
// (edgehft_lstm_run: the whole window) and the stream executor (cpu_stream.cpp: one tick at a time), so both
// compute every step with the same code and give the same bits on every target.
#ifndef EDGEHFT_CPU_LSTM_H_
#define EDGEHFT_CPU_LSTM_H_

namespace edgehft {
namespace lstm {

// One Highway target's code (cpu_lstm.cpp's header comment has the numerics). All pointers 64-byte aligned
// where a row of N (a multiple of 16) floats starts; H <= N / 4.
struct Fns {
    // G[T][N] = X[T][K] @ W[K][N] + b (X row stride ldx): per element, b then k ascending, fused multiply-adds.
    void (*gemm)(const float* X, int ldx, int T, int K, const float* W, int N, const float* b, float* G);
    // One step: z = g + hprev @ U (k ascending; hprev null: step 0, z = g), then the gates: c updated
    // (clamped to +-clip when clip > 0), h[0..H) written. z: N floats of scratch.
    void (*step)(const float* g, const float* hprev, int H, int N, const float* U, float* c, float* h, float* z,
                 float clip);
    // th[i] = tanh(x[i]), sg[i] = sigmoid(x[i]) as step computes them (the accuracy probe).
    void (*act)(const float* x, float* th, float* sg, int n);
    // One step with its own input projection: z = b + x @ W (k < K ascending) + hprev @ U, summed in that order
    // in the same registers, so with the same roundings as gemm's G row followed by step (the same bits);
    // the sum after x @ W is also stored to g when g is not null (the row's projection, for later windows).
    void (*step_in)(const float* b, const float* x, int K, const float* W, float* g, const float* hprev, int H,
                    int N, const float* U, float* c, float* h, float* z, float clip);
};

// The functions of Highway slot ``slot`` (cpu_dispatch.h: kAvx3 .. kFallback), nullptr for a slot this
// library did not compile or one out of range.
const Fns* fns(int slot);

}  // namespace lstm
}  // namespace edgehft

#endif  // EDGEHFT_CPU_LSTM_H_
