#!/usr/bin/env python3
"""Two sessions in one process, called at once from two threads: each on a
pool of its own (anyshape's default) or both on one shared pool
(``anyshape.ThreadPool``), against ONNX Runtime's two sessions (each with its
own intra-op pool, its default) in the same run. Reports the combined calls
per second; the conditions take turns, round after round.

    .venv-serve/bin/python bench/shared_pool.py /work/models/bert-base/model.onnx \\
        --seq 1,23,128 --threads 2 --seconds 6 --rounds 3 [--json out.json]
"""

import argparse
import json
import statistics
import threading
import time

import numpy as np


def feeds_for(names, seq):
    ids = ((np.arange(seq, dtype=np.int64) * 7) % 90).reshape(1, seq)
    f = {"input_ids": ids}
    if "attention_mask" in names:
        f["attention_mask"] = np.ones_like(ids)
    if "token_type_ids" in names:
        f["token_type_ids"] = np.zeros_like(ids)
    return f


def together(runs, feeds, seconds):
    """Each run called in a loop on a thread of its own for `seconds`: the
    combined calls per second."""
    counts = [0] * len(runs)
    stop = time.perf_counter() + seconds

    def loop(k):
        while time.perf_counter() < stop:
            runs[k](None, feeds)
            counts[k] += 1

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(len(runs))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--seq", default="1,23,128")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args()

    import anyshape
    import onnxruntime as ort

    own = [anyshape.InferenceSession(a.model, threads=a.threads) for _ in range(2)]
    pool = anyshape.ThreadPool(a.threads)
    shared = [anyshape.InferenceSession(a.model, pool=pool) for _ in range(2)]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = a.threads
    opts.inter_op_num_threads = 1
    peers = [ort.InferenceSession(a.model, opts, providers=["CPUExecutionProvider"]) for _ in range(2)]
    names = [i.name for i in own[0].get_inputs()]
    conditions = {
        "anyshape, a pool each": [s.run for s in own],
        "anyshape, one shared pool": [s.run for s in shared],
        "onnxruntime, a pool each": [s.run for s in peers],
    }
    results = {}
    for seq in (int(s) for s in a.seq.split(",")):
        feeds = feeds_for(names, seq)
        for runs in conditions.values():
            together(runs, feeds, 0.5)  # warm-up
        rates = {c: [] for c in conditions}
        for _ in range(a.rounds):
            for c, runs in conditions.items():
                rates[c].append(together(runs, feeds, a.seconds))
        results[seq] = {c: statistics.median(r) for c, r in rates.items()}
        row = ", ".join(f"{c} {v:.1f}" for c, v in results[seq].items())
        print(f"seq {seq}: combined calls/s: {row}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "threads": a.threads, "seconds": a.seconds, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
