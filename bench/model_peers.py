#!/usr/bin/env python3
"""End-to-end latency of one ONNX model in anyshape and its peers, in the same run.

    python bench/model_peers.py /work/models/bert-base/model.onnx \
        --shape batch=1,seq=1 --shape batch=1,seq=128 --threads 2 --rounds 3 [--json out.json] \
        [--pause MS] [--systems anyshape,onnxruntime,openvino,torch,torch.compile] [--torch-model bert-base]

Per system and shape: the first call and the median of --runs warm calls; the
systems take turns (round 1: every system, round 2: every system, ...) and each
keeps its best median, so that one slow phase of the machine does not decide a
ratio. A first call is one sample per round and the noisiest figure (a process's
first call after its compile sometimes took 40% longer than its warm calls in one
round and 5% in the next): the table gives the median of the rounds' first calls.
Systems (--systems, default every one that is available):

  anyshape       `anyshape bench --json`, compiled once per round
  anyshape-bf16  the same with `--precision bf16` (contractions in bf16; only when
                 asked for: AVX-512 BF16 machines)
  anyshape-int8-float  a quantized model with `--int8 float` (its 8-bit products on
                 the f32 family instead of the integer kernels; only when asked for)
  anyshape-int8-i16  a quantized model with `--int8 i16` (its int8 weights as 16-bit
                 integers instead of bytes; only when asked for)
  onnxruntime    CPU provider, all graph optimizations, intra-op threads = --threads
                 (alias: ort)
  openvino       CPU, f32, INFERENCE_NUM_THREADS = --threads, when installed
  openvino-bf16  the same with INFERENCE_PRECISION_HINT = bf16 (checked to be in
                 effect; only when asked for: the peer of anyshape-bf16)
  torch          PyTorch eager under torch.inference_mode(), torch.set_num_threads(--threads)
  torch.compile  torch.compile(model, dynamic=True) (inductor), same threads and mode

PyTorch cannot run the ONNX file, so the two torch systems run the architecture
the file was exported from, built by tools/models/export_full.py's build_model
(same config, seed --torch-seed, eval mode, eager attention). --torch-model names
it (bert-base, gpt2, vit-base, resnet-50, albert-base, t5-encoder, mobilenetv2);
without it the name is the model file's folder (/work/models/bert-base/model.onnx
-> bert-base; a "-dynamo" suffix is dropped), and the torch systems are skipped
with a note when that is not a known model or torch/transformers do not import.
Its weights are a fresh random init: they may differ from the file's (they match
only if the file was exported with the same seed and torch version), which does
not matter for timing. torch.compile is reset (torch._dynamo.reset()) at the start
of every round, so its first call at a shape includes tracing and compilation
(inductor's on-disk caches, /tmp/torchinductor_$USER, make a later
round's or a later run's compile faster); with dynamic=True a later shape
usually reuses the graph (dims of size 1 are specialized, so batch=1 and seq=1
get graphs of their own). The warm median is
the figure to compare. A system that fails (a missing C compiler for inductor,
say) is reported and dropped; the others go on.

Inputs are those `anyshape bench` makes: token ids i*7 % 90, attention masks of
ones, zeros for other integer inputs, a fixed pattern for floats; the torch
systems get the same arrays as torch tensors. Between systems the script sleeps
0.1 s, so that one system's spinning worker threads do not eat into the next.

With --pause MS, each system also makes --runs calls that each follow MS
milliseconds of idle sleep (a server between sporadic requests: its threads
park, the machine idles), and the table gives their median (the median over
the rounds) next to the warm median.

Prints a table of medians, their ratios to the first system (anyshape when it
runs) and first calls; --json writes every result (per system per shape:
first_call_ms, median_ms, and with --pause pause_ms and after_pause_ms;
bench/plot_models.py plots such files).
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
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# bench/profile.py would shadow the standard library's profile module (cProfile imports
# it; torch._dynamo imports cProfile): nothing is imported from bench/, so drop it.
sys.path = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
ALL_SYSTEMS = [
    "anyshape",
    "onnxruntime",
    "openvino",
    "torch",
    "torch.compile",
    "anyshape-bf16",
    "anyshape-int8-float",
    "anyshape-int8-i16",
    "openvino-bf16",
]
OPT_IN = ("anyshape-bf16", "anyshape-int8-float", "anyshape-int8-i16", "openvino-bf16")
ALIASES = {"ort": "onnxruntime", "ov": "openvino", "eager": "torch", "compile": "torch.compile"}
TORCH_SYSTEMS = ("torch", "torch.compile")
SETTLE_S = 0.1


def parse_shape(s):
    return {k: int(v) for k, v in (kv.split("=") for kv in s.split(","))}


def shape_str(s):
    return ",".join(f"{k}={v}" for k, v in s.items())


_GRAPH_INPUTS = {}


def graph_inputs(model_path):
    """(name, elem_type, dims) of the model's non-initializer inputs; parsed once per file."""
    if model_path not in _GRAPH_INPUTS:
        import onnx

        m = onnx.load(model_path, load_external_data=False)
        inits = {t.name for t in m.graph.initializer}
        _GRAPH_INPUTS[model_path] = [
            (i.name, i.type.tensor_type.elem_type,
             [d.dim_value if d.HasField("dim_value") else d.dim_param for d in i.type.tensor_type.shape.dim])
            for i in m.graph.input if i.name not in inits
        ]
    return _GRAPH_INPUTS[model_path]


