#!/usr/bin/env python3
"""End-to-end latency of one ONNX model in anyshape and its peers, in the same run.

    python bench/model_peers.py /work/models/bert-base/model.onnx \
        --shape batch=1,seq=1 --shape batch=1,seq=128 --threads 2 --rounds 3 [--json out.json]

Per system and shape: the first call and the median of --runs warm calls; the
systems take turns (round 1: every system, round 2: every system, ...) and each
keeps its best median, so that one slow phase of the machine does not decide a
ratio. Systems: anyshape (`anyshape bench --json`, compiled once per round),
ONNX Runtime (CPU provider, all graph optimizations, intra-op threads = --threads)
and OpenVINO (CPU, f32, INFERENCE_NUM_THREADS = --threads), when installed.
Inputs are those `anyshape bench` makes: token ids i*7 % 90, attention masks of
ones, zeros for other integer inputs, a fixed pattern for floats.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.dont_write_bytecode = True
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_shape(s):
    return {k: int(v) for k, v in (kv.split("=") for kv in s.split(","))}


def make_inputs(model_path, shape):
    import onnx

    m = onnx.load(model_path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    feeds = {}
    for i in m.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else shape[d.dim_param] for d in t.shape.dim]
        n = int(np.prod(dims)) if dims else 1
        if t.elem_type == onnx.TensorProto.INT64:
            if "mask" in i.name:
                v = np.ones(n, np.int64)
            elif "ids" in i.name and "type" not in i.name and "position" not in i.name:
                v = (np.arange(n, dtype=np.int64) * 7) % 90
            else:
                v = np.zeros(n, np.int64)
        else:
            v = (((np.arange(n) * 37) % 101).astype(np.float32) - 50.0) / 50.0
        feeds[i.name] = v.reshape(dims)
    return feeds


def time_calls(fn, runs):
    t = time.perf_counter()
    fn()
    first = (time.perf_counter() - t) * 1e3
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return first, statistics.median(times)


def bench_ort(path, shapes, threads, runs):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    t = time.perf_counter()
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    compile_ms = (time.perf_counter() - t) * 1e3
    out = []
    for s in shapes:
        feeds = make_inputs(path, s)
        first, med = time_calls(lambda: sess.run(None, feeds), runs)
        out.append({"first_call_ms": first, "median_ms": med, "compile_ms": compile_ms})
    return out


def bench_openvino(path, shapes, threads, runs):
    import openvino as ov

    core = ov.Core()
    t = time.perf_counter()
    compiled = core.compile_model(
        core.read_model(path), "CPU", {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"}
    )
    compile_ms = (time.perf_counter() - t) * 1e3
    req = compiled.create_infer_request()
    out = []
    for s in shapes:
        feeds = make_inputs(path, s)
        first, med = time_calls(lambda: req.infer(feeds), runs)
        out.append({"first_call_ms": first, "median_ms": med, "compile_ms": compile_ms})
    return out


def bench_anyshape(path, shapes, threads, runs, binary):
    cmd = [binary, "bench", path, "--threads", str(threads), "--runs", str(runs), "--json"]
    for s in shapes:
        cmd += ["--shape", ",".join(f"{k}={v}" for k, v in s.items())]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--shape", action="append", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--anyshape", default=os.path.join(ROOT, "target", "release", "anyshape"))
    ap.add_argument("--json")
    a = ap.parse_args()
    shapes = [parse_shape(s) for s in a.shape]
    systems = {"anyshape": lambda: bench_anyshape(a.model, shapes, a.threads, a.runs, a.anyshape),
               "onnxruntime": lambda: bench_ort(a.model, shapes, a.threads, a.runs)}
    try:
        import openvino  # noqa: F401

        systems["openvino"] = lambda: bench_openvino(a.model, shapes, a.threads, a.runs)
    except ImportError:
        print("(openvino not installed: skipped)", file=sys.stderr)
    best = {name: [None] * len(shapes) for name in systems}
    for r in range(a.rounds):
        for name, fn in systems.items():
            for i, res in enumerate(fn()):
                cur = best[name][i]
                if cur is None or res["median_ms"] < cur["median_ms"]:
                    best[name][i] = res
    names = list(systems)
    header = "| shape | " + " | ".join(f"{n} ms" for n in names) + " | " + " | ".join(
        f"{n} / anyshape" for n in names[1:]) + " | anyshape first call ms |"
    print(header)
    print("|" + "---|" * (1 + 2 * len(names)))
    for i, s in enumerate(shapes):
        meds = [best[n][i]["median_ms"] for n in names]
        ratios = [f"{m / meds[0]:.2f}x" for m in meds[1:]]
        cells = [f"{m:.3f}" for m in meds]
        shape = ",".join(f"{k}={v}" for k, v in s.items())
        print(f"| {shape} | " + " | ".join(cells) + " | " + " | ".join(ratios)
              + f" | {best['anyshape'][i]['first_call_ms']:.3f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "threads": a.threads, "rounds": a.rounds, "runs": a.runs,
                       "shapes": shapes, "results": best}, f, indent=1)


if __name__ == "__main__":
    main()
