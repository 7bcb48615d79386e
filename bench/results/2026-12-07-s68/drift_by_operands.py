"""Session 68's table of later waves' slowdown by a wave's operands.

Usage: anyshape-gpu replay RECORD --detail > detail.txt, built at a commit
before session 68's model (7766d50), then: python3 drift_by_operands.py detail.txt

For each single launch of a tensor-core kernel (`gemm_wg*`, batch 1, 8 us or
more) of at least 1.5 waves of 132 tiles: the operands one wave reads in the
raster order (groups of 8 tile rows: A's row panels and B's column panels its
tiles span, over all of K, bf16), and the slowdown of each wave after the
first that measured over predicted implies, (ratio - 1) * waves / (waves - 1);
the median per half-octave of the operands over a 50 MB L2.
"""
import math
import re
import sys
from collections import defaultdict


def load(fn):
    rows, prod = [], None
    for line in open(fn):
        m = re.match(r'^(\w\w)\s+(?:(\d+)x\()?(\d+)x(\d+)x(\d+)\)?\s', line)
        if m and ' best ' in line:
            prod = (int(m.group(2) or 1), int(m.group(3)), int(m.group(4)), int(m.group(5)))
            continue
        m = re.match(r'^\s+(\S+)\s+measured\s+([\d.]+) us predicted\s+([\d.]+) us', line)
        if m and prod:
            rows.append((prod, m.group(1), float(m.group(2)), float(m.group(3))))
    return rows


def wave_bytes(m, n, k, bm, bn, tiles):
    rows, cols = -(-m // bm), -(-n // bn)
    tiles = min(tiles, rows * cols)
    group = min(8, rows)
    if tiles < group * cols:
        r, c = min(group, tiles), -(-tiles // group)
    else:
        r, c = min(rows, group * -(-tiles // (group * cols))), cols
    return (min(r * bm, m) + min(c * bn, n)) * k * 2


bins = defaultdict(list)
for (batch, m, n, k), name, meas, pred in load(sys.argv[1]):
    if '+' in name or 'skx' in name or not name.startswith('gemm_wg') or meas < 8 or batch > 1:
        continue
    bm, bn = map(int, re.search(r'_(\d+)x(\d+)_w', name).groups())
    waves = -(-m // bm) * -(-n // bn) / 132
    if waves < 1.5:
        continue
    share = wave_bytes(m, n, k, bm, bn, 132) / 50e6
    bins[round(math.log2(share) * 2) / 2].append((meas / pred - 1) * waves / (waves - 1))
for b in sorted(bins):
    v = sorted(bins[b])
    print(f'operands/L2 2^{b:+.1f}: {len(v):3d} launches, median slowdown {v[len(v) // 2]:+.3f}')
