#!/usr/bin/env python3
"""Structured outputs' cost in serving (results/structured-outputs.md): output tokens/s of
constrained requests against plain ones on the same server, at 1 and 16 concurrent requests,
alternating the kinds round by round; a mix of 8 constrained + 8 plain against 16 plain; and a
fixed-key schema (jump-forward). Every constrained output is checked against its schema.

  .venv/bin/python bench/structured_outputs_bench.py [--model models/gemma-3-270m-q4_k_m.gguf]
      [--window 15] [--server-args "--jump-forward-tokens 0"]

Steady state (--window > 0, the default): each client sends its requests back to back; after a
warm-up the server's generated-token counter is read at the start and the end of the window, so
the rate is taken while every client is busy (constrained outputs end at different lengths; a
single wave would count the tail where fewer run). --window 0: one wave of requests, tokens of
all requests / wall time.

Prints a Markdown table with the CPU; raw runs go to bench/work/structured_outputs/.
"""
import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import subprocess
import shlex
import sys
import threading
import time

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from tessera_server import Server  # noqa: E402


def schema_of(n, bounded_strings=True):
    """n required properties of mixed kinds, bounded so that an instance ends (strings by
    maxLength unless bounded_strings is false: xgrammar's masks inside a maxLength string cost
    milliseconds on a 262k vocabulary, inside a plain string tens of microseconds)."""
    string = {"type": "string", "maxLength": 12} if bounded_strings else {"type": "string"}
    kinds = [string, {"type": "integer", "minimum": 0, "maximum": 100000},
             {"type": "boolean"}, {"enum": ["alpha", "beta", "gamma"]}, {"type": "number", "minimum": 0, "maximum": 1}]
    props = {f"field_{i}": kinds[i % len(kinds)] for i in range(n)}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


# The fixed-key schema: long keys and enum values, so most of the output is forced.
FIXED = {"type": "object", "properties": {
    f"the_{w}_property_of_this_record": {"enum": ["value_one_for_it", "value_two_for_it"]}
    for w in ("first", "second", "third", "fourth", "fifth", "sixth")},
    "required": [f"the_{w}_property_of_this_record" for w in ("first", "second", "third", "fourth", "fifth", "sixth")],
    "additionalProperties": False}

PROMPT = "Write the record of a customer order as JSON."


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            info = {}
            for line in f:
                if ":" in line:
                    k, v = line.split(":", 1)
                    info.setdefault(k.strip(), v.strip())
        return f"{info.get('model name')} (family {info.get('cpu family')} model {info.get('model')}), " \
               f"{os.cpu_count()} cores"
    except OSError:
        return platform.processor()


def one(server, kind, max_tokens):
    """One chat request of `kind` (plain, schema20, schema20u, fixed); returns (completion tokens,
    finish reason). A constrained output that completed is validated against its schema."""
    schema = {"schema20": lambda: schema_of(20), "schema20u": lambda: schema_of(20, bounded_strings=False),
              "fixed": lambda: FIXED}.get(kind, lambda: None)()
    kwargs = dict(model="test-model", messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens,
                  temperature=0.7, seed=1)
    if schema is None:
        kwargs["extra_body"] = {"ignore_eos": True}  # a plain request generates max_tokens tokens
    else:
        kwargs["response_format"] = {"type": "json_schema",
                                     "json_schema": {"name": "r", "schema": schema, "strict": True}}
    r = server.client.chat.completions.create(**kwargs)
    if schema is not None and r.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    return r.usage.completion_tokens, r.choices[0].finish_reason


def run(server, kinds, max_tokens):
    """Runs one request of each kind in `kinds` at once; returns (tokens by kind, wall seconds)."""
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(kinds)) as pool:
        results = list(pool.map(lambda k: one(server, k, max_tokens), kinds))
    wall = time.perf_counter() - t0
    tokens = {}
    for k, (n, _) in zip(kinds, results):
        tokens[k] = tokens.get(k, 0) + n
    return tokens, wall


def generated_tokens(server):
    return server.metric("tessera_generation_tokens_total")


