"""The PYNQ overlay's INT8 kernels, as references an accelerator is checked against.

``params`` derives one op's integer parameters from the IR (:mod:`edgehft.ir.tflite_model`) the way
TFLite's ``Prepare()`` does; ``reference`` runs the op with explicit integer steps (numpy int64, no float
in the datapath), bit-exact with the named LiteRT interpreter path; ``blob`` is the parameter layout the
fabric reads; ``csim`` loads the kernels' HLS C++ (``bitstreams/kernels``) built with g++ for the emulated
board.
"""
