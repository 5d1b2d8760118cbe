#!/usr/bin/env bash
# On a Jetson (or any machine with an NVIDIA GPU, TensorRT 8.6/10.x/11.x and cuda-python): build the
# TensorRT engines for DeepLOB and the MLP from bundles compiled on a host, check them against the
# bundles' golden vectors (tolerance in each manifest), and print p50/p99 latency.
#
#   host$  edgehft compile examples/deeplob/deeplob.keras --board jetson-orin-nx \
#              --calib examples/deeplob/data/btcusd_perp_20240808_depth.gz --out build/deeplob.jetson
#   host$  edgehft compile MLP.keras --board jetson-orin-nx --calib mlp_windows.npy --out build/mlp.jetson
#   board$ bash benchmarks/jetson_check.sh build/deeplob.jetson build/mlp.jetson [--dla-core 0]
#
# Exit status: 0 all golden checks passed; otherwise the first failing command's status (7 no GPU or
# TensorRT, 4 the builder refused, 8 golden vectors outside the tolerance).
set -euo pipefail
BUNDLES=()
EXTRA=()
for a in "$@"; do
    case "$a" in
        --*) EXTRA+=("$a") ;;
        *) if [[ ${#EXTRA[@]} -gt 0 && ${EXTRA[-1]} == --dla-core && "$a" =~ ^[0-9]+$ ]]; then EXTRA+=("$a"); else BUNDLES+=("$a"); fi ;;
    esac
done
[ ${#BUNDLES[@]} -gt 0 ] || { echo "usage: $0 BUNDLE... [--dla-core N]" >&2; exit 2; }
nvidia-smi -L 2>/dev/null || cat /etc/nv_tegra_release 2>/dev/null || true
python3 -c "import tensorrt, sys; print('TensorRT', tensorrt.__version__, 'python', sys.version.split()[0])"
for b in "${BUNDLES[@]}"; do
    echo "== $b"
    edgehft build-engine "$b" "${EXTRA[@]}"
    edgehft run "$b" --golden
    x=$(mktemp --suffix=.npy)
    python3 - "$b" "$x" <<'PY'
import sys
import numpy as np
z = np.load(f"{sys.argv[1]}/golden.npz")
x = next(v for k, v in z.items() if k.startswith("inputs/"))
np.save(sys.argv[2], np.concatenate([x] * 64))          # the golden windows, cycled
PY
    edgehft bench "$b" --ticks "$x" --samples 2000 --warmup 200
    rm -f "$x"
done
