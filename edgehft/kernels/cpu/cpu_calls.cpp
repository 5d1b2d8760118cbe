// edgehft native call list: a native plan's predict (edgehft.runtime.native_chain.bind) as one native call.
//
// The hot path of a chain of native kernels is a fixed list of kernel calls with pointers resolved once: every
// kernel's run entry point is int run(void* handle, const void* in, float* out) (0 on success), and a linked conv
// (cpu_conv.cpp's edgehft_conv_run_link) takes the next conv as a fourth argument. Calling them from Python costs
// ~0.35 µs of ctypes each (DeepLOB's plan makes 20); this runs the list in C, in order, and reports failures.
#include <cstdint>

namespace {
typedef int (*Run3)(void*, const void*, float*);
typedef int (*Run4)(void*, const void*, float*, void*);
}  // namespace

extern "C" {

// One call: fn(handle, in, out) when next is 0, else fn(handle, in, out, next) (ctypes mirrors it: every field a
// 64-bit integer, addresses included).
struct EdgehftBoundCall {
    int64_t fn, handle, in, out, next, nargs;
};

// Runs calls[0 .. n) in order (every one, also after a failure). Returns how many returned non-zero.
int edgehft_calls_run(const EdgehftBoundCall* calls, int n) {
    int failed = 0;
    for (int i = 0; i < n; i++) {
        const EdgehftBoundCall& c = calls[i];
        void* h = reinterpret_cast<void*>(c.handle);
        const void* in = reinterpret_cast<const void*>(c.in);
        float* out = reinterpret_cast<float*>(c.out);
        const int rc = c.nargs == 4 ? reinterpret_cast<Run4>(c.fn)(h, in, out, reinterpret_cast<void*>(c.next))
                                    : reinterpret_cast<Run3>(c.fn)(h, in, out);
        failed += rc != 0;
    }
    return failed;
}

}  // extern "C"
