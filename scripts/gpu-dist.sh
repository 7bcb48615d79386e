#!/usr/bin/env bash
# Builds what a GPU machine with only the NVIDIA driver needs, into dist/gpu:
# the runner `anyshape-gpu` (cudarc, loads libcuda at run time; no LLVM), the GEMM
# family's PTX and sm_90a cubins with their manifest, and the device script.
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
cp bench/gpu/device.sh bench/gpu/cublas.py "$out/"
if ldd "$out/anyshape-gpu" | grep -qi llvm; then
    echo "error: anyshape-gpu links LLVM" >&2
    exit 1
fi
du -sh "$out"
