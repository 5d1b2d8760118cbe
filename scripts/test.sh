#!/usr/bin/env bash
# Install everything the tests need into .venv and run them.
source "$(dirname "$0")/venv.sh" compile,bench,dev
exec .venv/bin/python -m pytest -q "$@"
