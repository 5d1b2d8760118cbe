"""Kernels edgehft itself provides, in two families that share nothing but the C++ build helper
(:mod:`edgehft.kernels.cxx`):

- :mod:`edgehft.kernels.fpga`: the PYNQ overlay's INT8 dense and LSTM kernels, as a bit-exact numpy golden
  model of TFLite's int8 arithmetic (``reference``, ``params``), the byte layout the fabric reads (``blob``)
  and the overlay's HLS C++ built for the host emulation (``csim``);
- :mod:`edgehft.kernels.cpu`: the ``cpu`` board's native kernels (CONV_2D, LSTM and the ops around them,
  ``cpu_*.cpp``) the native plans run, through ctypes.

Ground floor: imports numpy and the IR only, never TensorFlow, so boards can run it.
"""
