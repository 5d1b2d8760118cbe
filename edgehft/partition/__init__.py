"""Partitioners: which ops of the int8 IR run on a board's accelerator and which fall back to its CPU.

One module per vendor (``edgetpu.py`` for the Coral Edge TPU compiler's rules). A partitioner reads
the IR and writes the shared report schema; it never imports the compiler pipeline.
"""
