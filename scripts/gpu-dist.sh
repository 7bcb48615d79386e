#!/usr/bin/env bash
# Builds what a GPU machine with only the NVIDIA driver needs, into dist/gpu:
# the runner `anyshape-gpu` (cudarc, loads libcuda at run time; no LLVM), the GEMM
# family's PTX and sm_90a cubins with their manifest, `anyshape` with LLVM linked
# statically (it compiles models there for --device cuda), two bundled models, and
# the device scripts.
# Then, on the GPU machine: bash dist/gpu/device.sh OUTDIR
set -euo pipefail
cd "$(dirname "$0")/.."
out=dist/gpu
venv=.venv-ptxas
if ! [ -x "$venv/bin/python" ] || ! ls $venv/lib/python3*/site-packages/nvidia/cu13/bin/ptxas >/dev/null 2>&1; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "nvidia-cuda-nvcc==13.0.*"
fi
ptxas=$(ls $venv/lib/python3*/site-packages/nvidia/cu13/bin/ptxas | head -1)
cargo build --release --locked -p anyshape-cli -p anyshape-gpu --features anyshape-gpu/cuda
rm -rf "$out"
mkdir -p "$out"
target/release/anyshape gpu-kernels --out "$out/kernels" --ptxas "$ptxas" --arch sm_90a,sm_80
cp target/release/anyshape-gpu "$out/"
# The runtime alone (no LLVM): it runs GPU artifacts compiled there.
cp target/release/anyshape-rt "$out/"
strip "$out/anyshape-rt"
if ldd "$out/anyshape-rt" | grep -qi llvm; then
    echo "error: anyshape-rt links LLVM" >&2
    exit 1
fi
cp bench/gpu/device.sh bench/gpu/cublas.py bench/gpu/models.sh bench/gpu/models.py bench/gpu/torch_peers.py "$out/"
if ldd "$out/anyshape-gpu" | grep -qi llvm; then
    echo "error: anyshape-gpu links LLVM" >&2
    exit 1
fi
# The compiler itself, LLVM linked in statically: the GPU machine has no LLVM.
# It compiles models there (--device cuda); the bundled fixtures come along.
cargo build --release --locked -p anyshape-cli --bin anyshape --no-default-features --features llvm-static \
    --target-dir target/static
cp target/static/release/anyshape "$out/anyshape"
strip "$out/anyshape"
if ldd "$out/anyshape" | grep -qi llvm; then
    echo "error: the static anyshape links a shared LLVM" >&2
    exit 1
fi
# About 60 MB stripped: it travels compressed (models.sh unpacks it).
xz -T2 -f "$out/anyshape"
mkdir -p "$out/fixtures"
cp -r tests/fixtures/bert tests/fixtures/gpt2 "$out/fixtures/"
du -sh "$out"
