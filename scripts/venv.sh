# Sourced by the scripts: create .venv if needed and install edgehft with the extras in $1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The cpu board's native kernels (edgehft/kernels/cpu) are written with Google Highway: its headers
# (Debian's libhwy-dev) are needed to build them. Installed when missing and this runs as root with
# apt-get; otherwise say what to do (the native kernel tests then fail with that hint).
if [ ! -f /usr/include/hwy/highway.h ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing libhwy-dev (Google Highway headers, for edgehft's native CPU kernels)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libhwy-dev >/dev/null
    else
        echo "warning: no Google Highway headers; the native CPU kernels need them: sudo apt-get install libhwy-dev" >&2
    fi
fi
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[$1]"
