"""Serving throughput and latency on Ray Serve: the same deployment
(anyshape.serve.ModelDeployment, dynamic batching) backed by anyshape (a
compiled artifact) and by ONNX Runtime, one after the other on this machine.

Clients send single requests of random sequence lengths through a Ray handle
(``--http`` also over HTTP with JSON), at each concurrency level; the report
gives requests per second and p50/p99 latency per backend and level.

    .venv-serve/bin/python bench/serve_bench.py /work/models/bert-base/model.onnx \\
        --threads 2 --concurrency 1,4,16,64 --requests 64 --seq 8..128 --json out.json

With ``--generate N`` the model is a decoder with its KV cache (optimum's
``text-generation-with-past``, tools/models/export_decoder.py) served by
``anyshape.serve.GenerationDeployment``: each request streams N new tokens
(greedy) after a prompt of random length (``--seq``); the report gives
requests and tokens per second, the time to the first token and the time
per later token (p50/p99):

    .venv-serve/bin/python bench/serve_bench.py /work/models/llama-100m-optimum/model.onnx \\
        --generate 16 --seq 8..128 --concurrency 1,4,16 --requests 32
"""

import argparse
import json
import os
import socket
import tempfile
import threading
import time
import urllib.request

import numpy as np


def feeds_for(input_names, rng, lo, hi):
    seq = int(rng.integers(lo, hi + 1))
    ids = rng.integers(1000, 20000, size=(1, seq), dtype=np.int64)
    f = {"input_ids": ids}
    if "attention_mask" in input_names:
        f["attention_mask"] = np.ones_like(ids)
    if "token_type_ids" in input_names:
        f["token_type_ids"] = np.zeros_like(ids)
    return f


def run_clients(client, concurrency):
    """`client(k)` on `concurrency` threads at once; the seconds they took."""
    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def measure(send, input_names, concurrency, requests, lo, hi, seed):
    latencies = []
    lock = threading.Lock()
    per_client = max(1, requests // concurrency)

    def client(k):
        rng = np.random.default_rng(seed + k)
        for _ in range(per_client):
            f = feeds_for(input_names, rng, lo, hi)
            t = time.perf_counter()
            send(f)
            dt = time.perf_counter() - t
            with lock:
                latencies.append(dt)

    wall = run_clients(client, concurrency)
    lat = np.array(latencies) * 1e3
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "throughput_rps": len(latencies) / wall,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
    }


