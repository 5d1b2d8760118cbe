"""Latency measurement: replay real ticks through a runner and summarize p50 … p99.9 in µs."""
