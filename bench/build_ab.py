#!/usr/bin/env python3
"""Two builds of Tessera side by side: tessera-bench-cpu and `tessera bench serve`, paired rounds in
alternating order (A-B, B-A, A-B, ...), each figure reported as the median of its rounds and the
median (range) of the per-round B/A ratios.

    python3 bench/build_ab.py --a /work/base/build/bin --b build/bin --rounds 4 \
        --model models/gemma-3-270m-q4_k_m.gguf --markdown out.md

The same load generator (B's `tessera bench serve`) drives both servers, so only the server under
test differs. Prints the CPU with the tables."""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def cpu_line():
    name, family, model = "?", "?", "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "model name" and name == "?":
                name = value
            elif key == "cpu family" and family == "?":
                family = value
            elif key == "model" and model == "?":
                model = value
    return f"{name}, family {family} model {model}, {os.cpu_count()} logical CPUs"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_cpu(bin_dir, args):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [os.path.join(bin_dir, "tessera-bench-cpu"), "--model", args.model, "--threads", args.threads,
           "--prompt", str(args.prompt), "--gen", str(args.gen), "--batches", args.batches,
           "--reps", str(args.reps), "--no-bandwidth", "--json", out]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        data = json.load(f)
    os.unlink(out)
    figures = {}
    for run in data["runs"]:
        t = run["threads"]
        figures[f"prompt tok/s, {t} threads"] = run["prompt_tok_s"]
        figures[f"generation tok/s, {t} threads"] = run["gen_tok_s"]
        for batch, value in run.get("concurrent_tok_s", {}).items():
            figures[f"{batch} sequences tok/s, {t} threads"] = value
    return figures


def wait_healthy(port, process, timeout_s=120):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("server not healthy in time")


def bench_serve(bin_dir, loadgen_bin, args):
    port = free_port()
    server = subprocess.Popen([os.path.join(bin_dir, "tessera"), "serve", "--model", args.model,
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, server)
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        cmd = [loadgen_bin, "bench", "serve", "--url", f"http://127.0.0.1:{port}", "--sweep-concurrency",
               *args.clients.split(","), "-n", str(args.requests), "--prompt-tokens", str(args.prompt),
               "--output-tokens", str(args.gen), "--json", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as f:
            data = json.load(f)
        os.unlink(out)
    finally:
        server.terminate()
        server.wait(timeout=60)
    figures = {}
    for level in data["levels"]:
        c = int(level["load"])
        s = level["summary"]
        if s["failed"]:
            raise RuntimeError(f"{s['failed']} requests failed at {c} clients: {s['errors'][:3]}")
        figures[f"{c} clients: output tok/s"] = s["output_token_throughput"]
        figures[f"{c} clients: TTFT p50 ms"] = s["ttft_ms"]["p50"]
        figures[f"{c} clients: TTFT p99 ms"] = s["ttft_ms"]["p99"]
        figures[f"{c} clients: ITL p99 ms"] = s["itl_ms"]["p99"]
        figures[f"{c} clients: TPOT p50 ms"] = s["tpot_ms"]["p50"]
    return figures


def table(title, rounds_a, rounds_b, label_a, label_b):
    lines = [f"### {title}", "", f"| figure | {label_a} | {label_b} | B / A: median of paired ratios (range) |",
             "|---|---|---|---|"]
    for key in rounds_a[0]:
        a = [r[key] for r in rounds_a]
        b = [r[key] for r in rounds_b]
        ratios = [y / x for x, y in zip(a, b) if x]
        lines.append(f"| {key} | {statistics.median(a):.1f} | {statistics.median(b):.1f} | "
                     f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="bin directory of build A (before)")
    p.add_argument("--b", required=True, help="bin directory of build B (after)")
    p.add_argument("--label-a", default="A")
    p.add_argument("--label-b", default="B")
    p.add_argument("--model", default="models/gemma-3-270m-q4_k_m.gguf")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", default="2")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--batches", default="4,16")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--clients", default="1,4")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--skip-cpu", action="store_true")
    p.add_argument("--skip-serve", action="store_true")
    p.add_argument("--markdown", help="also write the tables here")
    args = p.parse_args()
    loadgen = os.path.join(args.b, "tessera")
    cpu = {"A": [], "B": []}
    serve = {"A": [], "B": []}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for r in range(args.rounds):
        order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
        for which in order:
            bin_dir = args.a if which == "A" else args.b
            if not args.skip_cpu:
                cpu[which].append(bench_cpu(bin_dir, args))
            if not args.skip_serve:
                serve[which].append(bench_serve(bin_dir, loadgen, args))
            print(f"round {r + 1}/{args.rounds}: {which} done", file=sys.stderr, flush=True)
    out = [f"- CPU: {cpu_line()}", f"- date: {started} to {time.strftime('%H:%M UTC', time.gmtime())}",
           f"- model: {args.model}", f"- rounds: {args.rounds}, alternating A-B then B-A", "",
           f"- command: `{' '.join(sys.argv)}`", ""]
    if not args.skip_cpu:
        out.append(table(f"tessera-bench-cpu --threads {args.threads} --prompt {args.prompt} --gen {args.gen} "
                         f"--batches {args.batches} --reps {args.reps} (median of reps, per round)",
                         cpu["A"], cpu["B"], args.label_a, args.label_b))
    if not args.skip_serve:
        out.append(table(f"tessera serve (defaults) loaded by tessera bench serve --sweep-concurrency "
                         f"{args.clients.replace(',', ' ')} -n {args.requests} --prompt-tokens {args.prompt} "
                         f"--output-tokens {args.gen}", serve["A"], serve["B"], args.label_a, args.label_b))
    text = "\n".join(out)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
