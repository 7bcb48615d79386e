"""The Ray Serve deployment (anyshape.serve) on a local Ray instance bound to the
loopback address: a compiled artifact of the bundled BERT deployed, concurrent
requests of different lengths sent by several clients over HTTP and through a
handle, every answer checked against the reference interpreter; malformed
requests get a 400 with the reason and the replica keeps serving. Ray is shut
down at the end (a bounded number of requests, nothing left running)."""

import json
import os
import socket
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

import anyshape
from anyshape.serve import GenerationDeployment, RequestError, _Batcher, _Generator, _open, build

ROOT = os.path.join(os.path.dirname(__file__), "..", "fixtures")
BERT = os.path.join(ROOT, "bert", "model.onnx")
# A Llama decoder's step with its KV cache (inputs input_ids, attention_mask,
# past_key_<l>, past_value_<l>; outputs logits, present_key_<l>, ...).
DECODER = os.path.join(ROOT, "..", "fixtures-current", "llama_step", "model.onnx")


def request(rng, seq, batch=1):
    ids = rng.integers(1, 90, size=(batch, seq), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[:, seq // 2 + 1 :] = rng.integers(0, 2, size=(batch, seq - seq // 2 - 1))
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


@pytest.fixture(scope="module")
def oracle():
    return anyshape.InferenceSession(BERT, interpret=True)


def assert_matches(oracle, feeds, got):
    want = oracle.run(None, feeds)
    names = [o.name for o in oracle.get_outputs()]
    assert sorted(got) == sorted(names)
    for n, w in zip(names, want):
        g = np.asarray(got[n], dtype=np.float32)
        assert g.shape == w.shape, n
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=n)


def test_batcher_pads_within_its_budget_only(oracle):
    """Without Ray: requests of close lengths run as one call padded to its
    longest, lengths further apart than the padding budget in calls of their
    own; each answer is cut back and matches the interpreter."""
    sess = anyshape.InferenceSession(BERT, threads=1)
    calls = []

    def run(names, feeds):
        calls.append(feeds["input_ids"].shape)
        return sess.run(names, feeds)

    from anyshape.serve import _Io

    ins = [_Io(i.name, i.shape, i.type) for i in sess.get_inputs()]
    outs = [_Io(o.name, o.shape, o.type) for o in sess.get_outputs()]
    rng = np.random.default_rng(0)
    # Any padding allowed: one call, padded to the longest of the batch (never the model's maximum).
    b = _Batcher(run, ins, outs, max_padding=10.0)
    reqs = [b.check(request(rng, s, batch)) for s, batch in [(3, 1), (11, 2), (1, 1), (7, 1)]]
    for feeds, got in zip(reqs, b.run_all(reqs)):
        assert_matches(oracle, feeds, got)
    assert calls == [(5, 11)], calls
    # 10% of padding: 10, 10 and 9 together (3 tokens of 32 padded), 3 alone.
    calls.clear()
    b = _Batcher(run, ins, outs, max_padding=0.1)
    reqs = [b.check(request(rng, s)) for s in [10, 3, 9, 10]]
    for feeds, got in zip(reqs, b.run_all(reqs)):
        assert_matches(oracle, feeds, got)
    assert sorted(calls) == [(1, 3), (3, 10)], calls
    with pytest.raises(RequestError, match="rank"):
        b.check({"input_ids": [1, 2], "attention_mask": [1, 1], "token_type_ids": [0, 0]})
    with pytest.raises(RequestError, match="missing"):
        b.check({"input_ids": [[1, 2]]})
    with pytest.raises(RequestError, match="floats given"):
        b.check({"input_ids": [[1.5, 2.0]], "attention_mask": [[1, 1]], "token_type_ids": [[0, 0]]})
    with pytest.raises(RequestError, match="not an array"):
        b.check({"input_ids": [["a", "b"]], "attention_mask": [[1, 1]], "token_type_ids": [[0, 0]]})
    with pytest.raises(RequestError, match="not an input"):
        b.check({**request(rng, 2), "pixel_values": [[0.0]]})


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    artifact = str(tmp_path_factory.mktemp("serve") / "bert.anyshape")
    anyshape.InferenceSession(BERT, threads=1).save(artifact)
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    # What a Serve config file's `import_path: anyshape.serve:build` with these args deploys.
    app = build({"model": artifact, "threads": 1, "max_batch_size": 8, "batch_wait_timeout_s": 0.01})
    handle = serve.run(app, name="bert", route_prefix="/bert")
    yield handle, f"http://127.0.0.1:{port}/bert"
    serve.shutdown()
    ray.shutdown()


def post(url, body):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_concurrent_clients_get_the_interpreters_answers(served, oracle):
    handle, url = served
    failures = []

    def client(k):
        rng = np.random.default_rng(100 + k)
        for i in range(6):
            feeds = request(rng, int(rng.integers(1, 24)), batch=1 + (i % 3 == 2))
            try:
                if (k + i) % 2:
                    body = json.dumps({"inputs": {n: v.tolist() for n, v in feeds.items()}}).encode()
                    status, doc = post(url, body)
                    assert status == 200, doc
                    got = doc["outputs"]
                else:
                    got = handle.infer.remote(feeds).result(timeout_s=60)
                assert_matches(oracle, feeds, got)
            except Exception as e:  # reported below, with the client and request
                failures.append(f"client {k} request {i}: {e!r}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "clients did not finish"
    assert not failures, "\n".join(failures)


def test_malformed_requests_get_400_and_the_replica_keeps_serving(served, oracle):
    handle, url = served
    bad = [
        b"not json",
        b"[1, 2]",
        json.dumps({"inputs": {"input_ids": [[1, 2]]}}).encode(),
        json.dumps({"inputs": {"input_ids": [["a", "b"]], "attention_mask": [[1, 1]], "token_type_ids": [[0, 0]]}}).encode(),
        json.dumps({"inputs": {"input_ids": [[1, 2], [3]], "attention_mask": [[1, 1]], "token_type_ids": [[0, 0]]}}).encode(),
        json.dumps({"inputs": {"input_ids": [1, 2], "attention_mask": [1, 1], "token_type_ids": [0, 0]}}).encode(),
    ]
    for body in bad:
        status, doc = post(url, body)
        assert status == 400 and doc.get("error"), (body, status, doc)
    rng = np.random.default_rng(7)
    feeds = request(rng, 5)
    status, doc = post(url, json.dumps({"inputs": {n: v.tolist() for n, v in feeds.items()}}).encode())
    assert status == 200, doc
    assert_matches(oracle, feeds, doc["outputs"])


def test_the_example_config_is_a_valid_serve_config():
    """examples/serve_config.yaml is what Ray Serve's `serve run`/`serve deploy`
    accept, naming this package's application builder with arguments it takes."""
    import yaml
    from ray.serve.schema import ServeDeploySchema

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "serve_config.yaml")
    with open(path) as f:
        schema = ServeDeploySchema.model_validate(yaml.safe_load(f))
    (app,) = schema.applications
    assert app.import_path == "anyshape.serve:build"
    (dep,) = app.deployments
    assert dep.name == "ModelDeployment" and dep.num_replicas == 2
    bound = build(app.args)
    assert type(bound).__name__ == "Application", type(bound)
    with pytest.raises(TypeError):
        build({**app.args, "no_such_option": 1})


def greedy(backend, prompt, n, **kw):
    run, ins, outs = _open(DECODER, backend, None, 1) if backend else (None, None, None)
    if not backend:
        sess = anyshape.InferenceSession(DECODER, interpret=True)
        from anyshape.serve import _Io

        run = sess.run
        ins = [_Io(i.name, i.shape, i.type) for i in sess.get_inputs()]
        outs = [_Io(o.name, o.shape, o.type) for o in sess.get_outputs()]
    return list(_Generator(run, ins, outs).steps(_Generator.check(prompt), n, **kw))


def test_generation_gives_onnxruntimes_greedy_tokens():
    """Without Ray: the generator's greedy tokens (the prompt's step with an
    empty cache, then a step a token) are ONNX Runtime's and the
    interpreter's; an end-of-sequence token stops it; bad prompts are
    request errors."""
    prompt = [3, 17, 42, 5, 64]
    got = greedy("anyshape", prompt, 12)
    assert got == greedy("onnxruntime", prompt, 12) == greedy(None, prompt, 12), got
    assert greedy("anyshape", prompt, 12, eos=got[3]) == got[: got.index(got[3]) + 1]
    for bad, why in [([], "non-empty"), ([[1, 2], [3, 4]], "non-empty"), ([1.5], "integers"), (["ab"], "integers")]:
        with pytest.raises(RequestError, match=why):
            _Generator.check(bad)
    with pytest.raises(ValueError, match="not a decoder"):
        _open_generator(BERT)


def _open_generator(path):
    run, ins, outs = _open(path, "anyshape", None, 1)
    return _Generator(run, ins, outs)


def test_concurrent_generations_stream_their_tokens(served, tmp_path):
    """Three clients stream generations at once from one replica (a compiled
    artifact of the decoder): each gets the tokens the generator gives alone."""
    from ray import serve

    artifact = str(tmp_path / "llama_step.anyshape")
    anyshape.InferenceSession(DECODER, threads=1).save(artifact)
    # No `threads`: the replica takes as many as its CPUs (one).
    app = GenerationDeployment.options(ray_actor_options={"num_cpus": 1}).bind(artifact, max_new_tokens=10, concurrent=2)
    handle = serve.run(app, name="llama", route_prefix="/llama")
    prompts = [[1, 2, 3], [40, 41, 42, 43, 44, 45, 46], [7]]
    want = [greedy("anyshape", p, 10) for p in prompts]
    got = [None] * len(prompts)

    def client(k):
        got[k] = list(handle.options(stream=True).generate.remote(prompts[k], 20))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert got == want, (got, want)
    with pytest.raises(Exception, match="token ids"):
        list(handle.options(stream=True).generate.remote([[1.5]], 3))
    serve.delete("llama")
