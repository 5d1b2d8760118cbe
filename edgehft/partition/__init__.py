"""Partitioners: which ops of the int8 IR run on a board's accelerator and which fall back to its CPU.

The contract is :class:`edgehft.partition.contract.Partitioner` (``predict(model, board, **board_options) ->
Report``, one signature for every backend), found by name through :mod:`edgehft.backends`; each backend's
object sits in a module named after it (``coral.py``, ``pynq.py``, ``jetson.py``) over its own helpers,
named after the backend too: ``coral_rules`` (what the Edge TPU compiler maps), ``coral_predict``,
``coral_compiled`` (what a compiled model holds), ``coral_report``, ``coral_options`` (its ``-m/-a/-i``);
``jetson_predict`` (TensorRT's ONNX parser and DLA rules), ``jetson_confirmed`` (the engine inspector's
placement). A partitioner reads the IR and writes the shared report schema; it never imports the compiler
pipeline.
"""
