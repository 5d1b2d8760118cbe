#!/usr/bin/env bash
# Install everything the tests need and run them: the main suite in .venv (TensorFlow, the compiler),
# then the board-side suite in .venv-board (pynq 4.0.0, numpy < 2, no TensorFlow), as a board has it.
set -euo pipefail
source "$(dirname "$0")/venv.sh" compile,bench,dev
bash scripts/board-venv.sh
status=0
.venv/bin/python -m pytest -q "$@" || status=$?
.venv-board/bin/python -m pytest -q "$@" tests/board || status=$?
exit $status
