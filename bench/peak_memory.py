#!/usr/bin/env python3
"""Peak memory (maximum resident set size) of one model at one shape, in
anyshape and its peers, each in a process of its own.

    python bench/peak_memory.py /work/models/bert-base/model.onnx --shape batch=1,seq=512 \
        [--threads 2] [--runs 3] [--systems anyshape,onnxruntime,openvino] [--json out.json]

Each system loads the model, prepares it (anyshape compiles, ONNX Runtime and
OpenVINO build their sessions) and runs --runs calls at the shape; the figure
is the child process's peak RSS from the kernel (`wait4`'s ru_maxrss), which
includes the weights, the code, the runtime's buffers and (for the Python peers)
the interpreter, about 30-60 MB. anyshape's own activation arena at the shape
(`anyshape inspect --stage dispatch`) is printed beside it.
"""

import argparse
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ANYSHAPE = os.path.join(ROOT, "target", "release", "anyshape")

# A peer's process: model_peers.py's own session set-up and inputs (those
# `anyshape bench` makes), one shape, --runs calls after the first. The file's
# input list is read first, so that the parsed ONNX message is gone before the
# session is built.
PEER = r"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("model_peers", sys.argv[1])
peers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peers)
path, system, threads, runs, shape = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
run = {"onnxruntime": peers.bench_ort, "openvino": peers.bench_openvino}[system]
peers.graph_inputs(path)  # the ONNX file parsed (and freed) before the session is built
run(path, [peers.parse_shape(shape)], threads, runs)
"""


def peak_rss_mb(cmd):
    """Run `cmd`; its peak RSS in MB (None when it fails)."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    err = p.stderr.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        print(f"  {cmd[0]} failed: {err.strip()[-500:]}", file=sys.stderr)
        return None
    return usage.ru_maxrss / 1024.0  # KiB on Linux


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--systems", default="anyshape,onnxruntime,openvino")
    ap.add_argument("--json")
    a = ap.parse_args()
    out = {"model": a.model, "shape": a.shape, "peak_rss_mb": {}}
    for system in a.systems.split(","):
        if system == "anyshape":
            cmd = [ANYSHAPE, "bench", a.model, "--shape", a.shape, "--threads", str(a.threads),
                   "--runs", str(a.runs)]
        else:
            peers = os.path.join(HERE, "model_peers.py")
            cmd = [sys.executable, "-c", PEER, peers, a.model, system, str(a.threads), str(a.runs), a.shape]
        mb = peak_rss_mb(cmd)
        out["peak_rss_mb"][system] = mb
        print(f"{system:12} peak RSS {mb:8.1f} MB" if mb is not None else f"{system:12} failed")
    insp = subprocess.run([ANYSHAPE, "inspect", a.model, "--stage", "dispatch", "--shape", a.shape],
                          capture_output=True, text=True)
    arena = [l for l in insp.stdout.splitlines() if l.startswith("arena:")]
    if arena:
        b = int(arena[0].split()[1])
        out["anyshape_arena_mb"] = b / 2**20
        print(f"anyshape activation arena at {a.shape}: {b / 2**20:.1f} MB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
