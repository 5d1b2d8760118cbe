"""Streaming inference: one tick in, one signal out.

A sliding window gains one row at the bottom and drops its oldest row each tick, so most of what a model
computes for window t+1 was already computed for window t (rows one position lower), or depends only on
rows received before the tick and can be computed ahead of it. This package works out, op by op, which:

- :mod:`edgehft.streaming.analysis`: the analysis of a TFLite graph (the IR a cpu bundle holds) along the
  input's time axis: per op the rows cached, prepared ahead of the tick and on the critical path, the
  recurrence steps of each kind, MACs per tick, and why a model cannot stream
  (``from edgehft.streaming.analysis import analyze``; ``python -m edgehft.streaming.analysis
  BUNDLE_OR_TFLITE [--json]``). Box side: numpy and the IR reader only, no TensorFlow.
- :mod:`edgehft.streaming.rows` and :mod:`edgehft.streaming.ops`: the row bookkeeping and the per-op rules
  the analysis is built from.
- :mod:`edgehft.streaming.stream`: the stream a runner opens (``runner.stream()``: ``push(row)``,
  ``prepare()``, ``reset()``), over the native stream executor (:mod:`edgehft.kernels.cpu.stream`,
  ``cpu_stream.cpp``) for the cpu board's native LSTM plans.

Nothing is imported here, so ``python -m edgehft.streaming.analysis`` runs the module once.
"""
