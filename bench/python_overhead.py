"""What a call costs from Python against the Rust API, on the same model and
inputs: the median of `InferenceSession.run` and of `anyshape bench` (the Rust
`CompiledModel::run`), measured in turns so that the machine's drift hits both.

    .venv-py/bin/python bench/python_overhead.py /work/models/bert-base/model.onnx \\
        --shape batch=1,seq=1 --threads 2 --runs 200 --rounds 3
"""

import argparse
import json
import subprocess
import time

import numpy as np

import anyshape


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--shape", default="batch=1,seq=1")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cli", default="target/release/anyshape")
    a = p.parse_args()
    dims = dict((k, int(v)) for k, v in (kv.split("=") for kv in a.shape.split(",")))
    sess = anyshape.InferenceSession(a.model, threads=a.threads)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else dims[d] for d in i.shape]
        n = int(np.prod(shape))
        if i.type == "int64":
            v = np.ones(n, np.int64) if "mask" in i.name else (np.arange(n) * 7 % 90).astype(np.int64)
            if "type" in i.name or "position" in i.name:
                v = np.zeros(n, np.int64)
        else:
            v = ((np.arange(n) * 37 % 101).astype(np.float32) - 50) / 50
        feeds[i.name] = v.reshape(shape)
    py, rust = [], []
    for _ in range(a.rounds):
        sess.run(None, feeds)
        times = []
        for _ in range(a.runs):
            t = time.perf_counter()
            sess.run(None, feeds)
            times.append(time.perf_counter() - t)
        py.append(float(np.median(times)) * 1e3)
        out = subprocess.run(
            [a.cli, "bench", a.model, "--shape", a.shape, "--threads", str(a.threads), "--runs", str(a.runs), "--json"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        rust.append(json.loads(out.strip().splitlines()[-1])["median_ms"])
    pm, rm = float(np.median(py)), float(np.median(rust))
    print(f"{a.model} {a.shape}, {a.threads} threads: Python run {pm:.4f} ms, Rust run {rm:.4f} ms, "
          f"overhead {pm - rm:+.4f} ms ({100 * (pm - rm) / rm:+.1f}%); rounds py {py} rust {rust}")


if __name__ == "__main__":
    main()
