#!/usr/bin/env python3
"""OpenVINO's time per layer of a model, from its own performance counters: what
a layer costs there and which kernel ran it, to set beside `anyshape bench MODEL
--profile --top N` (and `bench/ort_profile.py`).

    python bench/ov_profile.py MODEL.onnx --shape batch=8,height=224,width=224 --threads 2 --top 30

Symbolic dims are bound by --shape (name=value, comma-separated); the inputs are
random (float) or zeros (integer; ones for a mask). Of --runs calls after two warm
ones, the call whose layers sum least is printed: its total per layer type, then
the slowest layers with OpenVINO's kernel (`brgconv_avx512_I8`, `jit_avx512`, ...).
The precision is f32 unless --precision says bf16, as in `bench/model_peers.py`
(OpenVINO's own default on a CPU with AVX512-BF16 or AMX is bf16).
The counters cost a little: compare ratios within one run, not with an unprofiled
timing.
"""
import argparse
import collections
import os

import numpy as np
import openvino as ov
from ort_profile import dim_value  # a dim at the given symbols (bench/ort_profile.py)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--shape", default="", help="symbol values, e.g. batch=1,seq=128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    a = ap.parse_args()
    dims = dict(kv.split("=") for kv in a.shape.split(",") if kv)
    # The ONNX file's symbolic dims, read with onnx (OpenVINO names them `?`).
    import onnx

    graph = onnx.load(a.model, load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    shapes = {}
    for i in graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        shape = [dim_value(d.dim_param or d.dim_value, dims) for d in t.shape.dim]
        shapes[i.name] = (shape, t.elem_type)
    core = ov.Core()
    model = core.read_model(a.model)
    model.reshape({name: ov.PartialShape(s) for name, (s, _) in shapes.items()})
    config = {
        "PERF_COUNT": "YES",
        "INFERENCE_NUM_THREADS": str(a.threads),
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": a.precision,
    }
    compiled = core.compile_model(model, "CPU", config)
    in_effect = str(compiled.get_property("INFERENCE_PRECISION_HINT")).lower()
    if {"f32": "float32", "bf16": "bfloat16"}[a.precision] not in in_effect:
        raise SystemExit(f"openvino runs {in_effect}, not {a.precision}, on this CPU")
    request = compiled.create_infer_request()
    rng = np.random.default_rng(0)
    feeds = {}
    for name, (shape, elem) in shapes.items():
        if elem == onnx.TensorProto.FLOAT:
            feeds[name] = rng.random(shape, dtype=np.float32)
        elif "mask" in name:
            feeds[name] = np.ones(shape, dtype=np.int64)
        else:
            feeds[name] = np.zeros(shape, dtype=np.int64)
    best = None
    for run in range(2 + a.runs):
        request.infer(feeds)
        if run < 2:
            continue
        layers = [(p.node_name, p.node_type, p.exec_type, p.real_time.total_seconds() * 1e3) for p in request.profiling_info]
        total = sum(t for *_, t in layers)
        if best is None or total < best[0]:
            best = (total, layers)
    total, layers = best
    by_type = collections.defaultdict(float)
    for _, kind, _, t in layers:
        by_type[kind] += t
    print(f"# {os.path.basename(a.model)} {a.shape}, {a.threads} threads, {a.precision}: the least of {a.runs} calls")
    print(f"total of layers: {total:.3f} ms")
    for kind, t in sorted(by_type.items(), key=lambda kv: -kv[1]):
        if t > 0:
            print(f"  {kind:<24} {t:8.3f} ms")
    for name, _, kernel, t in sorted(layers, key=lambda x: -x[3])[: a.top]:
        print(f"{t:8.3f}  {kernel:<28} {name}")


if __name__ == "__main__":
    main()
