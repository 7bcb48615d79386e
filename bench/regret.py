"""Regret of the analytical schedule choice against exhaustive measurement.

    python3 bench/regret.py [--anyshape target/release/anyshape] [--threads 2] [--json out.json]

For every shape of the issue's sweep (dense QKV, FFN in/out, attention Q·Kᵀ and P·V),
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--anyshape", default="target/release/anyshape")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write all rows here")
    args = ap.parse_args()
    shapes = [s if len(s) == 4 else (1, *s) for s in SHAPES["dense"] + SHAPES["ffn"] + SHAPES["attention"]]
    rows = []
    for batch, m, n, k in shapes:
        cmd = [args.anyshape, "bench-matmul", "--m", str(m), "--n", str(n), "--k", str(k), "--batch", str(batch),
               "--threads", str(args.threads), "--json", "--exhaustive"]
        if batch > 1 and k == 64:
            cmd.append("--bt")  # Q·Kᵀ: K is stored [T, 64]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        row = json.loads(r.stdout.strip().splitlines()[-1])
        rows.append(row)
        reg = " ".join(f"{name} {100 * v:5.1f}%" for name, v in row["regret"].items())
        print(f"{batch:>3} {m:>5} {n:>5} {k:>5} {row['candidates']:>4} candidates  {reg}", flush=True)
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
