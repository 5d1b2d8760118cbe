"""Partitioners: which ops of the int8 IR run on a board's accelerator and which fall back to its CPU.

The contract is :class:`edgehft.partition.contract.Partitioner` (``predict(model, board, **board_options) ->
Report``, one signature for every backend), found by name through :mod:`edgehft.backends`; each backend's
object sits in a module named after it (``coral.py``, ``pynq.py``, ``jetson.py``) over the vendor's rules
(``edgetpu*.py`` for the Edge TPU compiler, ``tensorrt*.py`` for TensorRT). A partitioner reads the IR and
writes the shared report schema; it never imports the compiler pipeline.
"""
