#!/usr/bin/env bash
# Install onnxruntime for the board venv's Python into .venv-board/ort-site, a directory beside the venv's own
# site-packages that is on no sys.path: .venv-board stays a box without ONNX Runtime, and a box with it is
# .venv-board/bin/python with PYTHONPATH=.venv-board/ort-site (tests/deploy/test_deploy_ort_plans.py).
# onnxruntime alone (--no-deps: the venv's numpy 1.26 < 2, protobuf, flatbuffers and packaging serve it; its
# wheels need numpy >= 1.21.6); no onnx package, so the box validates models the way a box without it does.
#   scripts/box-ort.sh            # idempotent; ORT_VERSION=1.22.0 picks another onnxruntime
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv-board/bin/python
SITE=.venv-board/ort-site
[ -x "$PY" ] || { echo "no $PY: run scripts/board-venv.sh first" >&2; exit 1; }
CHECK='import numpy, onnxruntime; assert numpy.__version__.split(".")[0] == "1", numpy.__version__; print(onnxruntime.__version__)'
if PYTHONPATH="$SITE" "$PY" -c "$CHECK" 2>/dev/null; then
    echo "$SITE is up to date"
    exit 0
fi
rm -rf "$SITE"
"$PY" -m pip install -q --no-deps --target "$SITE" "onnxruntime${ORT_VERSION:+==$ORT_VERSION}"
PYTHONPATH="$SITE" "$PY" -c "$CHECK"
echo "$SITE ready: PYTHONPATH=$SITE $PY -m edgehft ..."
