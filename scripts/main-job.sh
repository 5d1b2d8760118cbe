#!/usr/bin/env bash
# The main job on real data with the embedded default (the cpu board): install, compile the trained
# DeepLOB on a real Binance depth capture, check the golden vectors, benchmark on real ticks.
source "$(dirname "$0")/venv.sh" compile,bench
D=examples/deeplob/data
mkdir -p build
.venv/bin/edgehft compile examples/deeplob/deeplob.keras --board cpu \
    --calib $D/btcusd_perp_20240808_depth.gz --out build/deeplob.cpu --force   # the job owns build/deeplob.cpu
.venv/bin/edgehft run build/deeplob.cpu --golden
# The feeds are raw captures: --run-features lets the bundle's own feature pipeline (features/features.py, a
# hash-checked copy of examples/deeplob/features.py) turn them into windows. Without it edgehft runs no code
# from a bundle and takes only .npy/.npz windows.
.venv/bin/edgehft run build/deeplob.cpu --run-features --ticks $D/btcusd_perp_20240808_depth.gz \
    --ticks $D/btcusd_perp_20240809_depth.gz --limit 5
.venv/bin/edgehft bench build/deeplob.cpu --run-features --ticks $D/btcusd_perp_20240808_depth.gz \
    --ticks $D/btcusd_perp_20240809_depth.gz --samples 5000 --affinity 0 --plot build/deeplob_latency.png
