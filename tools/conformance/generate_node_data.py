#!/usr/bin/env python3
"""Write the ONNX backend node tests of the installed `onnx` package from its case
definitions, in the layout its wheels used to ship (`onnx/backend/test/data/node`):

    OUT/node/<test name>/model.onnx
    OUT/node/<test name>/test_data_set_<k>/input_<j>.pb, output_<j>.pb

From onnx 1.18 on, the wheels no longer carry that data; the definitions
(`onnx.backend.test.case.node.collect_testcases`) still make every case, which is
how onnx generates it. A case whose inputs or outputs are not plain tensors
(sequences, maps, optionals) is left out, and counted.

    python tools/conformance/generate_node_data.py --out DIR
    cargo run --release -p anyshape-conformance -- DIR/node --expected tests/conformance/expected_failures.txt
"""
import argparse
import os
import shutil
import sys

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx.backend.test.case import node as node_cases


def tensor(value, name):
    if isinstance(value, TensorProto):
        return value
    if isinstance(value, np.ndarray) or np.isscalar(value):
        return numpy_helper.from_array(np.asarray(value), name)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    root = os.path.join(a.out, "node")
    if os.path.exists(root):
        shutil.rmtree(root)
    os.makedirs(root)
    written, left_out = 0, 0
    for case in node_cases.collect_testcases(None):
        out_dir = os.path.join(root, case.name)
        files = []
        ok = True
        for k, (inputs, outputs) in enumerate(case.data_sets):
            ins = case.model.graph.input
            outs = case.model.graph.output
            for j, v in enumerate(inputs):
                t = tensor(v, ins[j].name if j < len(ins) else f"input_{j}")
                ok &= t is not None
                files.append((f"test_data_set_{k}/input_{j}.pb", t))
            for j, v in enumerate(outputs):
                t = tensor(v, outs[j].name if j < len(outs) else f"output_{j}")
                ok &= t is not None
                files.append((f"test_data_set_{k}/output_{j}.pb", t))
        if not ok:
            left_out += 1
            continue
        os.makedirs(out_dir)
        with open(os.path.join(out_dir, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        for rel, t in files:
            path = os.path.join(out_dir, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(t.SerializeToString())
        written += 1
    print(f"onnx {onnx.__version__}: {written} node test cases written to {root}, "
          f"{left_out} left out (non-tensor inputs or outputs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
