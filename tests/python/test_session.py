"""The Python package against the committed fixtures (ONNX Runtime's outputs),
its errors for bad input, and one session used from several threads."""

import json
import os
import threading

import numpy as np
import pytest

import anyshape

ROOT = os.path.join(os.path.dirname(__file__), "..", "fixtures")
MANIFEST = json.load(open(os.path.join(ROOT, "manifest.json")))


def cases(name):
    entry = next(m for m in MANIFEST["models"] if m["name"] == name)
    for c in entry["cases"]:
        d = os.path.join(ROOT, c["dir"])
        feeds = {i["name"]: np.load(os.path.join(d, i["name"] + ".npy")) for i in entry["inputs"]}
        want = {o["name"]: np.load(os.path.join(d, "expected", o["name"] + ".npy")) for o in entry["outputs"]}
        yield feeds, want


def in_threads(fn, n=4):
    """Run fn(k) on n threads at once; fail with every thread's exception."""
    errors = []

    def guarded(k):
        try:
            fn(k)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.fixture(scope="module")
def bert():
    return anyshape.InferenceSession(os.path.join(ROOT, "bert", "model.onnx"), threads=2)


@pytest.mark.parametrize("name", ["bert", "gpt2", "vit", "resnet"])
def test_fixtures_match_onnxruntime(name):
    sess = anyshape.InferenceSession(os.path.join(ROOT, name, "model.onnx"), threads=2)
    outputs = [o.name for o in sess.get_outputs()]
    for feeds, want in cases(name):
        got = sess.run(None, feeds)
        assert len(got) == len(outputs)
        for n, g in zip(outputs, got):
            assert g.shape == want[n].shape and g.dtype == want[n].dtype, n
            np.testing.assert_allclose(g, want[n], rtol=1e-4, atol=1e-4, err_msg=n)


def test_a_decoders_first_step_takes_an_empty_cache():
    """A generation's first step passes an empty KV cache, with no `dims`."""
    root = os.path.join(os.path.dirname(__file__), "..", "fixtures-current")
    sess = anyshape.InferenceSession(os.path.join(root, "llama_step", "model.onnx"), threads=2)
    d = os.path.join(root, "llama_step", "case0")
    feeds = {i.name: np.load(os.path.join(d, i.name + ".npy")) for i in sess.get_inputs()}
    assert feeds["past_key_0"].shape[2] == 0
    for name, got in zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)):
        want = np.load(os.path.join(d, "expected", name + ".npy"))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)


def test_freed_outputs_serve_the_next_steps():
    """A decoder's outputs (its whole KV cache) go back to the session when their
    arrays are freed, and the next steps' outputs reuse their memory: each step
    equal to the interpreter's, fed its previous step's cache."""
    root = os.path.join(os.path.dirname(__file__), "..", "fixtures-current")
    path = os.path.join(root, "llama_step", "model.onnx")
    sess = anyshape.InferenceSession(path, threads=2)
    oracle = anyshape.InferenceSession(path, interpret=True)
    names = [o.name for o in sess.get_outputs()]
    rng = np.random.default_rng(5)
    # A past of 1100 positions: each cache 70 KB, kept when freed.
    feeds = {}
    for i in sess.get_inputs():
        if i.name.startswith("past_"):
            feeds[i.name] = rng.standard_normal((1, 2, 1100, 8)).astype(np.float32)
    pointers = []
    for step in range(4):
        total = 1100 + step + 1
        feeds["input_ids"] = np.array([[3 + step]], dtype=np.int64)
        feeds["attention_mask"] = np.ones((1, total), dtype=np.int64)
        got = dict(zip(names, sess.run(None, feeds)))
        want = dict(zip(names, oracle.run(None, feeds)))
        for n in names:
            np.testing.assert_allclose(got[n], want[n], rtol=1e-4, atol=1e-4, err_msg=f"step {step}: {n}")
        pointers.append(got["present_key_0"].ctypes.data)
        # The next step reads this one's caches; the step before's are freed here.
        feeds = {k: v for k, v in feeds.items() if not k.startswith("past_")}
        for n in names:
            if n.startswith("present_"):
                feeds["past_" + n[len("present_"):]] = got[n]
        del got, want
    # Step 2's caches are step 0's memory, step 3's step 1's (two steps' alive at once).
    assert pointers[2] == pointers[0] and pointers[3] == pointers[1], pointers


