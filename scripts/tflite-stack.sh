#!/usr/bin/env bash
# Install this checkout (editable, no native kernel build) into VENV on a board's tflite-runtime stack:
# pyproject.toml's dependencies with tflite-runtime in place of ai-edge-litert and numpy < 2 (tflite-runtime's
# ABI), plus the extra requirements given (e.g. "pynq==3.1.2" pytest). Used by board-venv.sh (the PYNQ-Z2) and
# box-pythons.sh (.venv-py3.10-tflite).
#   bash scripts/tflite-stack.sh VENV [REQUIREMENT ...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=$1
shift
"$venv/bin/python" -m pip install -q tomli
mapfile -t deps < <("$venv/bin/python" -c 'import re, tomli
deps = tomli.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not re.match(r"(ai-edge-litert|tflite-runtime|numpy)\b", d)))')
EDGEHFT_SKIP_NATIVE_KERNELS=1 "$venv/bin/python" -m pip install -q --no-deps -e .
echo "$venv: pip will say edgehft requires ai-edge-litert: expected, this venv runs tflite-runtime instead"
"$venv/bin/python" -m pip install -q "numpy>=1.23,<2" "tflite-runtime>=2.13" "${deps[@]}" "$@"
