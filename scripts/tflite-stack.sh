#!/usr/bin/env bash
# Install this checkout (editable) into VENV on a board's tflite-runtime stack: pyproject.toml's box-side
# dependencies with tflite-runtime in place of ai-edge-litert and numpy < 2 (tflite-runtime's ABI), plus the extra
# requirements given (e.g. pytest). The recipe is edgehft.emulate.board_venv.install_tflite_runtime_stack (the
# PYNQ-Z2's venv installs the same way); this runs it from the main venv. Used by box-pythons.sh
# (.venv-py3.10-tflite).
#   bash scripts/tflite-stack.sh VENV [REQUIREMENT ...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
HOST_PY=${HOST_PYTHON:-.venv/bin/python}
[ -x "$HOST_PY" ] || HOST_PY=python3
EDGEHFT_SKIP_NATIVE_KERNELS=1 "$HOST_PY" -c 'import sys
from pathlib import Path
from edgehft.emulate.board_venv import edgehft_requirement, install_tflite_runtime_stack
install_tflite_runtime_stack(Path(sys.argv[1]) / "bin" / "python", edgehft_requirement(), tuple(sys.argv[2:]))' "$@"
