"""Latency measurement: replay real ticks through a runner and summarize p50 … p99.9 in µs (``replay``),
time each step of a bundle's plan (``profile``), and say what machine the figures came from
(``fingerprint``)."""
