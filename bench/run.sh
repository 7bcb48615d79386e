#!/usr/bin/env bash
# Build anyshape and the Rust peers (bench/rs), make the peers' venv (pinned), run the
# single-matmul benchmark. Arguments go to bench/matmul_peers.py; to plot a `--json FILE`
# run afterwards: bench/rs/target/release/plot --input FILE --out-dir bench/plots
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p anyshape-cli
cargo build --release --manifest-path bench/rs/Cargo.toml
if ! bench/.venv/bin/python -c "import onnxruntime, openvino" 2>/dev/null; then
    python3 -m venv bench/.venv
    bench/.venv/bin/pip install --quiet --disable-pip-version-check -r bench/requirements.txt
fi
bench/.venv/bin/python bench/matmul_peers.py "$@"
