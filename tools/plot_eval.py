#!/usr/bin/env python3
"""Plots a `tessera eval` report: loss by precision and workload class (mean KL from the
reference, log scale, p99 as a tick), and memory against loss (bits per linear weight vs mean KL
per class). One pair of PNGs per model in the report.

Usage: plot_eval.py REPORT.json --out PREFIX   (writes PREFIX-<model>-kl.png and -memory.png)
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_model(m, prefix):
    name = os.path.basename(m["model"]).replace(".gguf", "")
    precs = [p for p in m["precisions"] if not p["reference"]]
    classes = m["classes"]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(precs)), 4))
    width = 0.8 / max(1, len(classes))
    for ci, cls in enumerate(classes):
        xs = [i + ci * width for i in range(len(precs))]
        kl = [max(p["classes"].get(cls, {}).get("kl_mean", 0), 1e-5) for p in precs]
        p99 = [max(p["classes"].get(cls, {}).get("kl_p99", 0), 1e-5) for p in precs]
        ax.bar(xs, kl, width, label=f"{cls} (mean)")
        ax.scatter(xs, p99, marker="_", color="black", s=80, zorder=3)
    ax.set_xticks([i + width * (len(classes) - 1) / 2 for i in range(len(precs))])
    ax.set_xticklabels([p["precision"] for p in precs], rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel(f"KL from {m['reference']} (nats/token; tick: p99)")
    ax.set_title(f"{name}: loss by precision and class")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{prefix}-{name}-kl.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for cls in classes:
        pts = sorted((p["bits_per_weight"], p["classes"][cls]["kl_mean"], p["precision"])
                     for p in precs if cls in p["classes"])
        ax.plot([x for x, _, _ in pts], [max(y, 1e-5) for _, y, _ in pts], marker="o", linestyle="none", label=cls)
        for x, y, label in pts:
            ax.annotate(label, (x, max(y, 1e-5)), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xlabel("bits per linear weight (as loaded)")
    ax.set_ylabel("mean KL (nats/token)")
    ax.set_title(f"{name}: memory vs loss")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{prefix}-{name}-memory.png", dpi=110)
    plt.close(fig)
    return [f"{prefix}-{name}-kl.png", f"{prefix}-{name}-memory.png"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.report) as f:
        report = json.load(f)
    for m in report["models"].values():
        for path in plot_model(m, args.out):
            print(path)


if __name__ == "__main__":
    main()
