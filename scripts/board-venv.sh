#!/usr/bin/env bash
# Create a board-side venv for pynq and the tests in tests/board, on a PYNQ image's software stack:
#   scripts/board-venv.sh      .venv-board: pynq 4.0.0 (the ZU+ boards' PYNQ 4.0), ai-edge-litert, this Python
#   scripts/board-venv.sh z2   .venv-board-z2: the PYNQ-Z2's PYNQ 3.1 stack: pynq 3.1.2 on pyenv's Python 3.10,
#                              tflite-runtime (armv7l has no ai-edge-litert), pycparser < 3 (pynq 3.1's rpc
#                              module imports pycparser.plyparser, which pycparser 3 removed)
#   then VENV/bin/python -m pytest -q tests/board
# pynq pins numpy < 2 (4.0.0 also grpcio 1.64 / protobuf < 6), so it cannot share .venv with TensorFlow 2.21.
# These venvs get edgehft's core only (no extras: no TensorFlow), as a board has.
# Idempotent: does nothing when the venv exists and its imports work. PYTHON picks .venv-board's interpreter.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
FLAVOUR=${1:-zu}
case $FLAVOUR in
    zu|z2) ;;
    *) echo "unknown board venv flavour '$FLAVOUR': zu (the default, .venv-board) or z2 (.venv-board-z2)" >&2; exit 2 ;;
esac
if [ "$FLAVOUR" = z2 ]; then
    VENV=.venv-board-z2
    PY=$(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.10.*/bin/python3 2>/dev/null | sort -V | tail -1 || true)
    if [ -z "$PY" ]; then
        echo "no Python 3.10 under pyenv: .venv-board-z2 (the PYNQ-Z2's stack) not made, its tests not run" >&2
        exit 0
    fi
else
    VENV=.venv-board
fi
# The recipe is edgehft.emulate.board_venv (it ships with the package: `python -m edgehft.emulate.board_venv`);
# this script runs it from the main venv for this checkout (edgehft editable in the board venv).
HOST_PY=${HOST_PYTHON:-.venv/bin/python}
[ -x "$HOST_PY" ] || HOST_PY=python3
args=(--stack "$FLAVOUR")
[ "$FLAVOUR" = z2 ] && args+=(--python "$PY")
[ "$FLAVOUR" = zu ] && [ -n "${PYTHON:-}" ] && args+=(--python "$PYTHON")
"$HOST_PY" -m edgehft.emulate.board_venv "${args[@]}" "$VENV" pytest

# The native kernel library the editable install builds into edgehft/kernels/cpu/prebuilt (hatch_build.py),
# so the box side opens native bundles without a compiler; stale once a kernel source changes.
KERNELS='from edgehft.kernels.cpu.build import prebuilt_library; assert prebuilt_library() is not None'
"$VENV/bin/python" -c "$KERNELS" 2>/dev/null && exit 0
"$VENV/bin/python" -m pip install -q --no-deps -e .          # rebuilds the prebuilt library
"$VENV/bin/python" -c "$KERNELS" 2>/dev/null ||
    echo "warning: no prebuilt native kernel library (needs g++ and libhwy-dev); native bundles build it at first open" >&2
