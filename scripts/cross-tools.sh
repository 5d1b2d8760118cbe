#!/usr/bin/env bash
# The tools two test files need to run code for another CPU on this x86-64 machine (correctness, not
# speed): g++-aarch64-linux-gnu + qemu-user-static run the native kernels' aarch64 build
# (tests/unit/test_native_aarch64.py), qemu-user's `qemu-x86_64 -cpu Haswell` runs the Q/DQ check on an
# AVX2 CPU without AVX-512 (tests/unit/test_qdq_exact.py). Installs Debian's packages when missing and this
# runs as root with apt-get; otherwise says what to do (those tests then skip, saying why).
set -euo pipefail
missing=()
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || missing+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null 2>&1 || missing+=(qemu-user-static)
command -v qemu-x86_64 >/dev/null 2>&1 || missing+=(qemu-user)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${missing[*]} (the aarch64 kernel tests and the AVX2 Q/DQ test run under QEMU)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    echo "warning: ${missing[*]} missing: sudo apt-get install ${missing[*]} (those tests skip without them)" >&2
fi
