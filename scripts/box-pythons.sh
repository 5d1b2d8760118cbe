#!/usr/bin/env bash
# Create .venv-py<V>: edgehft's box side (no extras: no TensorFlow) plus pytest on the other Pythons the boards
# ship (JetPack 5: 3.8, with tflite-runtime, its only TFLite interpreter there, and numpy 1.x, as pyproject.toml's
# markers pick; JetPack 6 and PYNQ 3.x images: 3.10; PYNQ 4.0 and Ubuntu 24.04 boxes: 3.12), from pyenv's interpreters,
# for the tests in tests/pythons (which skip, with the reason, a version whose interpreter or venv is missing).
# V-tflite (e.g. 3.10-tflite): the stack a PYNQ-Z2 (armv7l, no ai-edge-litert wheel) runs: tflite-runtime as
# the interpreter and numpy 1.x, edgehft's other dependencies as pyproject.toml lists them.
#   bash scripts/box-pythons.sh [VERSION ...]      (default: 3.8 3.10 3.12 3.10-tflite)
# Editable installs of this checkout, so the tests run its code; the native kernel library is the one the
# main venv's editable install built into edgehft/kernels/cpu/prebuilt (it does not depend on the Python).
# Idempotent: a venv whose imports work is left as it is.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.8 3.10 3.12 3.10-tflite)
CHECK='import importlib.metadata, pathlib, pytest, edgehft, edgehft.cli, edgehft.runtime, edgehft.deploy.agent
eps = importlib.metadata.entry_points()
eps = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])  # 3.8, 3.9: a dict
assert any(e.name == "edgehft" for e in eps), "HIL plugin entry point"
assert pathlib.Path(edgehft.__file__).resolve().parents[1] == pathlib.Path.cwd().resolve(), edgehft.__file__'
for v in "${versions[@]}"; do
    venv=".venv-py$v"
    py=$(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/"${v%-tflite}".*/bin/python3 2>/dev/null | sort -V | tail -1 || true)
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$CHECK" 2>/dev/null; then
        echo "$venv is up to date"
        continue
    fi
    if [ -z "$py" ]; then
        echo "no Python $v under pyenv: tests/pythons skips it" >&2
        continue
    fi
    rm -rf "$venv"
    "$py" -m venv "$venv"
    echo '*' > "$venv/.gitignore"
    "$venv/bin/python" -m pip install -q --upgrade pip
    if [[ "$v" == *-tflite ]]; then
        bash scripts/tflite-stack.sh "$venv" pytest
    else
        EDGEHFT_SKIP_NATIVE_KERNELS=1 "$venv/bin/python" -m pip install -q pytest -e .
    fi
    "$venv/bin/python" -c "$CHECK"
    echo "$venv ready ($("$venv/bin/python" --version))"
done
