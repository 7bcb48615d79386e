#!/usr/bin/env bash
# The test command (README): unit, property and fixture tests of every crate,
# then the ONNX backend node tests (conformance) from a pinned `onnx` package.
# Works on a fresh machine: the first run makes a venv in .venv for `onnx`.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv
if ! "$venv/bin/python" -c "import onnx" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r tools/conformance/requirements.txt
fi
data_dir=$("$venv/bin/python" -c "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend', 'test', 'data'))")

cargo test --workspace --locked
# The node tests, and the CNN models of onnx's `light` folder: all imported, the
# fastest three run on the interpreter (all nine: drop --light-run; ~6 min in release).
cargo run --locked --quiet -p anyshape-conformance -- "$data_dir/node" --expected tests/conformance/expected_failures.txt \
    --light "$data_dir/light" --light-run squeezenet,shufflenet,bvlc_alexnet
