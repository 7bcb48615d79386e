#!/usr/bin/env python3
"""Latency of one ONNX model under real conditions, anyshape beside its peers.

    python bench/busy_peers.py /work/models/gpt2/model.onnx \
        --shape batch=1,seq=1 --shape batch=1,seq=23 --threads 2 --rounds 3 \
        [--anyshape NAME=PATH ...] [--systems anyshape,onnxruntime,openvino] \
        [--conditions quiet,busy,two] [--runs 30] [--json out.json]

Conditions (--conditions, default all three):

  quiet  the system alone on the machine
  busy   while one other process spins on a core (`while True: pass` in Python)
  two    two processes of the same system at once, each timing the same shapes
         (two sessions on the same cores); reports each one's median and the
         pair's combined calls per second

Every system runs in a process of its own (`anyshape bench --json`, or this
script with --serve SYSTEM for ONNX Runtime and OpenVINO), compiled or loaded
once per round; systems and conditions take turns (round 1: every condition of
every system, round 2: ...), and the table gives the median over the rounds of
each round's median (a busy machine's figures move from round to round: the
median of rounds, not the best, is the honest one). Ratios compare with the
first system; "slowdown" is busy over quiet of the same system.

--anyshape NAME=PATH (repeatable) times several anyshape binaries as systems of
their own (a change against the build before it, in the same run); the
default is target/release/anyshape as "anyshape".
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from model_peers import make_inputs, parse_shape, shape_str  # noqa: E402

SETTLE_S = 0.3


def serve(system, model, shapes, threads, runs):
    """Child process: time `system` on `shapes`, print one JSON line a shape."""
    if system == "onnxruntime":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        call = lambda feeds: sess.run(None, feeds)  # noqa: E731
    elif system == "openvino":
        import openvino as ov

        core = ov.Core()
        compiled = core.compile_model(
            core.read_model(model), "CPU", {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"}
        )
        req = compiled.create_infer_request()
        call = req.infer
    else:
        raise SystemExit(f"unknown system {system}")
    for s in shapes:
        feeds = make_inputs(model, s)
        call(feeds)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            call(feeds)
            times.append((time.perf_counter() - t) * 1e3)
        print(json.dumps({"shape": s, "median_ms": statistics.median(times)}), flush=True)


def command(system, binary, a, shapes):
    if binary is not None:
        cmd = [binary, "bench", a.model, "--threads", str(a.threads), "--runs", str(a.runs), "--json"]
        for s in shapes:
            cmd += ["--shape", shape_str(s)]
        return cmd
    cmd = [sys.executable, os.path.abspath(__file__), a.model, "--serve", system, "--threads", str(a.threads),
           "--runs", str(a.runs)]
    for s in shapes:
        cmd += ["--shape", shape_str(s)]
    return cmd


def parse(out):
    return [json.loads(line)["median_ms"] for line in out.splitlines() if line.startswith("{")]


def run_condition(system, binary, a, shapes, condition):
    """Medians per shape (a list per process: one, or two for `two`)."""
    cmd = command(system, binary, a, shapes)
    busy = None
    if condition == "busy":
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.2)
    try:
        n = 2 if condition == "two" else 1
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
        outs = []
        for p in procs:
            out, err = p.communicate()
            if p.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {err.strip()[-1500:]}")
            outs.append(parse(out))
        return outs
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--shape", action="append", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--anyshape", action="append", metavar="NAME=PATH")
    ap.add_argument("--systems", default="anyshape,onnxruntime,openvino")
    ap.add_argument("--conditions", default="quiet,busy,two")
    ap.add_argument("--json")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    a = ap.parse_args()
    shapes = [parse_shape(s) for s in a.shape]
    if a.serve:
        serve(a.serve, a.model, shapes, a.threads, a.runs)
        return

    binaries = {}
    for spec in a.anyshape or [f"anyshape={os.path.join(ROOT, 'target', 'release', 'anyshape')}"]:
        name, _, path = spec.partition("=")
        if not path or not os.access(path, os.X_OK):
            ap.error(f"--anyshape {spec}: give NAME=PATH of an executable")
        binaries[name] = path
    systems = []
    for s in a.systems.split(","):
        # "anyshape" names every --anyshape build; each system runs once a round.
        systems += [n for n in (list(binaries) if s == "anyshape" else [s]) if n not in systems]
    conditions = a.conditions.split(",")
    for c in conditions:
        if c not in ("quiet", "busy", "two"):
            ap.error(f"unknown condition {c!r} (quiet, busy, two)")

    got = {(s, c): [] for s in systems for c in conditions}
    for r in range(a.rounds):
        for s in systems:
            for c in conditions:
                time.sleep(SETTLE_S)
                got[(s, c)].append(run_condition(s, binaries.get(s), a, shapes, c))
                print(f"(round {r + 1}: {s} {c} done)", file=sys.stderr)

    def med(s, c, i, proc=0):
        return statistics.median(r[proc][i] for r in got[(s, c)])

    base = systems[0]
    rows = []
    for i, sh in enumerate(shapes):
        row = {"shape": sh}
        for s in systems:
            for c in conditions:
                row[f"{s} {c} ms"] = med(s, c, i)
                # Each round's median too: a machine whose speed swings shows it here.
                row[f"{s} {c} ms by round"] = [r[0][i] for r in got[(s, c)]]
                if c == "two":
                    row[f"{s} two calls/s"] = sum(1e3 / med(s, c, i, p) for p in range(2))
        rows.append(row)
    cols = []
    for c in conditions:
        cols += [f"{s} {c} ms" for s in systems]
        if c == "two":
            cols += [f"{s} two calls/s" for s in systems]
    print("| shape | " + " | ".join(cols) + " |"
          + "".join(f" {s} busy / quiet |" for s in systems if "busy" in conditions and "quiet" in conditions))
    print("|" + "---|" * (1 + len(cols) + (len(systems) if "busy" in conditions and "quiet" in conditions else 0)))
    for row in rows:
        cells = [f"{row[c]:.2f}" if "ms" in c else f"{row[c]:.1f}" for c in cols]
        slow = ([f"{row[f'{s} busy ms'] / row[f'{s} quiet ms']:.2f}x" for s in systems]
                if "busy" in conditions and "quiet" in conditions else [])
        print(f"| {shape_str(row['shape'])} | " + " | ".join(cells) + " |" + "".join(f" {x} |" for x in slow))
    for c in conditions:
        for s in systems[1:]:
            ratios = [row[f"{s} {c} ms"] / row[f"{base} {c} ms"] for row in rows]
            print(f"{c}: {s} / {base}: " + ", ".join(f"{x:.2f}" for x in ratios))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "threads": a.threads, "runs": a.runs, "rounds": a.rounds,
                       "cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": "),
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