def dim_value(d, shape):
    """A dim of an input at `shape`: a number, a symbol, or an expression of
    symbols (optimum's mask: 'past_sequence_length + sequence_length')."""
    if not isinstance(d, str):
        return d
    if d in shape:
        return shape[d]
    return int(eval(d, {"__builtins__": {}}, dict(shape)))  # noqa: S307 (names and + - * / only)


def make_inputs(model_path, shape):
    import onnx

    feeds = {}
    for name, elem_type, dims in graph_inputs(model_path):
        dims = [dim_value(d, shape) for d in dims]
        n = int(np.prod(dims)) if dims else 1
        if elem_type == onnx.TensorProto.INT64:
            if "mask" in name:
                v = np.ones(n, np.int64)
            elif "ids" in name and "type" not in name and "position" not in name:
                v = (np.arange(n, dtype=np.int64) * 7) % 90
            else:
                v = np.zeros(n, np.int64)
        else:
            v = (((np.arange(n) * 37) % 101).astype(np.float32) - 50.0) / 50.0
        feeds[name] = v.reshape(dims)
    return feeds


PAUSE_MS = None  # --pause


def time_calls(fn, runs):
    """The first call, the median of warm calls and, with --pause, the median of
    calls made each after PAUSE_MS of sleep (None without it)."""
    t = time.perf_counter()
    fn()
    first = (time.perf_counter() - t) * 1e3

    def median(pause_s):
        times = []
        for _ in range(runs):
            if pause_s:
                time.sleep(pause_s)
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)

    med = median(0)
    return first, med, (median(PAUSE_MS / 1e3) if PAUSE_MS is not None else None)


def result(s, timed, **extra):
    first, med, paused = timed
    r = {"shape": s, "first_call_ms": first, "median_ms": med, **extra}
    if paused is not None:
        r.update(pause_ms=PAUSE_MS, after_pause_ms=paused)
    return r


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
        out.append(result(s, time_calls(lambda: sess.run(None, feeds), runs), compile_ms=compile_ms))
    return out


