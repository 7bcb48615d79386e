"""cuBLAS (through PyTorch, bf16) on the products `anyshape-gpu bench` measured, in
the same device session, and the outputs of anyshape's kernels compared with
cuBLAS's on the operands `anyshape-gpu bench --dump` wrote.

    python3 bench/gpu/cublas.py --bench bench.jsonl --dump DIR --json out.json

Prints a table of TFLOP/s and the ratio cuBLAS time / anyshape time (above 1:
anyshape faster), per product; then, per dumped product, the relative L2 error of
anyshape's and of cuBLAS's bf16 result against an f32 product of the same inputs.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch


def bf16_from_bits(path, shape):
    bits = np.fromfile(path, dtype=np.uint16).astype(np.int32) << 16
    return torch.from_numpy(bits.view(np.float32).reshape(shape))


def time_ms(fn, reps, per=20):
    """Device milliseconds per call: `per` calls captured into a CUDA graph, the
    graph replayed `reps` times between two events, the median over `per` (the
    runner times anyshape's kernels the same way). Back-to-back calls where the
    capture fails."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(per):
                fn()
        run = g.replay
        graph = True
    except Exception:
        run = lambda: [fn() for _ in range(per)]
        graph = False
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / per)
    times.sort()
    return times[len(times) // 2], graph


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--dump")
    ap.add_argument("--json", required=True)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__, flush=True)
    rows = []
    regret = None
    for line in open(args.bench):
        r = json.loads(line)
        if "regret" in r:
            regret = r["regret"]
        if "m" not in r:
            continue
        b, m, n, k = r["batch"], r["m"], r["n"], r["k"]
        a = torch.randn(b, m, k, device=dev, dtype=torch.bfloat16)
        if r["layout"] == "nt":
            w = torch.randn(b, n, k, device=dev, dtype=torch.bfloat16)
            fn = (lambda a=a, w=w: torch.matmul(a, w.transpose(1, 2))) if b > 1 else (lambda a=a[0], w=w[0]: torch.matmul(a, w.t()))
        else:
            w = torch.randn(b, k, n, device=dev, dtype=torch.bfloat16)
            fn = (lambda a=a, w=w: torch.matmul(a, w)) if b > 1 else (lambda a=a[0], w=w[0]: torch.matmul(a, w))
        t, graph = time_ms(fn, args.reps)
        t *= 1e-3
        flops = 2.0 * b * m * n * k
        row = dict(layout=r["layout"], batch=b, m=m, n=n, k=k, cublas_s=t, cublas_tflops=flops / t / 1e12,
                   ours_s=r["model_s"], ours_tflops=r["model_tflops"], ours_kernel=r["model"],
                   best_s=r["best_s"], best_kernel=r["best"], speedup=t / r["model_s"], best_speedup=t / r["best_s"],
                   cublas_graph=graph)
        rows.append(row)
        print(f'{r["layout"]} {b}x{m}x{n}x{k:<6} cuBLAS {row["cublas_tflops"]:7.1f} TF/s  ours {row["ours_tflops"]:7.1f} TF/s'
              f'  cuBLAS/ours {row["speedup"]:.2f}x (best kernel {row["best_speedup"]:.2f}x)', flush=True)
        del a, w
    checks = []
    if args.dump and os.path.exists(os.path.join(args.dump, "index.jsonl")):
        for line in open(os.path.join(args.dump, "index.jsonl")):
            d = json.loads(line)
            b, m, n, k = d["batch"], d["m"], d["n"], d["k"]
            stem = os.path.join(args.dump, d["stem"])
            a = bf16_from_bits(stem + ".a.bin", (b, m, k)).to(dev)
            bshape = (b, n, k) if d["layout"] == "nt" else (b, k, n)
            w = bf16_from_bits(stem + ".b.bin", bshape).to(dev)
            ours = bf16_from_bits(stem + ".c.bin", (b, m, n)).to(dev)
            wk = w.transpose(1, 2) if d["layout"] == "nt" else w
            exact = torch.matmul(a.double(), wk.double())
            cub = torch.matmul(a.bfloat16(), wk.bfloat16()).double()
            rel = lambda x: (torch.linalg.norm(x - exact) / torch.linalg.norm(exact)).item()
            vs = (torch.linalg.norm(ours - cub) / torch.linalg.norm(cub)).item()
            c = dict(stem=d["stem"], kernel=d["kernel"], ours_rel_l2=rel(ours), cublas_rel_l2=rel(cub), ours_vs_cublas_rel_l2=vs)
            checks.append(c)
            print(f'{d["stem"]:<28} {d["kernel"]:<36} rel L2: ours {c["ours_rel_l2"]:.2e}  cuBLAS {c["cublas_rel_l2"]:.2e}'
                  f'  ours vs cuBLAS {vs:.2e}', flush=True)
    ok = all(c["ours_rel_l2"] < 2 * c["cublas_rel_l2"] + 1e-3 for c in checks)
    json.dump(dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, rows=rows, checks=checks,
                   regret=regret, outputs_match=ok), open(args.json, "w"), indent=1)
    print("outputs match cuBLAS:", ok, f"({len(checks)} products)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
