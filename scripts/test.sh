#!/usr/bin/env bash
# Install everything the tests need and run them: the main suite in .venv (TensorFlow, the compiler),
# then the board-side suite in .venv-board (pynq 4.0.0, numpy < 2, no TensorFlow), as a board has it, and
# again in .venv-board-z2 (the PYNQ-Z2's PYNQ 3.1 stack on Python 3.10 with tflite-runtime).
# The deploy tests also need Debian's openssh-server (scripts/sshd.sh installs it when missing), the
# aarch64 and AVX2 checks QEMU and an aarch64 cross compiler (scripts/cross-tools.sh).
# The main suite is tests/{unit,compile,emulated,deploy,hw} (the groups in tests/conftest.py; tests/board
# skips there). Arguments go to every run, e.g. `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
source "$(dirname "$0")/venv.sh" compile,bench,dev
bash scripts/board-venv.sh
bash scripts/board-venv.sh z2  # the PYNQ-Z2's stack: pynq 3.1 on Python 3.10, tflite-runtime (tests/board)
bash scripts/sshd.sh
bash scripts/cross-tools.sh
bash scripts/box-ort.sh        # onnxruntime beside the board venv: a box with ONNX Runtime (tests/deploy)
bash scripts/box-pythons.sh    # the box side on Python 3.10, 3.12 and 3.10 with tflite-runtime (tests/pythons)
selects=0                     # a -m/-k selection may leave one of the runs with no test (pytest exit 5)
for a in "$@"; do case $a in -m|-k|-m?*|-k?*) selects=1 ;; esac; done
status=0
run() {
    "$@" || { rc=$?; [ "$rc" -eq 5 ] && [ "$selects" -eq 1 ] || status=$rc; }
}
run .venv/bin/python -m pytest -q "$@"
run .venv-board/bin/python -m pytest -q "$@" tests/board
if [ -x .venv-board-z2/bin/python ]; then
    run .venv-board-z2/bin/python -m pytest -q "$@" tests/board
else
    echo "tests/board on the PYNQ-Z2's stack not run: no .venv-board-z2 (needs Python 3.10 under pyenv)" >&2
fi
exit $status
