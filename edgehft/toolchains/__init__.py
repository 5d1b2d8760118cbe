"""Drivers for vendor tools (``edgetpu_compiler`` today): find, run isolated, parse their verdicts.

Kept apart from the partitioners (which predict) and the backends (which run): a driver only turns a
vendor tool's output into our data.
"""
