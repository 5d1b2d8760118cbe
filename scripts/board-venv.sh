#!/usr/bin/env bash
# Create .venv-board: the board-side venv for pynq and the tests in tests/board.
#   scripts/board-venv.sh && .venv-board/bin/python -m pytest -q tests/board
# pynq 4.0.0 pins numpy < 2 (and grpcio 1.64 / protobuf < 6), so it cannot share .venv with
# TensorFlow 2.21. This venv gets edgehft's core only (no extras: no TensorFlow), as a board has.
# Idempotent: does nothing when .venv-board exists and its imports work. PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=.venv-board
CHECK='import sys, pathlib, importlib.metadata, numpy, pynq, ai_edge_litert, pytest, edgehft
assert any(e.name == "edgehft" for e in importlib.metadata.entry_points(group="pytest11")), "HIL plugin entry point"
assert numpy.__version__.split(".")[0] == "1", "numpy " + numpy.__version__
assert pynq.__version__ == "4.0.0", "pynq " + pynq.__version__
assert pathlib.Path(edgehft.__file__).resolve().parents[1] == pathlib.Path.cwd().resolve(), edgehft.__file__'

# The native kernel library the editable install builds into edgehft/kernels/cpu/prebuilt (hatch_build.py),
# so the box side opens native bundles without a compiler; stale once a kernel source changes.
KERNELS='from edgehft.kernels.cpu.build import prebuilt_library; assert prebuilt_library() is not None'
kernels() {
    "$VENV/bin/python" -c "$KERNELS" 2>/dev/null && return 0
    "$VENV/bin/python" -m pip install -q --no-deps -e .          # rebuilds the prebuilt library
    "$VENV/bin/python" -c "$KERNELS" 2>/dev/null ||
        echo "warning: no prebuilt native kernel library (needs g++ and libhwy-dev); native bundles build it at first open" >&2
}

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
    kernels
    echo "$VENV is up to date"
    exit 0
fi
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
echo '*' > "$VENV/.gitignore"                 # keep the venv out of git status
"$VENV/bin/python" -m pip install -q --upgrade pip
# One resolver run, so edgehft's core dependencies are chosen under pynq's numpy < 2.
"$VENV/bin/python" -m pip install -q "pynq==4.0.0" "numpy<2" "ai-edge-litert==2.3.0" pytest -e .
"$VENV/bin/python" -c "$CHECK"
kernels
echo "$VENV ready: $VENV/bin/python -m pytest -q tests/board"
