#!/usr/bin/env python3
"""Table and plot of bench/serve_vs_vllm.sh: Tessera beside vLLM per concurrency, ranges over
the rounds (min-max), and the ratios of the medians.

    serve_vs_vllm.py --name NAME [--work DIR] --out PREFIX [--command TEXT]

Reads DIR/NAME-<engine>-c<C>-r<R>.json (`tessera bench serve --json`; DIR defaults to
bench/work/serve-vs-vllm, where bench/serve_vs_vllm.sh leaves them, git-ignored), writes PREFIX.md
(machine, command, date, table, targets met or not) and PREFIX.png.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

ENGINES = ("tessera", "vllm")
# (label, summary path, higher is better)
METRICS = [
    ("output tok/s", ("output_token_throughput",), True),
    ("TTFT p50 ms", ("ttft_ms", "p50"), False),
    ("TTFT p99 ms", ("ttft_ms", "p99"), False),
    ("ITL p50 ms", ("itl_ms", "p50"), False),
    ("ITL p99 ms", ("itl_ms", "p99"), False),
]


def value(summary, path):
    v = summary
    for k in path:
        v = v[k]
    return float(v)


def load(work, name):
    runs = {}  # (engine, c) -> [summary]
    machine = None
    dates = []
    pat = re.compile(re.escape(name) + r"-(tessera|vllm)-c(\d+)-r(\d+)\.json$")
    for path in sorted(glob.glob(os.path.join(work, f"{name}-*-c*-r*.json"))):
        m = pat.search(os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            d = json.load(f)
        s = d["levels"][0]["summary"]
        if s.get("failed", 0):
            print(f"warning: {path}: {s['failed']} failed requests", file=sys.stderr)
        runs.setdefault((m.group(1), int(m.group(2))), []).append(s)
        machine = machine or d.get("machine")
        dates.append(d.get("date", ""))
    return runs, machine, sorted(x for x in dates if x)


def cpu_line():
    """Model name, vendor, family and model of this machine's CPU (/proc/cpuinfo)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, v = (x.strip() for x in line.split(":", 1))
                    info.setdefault(k, v)
    except OSError:
        return "unknown CPU"
    flags = info.get("flags", "").split()
    isa = "avx512_bf16" if "avx512_bf16" in flags else "avx512f" if "avx512f" in flags else "avx2"
    return (f"{info.get('model name', '?')} ({info.get('vendor_id', '?')} family {info.get('cpu family', '?')} "
            f"model {info.get('model', '?')}, {isa})")


def fmt(x):
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def cell(vals):
    lo, hi = min(vals), max(vals)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--work", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "work", "serve-vs-vllm"),
                    help="folder of the per-run JSON (default: bench/work/serve-vs-vllm)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", default="")
    a = ap.parse_args()
    runs, machine, dates = load(a.work, a.name)
    if not runs:
        sys.exit(f"serve_vs_vllm.py: no runs named {a.name} in {a.work}")
    levels = sorted({c for (_, c) in runs})
    lines = [f"# Serving beside vLLM: {a.name}", ""]
    lines.append(f"- CPU: {cpu_line()}; load generator saw {machine.get('hardware_threads', '?') if machine else '?'} hardware threads")
    lines.append(f"- date: {dates[0]} to {dates[-1]}" if dates else "- date: ?")
    if a.command:
        lines.append(f"- command: `{a.command}`")
    lines.append("- cells: min–max over rounds (n per cell in brackets); ratio: Tessera median / vLLM median")
    lines.append("")
    head = "| c | " + " | ".join(f"{m} Tessera / vLLM (ratio)" for m, _, _ in METRICS) + " |"
    lines += [head, "|---" * (len(METRICS) + 1) + "|"]
    verdicts = []
    for c in levels:
        row = [str(c)]
        for label, path, higher in METRICS:
            t = [value(s, path) for s in runs.get(("tessera", c), [])]
            v = [value(s, path) for s in runs.get(("vllm", c), [])]
            if t and v:
                ratio = statistics.median(t) / statistics.median(v)
                row.append(f"{cell(t)} / {cell(v)} ({ratio:.2f}×) [{len(t)}/{len(v)}]")
                if label == "output tok/s":
                    verdicts.append((c, label, ratio >= 1.3, f"{ratio:.2f}× (target ≥ 1.3×)"))
                elif label in ("TTFT p50 ms", "TTFT p99 ms", "ITL p99 ms"):
                    verdicts.append((c, label, ratio <= 1.0, f"{ratio:.2f}× (target ≤ 1.0×)"))
            elif t:
                row.append(f"{cell(t)} / –")
            else:
                row.append(f"– / {cell(v)}")
        lines.append("| " + " | ".join(row) + " |")
    if verdicts:
        lines += ["", "Targets (issue 21), on the medians:", ""]
        for c, label, ok, text in verdicts:
            lines.append(f"- c={c} {label}: {text} {'met' if ok else '**not met**'}")
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: no matplotlib, no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 3.6))
    for ax, (label, path, _) in zip(axes, METRICS):
        for engine, color in zip(ENGINES, ("tab:blue", "tab:orange")):
            xs, med, lo, hi = [], [], [], []
            for c in levels:
                vals = [value(s, path) for s in runs.get((engine, c), [])]
                if vals:
                    xs.append(c)
                    med.append(statistics.median(vals))
                    lo.append(statistics.median(vals) - min(vals))
                    hi.append(max(vals) - statistics.median(vals))
            if xs:
                ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=engine, color=color)
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels)
        ax.set_xticklabels([str(c) for c in levels])
        ax.set_xlabel("concurrency")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{a.name}: Tessera vs vLLM ({machine.get('cpu', '') if machine else ''})", fontsize=9)
    fig.tight_layout()
    fig.savefig(a.out + ".png", dpi=110)
    print(f"wrote {a.out}.md, {a.out}.png")


if __name__ == "__main__":
    main()