def bench_openvino(path, shapes, threads, runs, precision="f32"):
    import openvino as ov

    core = ov.Core()
    t = time.perf_counter()
    compiled = core.compile_model(
        core.read_model(path), "CPU", {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": precision}
    )
    compile_ms = (time.perf_counter() - t) * 1e3
    # OpenVINO falls back to f32 where the CPU lacks the precision: a bf16 figure
    # counts only when the compiled model says it is in effect.
    in_effect = str(compiled.get_property("INFERENCE_PRECISION_HINT")).lower()
    if {"f32": "float32", "bf16": "bfloat16"}[precision] not in in_effect:
        raise RuntimeError(f"openvino runs {in_effect}, not {precision}, on this CPU")
    req = compiled.create_infer_request()
    out = []
    for s in shapes:
        feeds = make_inputs(path, s)
        out.append(result(s, time_calls(lambda: req.infer(feeds), runs), compile_ms=compile_ms))
    return out


def bench_anyshape(path, shapes, threads, runs, binary, extra=()):
    if not os.access(binary, os.X_OK):
        raise FileNotFoundError(f"no anyshape binary at {binary} (cargo build --release, or --anyshape PATH)")
    cmd = [binary, "bench", path, "--threads", str(threads), "--runs", str(runs), "--json", *extra]
    if PAUSE_MS is not None:
        cmd += ["--pause", str(PAUSE_MS)]
    for s in shapes:
        cmd += ["--shape", shape_str(s)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()[-2000:]}")
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


class TorchModel:
    """The torch architecture of the ONNX file, built once and shared by both torch systems."""

    def __init__(self, name, seed, threads):
        import torch

        sys.path.insert(0, os.path.join(ROOT, "tools", "models"))
        from export_full import build_model

        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass  # already set (only allowed before the first inter-op work)
        t = time.perf_counter()
        self.spec, self.to_torch = build_model(name, seed)
        self.build_ms = (time.perf_counter() - t) * 1e3
        self.module = self.spec.module
        self.name = name


def bench_torch(tm, path, shapes, runs, compile):
    import torch

    fn = tm.module
    if compile:
        import torch._dynamo

        torch._dynamo.reset()  # compile again this round: the first call per shape includes it
        fn = torch.compile(tm.module, dynamic=True)  # lazy: tracing and compiling happen at the first call
    out = []
    with torch.inference_mode():
        for s in shapes:
            kwargs = tm.to_torch(make_inputs(path, s), s)
            out.append(result(s, time_calls(lambda: fn(**kwargs), runs)))
    return out


def infer_torch_model(model_path):
    name = os.path.basename(os.path.dirname(os.path.abspath(model_path)))
    return name[: -len("-dynamo")] if name.endswith("-dynamo") else name


def short_error(e):
    msg = f"{type(e).__name__}: {e}".strip()
    lines = [ln for ln in msg.splitlines() if ln.strip()]
    return "\n    ".join(lines[:12]) + ("\n    ..." if len(lines) > 12 else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--shape", action="append", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--anyshape", default=os.path.join(ROOT, "target", "release", "anyshape"))
    ap.add_argument("--systems", default=",".join(n for n in ALL_SYSTEMS if n not in OPT_IN),
                    help="comma-separated, in table order (default: %(default)s; aliases ort, ov, eager, compile)")
    ap.add_argument("--torch-model", help="architecture for the torch systems (default: the model file's folder name)")
    ap.add_argument("--torch-seed", type=int, default=0, help="seed of the torch model's random init (default 0)")
    ap.add_argument("--json")
    ap.add_argument("--pause", type=float, metavar="MS",
                    help="also time calls that each follow MS milliseconds of idle sleep")
    a = ap.parse_args()
    global PAUSE_MS
    if a.pause is not None:
        if not 0 <= a.pause <= 60000:
            ap.error("--pause: give milliseconds from 0 to 60000")
        PAUSE_MS = a.pause
    shapes = [parse_shape(s) for s in a.shape]

    wanted = []
    for n in a.systems.split(","):
        n = ALIASES.get(n.strip(), n.strip())
        if n not in ALL_SYSTEMS:
            ap.error(f"unknown system {n!r} (known: {', '.join(ALL_SYSTEMS)})")
        if n not in wanted:
            wanted.append(n)

    skipped = {}
    runners = {}
    for name in wanted:
        if name == "anyshape":
            runners[name] = lambda: bench_anyshape(a.model, shapes, a.threads, a.runs, a.anyshape)
        elif name == "anyshape-bf16":
            runners[name] = lambda: bench_anyshape(
                a.model, shapes, a.threads, a.runs, a.anyshape, ["--precision", "bf16"]
            )
        elif name == "anyshape-int8-float":
            runners[name] = lambda: bench_anyshape(
                a.model, shapes, a.threads, a.runs, a.anyshape, ["--int8", "float"]
            )
        elif name == "anyshape-int8-i16":
            runners[name] = lambda: bench_anyshape(
                a.model, shapes, a.threads, a.runs, a.anyshape, ["--int8", "i16"]
            )
        elif name == "onnxruntime":
            runners[name] = lambda: bench_ort(a.model, shapes, a.threads, a.runs)
        elif name == "openvino":
            try:
                import openvino  # noqa: F401

                runners[name] = lambda: bench_openvino(a.model, shapes, a.threads, a.runs)
            except ImportError:
                skipped[name] = "openvino not installed"
        elif name == "openvino-bf16":
            try:
                import openvino  # noqa: F401

                runners[name] = lambda: bench_openvino(a.model, shapes, a.threads, a.runs, "bf16")
            except ImportError:
                skipped[name] = "openvino not installed"

    if any(n in wanted for n in TORCH_SYSTEMS):
        tm, why = None, None
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as e:
            why = f"torch/transformers do not import ({e})"
        if why is None:
            sys.path.insert(0, os.path.join(ROOT, "tools", "models"))
            from export_full import MODELS

            tname = a.torch_model or infer_torch_model(a.model)
            if tname not in MODELS:
                how = "--torch-model" if a.torch_model else f"folder name of {a.model}"
                why = f"no torch model for {tname!r} ({how}); pass --torch-model one of {', '.join(MODELS)}"
            else:
                try:
                    tm = TorchModel(tname, a.torch_seed, a.threads)
                    print(f"(torch: built {tname} with seed {a.torch_seed} in {tm.build_ms:.0f} ms; "
                          f"{a.threads} threads; random weights, not the ONNX file's)", file=sys.stderr)
                except Exception as e:  # noqa: BLE001
                    why = f"building {tname} failed: {short_error(e)}"
        for name in TORCH_SYSTEMS:
            if name not in wanted:
                continue
            if tm is None:
                skipped[name] = why
            else:
                runners[name] = (lambda c: lambda: bench_torch(tm, a.model, shapes, a.runs, c))(
                    name == "torch.compile")
    runners = {n: runners[n] for n in wanted if n in runners}  # table order = --systems order
    for name, why in skipped.items():
        print(f"({name} skipped: {why})", file=sys.stderr)

    best = {name: [None] * len(shapes) for name in runners}
    firsts = {name: [[] for _ in shapes] for name in runners}
    paused = {name: [[] for _ in shapes] for name in runners}
    for r in range(a.rounds):
        for name in list(runners):
            time.sleep(SETTLE_S)
            try:
                results = runners[name]()
            except Exception as e:  # noqa: BLE001
                skipped[name] = f"failed in round {r + 1}: {short_error(e)}"
                print(f"({name} failed in round {r + 1}, dropped: {short_error(e)})", file=sys.stderr)
                del runners[name]
                del best[name]
                continue
            if len(results) != len(shapes):
                raise RuntimeError(f"{name}: {len(results)} results for {len(shapes)} shapes")
            for i, res in enumerate(results):
                if res.get("first_call_ms") is not None:
                    firsts[name][i].append(res["first_call_ms"])
                if res.get("after_pause_ms") is not None:
                    paused[name][i].append(res["after_pause_ms"])
                cur = best[name][i]
                if cur is None or res["median_ms"] < cur["median_ms"]:
                    best[name][i] = res

    # The best round's median, the rounds' median first call.
    for name in best:
        for i, res in enumerate(best[name]):
            if res is not None and firsts[name][i]:
                best[name][i] = dict(res, first_call_ms=statistics.median(firsts[name][i]))
            if res is not None and paused[name][i]:
                best[name][i]["after_pause_ms"] = statistics.median(paused[name][i])
    names = list(best)
    if not names:
        print("no system ran", file=sys.stderr)
        sys.exit(1)
    base = names[0]
    first_cols = [base] + (["torch.compile"] if "torch.compile" in names and base != "torch.compile" else [])
    header = ("| shape | " + " | ".join(f"{n} ms" for n in names) + " | "
              + "".join(f"{n} / {base} | " for n in names[1:])
              + " | ".join(f"{n} first call ms" for n in first_cols) + " |")
    pause_cols = names if PAUSE_MS is not None else []
    header += "".join(f" {n} after {PAUSE_MS:g} ms pause / warm |" for n in pause_cols)
    print(header)
    print("|" + "---|" * (1 + 2 * len(names) - 1 + len(first_cols) + len(pause_cols)))
    for i, s in enumerate(shapes):
        meds = [best[n][i]["median_ms"] for n in names]
        cells = [f"{m:.3f}" for m in meds] + [f"{m / meds[0]:.2f}x" for m in meds[1:]]
        cells += [f"{best[n][i]['first_call_ms']:.3f}" for n in first_cols]
        cells += [f"{best[n][i]['after_pause_ms'] / best[n][i]['median_ms']:.2f}x" for n in pause_cols]
        print(f"| {shape_str(s)} | " + " | ".join(cells) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "threads": a.threads, "rounds": a.rounds, "runs": a.runs,
                       "shapes": shapes, "systems": names,
                       "torch_model": (a.torch_model or infer_torch_model(a.model))
                       if any(n in names for n in TORCH_SYSTEMS) else None,
                       "torch_seed": a.torch_seed, "skipped": skipped, "results": best}, f, indent=1)


if __name__ == "__main__":
    main()
