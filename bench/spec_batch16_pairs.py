#!/usr/bin/env python3
"""16 concurrent requests with speculation off and auto, paired: each repetition runs the batch
once per mode on the same server, so a change of machine load hits both; the ratio per
repetition and how many drafts auto proposed and kept (from /metrics) are printed.

    python bench/spec_batch16_pairs.py --model models/gemma-3-270m-q4_k_m.gguf --bin-dir build/bin \
        [--reps 5] [--workloads story,code] [--json out.json]

Workloads and sampling are spec_bench.py's: stories at temperature 1 (low acceptance), code
from the standard library to be reproduced (greedy, high acceptance). Throughput = streamed
tokens of the 16 requests / the batch's wall time.
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec_bench as sb  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--bin-dir", default="build/bin")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--workloads", default="story,code")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    print("cpu:", sb.cpu_line(), flush=True)
    log_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "work", "spec-batch16-pairs")
    os.makedirs(log_dir, exist_ok=True)
    log = open(os.path.join(log_dir, f"spec_batch16_server_{os.getpid()}.log"), "w")
    srv = sb.Tessera(a.bin_dir, a.model, a.threads, "auto", log)
    workloads = {"story": ([sb.story_prompt(s) for s in sb.STORIES][:3], 1.0),
                 "code": ([sb.code_prompt(*f) for f in sb.CODE_FUNCS][:3], 0.0)}

    def batch(prompts, temp, mode):
        res = [None] * 16

        def go(j):
            res[j] = srv.complete(prompts[j % len(prompts)], a.max_tokens, temp, mode, 500 + j)

        th = [threading.Thread(target=go, args=(j,)) for j in range(16)]
        before = srv.metrics()
        t0 = time.perf_counter()
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.perf_counter() - t0
        after = srv.metrics()
        d = {k: after.get(k, 0) - before.get(k, 0) for k in after if k.endswith("_total")}
        return {"tps": sum(x["chunks"] for x in res) / wall, "tokens": d.get("tessera_generation_tokens_total", 0),
                "proposed": d.get("tessera_spec_proposed_tokens_total", 0),
                "kept": d.get("tessera_spec_accepted_tokens_total", 0)}

    out = {}
    try:
        for wname in a.workloads.split(","):
            prompts, temp = workloads[wname]
            for rep in range(a.reps):
                row = {m: batch(prompts, temp, m) for m in ("off", "auto")}
                out.setdefault(wname, []).append(row)
                print(wname, rep, json.dumps(row), "ratio %.3f" % (row["auto"]["tps"] / row["off"]["tps"]), flush=True)
            r = [x["auto"]["tps"] / x["off"]["tps"] for x in out[wname]]
            print(wname, "median ratio %.3f" % statistics.median(r), "range %.3f-%.3f" % (min(r), max(r)), flush=True)
    finally:
        srv.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": sb.cpu_line(), "args": vars(a), "pairs": out}, f, indent=1)


if __name__ == "__main__":
    main()
