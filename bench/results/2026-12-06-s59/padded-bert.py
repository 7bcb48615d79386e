# The padded-mask check of BENCHMARKS.md session 59: .venv-serve/bin/python padded-bert.py 1
import sys, time, numpy as np
import anyshape, onnxruntime as ort
m = "/work/models/bert-base/model.onnx"
threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
sess = anyshape.InferenceSession(m, threads=threads)
so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
o = ort.InferenceSession(m, so, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
B, S = 4, 96
ids = rng.integers(1000, 20000, size=(B, S), dtype=np.int64)
full = np.ones((B, S), dtype=np.int64)
pad = full.copy()
for b, L in enumerate([96, 88, 90, 86]):
    pad[b, L:] = 0
tt = np.zeros_like(ids)
def t(f, feeds, n=8):
    f(feeds); ts = []
    for _ in range(n):
        s = time.perf_counter(); f(feeds); ts.append(time.perf_counter() - s)
    return 1e3 * float(np.median(ts))
for name, mask in [("ones", full), ("padded", pad)]:
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}
    a = t(lambda f: sess.run(None, f), feeds); r = t(lambda f: o.run(None, f), feeds)
    a2 = t(lambda f: sess.run(None, f), feeds)
    print(f"{name}: anyshape {a:.1f} / {a2:.1f} ms, ORT {r:.1f} ms")
