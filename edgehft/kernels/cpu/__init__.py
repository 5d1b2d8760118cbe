"""The ``cpu`` board's native kernels (``cpu_conv.cpp``, ``cpu_lstm.cpp``, ``cpu_ops.cpp``) through ctypes:
``build`` builds and loads them, ``conv``, ``lstm`` and ``ops`` wrap one family each. The native plans
(:mod:`edgehft.compiler.native`, :mod:`edgehft.runtime.native_chain`) chain them with LiteRT segments.
"""
