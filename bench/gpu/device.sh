#!/usr/bin/env bash
# On the GPU machine (only the NVIDIA driver and PyTorch needed), from dist/gpu's parent:
#   bash dist/gpu/device.sh OUTDIR
# Runs whole models through the GPU backend (models.sh), then checks every kernel against the host oracle (the mma.sync and the wgmma families in
# separate processes: a faulting kernel poisons its process's context), benchmarks
# the sweep with the kernels that passed (wave-model calibration, exhaustive times,
# regret), then cuBLAS on the same products and the outputs compared with cuBLAS's.
# Each step's log lands in OUTDIR even when a step fails.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: device.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
rt="$here/anyshape-gpu"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv 2>&1 | tee "$out/device.txt"
"$rt" info 2>&1 | tee -a "$out/device.txt"
# Whole models through the GPU backend first (MODELS_S=0 skips them).
if [ "${MODELS_S:-240}" -gt 0 ]; then
    bash "$here/models.sh" "$out"
fi
# Ten processes: the GEMV, the element-by-element mma.sync and the SIMT kernels
# first, then the TMA, the persistent, the ping-pong and the Stream-K ones (the
# newest: a hang or fault there costs only their own check), then mma.sync, wgmma,
# and wgmma with a group in flight.
chk() { # NAME TIMEOUT CASES ARGS...
    local name=$1 t=$2 cases=$3; shift 3
    timeout "$t" "$rt" check --dir "$here/kernels" --cases "$cases" --json "$out/check-$name.json" "$@" >> "$out/check.log" 2>&1
    echo "check ($name) exit $?" | tee -a "$out/check.log"
}
: > "$out/check.log"
chk gemv ${TMA_CHECK_S:-60} ${CASES:-4} --filter gemm_gemv_
chk unaligned ${TMA_CHECK_S:-60} ${CASES:-4} --filter gemm_ua_
chk simt ${TMA_CHECK_S:-60} ${CASES:-4} --filter gemm_simt_
chk tma ${TMA_CHECK_S:-60} ${CASES:-4} --filter gemm_wgt_
chk persistent ${TMA_CHECK_S:-60} ${CASES:-4} --filter gemm_wgp_ --exclude _sks
chk pingpong ${TMA_CHECK_S:-60} ${CASES:-4} --filter gemm_wgpp_
chk stream-k ${TMA_CHECK_S:-60} ${CASES:-4} --filter _sks
chk mma ${CHECK_S:-120} ${OTHER_CASES:-${CASES:-4}} --exclude gemm_wg --exclude gemm_simt_ --exclude gemm_gemv_ --exclude gemm_ua_ --exclude _sks
chk wgmma ${CHECK_S:-120} ${OTHER_CASES:-${CASES:-4}} --filter gemm_wg_ --exclude _sks
chk wgmma-overlap ${CHECK_S:-120} ${OTHER_CASES:-${CASES:-4}} --filter gemm_wgo_ --exclude _sks
grep -E "runs|exit" "$out/check.log"
grep -vE " ok$|runs|exit|^check on" "$out/check.log" | cut -c1-400 | head -30
skip=()
for name in gemv unaligned simt tma persistent pingpong mma wgmma wgmma-overlap; do
    f="$out/check-$name.json"
    [ -f "$f" ] && skip+=(--skip-failed "$f")
done
# A check that wrote no report (killed: a hang) leaves its kernels out.
[ -f "$out/check-gemv.json" ] || skip+=(--exclude gemm_gemv_)
[ -f "$out/check-unaligned.json" ] || skip+=(--exclude gemm_ua_)
[ -f "$out/check-simt.json" ] || skip+=(--exclude gemm_simt_)
[ -f "$out/check-tma.json" ] || skip+=(--exclude gemm_wgt_)
[ -f "$out/check-persistent.json" ] || skip+=(--exclude gemm_wgp_)
[ -f "$out/check-pingpong.json" ] || skip+=(--exclude gemm_wgpp_)
[ -f "$out/check-stream-k.json" ] || skip+=(--exclude _sks)
[ -f "$out/check-wgmma.json" ] || skip+=(--exclude gemm_wg_)
[ -f "$out/check-wgmma-overlap.json" ] || skip+=(--exclude gemm_wgo_)
timeout ${BENCH_S:-240} "$rt" bench --dir "$here/kernels" --json "$out/bench.jsonl" --dump /tmp/anyshape-dump "${skip[@]}" ${BENCH_ARGS:-} > "$out/bench.log" 2>&1
echo "bench exit $?" | tee -a "$out/bench.log"
grep -E "left out|regret|timing|error" "$out/bench.log" | tail -6
timeout ${CUBLAS_S:-150} python3 "$here/cublas.py" --bench "$out/bench.jsonl" --dump /tmp/anyshape-dump --json "$out/cublas.json" > "$out/cublas.log" 2>&1
echo "cublas exit $?" | tee -a "$out/cublas.log"
grep -E "^(nt|nn) " "$out/cublas.log" | cut -c1-130
tail -3 "$out/cublas.log"
