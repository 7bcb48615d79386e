#!/usr/bin/env bash
# The test command (README): unit, property and fixture tests of every crate,
# the Python package's tests, then the ONNX backend node tests (conformance) of
# two pinned `onnx` packages
# (1.17, which ships them, and 1.23, whose cases are generated). Works on a
# fresh machine: the first run makes the venvs .venv and .venv-onnx123.
set -euo pipefail
cd "$(dirname "$0")/.."

# LLVM 19 for the code generator (installed as root, else named).
bash scripts/setup.sh

venv=.venv
if ! "$venv/bin/python" -c "import onnx" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r tools/conformance/requirements.txt
fi
data_dir=$("$venv/bin/python" -c "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend', 'test', 'data'))")
# The current onnx (1.23): its node tests are generated from its case definitions
# (its wheels no longer ship them), once, into the venv.
venv123=.venv-onnx123
if ! "$venv123/bin/python" -c "import onnx" 2>/dev/null; then
    python3 -m venv "$venv123"
    "$venv123/bin/pip" install --quiet --disable-pip-version-check -r tools/conformance/requirements-onnx123.txt
fi
if [ ! -d "$venv123/node-data/node" ]; then
    "$venv123/bin/python" tools/conformance/generate_node_data.py --out "$venv123/node-data"
fi

# ptxas (PyPI's nvidia-cuda-nvcc, no GPU needed) for the GPU kernels' checks: the
# nvptx tests assemble the family with it (ANYSHAPE_PTXAS).
venvptx=.venv-ptxas
if ! ls $venvptx/lib/python3*/site-packages/nvidia/cu13/bin/ptxas >/dev/null 2>&1; then
    python3 -m venv "$venvptx"
    "$venvptx/bin/pip" install --quiet --disable-pip-version-check "nvidia-cuda-nvcc==13.0.*"
fi
ptxas=$(ls "$PWD"/$venvptx/lib/python3*/site-packages/nvidia/cu13/bin/ptxas | head -1)
export ANYSHAPE_PTXAS="$ptxas"
# A test that needs what this machine has may not skip (kernels::testing).
export ANYSHAPE_REQUIRE_PTXAS=1
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
if [[ " $flags " == *" avx2 "* && " $flags " == *" fma "* ]]; then export ANYSHAPE_REQUIRE_AVX2=1; fi
if [[ " $flags " == *" avx512_bf16 "* ]]; then export ANYSHAPE_REQUIRE_BF16=1; fi
if [[ " $flags " == *" avx512_vnni "* || " $flags " == *" avx_vnni "* ]]; then export ANYSHAPE_REQUIRE_VNNI=1; fi
if [[ " $flags " == *" amx_int8 "* && " $flags " == *" amx_bf16 "* && " $flags " == *" amx_tile "* ]]; then export ANYSHAPE_REQUIRE_AMX=1; fi
if [[ " $flags " == *" f16c "* ]]; then export ANYSHAPE_REQUIRE_F16C=1; fi

# One build for every crate's tests, the GPU runner included (anyshape's `gpu`
# feature turns on anyshape-gpu's `cuda`: cudarc, loaded at run time, which builds
# and fails cleanly without a GPU); the Python module's build below reuses it.
cargo test --workspace --locked
# The whole GPU family as shipped, assembled for sm_90a: a register spill or a
# ptxas warning (wgmma serialization) fails (codegen's nvptx test assembles the
# families for sm_80 too). Running the kernels needs a GPU
# (scripts/gpu-dist.sh, then bench/gpu/device.sh on the GPU machine).
target/debug/anyshape gpu-kernels --out target/gpu-kernels --ptxas "$ptxas" --arch sm_90a > target/gpu-kernels.log
tail -1 target/gpu-kernels.log
if ldd target/debug/anyshape-gpu | grep -i llvm; then
    echo "error: anyshape-gpu links LLVM" >&2
    exit 1
fi
# The runtime reads the plan contract alone: no compiler crate below it.
if cargo tree --locked -p anyshape-runtime -e normal --prefix none | grep -E '^anyshape-(onnx|reference|passes|lower|tune|codegen|gpu) '; then
    echo "error: the runtime depends on a compiler crate" >&2
    exit 1
fi
# anyshape-rt runs compiled artifacts with the runtime alone: it links no LLVM.
if ldd target/debug/anyshape-rt | grep -i llvm; then
    echo "error: anyshape-rt links LLVM" >&2
    exit 1
fi
# The Python package (crates/python + python/anyshape), built once as a wheel
# (debug) and installed into its own venv, and its tests.
venvpy=.venv-py
if ! "$venvpy/bin/python" -c "import pytest, numpy" 2>/dev/null || [ ! -x "$venvpy/bin/maturin" ]; then
    python3 -m venv "$venvpy"
    "$venvpy/bin/pip" install --quiet --disable-pip-version-check -r python/requirements-test.txt
fi
wheels=target/wheels-test
rm -rf "$wheels"
VIRTUAL_ENV="$PWD/$venvpy" "$venvpy/bin/maturin" build --quiet --locked --features extension-module,llvm-dynamic \
    --interpreter "$venvpy/bin/python" --auditwheel skip --out "$wheels"
wheel=$(ls "$wheels"/anyshape-*.whl)
"$venvpy/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"
"$venvpy/bin/python" -m pytest -q tests/python
# Serving on Ray Serve (python/anyshape/serve.py): a venv with ray[serve], the
# same wheel installed into it (one build for both: the package itself needs no
# Ray), and a local Ray instance on the loopback address that the tests start
# and stop.
venvserve=.venv-serve
if ! "$venvserve/bin/python" -c "import ray.serve, pytest, numpy, onnxruntime" 2>/dev/null; then
    python3 -m venv "$venvserve"
    "$venvserve/bin/pip" install --quiet --disable-pip-version-check -r python/requirements-serve.txt
fi
"$venvserve/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"
RAY_USAGE_STATS_ENABLED=0 "$venvserve/bin/python" -m pytest -q -W ignore::DeprecationWarning tests/serve
# The node tests, on the interpreter and compiled (canary margins on), and the CNN
# models of onnx's `light` folder: all nine compiled against their expected
# outputs, the fastest three also run on the interpreter (all nine: drop
# --light-run; ~6 min in release).
# The runner as the workspace's tests built it (its own tests run it): `cargo run
# -p` alone would build the compiler again with that package's features only.
conformance=target/debug/anyshape-conformance
"$conformance" "$data_dir/node" --expected tests/conformance/expected_failures.txt \
    --node-compiled --light "$data_dir/light" --light-run squeezenet,shufflenet,bvlc_alexnet --light-compiled
"$conformance" "$venv123/node-data/node" \
    --expected tests/conformance/expected_failures_onnx123.txt --node-compiled
