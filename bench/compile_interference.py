#!/usr/bin/env python3
"""Does a schema that compiles past its budget slow the streams in flight? (results/
structured-outputs.md.) One `tessera serve`; `tessera bench serve` streams plain requests at a
fixed concurrency; in the "compiling" rounds a client meanwhile sends chat requests whose
schema takes seconds to compile (a new pattern with a 300-character repetition of a negated class
each time: a pattern that may match a quote stays with xgrammar's automaton, ~1.7 s per 100), each
refused with a 400 when --grammar-compile-timeout passes while its compilation goes on. Rounds
alternate quiet / compiling; the load generator's inter-token latency and TTFT are compared.

  .venv/bin/python bench/compile_interference.py [--rounds 3] [--clients 4]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from structured_outputs_bench import cpu_name  # noqa: E402
from tessera_server import BIN, Server  # noqa: E402


def pathological(server, stop, refused, counter):
    while not stop.is_set():
        counter[0] += 1
        # A long repetition of a negated class in a pattern (a maxLength this long is refused up front
        # by its estimate; a narrow class such as [a-z] goes through the regex expansion and
        # compiles 300 characters in ~0.4 s).
        schema = {"type": "object", "properties": {f"p{counter[0]}": {"type": "string",
                                                                      "pattern": f'^[^"]{{0,{300 + counter[0]}}}$'}},
                  "required": [f"p{counter[0]}"]}
        body = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
        status, text = server.post_raw("/v1/chat/completions", json.dumps(body).encode())
        refused.append(status)


def load(server, clients, requests, out):
    cmd = [os.path.join(BIN, "tessera"), "bench", "serve", "--url", server.base, "--sweep-concurrency", str(clients),
           "-n", str(requests), "--prompt-tokens", "64", "--output-tokens", "64", "--json", out]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        s = json.load(f)["levels"][0]["summary"]
    return s["itl_ms"]["p50"], s["itl_ms"]["p99"], s["ttft_ms"]["p99"], s["output_token_throughput"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=32)
    args = ap.parse_args()
    server = Server(args.model, extra=["--grammar-compile-timeout", "2000"])
    rows = {"quiet": [], "compiling": []}
    statuses = []
    try:
        # The vocabulary's token tables are built by the first structured request: not in a round.
        server.post_raw("/v1/chat/completions", json.dumps({
            "model": "test-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "response_format": {"type": "json_object"}}).encode())
        with tempfile.TemporaryDirectory() as tmp:
            for rnd in range(args.rounds):
                order = ["quiet", "compiling"] if rnd % 2 == 0 else ["compiling", "quiet"]
                for kind in order:
                    stop, refused, counter = threading.Event(), [], [1000 * rnd + (500 if kind == "compiling" else 0)]
                    t = None
                    if kind == "compiling":
                        t = threading.Thread(target=pathological, args=(server, stop, refused, counter))
                        t.start()
                    rows[kind].append(load(server, args.clients, args.requests, os.path.join(tmp, f"{rnd}{kind}.json")))
                    stop.set()
                    if t:
                        t.join()
                        statuses += refused
                    print(f"round {rnd + 1} {kind}: {rows[kind][-1]}", file=sys.stderr, flush=True)
        compile_s = server.metric("tessera_grammar_compile_seconds_sum")
        compiles = server.metric("tessera_grammar_compile_seconds_count")
    finally:
        server.stop()
    print(f"CPU: {cpu_name()}")
    print(f"{args.clients} streaming clients, {args.requests} requests of 64 + 64 tokens per round, {args.rounds} rounds "
          f"alternating; --grammar-compile-timeout 2000; pathological requests: {len(statuses)}, statuses "
          f"{sorted(set(statuses))}, {compiles:.0f} compilations, {compile_s:.1f} s compiling")
    print()
    print("| figure | quiet | while schemas compile | compiling / quiet (median of paired rounds, range) |")
    print("| --- | --- | --- | --- |")
    for i, name in enumerate(["ITL p50 ms", "ITL p99 ms", "TTFT p99 ms", "output tok/s"]):
        q = [r[i] for r in rows["quiet"]]
        c = [r[i] for r in rows["compiling"]]
        ratios = sorted(b / a for a, b in zip(q, c))
        print(f"| {name} | {statistics.median(q):.1f} | {statistics.median(c):.1f} | "
              f"{ratios[len(ratios) // 2]:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f}) |")


if __name__ == "__main__":
    main()
