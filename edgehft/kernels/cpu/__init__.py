"""The ``cpu`` board's native kernels (``cpu_conv.cpp``, ``cpu_lstm.cpp``, ``cpu_ops.cpp``) through ctypes:
``build`` builds and loads them as one library and chooses its SIMD target at run time (Google Highway's
AVX3 / AVX2 / NEON / scalar code from one build, and the conv's own AVX512_BF16 and AMX-BF16 levels;
``build.targets()``, ``build.dispatch_target()``, ``build.force_target()``, ``$EDGEHFT_CPU_TARGET``);
``conv``, ``lstm`` and ``ops`` wrap one family each, ``stream`` the stream executor (``cpu_stream.cpp``:
one push runs the last LSTM step of each layer and the head, prepare the steps before it). The native plans (:mod:`edgehft.compiler.native`,
:mod:`edgehft.runtime.native_chain`) chain them with LiteRT segments.
"""
