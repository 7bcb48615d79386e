#!/usr/bin/env python3
"""Markdown tables (as in BENCHMARKS.md) from `matmul_peers.py --json` files.

    python3 bench/table.py bench/results/2026-11-22/ffn-f32-2t.json [more.json ...]

One row per shape: every system's GFLOP/s, anyshape against the best peer of the
same run, and anyshape's fraction of the measured peak. A summary line per file
gives the range of the ratio.
"""
import json
import sys

F32_PEERS = [("numpy", "numpy (OpenBLAS)"), ("onnxruntime", "ONNX Runtime"), ("openvino", "OpenVINO"),
             ("gemm_crate", "gemm crate")]
BF16_PEERS = [("openvino_bf16", "OpenVINO bf16"), ("onnxruntime", "ONNX Runtime f32")]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for path in sys.argv[1:]:
        rows = json.load(open(path))
        if not rows:
            continue
        bf16 = rows[0].get("dtype") == "bf16"
        peers = [(k, n) for k, n in (BF16_PEERS if bf16 else F32_PEERS) if k in rows[0]]
        print(f"\n{path}:\n")
        print("| batch | m | n | k | anyshape | " + " | ".join(n for _, n in peers)
              + " | anyshape / best peer | anyshape of peak |")
        print("|---" * (6 + len(peers) + 1) + "|")
        ratios = []
        for r in rows:
            best = max(r[k] for k, _ in peers if r.get(k))
            ratio = r["anyshape"] / best
            ratios.append(ratio)
            cells = " | ".join(f"{r[k]:.1f}" if r.get(k) else "–" for k, _ in peers)
            print(f"| {r['batch']} | {r['m']} | {r['n']} | {r['k']} | {r['anyshape']:.1f} | {cells} | "
                  f"{ratio:.2f}x | {100 * r['peak_fraction']:.1f}% |")
        print(f"\nanyshape / best peer: {min(ratios):.2f}–{max(ratios):.2f}x over {len(ratios)} rows; "
              f"at least level (≥ 0.995x) on {sum(x >= 0.995 for x in ratios)}")


if __name__ == "__main__":
    main()
