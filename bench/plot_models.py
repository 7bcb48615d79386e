#!/usr/bin/env python3
"""Plot `bench/model_peers.py --json` files: median latency against shape, one line per system.

    python bench/plot_models.py results-bert-base-2t.json [more.json ...] --out bench/plots/bert-base.png [--out x.svg]

One panel per JSON file, titled with the model (the torch model name, else the
model file's folder) and the thread count. x: the file's shapes in their order,
evenly spaced, labelled by the dims that change between them (seq=8, or
height=160,width=192); dims that stay the same go into the axis label. y: the
best median latency in ms, log scale. A system keeps its colour across panels.
The format follows each --out's extension (.png, .svg, .pdf); default: the first
file's name with .png. Needs matplotlib (bench/requirements.txt).
"""

import argparse
import json
import os
import sys

sys.dont_write_bytecode = True

COLORS = {
    "anyshape": "#d62728",
    "onnxruntime": "#1f77b4",
    "openvino": "#9467bd",
    "torch": "#ff7f0e",
    "torch.compile": "#2ca02c",
}
MARKERS = {"anyshape": "o", "onnxruntime": "s", "openvino": "^", "torch": "v", "torch.compile": "D"}
EXTRA_COLORS = ["#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def model_label(d):
    if d.get("torch_model"):
        return d["torch_model"]
    name = os.path.basename(os.path.dirname(os.path.abspath(d.get("model", "?"))))
    return name or os.path.basename(d.get("model", "?"))


def shape_labels(shapes):
    """(tick labels from the dims that vary, text for the dims that do not)."""
    keys = list(dict.fromkeys(k for s in shapes for k in s))
    varying = [k for k in keys if len({s.get(k) for s in shapes}) > 1]
    fixed = [k for k in keys if k not in varying]
    if not varying:  # one shape (or all the same): label by the whole shape
        varying, fixed = keys, []
    ticks = [",".join(f"{k}={s[k]}" for k in varying if k in s) for s in shapes]
    const = ",".join(f"{k}={shapes[0][k]}" for k in fixed)
    return ticks, const


def minor_formatter(results):
    """Plain numbers on the log axis' minor ticks: all of them over a short range, 2 and 5 over a wider one."""
    import math

    import matplotlib.ticker

    ys = [r["median_ms"] for rows in results.values() for r in rows if r and r["median_ms"] > 0]
    span = max(ys) / min(ys) if ys else 1.0
    keep = None if span <= 20 else ({2, 5} if span <= 1000 else set())

    def fmt(v, _):
        lead = round(v / 10 ** math.floor(math.log10(v) + 1e-9)) if v > 0 else 0
        return f"{v:g}" if keep is None or lead in keep else ""

    return matplotlib.ticker.FuncFormatter(fmt)


def plot(files, outs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    data = []
    for f in files:
        with open(f) as fh:
            data.append((f, json.load(fh)))
    n = len(data)
    fig, axes = plt.subplots(1, n, figsize=(max(6.4, 5.6 * n), 4.8), squeeze=False)
    extra = {}
    for ax, (f, d) in zip(axes[0], data):
        shapes = d["shapes"]
        ticks, const = shape_labels(shapes)
        xs = list(range(len(shapes)))
        for sysname, rows in d["results"].items():
            ys = [r["median_ms"] if r else float("nan") for r in rows]
            color = COLORS.get(sysname) or extra.setdefault(sysname, EXTRA_COLORS[len(extra) % len(EXTRA_COLORS)])
            ax.plot(xs, ys, marker=MARKERS.get(sysname, "o"), color=color, label=sysname, linewidth=1.6,
                    markersize=5)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(minor_formatter(d["results"]))
        ax.set_xticks(xs)
        long = max((len(t) for t in ticks), default=0) > 8 or len(ticks) > 10
        ax.set_xticklabels(ticks, rotation=35 if long else 0, ha="right" if long else "center")
        ax.set_xlabel("shape" + (f" ({const})" if const else ""))
        ax.set_ylabel("median latency, ms (log scale)")
        th = d.get("threads")
        title = f"{model_label(d)}, {th} thread{'s' if th != 1 else ''}"
        ax.set_title(title)
        ax.grid(True, which="major", alpha=0.4)
        ax.grid(True, which="minor", axis="y", alpha=0.15)
        ax.legend(fontsize="small")
        skipped = d.get("skipped") or {}
        if skipped:
            ax.text(0.01, 0.01, "skipped: " + ", ".join(skipped), transform=ax.transAxes, fontsize="x-small",
                    color="gray", va="bottom")
    fig.tight_layout()
    for out in outs:
        d = os.path.dirname(out)
        if d:
            os.makedirs(d, exist_ok=True)
        fig.savefig(out, dpi=120)
        print(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="JSON files written by bench/model_peers.py --json")
    ap.add_argument("--out", action="append", help="output image (.png/.svg/.pdf); repeatable")
    a = ap.parse_args()
    outs = a.out or [os.path.splitext(a.files[0])[0] + ".png"]
    plot(a.files, outs)


if __name__ == "__main__":
    main()
