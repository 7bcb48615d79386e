#!/usr/bin/env python3
"""How far a reduced precision moves a model's outputs from its f32 outputs.

    python bench/precision_error.py /work/models/bert-base/model.onnx \
        --shape batch=1,seq=128 [--shape ...] [--precision bf16] [--seed 0]

Runs `anyshape run` twice on the same seeded random inputs (those
tools/models/quantize_full.py calibrates with: token ids below --vocab for int64
inputs, ones for masks, zeros for token types, standard normal for float
inputs), once with `--precision f32` and once with `--precision`, and
prints per output the relative L2 error (||a - b|| / ||a||), the largest
absolute difference and, for 2-D and 3-D outputs, the cosine similarity of each
row's (first token's) vectors, worst first.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "models"))
from quantize_full import inputs_of  # noqa: E402  (the calibration's seeded inputs)


def run(binary, model, files, precision, threads, out):
    cmd = [binary, "run", model, "--threads", str(threads), "--precision", precision, "--output-dir", out]
    for name, f in files.items():
        cmd += ["--input", f"{name}={f}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()[-2000:]}")
    return {f[:-4]: np.load(os.path.join(out, f)) for f in sorted(os.listdir(out)) if f.endswith(".npy")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--shape", action="append", required=True, help="e.g. batch=1,seq=128 (repeatable)")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--anyshape", default=os.path.join(ROOT, "target", "release", "anyshape"))
    a = ap.parse_args()
    rng = np.random.RandomState(a.seed)
    print("| shape | output | relative L2 | largest abs. difference | lowest row cosine |")
    print("|---|---|---|---|---|")
    for s in a.shape:
        shape = {k: int(v) for k, v in (kv.split("=") for kv in s.split(","))}
        with tempfile.TemporaryDirectory() as tmp:
            files = {}
            for name, x in inputs_of(a.model, shape, a.vocab, rng).items():
                files[name] = os.path.join(tmp, f"{name}.npy")
                np.save(files[name], x)
            want = run(a.anyshape, a.model, files, "f32", a.threads, os.path.join(tmp, "f32"))
            got = run(a.anyshape, a.model, files, a.precision, a.threads, os.path.join(tmp, a.precision))
        for name, w in want.items():
            w, g = w.astype(np.float64), got[name].astype(np.float64)
            rel = np.linalg.norm(w - g) / max(np.linalg.norm(w), 1e-30)
            cos = ""
            if w.ndim in (2, 3):
                rw, rg = w.reshape(-1, w.shape[-1]), g.reshape(-1, g.shape[-1])
                c = (rw * rg).sum(1) / np.maximum(np.linalg.norm(rw, axis=1) * np.linalg.norm(rg, axis=1), 1e-30)
                cos = f"{c.min():.6f}"
            print(f"| {s} | {name} | {rel:.2e} | {np.abs(w - g).max():.2e} | {cos} |")


if __name__ == "__main__":
    main()
