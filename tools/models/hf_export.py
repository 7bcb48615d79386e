"""Shared helpers for exporting random-weight Hugging Face models to ONNX.

Used by tools/fixtures/make_fixtures.py (tiny models -> committed test fixtures)
and tools/models/export_full.py (full-size models -> benchmarks, not committed).

Nothing here downloads anything: every model is built from a config with
random (seeded) weights.

Each model is wrapped in a small nn.Module whose forward takes the ONNX inputs
positionally (by name) and returns a plain tuple of tensors, so that both the
TorchScript exporter and the dynamo exporter see a simple signature and the
ONNX graph gets exactly the input/output names we ask for.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

# A decoder of about 100M parameters (llama-100m here; tools/models/export_decoder.py
# builds Llama and Qwen2 of these sizes): 8 layers, 12 query heads sharing 4
# key/value heads.
DECODER_100M = dict(
    vocab_size=32000,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=8,
    num_attention_heads=12,
    num_key_value_heads=4,
)

# transformers is imported lazily inside the builders so that --help is fast.


# ---------------------------------------------------------------------------
# wrappers: positional named inputs -> tuple of named outputs
# ---------------------------------------------------------------------------


class TextWrap3(nn.Module):
    """input_ids, attention_mask, token_type_ids -> outputs (BERT, ALBERT)."""

    def __init__(self, model: nn.Module, outputs: list[str]):
        super().__init__()
        self.model = model
        self.outputs = list(outputs)

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            return_dict=True,
        )
        return tuple(getattr(out, n) for n in self.outputs)


class TextWrap2(nn.Module):
    """input_ids, attention_mask -> outputs (GPT-2, T5 encoder)."""

    def __init__(self, model: nn.Module, outputs: list[str]):
        super().__init__()
        self.model = model
        self.outputs = list(outputs)

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return tuple(getattr(out, n) for n in self.outputs)


class MeanPoolWrap(nn.Module):
    """input_ids, attention_mask -> sentence_embedding: a sentence-transformers model
    (the encoder's last hidden state averaged over the mask, L2-normalized)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        h = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return (torch.nn.functional.normalize(pooled, p=2.0, dim=1),)


class DecoderStepWrap(nn.Module):
    """One decoding step with a KV cache: input_ids [batch, seq], attention_mask
    [batch, past + seq], then past_key_<l>, past_value_<l> [batch, kv_heads, past,
    head_dim] per layer -> logits and present_key_<l>, present_value_<l> (the cache
    grown by seq)."""

    def __init__(self, model: nn.Module, layers: int):
        super().__init__()
        self.model = model
        self.layers = layers

    def forward(self, input_ids, attention_mask, *past):
        from transformers import DynamicCache

        cache = DynamicCache()
        for l in range(self.layers):
            cache.update(past[2 * l], past[2 * l + 1], l)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        present = []
        for l in range(self.layers):
            layer = out.past_key_values.layers[l]
            present += [layer.keys, layer.values]
        return (out.logits, *present)


class ImageWrap(nn.Module):
    """One tensor input -> outputs: pixel_values (ViT, ResNet, MobileNetV2), or
    another keyword (``arg="input_features"``: the Whisper encoder)."""

    def __init__(self, model: nn.Module, outputs: list[str], arg: str = "pixel_values"):
        super().__init__()
        self.model = model
        self.outputs = list(outputs)
        self.arg = arg

    def forward(self, x):
        out = self.model(**{self.arg: x}, return_dict=True)
        return tuple(getattr(out, n) for n in self.outputs)


# ---------------------------------------------------------------------------
# model specs
# ---------------------------------------------------------------------------


@dataclass
class InputSpec:
    name: str
    dtype: str  # numpy dtype name: "int64" / "float32"
    dims: list  # str = symbolic dim name, int = fixed size
    # for int inputs: values drawn in [low, high); "mask" = 1s with right padding;
    # "float": standard normal values (a KV cache, audio features)
    kind: str = "ids"  # "ids" | "mask" | "types" | "pixels" | "float"
    high: int = 0


@dataclass
class ModelSpec:
    name: str
    module: nn.Module  # the wrapper
    inputs: list[InputSpec]
    outputs: list[str]
    output_dims: dict  # output name -> list of dims (str / int / None for "unnamed")
    notes: str = ""
    extra: dict = field(default_factory=dict)


def _eager(cfg):
    # plain MatMul/Softmax attention instead of SDPA
    cfg._attn_implementation = "eager"
    return cfg


def _two_input_text(name: str, m: nn.Module, vocab: int, outs: list[str], dims: dict, max_seq: int) -> ModelSpec:
    """A text model taking input_ids and attention_mask (GPT-2, T5 encoder,
    DistilBERT, RoBERTa, Llama): the spec every such model shares."""
    return ModelSpec(name, TextWrap2(m, outs), _text_inputs(vocab, False), outs, dims, extra={"max_seq": max_seq})


def _text_inputs(vocab: int, with_types: bool, type_vocab: int = 2) -> list[InputSpec]:
    ins = [
        InputSpec("input_ids", "int64", ["batch", "seq"], "ids", vocab),
        InputSpec("attention_mask", "int64", ["batch", "seq"], "mask", 2),
    ]
    if with_types:
        ins.append(InputSpec("token_type_ids", "int64", ["batch", "seq"], "types", type_vocab))
    return ins


def build(name: str, size: str = "tiny") -> ModelSpec:
    """Build a random-init model (call torch.manual_seed first for determinism).

    size="tiny": the small configs used for committed test fixtures.
    size="full": default (base-size) configs for benchmarks.
    """
    import transformers as T

    tiny = size == "tiny"
    if name in ("bert", "bert-base"):
        cfg = (
            T.BertConfig(
                vocab_size=99,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=64,
            )
            if tiny
            else T.BertConfig()
        )
        _eager(cfg)
        m = T.BertModel(cfg, add_pooling_layer=True)
        outs = ["last_hidden_state", "pooler_output"]
        return ModelSpec(
            name,
            TextWrap3(m, outs),
            _text_inputs(cfg.vocab_size, True, cfg.type_vocab_size),
            outs,
            {"last_hidden_state": ["batch", "seq", cfg.hidden_size], "pooler_output": ["batch", cfg.hidden_size]},
            extra={"max_seq": cfg.max_position_embeddings},
        )
    if name in ("albert", "albert-base"):
        cfg = (
            T.AlbertConfig(
                vocab_size=99,
                embedding_size=16,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=64,
            )
            if tiny
            # albert-base-v2 (AlbertConfig() defaults are albert-xxlarge)
            else T.AlbertConfig(
                vocab_size=30000,
                embedding_size=128,
                hidden_size=768,
                num_hidden_layers=12,
                num_attention_heads=12,
                intermediate_size=3072,
                hidden_act="gelu_new",
                max_position_embeddings=512,
            )
        )
        _eager(cfg)
        m = T.AlbertModel(cfg, add_pooling_layer=True)
        outs = ["last_hidden_state", "pooler_output"]
        return ModelSpec(
            name,
            TextWrap3(m, outs),
            _text_inputs(cfg.vocab_size, True, cfg.type_vocab_size),
            outs,
            {"last_hidden_state": ["batch", "seq", cfg.hidden_size], "pooler_output": ["batch", cfg.hidden_size]},
            extra={"max_seq": cfg.max_position_embeddings},
        )
    if name in ("gpt2", "gpt2-lm"):
        cfg = (
            T.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=2, n_positions=64)
            if tiny
            else T.GPT2Config()
        )
        cfg.use_cache = False
        _eager(cfg)
        if name == "gpt2":
            m = T.GPT2Model(cfg)
            outs, dims = ["last_hidden_state"], {"last_hidden_state": ["batch", "seq", cfg.n_embd]}
        else:
            # GPT2LMHeadModel: the LM head's weight is the token embedding's (tied).
            m = T.GPT2LMHeadModel(cfg)
            outs, dims = ["logits"], {"logits": ["batch", "seq", cfg.vocab_size]}
        return _two_input_text(name, m, cfg.vocab_size, outs, dims, cfg.n_positions)
    if name == "t5-encoder":
        cfg = T.T5Config() if not tiny else T.T5Config(vocab_size=99, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)
        cfg.use_cache = False
        cfg.is_encoder_decoder = False
        _eager(cfg)
        m = T.T5EncoderModel(cfg)
        outs = ["last_hidden_state"]
        dims = {"last_hidden_state": ["batch", "seq", cfg.d_model]}
        return _two_input_text(name, m, cfg.vocab_size, outs, dims, 512)
    if name in ("vit", "vit-base"):
        cfg = (
            T.ViTConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                image_size=32,
                patch_size=8,
                num_channels=3,
            )
            if tiny
            else T.ViTConfig()  # vit-base-patch16-224
        )
        _eager(cfg)
        m = T.ViTModel(cfg, add_pooling_layer=True)
        outs = ["last_hidden_state", "pooler_output"]
        n_tok = (cfg.image_size // cfg.patch_size) ** 2 + 1
        return ModelSpec(
            name,
            ImageWrap(m, outs),
            [InputSpec("pixel_values", "float32", ["batch", cfg.num_channels, cfg.image_size, cfg.image_size], "pixels")],
            outs,
            {"last_hidden_state": ["batch", n_tok, cfg.hidden_size], "pooler_output": ["batch", cfg.hidden_size]},
        )
    if name in ("resnet", "resnet-50"):
        cfg = (
            T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_channels=3)
            if tiny
            else T.ResNetConfig()  # resnet-50
        )
        m = T.ResNetModel(cfg)
        outs = ["last_hidden_state", "pooler_output"]
        c = cfg.hidden_sizes[-1]
        return ModelSpec(
            name,
            ImageWrap(m, outs),
            [InputSpec("pixel_values", "float32", ["batch", 3, "height", "width"], "pixels")],
            outs,
            # last_hidden_state spatial dims are derived (ceil/floor of height/width / 32 ...)
            {"last_hidden_state": ["batch", c, None, None], "pooler_output": ["batch", c, 1, 1]},
        )
    if name == "mobilenetv2":
        cfg = T.MobileNetV2Config() if not tiny else T.MobileNetV2Config(depth_multiplier=0.35, image_size=32)
        m = T.MobileNetV2Model(cfg)
        outs = ["last_hidden_state", "pooler_output"]
        return ModelSpec(
            name,
            ImageWrap(m, outs),
            [InputSpec("pixel_values", "float32", ["batch", 3, "height", "width"], "pixels")],
            outs,
            {"last_hidden_state": ["batch", None, None, None], "pooler_output": ["batch", None]},
        )
    if name in ("distilbert", "distilbert-base"):
        cfg = (
            T.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64)
            if tiny
            else T.DistilBertConfig()
        )
        _eager(cfg)
        m = T.DistilBertModel(cfg)
        outs = ["last_hidden_state"]
        dims = {"last_hidden_state": ["batch", "seq", cfg.dim]}
        return _two_input_text(name, m, cfg.vocab_size, outs, dims, cfg.max_position_embeddings)
    if name in ("roberta", "roberta-base"):
        cfg = (
            T.RobertaConfig(
                vocab_size=99,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=66,
                type_vocab_size=1,
            )
            if tiny
            else T.RobertaConfig(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1)
        )
        _eager(cfg)
        m = T.RobertaModel(cfg, add_pooling_layer=True)
        outs = ["last_hidden_state", "pooler_output"]
        # position ids start after the padding id: two positions fewer
        dims = {"last_hidden_state": ["batch", "seq", cfg.hidden_size], "pooler_output": ["batch", cfg.hidden_size]}
        return _two_input_text(name, m, cfg.vocab_size, outs, dims, cfg.max_position_embeddings - 2)
    if name in ("minilm", "minilm-l6"):
        # sentence-transformers/all-MiniLM-L6-v2's architecture: BERT, mean pooling,
        # L2 normalization
        cfg = (
            T.BertConfig(
                vocab_size=99,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=64,
            )
            if tiny
            else T.BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
        )
        _eager(cfg)
        m = T.BertModel(cfg, add_pooling_layer=False)
        return ModelSpec(
            name,
            MeanPoolWrap(m),
            _text_inputs(cfg.vocab_size, False),
            ["sentence_embedding"],
            {"sentence_embedding": ["batch", cfg.hidden_size]},
            extra={"max_seq": cfg.max_position_embeddings},
        )
    if name in ("whisper-encoder", "whisper-encoder-base"):
        cfg = (
            T.WhisperConfig(
                num_mel_bins=16,
                d_model=32,
                encoder_layers=2,
                encoder_attention_heads=2,
                encoder_ffn_dim=64,
                decoder_layers=2,
                decoder_attention_heads=2,
                decoder_ffn_dim=64,
                max_source_positions=16,
            )
            if tiny
            else T.WhisperConfig()  # whisper-base-like defaults, 80 mel bins, 1500 positions
        )
        _eager(cfg)
        m = T.WhisperModel(cfg).get_encoder()
        outs = ["last_hidden_state"]
        # the encoder takes exactly 2 * max_source_positions frames
        frames = 2 * cfg.max_source_positions
        return ModelSpec(
            name,
            ImageWrap(m, outs, arg="input_features"),
            [InputSpec("input_features", "float32", ["batch", cfg.num_mel_bins, frames], "float")],
            outs,
            {"last_hidden_state": ["batch", cfg.max_source_positions, cfg.d_model]},
        )
    if name in ("llama", "llama-100m", "llama_step", "llama-100m_step"):
        # Llama's architecture (RMSNorm, rotary embeddings, SwiGLU, grouped-query
        # attention: 4 query heads share 2 key/value heads)
        cfg = (
            T.LlamaConfig(
                vocab_size=99,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=128,
            )
            if tiny
            else T.LlamaConfig(**DECODER_100M, max_position_embeddings=2048)
        )
        _eager(cfg)
        m = T.LlamaForCausalLM(cfg)
        vocab = cfg.vocab_size
        if not name.endswith("_step"):
            cfg.use_cache = False
            return _two_input_text(
                name, m, vocab, ["logits"], {"logits": ["batch", "seq", vocab]}, cfg.max_position_embeddings
            )
        hd = cfg.hidden_size // cfg.num_attention_heads
        kv = cfg.num_key_value_heads
        layers = cfg.num_hidden_layers
        ins = [
            InputSpec("input_ids", "int64", ["batch", "seq"], "ids", vocab),
            InputSpec("attention_mask", "int64", ["batch", "total"], "mask", 2),
        ]
        outs, dims = ["logits"], {"logits": ["batch", "seq", vocab]}
        for l in range(layers):
            for kind in ("key", "value"):
                ins.append(InputSpec(f"past_{kind}_{l}", "float32", ["batch", kv, "past", hd], "float"))
                outs.append(f"present_{kind}_{l}")
                dims[f"present_{kind}_{l}"] = ["batch", kv, "total", hd]
        return ModelSpec(name, DecoderStepWrap(m, layers), ins, outs, dims)
    raise ValueError(f"unknown model {name!r}")


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------


