#!/usr/bin/env python3
"""Plots for `tessera bench serve` results (the JSON it writes with --json).

    plot_serve.py --out PREFIX run.json [other.json ...]

Writes
  PREFIX-latency.png   TTFT, ITL and E2E (P50 solid, P99 dashed) and output-token throughput
                       against offered load, one series per input file. When every file holds
                       a single load level (e.g. one server setting per file), the x axis is the
                       files' titles instead.
  PREFIX-timeline.png  batch size and KV-cache usage over time, sampled from the server's
                       /metrics, one panel row per load level (only when samples exist).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load_runs(paths):
    runs = []
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        if r.get("kind") != "serve":
            sys.exit(f"{p}: not a serve benchmark result (kind={r.get('kind')!r})")
        r["_label"] = r.get("title") or os.path.splitext(os.path.basename(p))[0]
        runs.append(r)
    return runs


def x_label(level):
    return "clients" if level["mode"] == "concurrency" else "requests/s"


def latency_plot(runs, out):
    by_title = len(runs) > 1 and all(len(r["levels"]) == 1 for r in runs)
    panels = [("ttft_ms", "TTFT (ms)"), ("itl_ms", "inter-token latency (ms)"), ("e2e_ms", "end-to-end (ms)")]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    if by_title:
        names = [r["_label"] for r in runs]
        xs = list(range(len(runs)))
        for ax, (key, title) in zip(axes, panels):
            p50 = [r["levels"][0]["summary"][key]["p50"] for r in runs]
            p99 = [r["levels"][0]["summary"][key]["p99"] for r in runs]
            ax.plot(xs, p50, "o-", label="P50")
            ax.plot(xs, p99, "s--", label="P99")
            ax.set_title(title)
            ax.set_xticks(xs, names, rotation=20, ha="right", fontsize=8)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        tput = [r["levels"][0]["summary"]["output_token_throughput"] for r in runs]
        axes[3].bar(xs, tput, color="tab:green")
        axes[3].set_xticks(xs, names, rotation=20, ha="right", fontsize=8)
        axes[3].set_title("output tokens/s")
        axes[3].grid(alpha=0.3, axis="y")
        load = runs[0]["levels"][0]
        fig.suptitle(f"at {load['load']:g} {x_label(load)}")
    else:
        for i, r in enumerate(runs):
            levels = r["levels"]
            if not levels:
                continue
            color = f"C{i}"
            xs = [lv["load"] for lv in levels]
            for ax, (key, title) in zip(axes, panels):
                ax.plot(xs, [lv["summary"][key]["p50"] for lv in levels], "o-", color=color,
                        label=f"{r['_label']} P50")
                ax.plot(xs, [lv["summary"][key]["p99"] for lv in levels], "s--", color=color,
                        label=f"{r['_label']} P99")
                ax.set_title(title)
            axes[3].plot(xs, [lv["summary"]["output_token_throughput"] for lv in levels], "o-", color=color,
                         label=r["_label"])
            axes[3].set_title("output tokens/s")
            for ax in axes:
                ax.set_xlabel(f"offered load ({x_label(levels[0])})")
                if len(xs) > 1 and max(xs) / max(min(xs), 1e-9) >= 8:
                    ax.set_xscale("log", base=2)
                ax.grid(alpha=0.3)
        for ax in axes:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def timeline_plot(runs, out):
    rows = []
    for r in runs:
        for lv in r["levels"]:
            if lv.get("timeline"):
                rows.append((r, lv))
    if not rows:
        return False
    fig, axes = plt.subplots(len(rows), 1, figsize=(10, 2.4 * len(rows) + 0.6), squeeze=False)
    for ax, (r, lv) in zip(axes[:, 0], rows):
        t = [s["t_s"] for s in lv["timeline"]]
        batch = [s.get("batch_size", float("nan")) for s in lv["timeline"]]
        waiting = [s.get("waiting", float("nan")) for s in lv["timeline"]]
        kv = [100.0 * s.get("kv_usage", float("nan")) for s in lv["timeline"]]
        ax.step(t, batch, ".-", where="post", color="tab:blue", label="batch size", markersize=3)
        ax.step(t, waiting, ".-", where="post", color="tab:orange", alpha=0.7, label="waiting", markersize=3)
        ax.set_ylabel("sequences")
        ax2 = ax.twinx()
        ax2.plot(t, kv, ".-", color="tab:red", label="KV usage %", markersize=3)
        ax2.set_ylabel("KV usage %")
        ax2.set_ylim(0, max(5.0, max([k for k in kv if k == k] or [0]) * 1.15))
        ax.set_title(f"{r['_label']}: {lv['load']:g} {x_label(lv)}", fontsize=9)
        ax.grid(alpha=0.3)
        lines = ax.get_legend_handles_labels()
        lines2 = ax2.get_legend_handles_labels()
        ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time since the level started (s)")
    fig.tight_layout()
    fig.savefig(out, dpi=70)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="prefix of the PNG files")
    ap.add_argument("--no-timeline", action="store_true")
    ap.add_argument("json", nargs="+")
    a = ap.parse_args()
    runs = load_runs(a.json)
    latency_plot(runs, a.out + "-latency.png")
    if not a.no_timeline:
        timeline_plot(runs, a.out + "-timeline.png")


if __name__ == "__main__":
    main()
