#!/usr/bin/env bash
# Install everything the tests need into .venv and run them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[compile,bench,dev]'
exec .venv/bin/python -m pytest -q "$@"