def make_inputs(spec: ModelSpec, shape: dict, rng) -> dict:
    """Random inputs for the given symbolic-dim binding, e.g. {"batch": 2, "seq": 7}.

    rng: numpy.random.RandomState. Attention masks are all ones with right padding
    (zeros at the end) in rows > 0 when shape.get("pad") is set.
    """
    import numpy as np

    out = {}
    shape = dict(shape)
    if "past" in shape:
        # a decoder step's mask covers the cache and the new tokens
        shape.setdefault("total", shape["past"] + shape["seq"])
    for inp in spec.inputs:
        dims = [shape[d] if isinstance(d, str) else d for d in inp.dims]
        if inp.kind in ("pixels", "float"):
            out[inp.name] = rng.standard_normal(dims).astype(np.float32)
        elif inp.kind == "mask":
            mask = np.ones(dims, dtype=np.int64)
            pad = shape.get("pad")
            if pad:
                # row r gets r*pad padding zeros at the end (first row unpadded), at
                # least one real token kept
                b, s = dims
                for r in range(b):
                    n = min(r * pad, s - 1)
                    if n > 0:
                        mask[r, s - n :] = 0
            out[inp.name] = mask
        else:
            out[inp.name] = rng.randint(0, inp.high, size=dims).astype(np.int64)
    return out


