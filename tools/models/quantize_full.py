#!/usr/bin/env python3
"""Quantize a full-size model made by export_full.py with ONNX Runtime's tools,
in their default settings, for benchmarks (not committed: hundreds of MB).

    python tools/models/quantize_full.py /work/models/bert-base/model.onnx --how dynamic
    python tools/models/quantize_full.py /work/models/bert-base/model.onnx --how static
    python tools/models/quantize_full.py /work/models/resnet-50/model.onnx --how static --per-channel
    python tools/models/quantize_full.py /work/models/bert-base/model.onnx --how static-int16
    python tools/models/quantize_full.py /work/models/gpt2-lm/model.onnx --how weight-int4

`dynamic` is `quantize_dynamic(..., weight_type=QuantType.QInt8)` (DynamicQuantizeLinear
and MatMulInteger), written to <model folder>-int8/model.onnx; `static` is
`quantize_static` (QDQ format, uint8 activations and int8 weights per tensor), calibrated
on 8 seeded random inputs of --shape (token ids below --vocab for int64 inputs, ones for
masks, standard normal for float inputs), written to <model folder>-qdq/model.onnx;
`--per-channel` quantizes weights per output channel (`per_channel=True`), written to
<model folder>-qdq-pc/model.onnx; `--signed` keeps `quantize_static`'s own default of
int8 activations (`QuantType.QInt8`), written to <model folder>-qdq-s8/ (-qdq-pc-s8/); `static-int16` is `quantize_static` with int16
activations (`activation_type=QuantType.QInt16`, int8 weights), written to <model
folder>-qdq-a16/model.onnx; `weight-int4` is `MatMulNBitsQuantizer` in its QDQ format
(uint4 MatMul weights in blocks of 32, DequantizeLinear), written to <model folder>-w4/;
`weight-int4-nbits` the same quantizer's default form (ONNX Runtime's `MatMulNBits`
contrib operator), written to <model folder>-nbits/.
"""

import argparse
import os

import numpy as np
import onnx


def inputs_of(path, shape, vocab, rng):
    feeds = {}
    for i in onnx.load(path, load_external_data=False).graph.input:
        t = i.type.tensor_type
        dims = [shape.get(d.dim_param, d.dim_value or 1) for d in t.shape.dim]
        if t.elem_type == onnx.TensorProto.INT64:
            if "mask" in i.name:
                feeds[i.name] = np.ones(dims, dtype=np.int64)
            elif "type" in i.name:
                feeds[i.name] = np.zeros(dims, dtype=np.int64)
            else:
                feeds[i.name] = rng.randint(0, vocab, size=dims).astype(np.int64)
        else:
            feeds[i.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--how", choices=["dynamic", "static", "static-int16", "weight-int4", "weight-int4-nbits"], required=True)
    ap.add_argument("--shape", default="batch=1,seq=128", help="calibration shape (static)")
    ap.add_argument("--vocab", type=int, default=30522, help="token ids drawn below this (static)")
    ap.add_argument("--per-channel", action="store_true", help="a weight scale per output channel (static)")
    ap.add_argument("--signed", action="store_true", help="int8 activations, quantize_static's default (static)")
    a = ap.parse_args()
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_dynamic, quantize_static

    folder = os.path.dirname(os.path.abspath(a.model))
    suffix = {"dynamic": "-int8", "static-int16": "-qdq-a16", "weight-int4": "-w4", "weight-int4-nbits": "-nbits"}.get(
        a.how
    )
    out_dir = folder + (suffix or ("-qdq-pc" if a.per_channel else "-qdq") + ("-s8" if a.signed else ""))
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "model.onnx")
    if a.how == "dynamic":
        quantize_dynamic(a.model, out, weight_type=QuantType.QInt8)
    elif a.how in ("weight-int4", "weight-int4-nbits"):
        from onnxruntime.quantization import QuantFormat
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            MatMulNBitsQuantizer,
        )

        fmt = QuantFormat.QDQ if a.how == "weight-int4" else QuantFormat.QOperator
        config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=False, quant_format=fmt)
        q = MatMulNBitsQuantizer(onnx.load(a.model), algo_config=config)
        q.process()
        q.model.save_model_to_file(out, use_external_data_format=False)
    else:
        shape = {k: int(v) for k, v in (p.split("=") for p in a.shape.split(","))}

        class Reader(CalibrationDataReader):
            def __init__(self):
                rng = np.random.RandomState(4321)
                self.feeds = iter([inputs_of(a.model, shape, a.vocab, rng) for _ in range(8)])

            def get_next(self):
                return next(self.feeds, None)

        activations = QuantType.QInt16 if a.how == "static-int16" else QuantType.QUInt8
        if a.signed:
            activations = QuantType.QInt8
        quantize_static(a.model, out, Reader(), per_channel=a.per_channel, activation_type=activations)
    print(f"{out} ({os.path.getsize(out) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
