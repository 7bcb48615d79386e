#!/usr/bin/env python3
"""A Softmax of `x/8 + mask` over the last axis of `x: [r, t]` (`mask: [1, t]`), the
shape of attention's scores, as an ONNX model: the memory-bound kernel alone.

    bench/.venv/bin/python bench/softmax_model.py /tmp/sm.onnx
    anyshape bench /tmp/sm.onnx --shape r=171,t=384 --threads 1 --runs 1000
"""
import sys

import onnx
from onnx import TensorProto, helper


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "softmax.onnx"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["r", "t"])
    mask = helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, "t"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["r", "t"])
    eight = helper.make_tensor("c", TensorProto.FLOAT, [], [8.0])
    graph = helper.make_graph(
        [
            helper.make_node("Div", ["x", "c"], ["d"]),
            helper.make_node("Add", ["d", "m"], ["a"]),
            helper.make_node("Softmax", ["a"], ["y"], axis=-1),
        ],
        "softmax",
        [x, mask],
        [y],
        [eight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out)


if __name__ == "__main__":
    main()