def test_inputs_outputs_and_named_outputs(bert):
    ins = bert.get_inputs()
    assert [i.name for i in ins] == ["input_ids", "attention_mask", "token_type_ids"]
    assert ins[0].shape == ["batch", "seq"] and ins[0].type == "int64"
    outs = bert.get_outputs()
    assert [o.name for o in outs] == ["last_hidden_state", "pooler_output"]
    assert outs[0].shape == ["batch", "seq", 32] and outs[0].type == "float32"
    feeds, want = next(cases("bert"))
    pooled, hidden, again = bert.run(["pooler_output", "last_hidden_state", "pooler_output"], feeds)
    np.testing.assert_allclose(pooled, want["pooler_output"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(hidden, want["last_hidden_state"], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(again, pooled)
    assert again is not pooled


def bad(bert, feeds, *words):
    with pytest.raises(anyshape.InvalidArgument) as e:
        bert.run(None, feeds)
    assert isinstance(e.value, ValueError)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_bad_feeds_are_clear_errors(bert):
    feeds, _ = list(cases("bert"))[1]  # batch 1, seq 7
    bad(bert, {k: v for k, v in feeds.items() if k != "attention_mask"}, "attention_mask", "missing")
    bad(bert, {**feeds, "extra": feeds["input_ids"]}, "'extra' is not an input")
    bad(bert, {**feeds, "input_ids": feeds["input_ids"].astype(np.int32)}, "input_ids", "int64", "int32")
    bad(bert, {**feeds, "input_ids": feeds["input_ids"].reshape(-1)}, "input_ids")
    bad(bert, {**feeds, "input_ids": np.array([[object()]], dtype=object)}, "input_ids", "object")
    bad(bert, {**feeds, "input_ids": [[1, 2, 3]]}, "input_ids", "numpy array")
    wide = np.zeros((feeds["input_ids"].shape[0], feeds["input_ids"].shape[1] * 2), np.int64)
    bad(bert, {**feeds, "input_ids": wide[:, ::2]}, "input_ids", "C-contiguous")
    # Two inputs that disagree on `seq`.
    short = {**feeds, "attention_mask": feeds["attention_mask"][:, :1].copy()}
    bad(bert, short, "seq")
    with pytest.raises(anyshape.InvalidArgument, match="not an output"):
        bert.run(["nope"], feeds)


def test_bad_models_and_options_are_clear_errors(tmp_path):
    with pytest.raises(anyshape.InvalidArgument):
        anyshape.InferenceSession(str(tmp_path / "missing.onnx"))
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x0a\xff\xff\xff\x0f not a model")
    with pytest.raises(anyshape.InvalidArgument):
        anyshape.InferenceSession(str(garbage))
    with pytest.raises(anyshape.InvalidArgument, match="threads"):
        anyshape.InferenceSession(os.path.join(ROOT, "bert", "model.onnx"), threads=0)
    with pytest.raises(anyshape.InvalidArgument, match="precision='f8'"):
        anyshape.InferenceSession(os.path.join(ROOT, "bert", "model.onnx"), precision="f8")
    with pytest.raises(anyshape.InvalidArgument, match="precision"):
        anyshape.InferenceSession(os.path.join(ROOT, "bert", "model.onnx"), interpret=True, precision="bf16")


def _has_avx512_bf16():
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return " avx512_bf16" in flags


def test_bf16_precision_stays_near_onnxruntime():
    path = os.path.join(ROOT, "bert", "model.onnx")
    if not _has_avx512_bf16():
        # Without AVX-512 BF16 the request is an error that says what is missing.
        with pytest.raises(Exception, match="BF16"):
            anyshape.InferenceSession(path, threads=2, precision="bf16")
        return
    sess = anyshape.InferenceSession(path, threads=2, precision="bf16")
    outputs = [o.name for o in sess.get_outputs()]
    for feeds, want in cases("bert"):
        for n, g in zip(outputs, sess.run(None, feeds)):
            scale = float(np.abs(want[n]).max())
            assert float(np.abs(g - want[n]).max()) < 1e-2 * scale, n


def _field(num, payload):
    """A protobuf field: varints for ints, length-delimited for bytes."""

    def varint(v):
        out = b""
        while True:
            b, v = v & 0x7F, v >> 7
            out += bytes([b | (0x80 if v else 0)])
            if not v:
                return out

    if isinstance(payload, int):
        return varint(num << 3) + varint(payload)
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def _one_node_model(op_type):
    """An ONNX model (opset 17) of one node `op_type` named my_node, x -> y, f32 [2]."""
    shape = _field(2, _field(1, _field(1, 2)))  # TensorShapeProto { dim { dim_value: 2 } }
    ttype = _field(1, _field(1, 1) + shape)  # TypeProto { tensor_type { elem_type: FLOAT, shape } }
    node = _field(1, b"x") + _field(2, b"y") + _field(3, b"my_node") + _field(4, op_type.encode())
    graph = (_field(1, node) + _field(2, b"g") + _field(11, _field(1, b"x") + _field(2, ttype))
             + _field(12, _field(1, b"y") + _field(2, ttype)))
    return _field(1, 8) + _field(7, graph) + _field(8, _field(1, b"") + _field(2, 17))


def test_an_unsupported_operator_is_the_models_limit_not_the_callers_input(tmp_path):
    path = tmp_path / "unsupported.onnx"
    path.write_bytes(_one_node_model("NonMaxSuppression"))
    with pytest.raises(anyshape.UnsupportedModel, match="NonMaxSuppression.*my_node") as e:
        anyshape.InferenceSession(str(path))
    assert not isinstance(e.value, ValueError) and isinstance(e.value, anyshape.AnyshapeError)
    # The same file with an operator anyshape has runs: the encoding is a real model.
    path.write_bytes(_one_node_model("Relu"))
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(anyshape.InferenceSession(str(path)).run(None, {"x": x})[0], [0.0, 2.0])


def test_sessions_sharing_a_pool_run_at_once():
    pool = anyshape.ThreadPool(2)
    assert pool.threads == 2
    shared = [anyshape.InferenceSession(os.path.join(ROOT, n, "model.onnx"), pool=pool) for n in ("bert", "gpt2")]
    work = [(s, feeds, want) for s, n in zip(shared, ("bert", "gpt2")) for feeds, want in cases(n)]

    def caller(k):
        for i in range(8):
            sess, feeds, want = work[(k + i) % len(work)]
            got = sess.run(None, feeds)
            for o, g in zip(sess.get_outputs(), got):
                np.testing.assert_allclose(g, want[o.name], rtol=1e-4, atol=1e-4, err_msg=o.name)
    in_threads(caller)
    with pytest.raises(anyshape.InvalidArgument, match="threads"):
        anyshape.ThreadPool(0)
    with pytest.raises(anyshape.InvalidArgument, match="pool has 2 threads"):
        anyshape.InferenceSession(os.path.join(ROOT, "bert", "model.onnx"), threads=3, pool=pool)


def test_dims_bound_the_symbols():
    sess = anyshape.InferenceSession(os.path.join(ROOT, "bert", "model.onnx"), dims={"seq": (1, 8)}, threads=1)
    ids = np.zeros((1, 9), np.int64)
    with pytest.raises(anyshape.InvalidArgument, match="seq"):
        sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": ids})


def test_one_session_from_many_threads(bert):
    all_cases = list(cases("bert"))

    def work(k):
        for r in range(12):
            feeds, want = all_cases[(k + r) % len(all_cases)]
            got = bert.run(["last_hidden_state"], feeds)[0]
            np.testing.assert_allclose(got, want["last_hidden_state"], rtol=1e-4, atol=1e-4)
    in_threads(work)


def test_inputs_are_read_in_place_and_left_as_they_were(bert):
    feeds, want = list(cases("bert"))[2]
    frozen = {}
    for k, v in feeds.items():
        a = v.copy()
        a.setflags(write=False)  # a read-only array is read as it is
        frozen[k] = a
    before = {k: v.copy() for k, v in frozen.items()}
    got = bert.run(["last_hidden_state"], frozen)[0]
    np.testing.assert_allclose(got, want["last_hidden_state"], rtol=1e-4, atol=1e-4)
    for k in frozen:
        np.testing.assert_array_equal(frozen[k], before[k])


@pytest.mark.parametrize("name", ["bert", "gpt2", "resnet"])
def test_saved_artifact_loads_and_matches(name, tmp_path):
    sess = anyshape.InferenceSession(os.path.join(ROOT, name, "model.onnx"), threads=2)
    path = tmp_path / f"{name}.anyshape"
    sess.save(str(path))
    loaded = anyshape.InferenceSession(str(path))
    assert loaded.get_inputs() == sess.get_inputs()
    assert loaded.get_outputs() == sess.get_outputs()
    for feeds, want in cases(name):
        for g, s, (n, w) in zip(loaded.run(None, feeds), sess.run(None, feeds), want.items()):
            np.testing.assert_array_equal(g, s, err_msg=n)
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=n)


def test_bad_artifacts_are_clear_errors(bert, tmp_path):
    path = tmp_path / "bert.anyshape"
    bert.save(str(path))
    good = path.read_bytes()
    with pytest.raises(anyshape.InvalidArgument, match="dims"):
        anyshape.InferenceSession(str(path), dims={"seq": (1, 8)})
    cut = tmp_path / "cut.anyshape"
    cut.write_bytes(good[: len(good) // 2])
    with pytest.raises(anyshape.InvalidArgument, match="truncated"):
        anyshape.InferenceSession(str(cut))
    flipped = bytearray(good)
    flipped[len(good) // 3] ^= 1
    bad = tmp_path / "flipped.anyshape"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(anyshape.InvalidArgument, match="corrupted|malformed"):
        anyshape.InferenceSession(str(bad))
    with pytest.raises(anyshape.InvalidArgument):
        bert.save(str(tmp_path / "no" / "such" / "folder" / "x.anyshape"))


def test_interpreted_session_is_the_oracle(bert, tmp_path):
    oracle = anyshape.InferenceSession(os.path.join(ROOT, "bert", "model.onnx"), interpret=True)
    assert oracle.get_inputs() == bert.get_inputs()
    for feeds, want in cases("bert"):
        for g, (n, w) in zip(oracle.run(None, feeds), want.items()):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=n)
    with pytest.raises(anyshape.InvalidArgument, match="no compiled code"):
        oracle.save(str(tmp_path / "x.anyshape"))


def test_the_gpu_emulator_matches_onnxruntime():
    """device="gpu-emulator": the GPU backend's kernels, run on this machine's
    threads, give ONNX Runtime's outputs (to the GPU's bf16 contractions:
    relative L2 error under 3e-2, as the Rust model tests)."""
    sess = anyshape.InferenceSession(os.path.join(ROOT, "gpt2", "model.onnx"), device="gpu-emulator")
    for feeds, want in list(cases("gpt2"))[:2]:
        got = sess.run(None, feeds)
        for g, (name, w) in zip(got, want.items()):
            err = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)
            assert err < 3e-2, (name, err)
    # The device memory it holds: its weights, a call's memory, the peak of both.
    held = sess.device_memory()
    assert set(held) == {"weights", "calls", "peak"}, held
    assert held["weights"] > 0 and held["calls"] > 0 and held["peak"] >= held["weights"] + held["calls"], held
    with pytest.raises(anyshape.InvalidArgument, match="need a GPU session"):
        anyshape.InferenceSession(os.path.join(ROOT, "gpt2", "model.onnx"), threads=2).device_memory()


def test_gpu_devices_say_what_they_need(tmp_path):
    """device="cuda" where there is no GPU is an AnyshapeError saying so (where
    there is one, the session works); unknown devices and CPU-only options
    with a GPU device are InvalidArgument."""
    path = os.path.join(ROOT, "bert", "model.onnx")
    try:
        sess = anyshape.InferenceSession(path, device="cuda")
    except anyshape.InvalidArgument:
        raise
    except anyshape.AnyshapeError as e:
        assert "no NVIDIA driver" in str(e) or "no CUDA device" in str(e), e
    else:
        feeds, want = next(cases("bert"))
        got = sess.run(None, feeds)
        err = np.linalg.norm(got[0] - want["last_hidden_state"]) / np.linalg.norm(want["last_hidden_state"])
        assert err < 3e-2, err
    with pytest.raises(anyshape.InvalidArgument, match="device='tpu'"):
        anyshape.InferenceSession(path, device="tpu")
    with pytest.raises(anyshape.InvalidArgument, match="threads"):
        anyshape.InferenceSession(path, device="gpu-emulator", threads=2)


def test_a_gpu_session_saves_a_gpu_artifact(tmp_path):
    """A GPU session saves a GPU artifact (PTX, plan, weights); loaded again
    with device="gpu-emulator" it gives the same outputs, with device="cpu"
    it is refused, and with device="cuda" where there is no GPU the error
    says so."""
    path = os.path.join(ROOT, "bert", "model.onnx")
    art = str(tmp_path / "bert-gpu.anyshape")
    sess = anyshape.InferenceSession(path, device="gpu-emulator")
    sess.save(art)
    again = anyshape.InferenceSession(art, device="gpu-emulator")
    feeds, _ = next(cases("bert"))
    for a, b in zip(sess.run(None, feeds), again.run(None, feeds)):
        assert np.array_equal(a, b)
    with pytest.raises(anyshape.InvalidArgument, match="GPU artifact"):
        anyshape.InferenceSession(art)
    try:
        anyshape.InferenceSession(art, device="cuda")
    except anyshape.InvalidArgument:
        raise
    except anyshape.AnyshapeError as e:
        assert "no NVIDIA driver" in str(e) or "no CUDA device" in str(e), e


def test_int8_kernels_are_exact_either_way():
    """A dynamically quantized BERT on the integer kernels (u8s8 where the
    machine has VNNI, i16s8 otherwise), on the i16s8, i16 and f32 ones: the
    same bits, all at ONNX Runtime's operator-by-operator outputs."""
    folder = os.path.join(ROOT, "..", "fixtures-quantized", "bert_int8")
    path = os.path.join(folder, "model.onnx")
    kinds = ("auto", "i16s8", "i16", "float")
    sessions = [anyshape.InferenceSession(path, threads=2, int8=k) for k in kinds]
    case = os.path.join(folder, "case1")
    names = [i.name for i in sessions[0].get_inputs()]
    feeds = {n: np.load(os.path.join(case, n + ".npy")) for n in names}
    got = [s.run(None, feeds) for s in sessions]
    for i, o in enumerate(sessions[0].get_outputs()):
        for other in got[1:]:
            assert np.array_equal(got[0][i], other[i]), o.name
        want = np.load(os.path.join(case, "exact", o.name + ".npy"))
        assert np.linalg.norm(got[0][i] - want) <= 1e-5 * np.linalg.norm(want), o.name
    with pytest.raises(anyshape.InvalidArgument, match="int8"):
        anyshape.InferenceSession(path, interpret=True, int8="float")
    with pytest.raises(anyshape.InvalidArgument, match="unknown int8"):
        anyshape.InferenceSession(path, int8="int4")


def test_device_tensors_run_in_place_on_a_gpu_session():
    """run_device reads its inputs from device tensors and writes its outputs
    into the caller's: on the emulator (device memory is this process's)
    numpy arrays by __array_interface__, bit for bit what run returns;
    output_shapes says what to allocate."""
    sess = anyshape.InferenceSession(os.path.join(ROOT, "bert", "model.onnx"), device="gpu-emulator")
    names = [o.name for o in sess.get_outputs()]
    for feeds, _ in list(cases("bert"))[:2]:
        want = sess.run(None, feeds)
        shapes = sess.output_shapes(feeds)
        assert list(shapes) == names
        outs = {n: np.full(s, np.nan, dtype=t) for n, (s, t) in shapes.items()}
        assert sess.run_device(feeds, outs) is None
        for n, w in zip(names, want):
            assert outs[n].shape == w.shape and np.array_equal(outs[n], w), n


def test_device_tensors_that_do_not_fit_are_refused_before_anything_is_written():
    """Wrong output shapes or dtypes, a missing or unknown output, read-only
    or overlapping outputs, non-contiguous inputs, objects with no array
    interface and CPU sessions: InvalidArgument naming the tensor, outputs
    untouched."""
    path = os.path.join(ROOT, "bert", "model.onnx")
    sess = anyshape.InferenceSession(path, device="gpu-emulator")
    # The case with the most tokens (a strided view of it is not contiguous).
    feeds = max((f for f, _ in cases("bert")), key=lambda f: next(iter(f.values())).size)
    shapes = sess.output_shapes(feeds)
    first, (shape, dtype) = next(iter(shapes.items()))

    def fresh():
        return {n: np.full(s, 7.0, dtype=t) for n, (s, t) in shapes.items()}

    def refused(match, feeds=feeds, outs=None):
        outs = fresh() if outs is None else outs
        before = {n: a.copy() for n, a in outs.items()}
        with pytest.raises(anyshape.InvalidArgument, match=match):
            sess.run_device(feeds, outs)
        for n, a in outs.items():
            assert np.array_equal(a, before[n]), n

    bad = fresh()
    bad[first] = np.zeros([d + 1 for d in shape], dtype=dtype)
    refused(f"output '{first}'", outs=bad)
    bad = fresh()
    bad[first] = np.zeros(shape, dtype=np.float64)
    refused(f"output '{first}'", outs=bad)
    bad = fresh()
    del bad[first]
    refused(f"output '{first}' must be given once", outs=bad)
    refused("'nope' is not an output", outs={**fresh(), "nope": np.zeros(1, np.float32)})
    bad = fresh()
    bad[first].setflags(write=False)
    refused(f"output '{first}' is read-only", outs=bad)
    # An output sharing bytes with an input.
    name, value = next(iter(feeds.items()))
    bad = fresh()
    n_out = bad[first].nbytes
    raw = np.zeros(n_out + value.nbytes, dtype=np.uint8)
    bad[first] = raw[:n_out].view(dtype).reshape(shape)
    shared = raw[n_out - 8 : n_out - 8 + value.nbytes].view(value.dtype).reshape(value.shape)
    shared[...] = value
    refused(f"output '{first}' overlaps input '{name}'", feeds={**feeds, name: shared}, outs=bad)
    wide = np.zeros((value.shape[0], value.shape[1] * 2), dtype=value.dtype)
    wide[:, ::2] = value
    refused(f"input '{name}': not C-contiguous", feeds={**feeds, name: wide[:, ::2]})
    refused(f"input '{name}': expected dtype", feeds={**feeds, name: value.astype(np.int32)})
    refused(f"input '{name}': expected a numpy array", feeds={**feeds, name: value.tolist()})
    cpu = anyshape.InferenceSession(path, threads=2)
    with pytest.raises(anyshape.InvalidArgument, match="need a GPU session"):
        cpu.run_device(feeds, fresh())
    with pytest.raises(anyshape.InvalidArgument, match="need a GPU session"):
        cpu.output_shapes(feeds)
    # The session is usable after every refusal.
    outs = fresh()
    sess.run_device(feeds, outs)
    assert all(np.isfinite(a).all() for a in outs.values())
