"""Compare anyshape (compiled, through the CLI) with ONNX Runtime on
a model at several sequence lengths, and report the symbols left in its shapes
and its import time.

    python tools/models/compare_ort.py /work/models/bert-base/model.onnx --seq 1,7,128 [--batch 1] [--key-chunks 100]

Inputs are random (seeded): token ids for int64 inputs named *ids*, ones for
attention masks, zeros for token types, N(0,1) for floats. Needs onnxruntime and
numpy (tools/fixtures/requirements.txt) and a built `anyshape` binary.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

sys.dont_write_bytecode = True


def make_inputs(model, batch, seq, rng):
    feeds = {}
    for i in model.graph.input:
        if i.name in {t.name for t in model.graph.initializer}:
            continue
        t = i.type.tensor_type
        dims = [d.dim_value if d.dim_value > 0 else None for d in t.shape.dim]
        names = [d.dim_param for d in t.shape.dim]
        shape = []
        for k, (v, n) in enumerate(zip(dims, names)):
            if v is not None:
                shape.append(v)
            elif k == 0:
                shape.append(batch)
            else:
                shape.append(seq)
        if t.elem_type == onnx.TensorProto.INT64:
            if "mask" in i.name:
                a = np.ones(shape, dtype=np.int64)
            elif "type" in i.name:
                a = np.zeros(shape, dtype=np.int64)
            else:
                a = rng.integers(0, 1000, size=shape, dtype=np.int64)
        else:
            a = rng.standard_normal(shape).astype(np.float32)
        feeds[i.name] = a
    return feeds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--seq", default="1,7,128")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--anyshape", default="target/release/anyshape")
    ap.add_argument("--key-chunks", default="auto",
                    help="how fused attention takes its keys: auto, never, always or N (online softmax over chunks of N)")
    args = ap.parse_args()
    model = onnx.load(args.model, load_external_data=False)
    insp = subprocess.run([args.anyshape, "inspect", args.model], capture_output=True, text=True)
    if insp.returncode != 0:
        sys.exit(f"inspect failed: {insp.stderr}")
    summary = insp.stdout.strip().splitlines()[-1]
    print(f"{os.path.basename(os.path.dirname(args.model))}: {summary}")
    sess = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for seq in [int(s) for s in args.seq.split(",")]:
        feeds = make_inputs(model, args.batch, seq, rng)
        t0 = time.perf_counter()
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        t_ort = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as d:
            cmd = [args.anyshape, "run", args.model, "--output-dir", d, "--key-chunks", args.key_chunks]
            for k, v in feeds.items():
                p = os.path.join(d, f"in_{k}.npy")
                np.save(p, v)
                cmd += ["--input", f"{k}={p}"]
            t0 = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, text=True)
            t_any = time.perf_counter() - t0
            if r.returncode != 0:
                print(f"  seq {seq}: anyshape failed: {r.stderr.strip()}")
                continue
            for name, w in want.items():
                fname = re.sub(r"[^A-Za-z0-9._-]", "_", name)
                g = np.load(os.path.join(d, f"{fname}.npy"))
                rel = np.linalg.norm((g - w).ravel()) / max(np.linalg.norm(w.ravel()), 1e-30)
                print(f"  batch {args.batch} seq {seq:4d} {name}: shape {list(g.shape)} rel L2 {rel:.2e} max abs {np.abs(g - w).max():.2e}"
                      f"  (anyshape run, compiled, {t_any:.1f} s incl. load, ORT {t_ort * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