def run_steady(server, kinds, max_tokens, window_s, warmup_s=3.0):
    """Each kind in `kinds` is one client sending requests back to back; returns (tokens by kind
    finished during the run, generated tokens/s over the window after the warm-up)."""
    stop = threading.Event()
    tokens = {}
    lock = threading.Lock()
    errors = []

    def client(kind):
        while not stop.is_set():
            try:
                n, _ = one(server, kind, max_tokens)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(repr(e))
                return
            with lock:
                tokens[kind] = tokens.get(kind, 0) + n

    threads = [threading.Thread(target=client, args=(k,)) for k in kinds]
    for t in threads:
        t.start()
    time.sleep(warmup_s)
    c0, t0 = generated_tokens(server), time.perf_counter()
    time.sleep(window_s)
    c1, t1 = generated_tokens(server), time.perf_counter()
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[:3]}")
    return tokens, (c1 - c0) / (t1 - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--scenarios", default="all", help="all, or scenario names separated by ';' (schema20u: unbounded strings)")
    ap.add_argument("--window", type=float, default=15.0, help="seconds of steady state per measurement (0: one wave)")
    ap.add_argument("--server-args", default="", help="extra `tessera serve` flags, e.g. \"--jump-forward-tokens 0\"")
    args = ap.parse_args()
    work = os.path.join(ROOT, "bench", "work", "structured_outputs")
    os.makedirs(work, exist_ok=True)
    server = Server(args.model, extra=shlex.split(args.server_args))
    scenarios = [
        ("1 request", ["plain"], ["schema20"]),
        ("16 requests", ["plain"] * 16, ["schema20"] * 16),
        ("16 requests, fixed keys", ["plain"] * 16, ["fixed"] * 16),
        ("1 request, fixed keys", ["plain"], ["fixed"]),
        ("8 + 8 mix vs 16 plain", ["plain"] * 16, ["schema20"] * 8 + ["plain"] * 8),
        ("1 request, schema20u", ["plain"], ["schema20u"]),
        ("16 requests, schema20u", ["plain"] * 16, ["schema20u"] * 16),
        ("8 + 8 mix (schema20u) vs 16 plain", ["plain"] * 16, ["schema20u"] * 8 + ["plain"] * 8),
    ]
    if args.scenarios != "all":
        wanted = [w.strip() for w in args.scenarios.split(";")]
        scenarios = [sc for sc in scenarios if sc[0] in wanted]
        if len(scenarios) != len(wanted):
            sys.exit(f"--scenarios: names separated by ';', each one of the table's rows; got {wanted}")
    rows = []
    raw = []
    try:
        run(server, ["schema20", "schema20u", "fixed", "plain"], 32)  # compile the grammars, warm up
        for name, a, b in scenarios:
            rates = {"A": [], "B": []}
            for rnd in range(args.rounds):
                order = (("A", a), ("B", b)) if rnd % 2 == 0 else (("B", b), ("A", a))
                for label, kinds in order:
                    if args.window > 0:
                        tokens, rate = run_steady(server, kinds, args.max_tokens, args.window)
                        raw.append({"scenario": name, "side": label, "round": rnd, "kinds": kinds, "tokens": tokens,
                                    "window_s": args.window, "tok_s": rate})
                    else:
                        tokens, wall = run(server, kinds, args.max_tokens)
                        rate = sum(tokens.values()) / wall
                        raw.append({"scenario": name, "side": label, "round": rnd, "kinds": kinds, "tokens": tokens,
                                    "wall_s": wall})
                    rates[label].append(rate)
            med = {k: sorted(v)[len(v) // 2] for k, v in rates.items()}
            ratios = sorted(b_ / a_ for a_, b_ in zip(rates["A"], rates["B"]))
            rows.append((name, med["A"], med["B"], ratios[len(ratios) // 2], ratios[0], ratios[-1]))
        _, metrics = server.get("/metrics")
    finally:
        server.stop()
    with open(os.path.join(work, "runs.json"), "w") as f:
        json.dump(raw, f, indent=1)
    mask = {l.split()[0]: float(l.split()[-1]) for l in metrics.splitlines()
            if l.startswith("tessera_grammar_mask_seconds_") or l.startswith("tessera_grammar_jump_forward")}
    print(f"CPU: {cpu_name()}")
    how = (f"steady state, {args.window:.0f} s windows (generated tokens / window)" if args.window > 0
           else "one wave (all requests' completion tokens / wall)")
    print(f"date: {datetime.date.today()}; model: {os.path.basename(args.model)}; max_tokens {args.max_tokens}; "
          f"{args.rounds} rounds alternating; medians of output tokens/s, {how}; server args: "
          f"{args.server_args or 'none'}")
    print()
    print("| scenario | plain tok/s (A) | constrained tok/s (B) | B / A, median of paired rounds (range) |")
    print("| --- | --- | --- | --- |")
    for name, a, b, r, lo, hi in rows:
        print(f"| {name} | {a:.1f} | {b:.1f} | {r:.3f} ({lo:.3f}-{hi:.3f}) |")
    n = mask.get("tessera_grammar_mask_seconds_count", 0)
    if n:
        print(f"\nmask time over the run: {n:.0f} masks, mean {1e6 * mask['tessera_grammar_mask_seconds_sum'] / n:.0f} us; "
              f"jump-forward tokens {mask.get('tessera_grammar_jump_forward_tokens_total', 0):.0f}")


if __name__ == "__main__":
    main()
