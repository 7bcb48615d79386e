#!/usr/bin/env bash
# What building anyshape needs beyond Rust: LLVM 19 (Debian's llvm-19-dev, linked
# dynamically by the code generator). As root on Debian or Ubuntu it installs it;
# otherwise it names the packages to install and fails. Quiet when all is there.
set -euo pipefail
if [ -x /usr/lib/llvm-19/bin/llvm-config ]; then
    exit 0
fi
packages="llvm-19-dev libpolly-19-dev zlib1g-dev libzstd-dev"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing LLVM 19 ($packages)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages >/dev/null
else
    echo "error: LLVM 19 is missing: install it, e.g. sudo apt-get install $packages" >&2
    echo "(on other systems: LLVM 19 with llvm-config at /usr/lib/llvm-19/bin, or set LLVM_SYS_191_PREFIX)" >&2
    exit 2
fi