def measure_generation(stream, concurrency, requests, lo, hi, new_tokens, seed):
    """Clients that each stream generations: per request the time to its first
    token and between later tokens."""
    first, later, tokens = [], [], [0]
    lock = threading.Lock()
    per_client = max(1, requests // concurrency)

    def client(k):
        rng = np.random.default_rng(seed + k)
        for _ in range(per_client):
            prompt = rng.integers(1000, 20000, size=int(rng.integers(lo, hi + 1))).tolist()
            t = time.perf_counter()
            stamps = []
            for _token in stream(prompt, new_tokens):
                stamps.append(time.perf_counter())
            with lock:
                first.append(stamps[0] - t)
                later.extend(b - a for a, b in zip(stamps, stamps[1:]))
                tokens[0] += len(stamps)

    wall = run_clients(client, concurrency)
    f, g = np.array(first) * 1e3, np.array(later) * 1e3
    return {
        "concurrency": concurrency,
        "requests": len(first),
        "throughput_rps": len(first) / wall,
        "tokens_per_s": tokens[0] / wall,
        "first_token_p50_ms": float(np.percentile(f, 50)),
        "first_token_p99_ms": float(np.percentile(f, 99)),
        "next_token_p50_ms": float(np.percentile(g, 50)) if len(g) else None,
        "next_token_p99_ms": float(np.percentile(g, 99)) if len(g) else None,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2, help="threads per replica")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--requests", type=int, default=64, help="requests per level")
    p.add_argument("--seq", default="8..128")
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--wait-ms", type=float, default=2.0)
    p.add_argument("--backends", default="anyshape,onnxruntime")
    p.add_argument("--http", action="store_true", help="send over HTTP with JSON instead of a handle")
    p.add_argument("--generate", type=int, metavar="N", help="a decoder: stream N new tokens per request")
    p.add_argument("--concurrent", type=int, default=4, help="with --generate: requests a replica steps at once")
    p.add_argument("--json")
    a = p.parse_args()
    lo, hi = (int(x) for x in a.seq.split(".."))
    levels = [int(c) for c in a.concurrency.split(",")]

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    import anyshape
    from anyshape.serve import GenerationDeployment, ModelDeployment

    tmp = tempfile.mkdtemp()
    artifact = os.path.join(tmp, "model.anyshape")
    t = time.perf_counter()
    sess = anyshape.InferenceSession(a.model, threads=a.threads)
    sess.save(artifact)
    names = [i.name for i in sess.get_inputs()]
    del sess
    print(f"compiled and saved the artifact in {time.perf_counter() - t:.1f} s")

    ray.init(num_cpus=max(2, a.threads * a.replicas), include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    results = []
    for backend in a.backends.split(","):
        model = artifact if backend == "anyshape" else a.model
        if a.generate:
            app = GenerationDeployment.options(num_replicas=a.replicas, ray_actor_options={"num_cpus": a.threads}).bind(
                model, backend=backend, threads=a.threads, max_new_tokens=a.generate, concurrent=a.concurrent
            )
            handle = serve.run(app, name=backend, route_prefix=f"/{backend}")

            def stream(prompt, n, handle=handle):
                return handle.options(stream=True).generate.remote(prompt, n)

            measure_generation(stream, 2, 2, lo, hi, 2, 99)  # warm-up
            for c in levels:
                r = measure_generation(stream, c, a.requests, lo, hi, a.generate, 1000 * c)
                r["backend"] = backend
                results.append(r)
                print(
                    f"{backend:12s} concurrency {c:3d}: {r['throughput_rps']:6.2f} req/s, {r['tokens_per_s']:6.1f} "
                    f"tokens/s, first token p50 {r['first_token_p50_ms']:7.1f} p99 {r['first_token_p99_ms']:7.1f} ms, "
                    f"next token p50 {r['next_token_p50_ms']:6.1f} p99 {r['next_token_p99_ms']:6.1f} ms",
                    flush=True,
                )
            serve.delete(backend)
            continue
        app = ModelDeployment.options(num_replicas=a.replicas, ray_actor_options={"num_cpus": a.threads}).bind(
            model, backend=backend, threads=a.threads, max_batch_size=a.max_batch, batch_wait_timeout_s=a.wait_ms / 1e3
        )
        handle = serve.run(app, name=backend, route_prefix=f"/{backend}")
        url = f"http://127.0.0.1:{port}/{backend}"

        def send(f, handle=handle, url=url):
            if a.http:
                body = json.dumps({"inputs": {k: v.tolist() for k, v in f.items()}}).encode()
                req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=300) as r:
                    r.read()
            else:
                handle.infer.remote(f).result(timeout_s=300)

        measure(send, names, 2, 8, lo, hi, 99)  # warm-up
        for c in levels:
            r = measure(send, names, c, a.requests, lo, hi, 1000 * c)
            r["backend"] = backend
            results.append(r)
            print(
                f"{backend:12s} concurrency {c:3d}: {r['throughput_rps']:7.1f} req/s, "
                f"p50 {r['p50_ms']:8.1f} ms, p99 {r['p99_ms']:8.1f} ms ({r['requests']} requests)",
                flush=True,
            )
        serve.delete(backend)
    serve.shutdown()
    ray.shutdown()
    for c in levels:
        row = {r["backend"]: r for r in results if r["concurrency"] == c}
        if "anyshape" in row and "onnxruntime" in row:
            x, o = row["anyshape"], row["onnxruntime"]
            if a.generate:
                print(
                    f"concurrency {c:3d}: tokens/s anyshape/ORT {x['tokens_per_s'] / o['tokens_per_s']:.2f}x, "
                    f"first token ORT/anyshape {o['first_token_p50_ms'] / x['first_token_p50_ms']:.2f}x, "
                    f"next token ORT/anyshape {o['next_token_p50_ms'] / x['next_token_p50_ms']:.2f}x"
                )
                continue
            print(
                f"concurrency {c:3d}: throughput anyshape/ORT {x['throughput_rps'] / o['throughput_rps']:.2f}x, "
                f"p50 ORT/anyshape {o['p50_ms'] / x['p50_ms']:.2f}x, p99 ORT/anyshape {o['p99_ms'] / x['p99_ms']:.2f}x"
            )
    if a.json:
        with open(a.json, "w") as f:
            doc = {"model": a.model, "threads": a.threads, "replicas": a.replicas, "seq": a.seq, "http": a.http}
            doc["generate"] = a.generate
            json.dump({**doc, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
