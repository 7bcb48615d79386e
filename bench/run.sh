#!/usr/bin/env bash
# Build anyshape, make the peers' venv (pinned), run the single-matmul benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p anyshape-cli
if ! bench/.venv/bin/python -c "import onnxruntime, openvino" 2>/dev/null; then
    python3 -m venv bench/.venv
    bench/.venv/bin/pip install --quiet --disable-pip-version-check -r bench/requirements.txt
fi
bench/.venv/bin/python bench/matmul_peers.py "$@"
