#!/usr/bin/env python3
"""Constrained decoding beside llama.cpp's server (results/structured-outputs.md): the same GGUF,
the same JSON Schema, the same load, through each server's OpenAI API: tokens/s of schema-
constrained chat completions at 1 and at N concurrent requests, the engines alternating round
by round. Every output is validated with PyPI's jsonschema.

llama-server is built outside the project from the llama.cpp tree in PyPI's llama-cpp-python
0.3.36 source distribution (nothing of it is committed):

  pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/llama
  tar xzf /tmp/llama/llama_cpp_python-0.3.36.tar.gz -C /tmp/llama
  cd /tmp/llama/llama_cpp_python-0.3.36/vendor/llama.cpp
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \\
      -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  cmake --build build -j2 --target llama-server

  .venv/bin/python bench/structured_vs_llama_server.py --llama-server /tmp/llama/.../build/bin/llama-server

Load: "1": --single requests one after another; "N": one wave of N concurrent requests (each
engine gets the same requests). tokens/s = completion tokens of all requests / wall time.
Outputs: valid (complete, validates), cut (max_tokens reached first) or invalid (complete, fails
the schema: an engine whose grammar does not enforce a keyword, e.g. a number's maximum).
"""
import argparse
import concurrent.futures
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import jsonschema
import openai

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from build_ab import free_port, wait_healthy  # noqa: E402
from structured_outputs_bench import PROMPT, cpu_name, schema_of  # noqa: E402
from tessera_server import Server  # noqa: E402


class LlamaServer:
    def __init__(self, binary, model, slots, threads, ctx_per_slot):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "-m", model, "--port", str(self.port), "--host", "127.0.0.1", "-np", str(slots),
             "-c", str(slots * ctx_per_slot), "-t", str(threads), "-tb", str(threads), "--jinja", "--no-webui"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_healthy(self.port, self.proc)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none", max_retries=0,
                                    timeout=600)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def one(client, model, schema, max_tokens, seed):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens, temperature=0.7,
        seed=seed, response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema,
                                                                          "strict": True}})
    if r.choices[0].finish_reason != "stop":
        return r.usage.completion_tokens, "cut"  # max_tokens reached (an unbounded string ran on)
    try:
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
        return r.usage.completion_tokens, "valid"
    except (ValueError, jsonschema.ValidationError):
        return r.usage.completion_tokens, "invalid"


def wave(client, model, schema, n, max_tokens, seed0):
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        out = list(pool.map(lambda i: one(client, model, schema, max_tokens, seed0 + i), range(n)))
    wall = time.perf_counter() - t0
    return sum(t for t, _ in out) / wall, [v for _, v in out]


def sequential(client, model, schema, n, max_tokens, seed0):
    t0 = time.perf_counter()
    out = [one(client, model, schema, max_tokens, seed0 + i) for i in range(n)]
    wall = time.perf_counter() - t0
    return sum(t for t, _ in out) / wall, [v for _, v in out]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--single", type=int, default=4, help="requests one after another for the 1-request figure")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bounded-strings", action="store_true", help="schema20 with maxLength strings (default: plain strings)")
    args = ap.parse_args()
    schema = schema_of(20, bounded_strings=args.bounded_strings)
    engines = {"tessera": Server(args.model),
               "llama-server": LlamaServer(args.llama_server, args.model, args.concurrency, args.threads, 1024)}
    clients = {"tessera": (engines["tessera"].client, "test-model"),
               "llama-server": (engines["llama-server"].client, "m")}
    results = {(e, load): [] for e in engines for load in ("1", "N")}
    outcomes = {(e, load): [] for e in engines for load in ("1", "N")}
    try:
        for e, (c, m) in clients.items():  # warm-up: grammar compiled, caches touched
            one(c, m, schema, 32, 1)
        for rnd in range(args.rounds):
            order = list(clients) if rnd % 2 == 0 else list(clients)[::-1]
            for load in ("1", "N"):
                for e in order:
                    c, m = clients[e]
                    if load == "1":
                        rate, got = sequential(c, m, schema, args.single, args.max_tokens, 100 * rnd)
                    else:
                        rate, got = wave(c, m, schema, args.concurrency, args.max_tokens, 100 * rnd)
                    results[(e, load)].append(rate)
                    outcomes[(e, load)] += got
                    print(f"round {rnd + 1} load {load} {e}: {rate:.1f} tok/s", file=sys.stderr, flush=True)
    finally:
        for s in engines.values():
            s.stop()
    print(f"CPU: {cpu_name()}")
    print(f"date: {datetime.date.today()}; model: {os.path.basename(args.model)}; schema: 20 properties "
          f"({'maxLength strings' if args.bounded_strings else 'plain strings'}); temperature 0.7, max_tokens "
          f"{args.max_tokens}; {args.threads} threads each; llama-server -np {args.concurrency}; {args.rounds} rounds, "
          f"engines alternating; medians")
    print()
    print("| load | Tessera tok/s | llama-server tok/s | Tessera / llama-server (median of rounds, range) | outputs valid / cut / invalid: Tessera; llama-server |")
    print("| --- | --- | --- | --- | --- |")
    for load, label in (("1", f"1 request ({args.single} in turn)"), ("N", f"{args.concurrency} concurrent")):
        t, l = results[("tessera", load)], results[("llama-server", load)]
        ratios = sorted(a / b for a, b in zip(t, l))
        count = {e: "/".join(str(outcomes[(e, load)].count(k)) for k in ("valid", "cut", "invalid")) for e in engines}
        print(f"| {label} | {statistics.median(t):.1f} | {statistics.median(l):.1f} | "
              f"{ratios[len(ratios) // 2]:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f}) | {count['tessera']}; "
              f"{count['llama-server']} |")


if __name__ == "__main__":
    main()
