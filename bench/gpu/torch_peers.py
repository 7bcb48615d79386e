"""PyTorch's side of bench/gpu/models.py (issue 37): the full-size models it
exports (random weights from a fixed seed, nothing from a hub) and the peers
it times beside anyshape on the same device: eager, `torch.compile(dynamic=True)`
and `torch.compile(mode="reduce-overhead", dynamic=True)`, each call's first
time at a new shape (a compiled peer's compilation included) and its warm
median. Importable without a GPU, so that its parts run on a CPU too:

    python3 bench/gpu/torch_peers.py [--device cpu]   # a small self-check
"""
import time

import torch

# BERT-base's shapes of the targets: batch 1 at seq 1-512, and 8x128.
BERT_SHAPES = [(1, 1), (1, 8), (1, 17), (1, 32), (1, 128), (1, 512), (8, 128)]

# The PyTorch modes timed as peers: eager, and the two compiled ones.
MODES = ["eager", "compile", "compile-ro"]


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def compiled(model, mode):
    """`model` as PyTorch `mode` runs it (a fresh compilation cache each)."""
    if mode == "eager":
        return model
    torch._dynamo.reset()
    if mode == "compile":
        return torch.compile(model, dynamic=True)
    if mode == "compile-ro":
        return torch.compile(model, mode="reduce-overhead", dynamic=True)
    raise ValueError(f"unknown mode {mode}")


def time_calls(fn, inputs, device, runs=20, warm=3):
    """The first call's ms (a compiled peer compiles there), then the median
    of `runs` calls after `warm` more."""
    with torch.no_grad():
        sync(device)
        t0 = time.perf_counter()
        fn(*inputs)
        sync(device)
        first = (time.perf_counter() - t0) * 1e3
        for _ in range(warm):
            fn(*inputs)
        sync(device)
        ts = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn(*inputs)
            sync(device)
            ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return first, ts[len(ts) // 2]


def peers(model, make_inputs, shapes, device, modes=MODES, deadline=None, runs=20):
    """One record a mode and shape: `peer`, `shape`, `first_call_ms`,
    `median_ms` (or `error`); modes in turn, each over every shape in order
    (a compiled mode's first call at each shape is its first at that shape).
    Stops at `deadline` (time.time()), saying what it skipped."""
    for mode in modes:
        try:
            fn = compiled(model, mode)
        except Exception as e:  # the other modes' records stand
            yield dict(peer=f"pytorch-{mode}", error=repr(e)[-300:])
            continue
        for shape in shapes:
            if deadline is not None and time.time() > deadline:
                yield dict(peer=f"pytorch-{mode}", shape=list(shape), skipped="budget")
                continue
            try:
                first, median = time_calls(fn, make_inputs(shape), device, runs=runs)
                yield dict(peer=f"pytorch-{mode}", shape=list(shape), first_call_ms=round(first, 3),
                           median_ms=round(median, 3))
            except Exception as e:
                yield dict(peer=f"pytorch-{mode}", shape=list(shape), error=repr(e)[-300:])


class Outputs(torch.nn.Module):
    """A Hugging Face model's outputs as a tuple of tensors (`names` of its
    output object), its inputs positional: the export's signature."""

    def __init__(self, m, inputs, names):
        super().__init__()
        self.m, self.inputs, self.names = m, inputs, names

    def forward(self, *args):
        o = self.m(**dict(zip(self.inputs, args)))
        return tuple(getattr(o, n) for n in self.names)


def vision(kind, seed=0):
    """ViT-base/16 at 224 (`vit`) or ResNet-50 (`resnet`), transformers'
    default configurations, random weights from `seed`, in eval mode, as
    `Outputs` over `pixel_values` (last_hidden_state, pooler_output)."""
    torch.manual_seed(seed)
    if kind == "vit":
        from transformers import ViTConfig, ViTModel

        cfg = ViTConfig()
        cfg._attn_implementation = "eager"
        m = ViTModel(cfg)
    elif kind == "resnet":
        from transformers import ResNetConfig, ResNetModel

        m = ResNetModel(ResNetConfig())
    else:
        raise ValueError(kind)
    # Wrappers are made in training mode, and the export restores a
    # wrapper's mode to its children: eval() first, or dropout runs.
    return Outputs(m.eval(), ["pixel_values"], ["last_hidden_state", "pooler_output"]).eval()


def export(model, example, path, names, outputs, axes):
    """TorchScript export at opset 17 (the exporter the fixtures use)."""
    with torch.no_grad():
        torch.onnx.export(model, example, path, input_names=names, output_names=outputs, dynamic_axes=axes,
                          opset_version=17, dynamo=False)


def image(b, device="cpu", dtype=torch.float32, size=224):
    return torch.randn(b, 3, size, size, device=device, dtype=dtype)


if __name__ == "__main__":
    # A self-check of the parts above on a small model: every mode's records
    # at two shapes, and a vision model's export and outputs.
    import argparse, os, tempfile

    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    cfg._attn_implementation = "eager"
    bert = BertModel(cfg).eval().to(a.device)
    make = lambda s: (torch.randint(0, cfg.vocab_size, s, device=a.device),
                      torch.ones(s, dtype=torch.long, device=a.device))
    for r in peers(bert, make, [(1, 8), (2, 17)], a.device, runs=3):
        print(r)
        assert "median_ms" in r, r
    with tempfile.TemporaryDirectory() as d:
        for kind in ["vit", "resnet"]:
            m = vision(kind)
            path = os.path.join(d, f"{kind}.onnx")
            export(m, (image(1),), path, ["pixel_values"], ["last_hidden_state", "pooler_output"],
                   {"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"}, "pooler_output": {0: "batch"}})
            with torch.no_grad():
                outs = m(image(2))
            print(kind, os.path.getsize(path) // 2**20, "MiB", [tuple(o.shape) for o in outs])
