#!/usr/bin/env bash
# On the GPU machine, from dist/gpu's parent (device.sh runs it first):
#   bash dist/gpu/models.sh OUTDIR
# Whole models through anyshape's GPU backend (issue 37): the statically
# linked `anyshape` (it compiles here, without LLVM installed) runs the bundled
# fixtures with --device cuda against ONNX Runtime's outputs, then BERT-base
# exported by this machine's PyTorch, compared with PyTorch fp32 and timed
# beside PyTorch eager. Results: OUTDIR/models.jsonl (OUTDIR/models.log holds
# the profiles). OUTDIR/models also gets the exported models and artifacts
# (over 1 GB): through the device tool, point OUTDIR outside $OUT and copy the
# two files back, e.g. `SECTIONS=bert-rt,profile bash dist/gpu/models.sh /tmp/m;
# cp /tmp/m/models.jsonl /tmp/m/models.log $OUT/` (SECTIONS: models.py's header).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: models.sh OUTDIR}
mkdir -p "$out"
# The compiler travels compressed.
if [ -f "$here/anyshape.xz" ] && ! [ -x "$here/anyshape" ]; then
    xz -dk "$here/anyshape.xz" && chmod +x "$here/anyshape"
fi
ANYSHAPE_REQUIRE_GPU=1 timeout ${MODELS_S:-240} python3 "$here/models.py" "$here/anyshape" "$here/fixtures" "$out/models" \
    $(( ${MODELS_S:-240} - 20 )) > "$out/models.jsonl" 2> "$out/models.log"
echo "models exit $?" | tee -a "$out/models.log"
cut -c1-300 "$out/models.jsonl"
