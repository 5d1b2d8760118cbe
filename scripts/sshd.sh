#!/usr/bin/env bash
# Make sure OpenSSH's server binary is installed: the deploy and HIL tests start their own sshd on
# 127.0.0.1 (tests/sshbox.py) as "the box". Installs Debian's openssh-server when missing and this runs as
# root with apt-get; otherwise says what to do (the tests then skip, or fail under CI=true).
set -euo pipefail
if [ -x /usr/sbin/sshd ] || command -v sshd >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing openssh-server (the deploy tests run a loopback sshd)"
    apt-get update -qq
    # policy-rc.d keeps the package from starting the system sshd; the tests start their own.
    made_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && made_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server >/dev/null
    if [ "$made_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
else
    echo "warning: no sshd; the deploy tests need it: sudo apt-get install openssh-server" >&2
fi
