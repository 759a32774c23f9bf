#!/usr/bin/env python3
"""Plot of `tessera tune --json`: every simulated setting as output throughput against P99 TTFT,
the Pareto front joined, settings meeting the SLO filled, the recommendation and the built-in
profiles labelled. Needs matplotlib (the project's .venv has it after `bench serve` plots).

    python3 tools/plot_tune.py TUNE.json OUT.png
"""
import json
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_tune.py TUNE.json OUT.png")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(sys.argv[1]) as f:
        j = json.load(f)
    cands = j["candidates"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for ok, marker, label in ((False, "x", "misses the SLO"), (True, "o", "meets the SLO")):
        pts = [c for c in cands if bool(c["meets_slo"]) == ok]
        ax.scatter([c["ttft_p99_s"] * 1e3 for c in pts], [c["output_tok_s"] for c in pts], marker=marker, s=14,
                   alpha=0.5, label=label)
    front = sorted((c for c in cands if c["pareto"]), key=lambda c: c["ttft_p99_s"])
    ax.plot([c["ttft_p99_s"] * 1e3 for c in front], [c["output_tok_s"] for c in front], "k-", lw=1, label="Pareto front")
    rec = cands[j["recommended"]]
    ax.scatter([rec["ttft_p99_s"] * 1e3], [rec["output_tok_s"]], marker="*", s=200, c="red", label="recommended")
    for i in j.get("builtin", []):
        c = cands[i]
        ax.annotate(c["profile"], (c["ttft_p99_s"] * 1e3, c["output_tok_s"]), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("P99 time to first token (ms)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"tessera tune: {len(cands)} settings, SLO {j['slo']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
