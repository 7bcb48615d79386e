#!/usr/bin/env python3
"""Export FULL-SIZE random-weight Hugging Face models to ONNX (on demand).

For benchmarks and notes only: the output is large (hundreds of MB) and is NOT
committed. Weights are random (seeded); nothing is downloaded from any hub.

Models (--model):
    bert-base     BertModel, BertConfig() defaults          inputs input_ids/attention_mask/token_type_ids [batch, seq]
    gpt2          GPT2Model, GPT2Config() defaults (124M)   inputs input_ids/attention_mask [batch, seq]
    gpt2-lm       GPT2LMHeadModel (the same with its LM head tied to the token embedding) -> logits
    vit-base      ViTModel, ViTConfig() defaults (base/16, 224)  pixel_values [batch, 3, 224, 224]
    resnet-50     ResNetModel, ResNetConfig() defaults      pixel_values [batch, 3, height, width]
    albert-base   AlbertModel, albert-base-v2 sizes         like bert-base
    mobilenetv2   MobileNetV2Model, MobileNetV2Config() defaults  pixel_values [batch, 3, height, width]
    t5-encoder    T5EncoderModel, T5Config() defaults (= t5-small)  input_ids/attention_mask [batch, seq]
    llama-100m    LlamaForCausalLM, 8 layers, hidden 768, 12 heads sharing 4 key/value
                  heads, vocab 32000 (about 100M parameters)  input_ids/attention_mask [batch, seq]
    all           every model above

Usage:
    python tools/models/export_full.py --model bert-base --out /tmp/models [--dynamo] [--external-data] [--check]

Writes <out>/<model>/model.onnx (TorchScript exporter, opset 17, constant
folding, eager attention, dynamic axes named batch/seq or batch/height/width)
or <out>/<model>-dynamo/model.onnx with --dynamo (torch.export-based exporter;
the dims come out named s0, s1, ...). With --external-data the weights are
re-saved next to the model as model.onnx.data (onnx.save_model(...,
save_as_external_data=True)). --check runs the model once in onnxruntime and
compares with PyTorch.

Known limits with the pinned versions (torch 2.5.1 + onnxscript 0.7.2):
  * --dynamo works for bert-base, gpt2, albert-base, vit-base, t5-encoder, but
    fails for resnet-50 and mobilenetv2: ConversionError translating
    aten._native_batch_norm_legit_no_training ("'tuple' object has no attribute
    'dtype'"). Use the default TorchScript path for the CNNs.
  * --dynamo bounds seq to [1, max_position - 1] (torch.export guards seq != max).
  * random-init mobilenetv2 (HF init, std 0.02 convs) produces ~1e-27 outputs:
    fine for timing, useless for numeric comparisons.

Requirements: tools/fixtures/requirements.txt (the pinned 2024 toolchain), or
tools/fixtures/requirements-current.txt (torch 2.15, transformers 5.23, onnx 1.23:
what users export with today). With the current toolchain --dynamo works for
every model, the CNNs included.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in tools/models
sys.path.insert(0, HERE)

MODELS = ["bert-base", "gpt2", "gpt2-lm", "vit-base", "resnet-50", "albert-base", "mobilenetv2", "t5-encoder", "llama-100m"]
# example input shapes used while exporting (not 1s: the tracer would specialize them)
EXAMPLE = {"batch": 2, "seq": 16, "height": 224, "width": 224}


def build_model(name: str, seed: int = 0):
    """The torch module that export_one exports for `name`, and a feed mapper.

    Same code path as the export: torch.manual_seed(seed), hf_export.build(name,
    "full") (seeded config, random weights, eager attention), eval mode. Returns
    (spec, to_torch): spec is the hf_export.ModelSpec (spec.module is the wrapper
    whose forward takes the ONNX inputs by name), and to_torch(feeds, shape) maps
    a dict of numpy arrays keyed by ONNX input name to the wrapper's keyword
    arguments (torch tensors). An input the wrapper takes but the feed lacks
    (dropped from the ONNX graph because it was unused, say) is made from its
    spec: ones for a mask, zeros otherwise, sized by the shape binding `shape`.
    Feeds the wrapper does not take are ignored.
    """
    import numpy as np
    import torch

    import hf_export as hx

    torch.manual_seed(seed)
    spec = hx.build(name, "full")
    spec.module.eval()

    def to_torch(feeds: dict, shape: dict | None = None) -> dict:
        kwargs = {}
        for inp in spec.inputs:
            if inp.name in feeds:
                v = np.ascontiguousarray(feeds[inp.name])
            else:
                dims = [(shape or {})[d] if isinstance(d, str) else d for d in inp.dims]
                v = (np.ones if inp.kind == "mask" else np.zeros)(dims, dtype=inp.dtype)
            kwargs[inp.name] = torch.from_numpy(v)
        return kwargs

    return spec, to_torch


def export_one(name: str, out: str, dynamo: bool, external: bool, check: bool, opset: int, seed: int) -> str:
    import numpy as np
    import onnx
    import torch

    import hf_export as hx

    t0 = time.time()
    spec, _ = build_model(name, seed)
    n_params = sum(p.numel() for p in spec.module.parameters())
    print(f"[{name}] built {type(spec.module.model).__name__} ({n_params / 1e6:.1f}M params) in {time.time() - t0:.1f}s")

    mdir = os.path.join(out, name + ("-dynamo" if dynamo else ""))
    os.makedirs(mdir, exist_ok=True)
    path = os.path.join(mdir, "model.onnx")
    for stale in (path, path + ".data"):
        if os.path.exists(stale):
            os.remove(stale)
    example = hx.make_inputs(spec, EXAMPLE, np.random.RandomState(seed))

    t0 = time.time()
    with torch.no_grad():
        if dynamo:
            hx.export_dynamo(spec, example, path, max_seq=spec.extra.get("max_seq"))
        else:
            hx.export_torchscript(spec, example, path, opset=opset)
    if external:
        hx.save_external(path)
    size = sum(os.path.getsize(os.path.join(mdir, f)) for f in os.listdir(mdir))
    print(f"[{name}] exported in {time.time() - t0:.1f}s -> {path} ({size / 2**20:.1f} MiB)")

    m = onnx.load(path, load_external_data=False)
    ops = sorted({n.op_type for n in m.graph.node})
    print(f"[{name}] opset {[(o.domain or 'ai.onnx', o.version) for o in m.opset_import]}, {len(m.graph.node)} nodes")
    print(f"[{name}] ops: {ops}")

    if check:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        feeds = hx.make_inputs(spec, {**EXAMPLE, "batch": 1, "seq": 9, "height": 160, "width": 192}, np.random.RandomState(seed + 1))
        feeds = {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}}
        outs = sess.run(None, feeds)
        with torch.no_grad():
            touts = spec.module(*[torch.from_numpy(feeds[i.name]) for i in spec.inputs])
        for oname, o, t in zip(spec.outputs, outs, touts):
            print(f"[{name}] check {oname} {list(o.shape)}: max abs diff vs torch {float(np.abs(o - t.numpy()).max()):.2e}")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, choices=MODELS + ["all"])
    ap.add_argument("--out", required=True, help="output directory (outside the repo)")
    ap.add_argument("--dynamo", action="store_true", help="use torch.onnx.export(dynamo=True)")
    ap.add_argument("--external-data", action="store_true", help="store weights in model.onnx.data")
    ap.add_argument("--check", action="store_true", help="run once in onnxruntime and compare with torch")
    ap.add_argument("--opset", type=int, default=17, help="TorchScript exporter opset (default 17)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    names = MODELS if args.model == "all" else [args.model]
    for n in names:
        export_one(n, args.out, args.dynamo, args.external_data, args.check, args.opset, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
