#!/usr/bin/env python3
"""Export a random-weight decoder with its KV cache the way users do: optimum's
``text-generation-with-past`` task (``optimum-cli export onnx``), for
benchmarks and checks only (hundreds of MB, not committed, nothing downloaded).

Models (--model):
    llama-100m   LlamaForCausalLM, 8 layers, hidden 768, 12 query heads sharing 4
                 key/value heads, vocab 32000 (about 100M parameters)
    qwen2-100m   Qwen2ForCausalLM, the same sizes (biases on q/k/v)

Writes <out>/<model>-optimum/model.onnx (inputs input_ids, attention_mask,
position_ids [batch_size, sequence_length] and past_key_values.<l>.key/value
[batch_size, 4, past_sequence_length, 64]; the mask's length is optimum's
``past_sequence_length + sequence_length``; outputs logits and present.<l>.*).

optimum-onnx 0.1 needs transformers 4.57 (not the 5.x of
tools/fixtures/requirements-current.txt); a venv of its own that borrows torch
from the benchmark venv:

    python3 -m venv .venv-optimum
    .venv-optimum/bin/pip install --no-deps optimum-onnx==0.1.0 optimum==2.1.0 \\
        transformers==4.57.6 tokenizers==0.22.2 huggingface_hub==0.36.2 \\
        requests==2.34.2 certifi charset-normalizer urllib3 idna
    echo "$PWD/.venv-bench/lib/python3.11/site-packages" \\
        > .venv-optimum/lib/python3.11/site-packages/zz-bench.pth
    .venv-optimum/bin/python tools/models/export_decoder.py --model llama-100m --out /work/models
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def config(name: str):
    import transformers as T

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from hf_export import DECODER_100M

    common = dict(DECODER_100M, max_position_embeddings=4096)
    if name == "llama-100m":
        return T.LlamaConfig(**common), T.LlamaForCausalLM
    if name == "qwen2-100m":
        return T.Qwen2Config(**common), T.Qwen2ForCausalLM
    raise SystemExit(f"unknown model {name!r} (llama-100m, qwen2-100m)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-100m")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    import torch
    from optimum.exporters.onnx import main_export

    cfg, cls = config(a.model)
    torch.manual_seed(a.seed)
    model = cls(cfg).eval()
    out = os.path.join(a.out, f"{a.model}-optimum")
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        t = time.perf_counter()
        main_export(tmp, out, task="text-generation-with-past", opset=17, device="cpu", no_post_process=True)
    print(f"exported {out}/model.onnx in {time.perf_counter() - t:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
