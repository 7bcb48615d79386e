"""Regret of the analytical schedule choice against exhaustive measurement.

    python3 bench/regret.py [--anyshape target/release/anyshape] [--threads 2] [--set layers] [--json out.json]

For every shape of the issue's sweep (dense QKV, FFN in/out, attention Q·Kᵀ and P·V;
with --set layers: the weight products of BERT-base and ResNet-50's layers at the
shapes the compiled models meet, and five of ResNet-50's convolutions as implicit GEMM),
`anyshape bench-matmul --exhaustive` measures every candidate schedule the generator
yields and reports, for each model (hierarchical = Vortex Eq. 2-4, dietcode, sia) and
for the fixed rule of thumb, regret = time of its pick / best measured time - 1.
Prints per-shape regrets and, per model, the mean, the maximum and how many shapes
are within 5% of the best.
"""
import argparse
import json
import subprocess
import sys

sys.dont_write_bytecode = True
from matmul_peers import SHAPES  # noqa: E402  (the same shapes as the peer benchmark)

# (m, n, k) of weight products in the compiled models: ResNet-50's 1×1 layers at
# 160 and 224, BERT-base's projections and FFN at seq 1-1024.
LAYERS = [
    (100, 256, 1024), (100, 1024, 256), (25, 512, 2048), (196, 256, 1024), (49, 512, 2048),
    (49, 2048, 512), (784, 128, 512), (3136, 64, 256), (3136, 256, 64), (1, 768, 768),
    (8, 768, 768), (17, 768, 3072), (32, 3072, 768), (64, 2304, 768), (128, 768, 768),
    (128, 3072, 768), (128, 768, 3072), (384, 768, 768), (512, 3072, 768), (1024, 768, 3072),
]
# ResNet-50's convolutions (`bench-matmul --conv`), with their output channels.
CONVS = [
    ("56x56x64:3x3:s1:p1", 64), ("28x28x128:3x3:s1:p1", 128), ("14x14x256:3x3:s1:p1", 256),
    ("7x7x512:3x3:s1:p1", 512), ("224x224x3:7x7:s2:p3", 64), ("72x72x64:3x3:s1:p1", 64),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--anyshape", default="target/release/anyshape")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write all rows here")
    ap.add_argument("--set", choices=["sweep", "layers"], default="sweep",
                    help="the issue's sweep, or the models' layers (weights packed as the models pack them)")
    args = ap.parse_args()
    if args.set == "layers":
        cases = [((1, m, n, k), None) for m, n, k in LAYERS] + [(None, c) for c in CONVS]
    else:
        cases = [((s if len(s) == 4 else (1, *s)), None)
                 for s in SHAPES["dense"] + SHAPES["ffn"] + SHAPES["attention"]]
    rows = []
    for shape, conv in cases:
        if conv is not None:
            spec, n = conv
            batch, m, k = 1, spec, "-"
            cmd = [args.anyshape, "bench-matmul", "--conv", spec, "--n", str(n),
                   "--threads", str(args.threads), "--json", "--exhaustive"]
        else:
            batch, m, n, k = shape
            cmd = [args.anyshape, "bench-matmul", "--m", str(m), "--n", str(n), "--k", str(k),
                   "--batch", str(batch), "--threads", str(args.threads), "--json", "--exhaustive"]
            if batch > 1 and k == 64:
                cmd.append("--bt")  # Q·Kᵀ: K is stored [T, 64]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        row = json.loads(r.stdout.strip().splitlines()[-1])
        rows.append(row)
        reg = " ".join(f"{name} {100 * v:5.1f}%" for name, v in row["regret"].items())
        print(f"{batch:>3} {m:>5} {n:>5} {k:>5} {row['candidates']:>4} candidates  {reg}  {row['schedule']}",
              flush=True)
    names = list(rows[0]["regret"].keys())
    print(f"\n{'model':>13} {'mean':>7} {'max':>7} {'within 5%':>10}  ({len(rows)} shapes)")
    for name in names:
        v = [r["regret"][name] for r in rows]
        print(f"{name:>13} {100 * sum(v) / len(v):>6.1f}% {100 * max(v):>6.1f}% {sum(x <= 0.05 for x in v):>10}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
