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
    VENV=.venv-board-z2 PYNQ=3.1.2 INTERPRETER=tflite_runtime
    PY=$(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.10.*/bin/python3 2>/dev/null | sort -V | tail -1 || true)
    if [ -z "$PY" ]; then
        echo "no Python 3.10 under pyenv: .venv-board-z2 (the PYNQ-Z2's stack) not made, its tests not run" >&2
        exit 0
    fi
else
    VENV=.venv-board PYNQ=4.0.0 INTERPRETER=ai_edge_litert PY=${PYTHON:-python3}
fi
CHECK='import sys, pathlib, importlib.metadata, numpy, pynq, '$INTERPRETER', pytest, edgehft
assert any(e.name == "edgehft" for e in importlib.metadata.entry_points(group="pytest11")), "HIL plugin entry point"
assert numpy.__version__.split(".")[0] == "1", "numpy " + numpy.__version__
assert pynq.__version__ == "'$PYNQ'", "pynq " + pynq.__version__
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
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
echo '*' > "$VENV/.gitignore"                 # keep the venv out of git status
"$VENV/bin/python" -m pip install -q --upgrade pip
if [ "$FLAVOUR" = z2 ]; then
    bash scripts/tflite-stack.sh "$VENV" "pynq==$PYNQ" "pycparser<3" pytest
else
    # One resolver run, so edgehft's core dependencies are chosen under pynq's numpy < 2.
    "$VENV/bin/python" -m pip install -q "pynq==$PYNQ" "numpy<2" "ai-edge-litert==2.3.0" pytest -e .
fi
"$VENV/bin/python" -c "$CHECK"
kernels
echo "$VENV ready: $VENV/bin/python -m pytest -q tests/board"
