"""Single-matmul benchmark: anyshape against its peers, in the same run, on the same machine.

    python bench/matmul_peers.py [--threads 2] [--shapes dense|ffn|all] [--dtype f32|bf16] [--json out.json]

Peers (pinned in bench/requirements.txt; `bash bench/run.sh` makes the venv):
- numpy (OpenBLAS), `a @ b`;
- ONNX Runtime (CPU), a one-MatMul model whose weight is an initializer;
- OpenVINO (CPU), the same model;
- the Rust `gemm` crate: `bench/rs/target/release/gemm_peer` (`--gemm-crate`; built by
  `bash bench/run.sh`, skipped when the binary is missing), B not pre-packed;
- anyshape: `target/release/anyshape bench-matmul --json` (weights pre-packed, as
  every peer does with an initializer).
Each system gets the same thread count; each figure is the best of five rounds of at
least 40 ms. Prints GFLOP/s per system and anyshape's ratio to the best peer.

With `--dtype bf16`, anyshape runs its bf16 family (`--dtype bf16`: operands rounded to
bf16 when packed, f32 accumulation) and the peers that multiply in bf16 on this CPU run
so too: OpenVINO with `INFERENCE_PRECISION_HINT=bf16`. ONNX Runtime has no bf16 MatMul
on its CPU provider; it runs in f32, as the fp32 reference. The ratio is to the best bf16
peer, and the last column to the best f32 peer.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True

SHAPES = {
    # attention: [12, T, 64]·[12, 64, T] (Q·Kᵀ) and [12, T, T]·[12, T, 64] (P·V), batch 12
    "attention": [(12, t, t, 64) for t in (16, 64, 128, 384)] + [(12, t, 64, t) for t in (16, 64, 128, 384)],
    # X[16*T, 768] . W[768, 2304] (BERT-base QKV), from the issue
    "dense": [(16 * t, 2304, 768) for t in (1, 5, 8, 13, 16, 24, 32, 43, 50, 64, 81, 100, 119, 128)],
    # X[T, 1024] . W[1024, 4096] and X[T, 4096] . W[4096, 1024]
    "ffn": [(t, 4096, 1024) for t in (1, 7, 32, 100, 128, 333, 512)] + [(t, 1024, 4096) for t in (1, 7, 32, 100, 128, 333, 512)],
}


def best_time(fn):
    fn()
    best = float("inf")
    for _ in range(5):
        reps, t0 = 0, time.perf_counter()
        while reps == 0 or time.perf_counter() - t0 < 0.04:
            fn()
            reps += 1
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def matmul_model(k, n, w):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm", [x], [y], [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def batched_model(batch, m, n, k):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, m, k])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [batch, k, n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, m, n])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "bmm", [x, w], [y])
    m_ = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m_.ir_version = 8
    return m_


def peers(m, n, k, threads, batch=1, dtype="f32"):
    import numpy as np

    rng = np.random.default_rng(0)
    shape_a, shape_w = ((m, k), (k, n)) if batch == 1 else ((batch, m, k), (batch, k, n))
    a = rng.standard_normal(shape_a, dtype=np.float32)
    w = rng.standard_normal(shape_w, dtype=np.float32)
    out = {}
    if dtype == "f32":
        out["numpy"] = best_time(lambda: a @ w)
    model = matmul_model(k, n, w) if batch == 1 else batched_model(batch, m, n, k)
    feeds = {"x": a} if batch == 1 else {"x": a, "w": w}
    try:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        out["onnxruntime"] = best_time(lambda: s.run(None, feeds))
    except ImportError:
        pass
    try:
        import openvino as ov

        core = ov.Core()
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "mm.onnx")
            import onnx

            onnx.save(model, p)
            cm = core.compile_model(core.read_model(p), "CPU", {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": dtype})
            if cm.get_property("INFERENCE_PRECISION_HINT") != {"f32": ov.Type.f32, "bf16": ov.Type.bf16}[dtype]:
                sys.exit(f"OpenVINO does not run {dtype} here: {cm.get_property('INFERENCE_PRECISION_HINT')}")
            req = cm.create_infer_request()
            inputs = {0: a} if batch == 1 else {0: a, 1: w}
            out["openvino" if dtype == "f32" else "openvino_bf16"] = best_time(lambda: req.infer(inputs))
    except ImportError:
        pass
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--shapes", default="all", choices=["dense", "ffn", "attention", "all"])
    ap.add_argument("--anyshape", default="target/release/anyshape")
    ap.add_argument("--json", help="write all figures here")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"],
                    help="the element type multiplied (bf16: anyshape's bf16 family against OpenVINO's bf16)")
    ap.add_argument("--anyshape-args", default="", help="extra flags for `anyshape bench-matmul`, e.g. '--tile 8x32 --kc 256'")
    ap.add_argument("--rounds", type=int, default=2,
                    help="measure every system this many times per shape, interleaved, and keep each one's best "
                         "(this machine has phases in which a core is taken away for a second or more)")
    ap.add_argument("--gemm-crate", default="bench/rs/target/release/gemm_peer",
                    help="the Rust gemm crate's peer binary (`cargo build --release --manifest-path bench/rs/Cargo.toml`); skipped if missing")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    if args.shapes == "all":
        shapes = SHAPES["dense"] + SHAPES["ffn"] + SHAPES["attention"]
    else:
        shapes = SHAPES[args.shapes]
    shapes = [s if len(s) == 4 else (1, *s) for s in shapes]
    gemm_crate = args.gemm_crate if os.path.isfile(args.gemm_crate) and os.access(args.gemm_crate, os.X_OK) else None
    if args.dtype != "f32":
        gemm_crate = None
    if gemm_crate is None:
        print(f"# {args.gemm_crate} not found: no gemm crate figures", file=sys.stderr)
    rows = []
    bf16 = args.dtype == "bf16"
    if bf16:
        print(f"{'batch':>5} {'m':>6} {'n':>6} {'k':>6} {'anyshape':>9} {'ov bf16':>8} {'ort f32':>8} {'vs bf16':>8} {'vs f32':>8}  (GFLOP/s, {args.threads} threads)")
    else:
        print(f"{'batch':>5} {'m':>6} {'n':>6} {'k':>6} {'anyshape':>9} {'numpy':>8} {'ort':>8} {'openvino':>9} {'gemm':>8} {'vs best':>8}  (GFLOP/s, {args.threads} threads)")
    for batch, m, n, k in shapes:
        flops = 2.0 * batch * m * n * k
        ours, g = None, {}
        for _ in range(max(1, args.rounds)):
            r = subprocess.run([args.anyshape, "bench-matmul", "--m", str(m), "--n", str(n), "--k", str(k), "--batch", str(batch),
                                "--threads", str(args.threads), "--dtype", args.dtype, "--json"] + args.anyshape_args.split(),
                               capture_output=True, text=True, check=True)
            run = json.loads(r.stdout.strip().splitlines()[-1])
            if ours is None or run["gflops"] > ours["gflops"]:
                ours = run
            times = peers(m, n, k, args.threads, batch, args.dtype)
            for name, t in times.items():
                g[name] = max(g.get(name, 0.0), flops / t / 1e9)
            if gemm_crate:
                rg = subprocess.run([gemm_crate, "--shape", f"{batch},{m},{n},{k}", "--threads", str(args.threads)],
                                    capture_output=True, text=True)
                if rg.returncode != 0:
                    sys.exit(f"{gemm_crate} failed on {batch},{m},{n},{k}: {rg.stderr.strip()}")
                g["gemm_crate"] = max(g.get("gemm_crate", 0.0), json.loads(rg.stdout.strip().splitlines()[-1])["gflops"])
        row = {"dtype": args.dtype, "batch": batch, "m": m, "n": n, "k": k, "anyshape": ours["gflops"], "peak_fraction": ours["peak_fraction"], **g}
        rows.append(row)
        if bf16:
            best_bf16 = max(v for name, v in g.items() if name.endswith("_bf16"))
            best_f32 = max((v for name, v in g.items() if not name.endswith("_bf16")), default=float("nan"))
            print(f"{batch:>5} {m:>6} {n:>6} {k:>6} {ours['gflops']:>9.1f} {g.get('openvino_bf16', 0):>8.1f} {g.get('onnxruntime', 0):>8.1f} {ours['gflops'] / best_bf16:>7.2f}x {ours['gflops'] / best_f32:>7.2f}x")
            continue
        best_peer = max(g.values())
        print(f"{batch:>5} {m:>6} {n:>6} {k:>6} {ours['gflops']:>9.1f} {g.get('numpy', 0):>8.1f} {g.get('onnxruntime', 0):>8.1f} {g.get('openvino', 0):>9.1f} {g.get('gemm_crate', 0):>8.1f} {ours['gflops'] / best_peer:>7.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
