#!/usr/bin/env python3
"""Small convolution models for benchmarks (generated on demand, not committed):
single grouped and depthwise layers, and the blocks of MobileNetV2 and ResNeXt
in which they sit between 1×1 convolutions, with symbolic image sizes.

    python bench/conv_blocks.py --out /tmp/rb

writes dw1.onnx (depthwise 3×3, 144 channels, + ReLU), dw2.onnx (the same at
stride 2), grp.onnx (3×3, 128 channels in 32 groups, + ReLU), mbv2.onnx (an
inverted residual block: 1×1 24→144, ReLU6, depthwise 3×3, ReLU6, 1×1 144→24,
residual) and resnext.onnx (a ResNeXt-50 32×4d bottleneck: 1×1 256→128, 3×3 in
32 groups, 1×1 128→256, residual), each taking x[1, C, h, w].
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def conv(name, x, cin, cout, k, group=1, stride=1, inits=None, rng=None):
    w = (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)).astype(np.float32)
    b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
    inits += [numpy_helper.from_array(w, name + ".w"), numpy_helper.from_array(b, name + ".b")]
    p = k // 2
    return helper.make_node(
        "Conv", [x, name + ".w", name + ".b"], [name], group=group, pads=[p] * 4, strides=[stride] * 2
    )


def relu6(name, x, inits):
    inits += [numpy_helper.from_array(np.float32(0), name + ".lo"), numpy_helper.from_array(np.float32(6), name + ".hi")]
    return helper.make_node("Clip", [x, name + ".lo", name + ".hi"], [name])


def save(path, nodes, inits, cin, cout, out="y"):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, "h", "w"])
    y = helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, cout, "oh", "ow"])
    g = helper.make_graph(nodes, "g", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/rb")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, c, g, s in [("dw1", 144, 144, 1), ("dw2", 144, 144, 2), ("grp", 128, 32, 1)]:
        inits = []
        nodes = [conv("c", "x", c, c, 3, g, s, inits, rng), helper.make_node("Relu", ["c"], ["y"])]
        save(os.path.join(a.out, name + ".onnx"), nodes, inits, c, c)
    inits = []
    nodes = [
        conv("e", "x", 24, 144, 1, 1, 1, inits, rng),
        relu6("e6", "e", inits),
        conv("d", "e6", 144, 144, 3, 144, 1, inits, rng),
        relu6("d6", "d", inits),
        conv("p", "d6", 144, 24, 1, 1, 1, inits, rng),
        helper.make_node("Add", ["p", "x"], ["y"]),
    ]
    save(os.path.join(a.out, "mbv2.onnx"), nodes, inits, 24, 24)
    inits = []
    nodes = [
        conv("r", "x", 256, 128, 1, 1, 1, inits, rng),
        helper.make_node("Relu", ["r"], ["r1"]),
        conv("g", "r1", 128, 128, 3, 32, 1, inits, rng),
        helper.make_node("Relu", ["g"], ["g1"]),
        conv("e", "g1", 128, 256, 1, 1, 1, inits, rng),
        helper.make_node("Add", ["e", "x"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    save(os.path.join(a.out, "resnext.onnx"), nodes, inits, 256, 256)


if __name__ == "__main__":
    main()
