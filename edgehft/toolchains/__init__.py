"""Drivers for vendor tools (``edgetpu_compiler``; TensorRT's builder and engine inspector, on a Jetson):
find, run isolated, parse their verdicts. Named after the vendor's tool, not the backend.

Kept apart from the partitioners (which predict) and the backends (which run): a driver only turns a
vendor tool's output into our data.
"""