# ---------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------


def dynamic_axes_of(spec: ModelSpec) -> dict:
    axes = {}
    for inp in spec.inputs:
        d = {i: n for i, n in enumerate(inp.dims) if isinstance(n, str)}
        if d:
            axes[inp.name] = d
    for o, dims in spec.output_dims.items():
        d = {i: n for i, n in enumerate(dims) if isinstance(n, str)}
        if d:
            axes[o] = d
    return axes


def export_torchscript(spec: ModelSpec, example: dict, path: str, opset: int = 17) -> None:
    """TorchScript (tracing) exporter, weights embedded in the file."""
    args = tuple(torch.from_numpy(example[i.name]) for i in spec.inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            spec.module,
            args,
            path,
            input_names=[i.name for i in spec.inputs],
            output_names=spec.outputs,
            dynamic_axes=dynamic_axes_of(spec),
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )


def export_dynamo(spec: ModelSpec, example: dict, path: str, max_seq: int | None = None) -> None:
    """torch.export-based exporter (torch.onnx.export(dynamo=True))."""
    from torch.export import Dim

    dims: dict[str, Dim] = {}

    def dim(n: str) -> Dim:
        if n not in dims:
            if n == "seq" and max_seq:
                # max_seq - 1: torch.export emits a guard seq != max_seq (buffer slice)
                dims[n] = Dim(n, min=1, max=max_seq - 1)
            else:
                dims[n] = Dim(n, min=1, max=4096)
        return dims[n]

    # By position, in the structure of forward's arguments: a decoder step's
    # cache comes as one tuple (*past).
    import inspect

    shapes = [{i: dim(n) for i, n in enumerate(inp.dims) if isinstance(n, str)} for inp in spec.inputs]
    params = inspect.signature(spec.module.forward).parameters.values()
    named = sum(p.kind == p.POSITIONAL_OR_KEYWORD for p in params)
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        dynamic_shapes = (*shapes[:named], tuple(shapes[named:]))
    else:
        dynamic_shapes = tuple(shapes)
    args = tuple(torch.from_numpy(example[i.name]) for i in spec.inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            spec.module,
            args,
            input_names=[i.name for i in spec.inputs],
            output_names=spec.outputs,
            dynamic_shapes=dynamic_shapes,
            dynamo=True,
        )
    prog.save(path)


def save_external(path: str) -> None:
    """Re-save an ONNX file with its weights as external data (<file>.data)."""
    import onnx

    model = onnx.load(path)
    loc = os.path.basename(path) + ".data"
    data_path = os.path.join(os.path.dirname(path), loc)
    if os.path.exists(data_path):
        os.remove(data_path)
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=loc,
        size_threshold=1024,
    )
