"""Golden integer models of TFLite int8 kernels, the reference an accelerator kernel is checked against.

``params`` derives one op's integer parameters from the IR (:mod:`edgehft.ir.tflite_model`) the way
TFLite's ``Prepare()`` does; ``reference`` runs the op with explicit integer steps (numpy int64, no float
in the datapath), bit-exact with the named LiteRT interpreter path. Ground floor: imports numpy and the
IR only, never TensorFlow, so boards can run it.
"""
