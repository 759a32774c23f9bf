#!/usr/bin/env python3
"""Plot for `tessera bench scale` results (the JSON it writes with --json).

    plot_scale.py --out scaling.png run.json

Left: the mean decode step split into compute, all-reduce and host time per TP degree.
Right: decode throughput against TP, with the ideal line (linear from the first degree).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("json")
    a = ap.parse_args()
    with open(a.json) as f:
        r = json.load(f)
    if r.get("kind") != "scale":
        sys.exit(f"{a.json}: not a scale benchmark result")
    pts = r["points"]
    tps = [p["tp"] for p in pts]
    labels = [str(t) for t in tps]
    compute = [p["compute_ms"] for p in pts]
    comm = [p["allreduce_ms"] for p in pts]
    host = [p["host_ms"] for p in pts]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.bar(labels, compute, label="compute", color="tab:blue")
    ax1.bar(labels, comm, bottom=compute, label="all-reduce", color="tab:orange")
    ax1.bar(labels, host, bottom=[c + m for c, m in zip(compute, comm)], label="host / scheduling", color="tab:gray")
    ax1.set_xlabel("TP degree")
    ax1.set_ylabel("ms per decode step (mean)")
    ax1.set_title("decode step breakdown")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3, axis="y")
    tput = [p["decode_tokens_per_s"] for p in pts]
    ax2.plot(tps, tput, "o-", label="measured")
    ideal = [tput[0] * t / tps[0] for t in tps]
    ax2.plot(tps, ideal, "k:", label="linear scaling")
    for t, y, p in zip(tps, tput, pts):
        ax2.annotate(f"{100 * p['efficiency']:.0f}%", (t, y), textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax2.set_xticks(tps)
    ax2.set_xlabel("TP degree")
    ax2.set_ylabel("decode tokens/s")
    ax2.set_title("throughput (labels: scaling efficiency)")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    cfg = r.get("config", {})
    model = os.path.basename(cfg.get("model", ""))
    cpu = r.get("machine", {}).get("cpu", "")
    fig.suptitle(f"{model}: batch {cfg.get('batch')}, {cpu}", fontsize=9)
    fig.tight_layout()
    fig.savefig(a.out, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    main()
