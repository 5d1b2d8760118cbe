#!/usr/bin/env bash
# The main job on real data with the embedded default (the cpu board): install, compile the trained
# DeepLOB on a real Binance depth capture, check the golden vectors, benchmark on real ticks.
source "$(dirname "$0")/venv.sh" compile,bench
D=examples/deeplob/data
mkdir -p build
.venv/bin/edgehft compile examples/deeplob/deeplob.keras --board cpu \
    --calib $D/btcusd_perp_20240808_depth.gz --out build/deeplob.cpu
.venv/bin/edgehft run build/deeplob.cpu --golden
.venv/bin/edgehft run build/deeplob.cpu --ticks $D/btcusd_perp_20240808_depth.gz \
    --ticks $D/btcusd_perp_20240809_depth.gz --limit 5
.venv/bin/edgehft bench build/deeplob.cpu --ticks $D/btcusd_perp_20240808_depth.gz \
    --ticks $D/btcusd_perp_20240809_depth.gz --samples 5000 --affinity 0 --plot build/deeplob_latency.png
