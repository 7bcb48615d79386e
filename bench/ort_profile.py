#!/usr/bin/env python3
"""ONNX Runtime's time per node of a model, from its own profiler: what a layer
costs there, to set beside `anyshape bench MODEL --profile --top N`.

    python bench/ort_profile.py MODEL.onnx --shape batch=1,height=224,width=224 --threads 2 --top 30

Symbolic dims are bound by --shape (name=value, comma-separated); the inputs are
random (float) or zeros (integer). The profile covers --runs calls after two warm
ones; each node's median kernel time is printed, the slowest first, with the total
per operator type. ONNX Runtime's profiling adds its own overhead (a few percent):
compare ratios within one run, not with an unprofiled timing.
"""
import argparse
import collections
import json
import os
import tempfile

import numpy as np
import onnxruntime as ort


def dim_value(d, dims):
    """A dim at the given symbols: a number, a symbol, or an expression of symbols."""
    if not isinstance(d, str):
        return d
    if d in dims:
        return int(dims[d])
    return int(eval(d, {"__builtins__": {}}, {k: int(v) for k, v in dims.items()}))  # noqa: S307


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--shape", default="", help="symbol values, e.g. batch=1,seq=128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    dims = dict(kv.split("=") for kv in a.shape.split(",") if kv)
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    s = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    feeds = {}
    for i in s.get_inputs():
        # A dim may be an expression of symbols (optimum's mask:
        # 'past_sequence_length + sequence_length').
        shape = [dim_value(d, dims) for d in i.shape]
        if "float" in i.type:
            feeds[i.name] = np.random.rand(*shape).astype(np.float32)
        elif "mask" in i.name:
            feeds[i.name] = np.ones(shape, dtype=np.int64)
        else:
            feeds[i.name] = np.zeros(shape, dtype=np.int64)
    for _ in range(2 + a.runs):
        s.run(None, feeds)
    with open(s.end_profiling()) as f:
        events = json.load(f)
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    per = collections.defaultdict(list)
    by_op = collections.defaultdict(float)
    for e in nodes:
        per[e["name"][: -len("_kernel_time")]].append(e["dur"] / 1000)
        by_op[e["args"].get("op_name", "?")] += e["dur"] / 1000
    calls = max(len(v) for v in per.values())
    rows = sorted(((float(np.median(v)), k) for k, v in per.items()), reverse=True)
    print(f"# {os.path.basename(a.model)} {a.shape}, {a.threads} threads: per-node median ms over {calls} calls")
    print(f"total of node medians: {sum(t for t, _ in rows):.3f} ms")
    for op, t in sorted(by_op.items(), key=lambda kv: -kv[1]):
        print(f"  {op:<24} {t / calls:8.3f} ms per call")
    for t, k in rows[: a.top]:
        print(f"{t:8.3f}  {k}")


if __name__ == "__main__":
    main()
