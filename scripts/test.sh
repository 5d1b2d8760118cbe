#!/usr/bin/env bash
# Install everything the tests need and run them: the main suite in .venv (TensorFlow, the compiler),
# then the board-side suite in .venv-board (pynq 4.0.0, numpy < 2, no TensorFlow), as a board has it.
# The deploy tests also need Debian's openssh-server (scripts/sshd.sh installs it when missing).
set -euo pipefail
source "$(dirname "$0")/venv.sh" compile,bench,dev
bash scripts/board-venv.sh
bash scripts/sshd.sh
status=0
.venv/bin/python -m pytest -q "$@" || status=$?
.venv-board/bin/python -m pytest -q "$@" tests/board || status=$?
exit $status
