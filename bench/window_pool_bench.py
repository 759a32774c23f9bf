#!/usr/bin/env python3
"""The window pool on a real sliding-window model (Gemma 3): `tessera serve` with
--kv-window-pool on and off, alternating, on the same long prompts.

Per setting it reports the KV plan the coordinator logs (blocks of the full layers, the window
pool, tokens of context the plan holds), the greedy tokens of each prompt (which must be equal),
the time of the request, and the shard process's peak resident memory (VmHWM). Prompts are the
Python standard library's own sources (text written by people), cut to --tokens tokens.

Example:
  bench/window_pool_bench.py --model models/gemma-3-270m-q4_k_m.gguf --tokens 2000,8000 \
      --out bench/results/gemma3_window_pool.md
"""
import argparse
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        name = re.search(r"model name\s*:\s*(.*)", info).group(1)
        fam = re.search(r"cpu family\s*:\s*(\d+)", info).group(1)
        model = re.search(r"model\s*:\s*(\d+)", info).group(1)
        return f"{name} (family {fam}, model {model}), {os.cpu_count()} cores"
    except (OSError, AttributeError):
        return platform.processor() or "unknown CPU"


def children(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    kids = [int(x) for x in out.split()]
    return kids + [g for k in kids for g in children(k)]


def vm_hwm_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Serve:
    def __init__(self, bin_dir, model, pool, threads, extra):
        cmd = [os.path.join(bin_dir, "tessera"), "serve", "--model", model, "--port", "0", "--model-name", "m",
               "--kv-window-pool", pool, *extra]
        if threads:
            cmd += ["--threads", str(threads)]
        env = dict(os.environ, TESSERA_LOG_LEVEL="info")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, env=env)
        self.log = []
        self.base = None
        for line in self.proc.stdout:
            self.log.append(line)
            m = re.search(r"listening on (http://[\d.]+:\d+)", line)
            if m:
                self.base = m.group(1)
                break
        if self.base is None:
            self.close()
            raise RuntimeError("tessera serve did not start:\n" + "".join(self.log))
        threading.Thread(target=lambda: [self.log.append(l) for l in self.proc.stdout], daemon=True).start()

    def plan(self):
        text = "".join(self.log)
        m = re.search(r"KV cache plan: (\d+) blocks of (\d+) tokens (?:of \w+ )?\(([\d.]+) MiB per shard", text)
        w = re.search(r"KV window pool: (\d+) blocks .*?\(([\d.]+) MiB per shard", text)
        return {"blocks": int(m.group(1)), "block": int(m.group(2)), "mib": float(m.group(3)),
                "window_blocks": int(w.group(1)) if w else 0}

    def tokenize(self, text):
        return self.post("/tokenize", {"model": "m", "prompt": text})["tokens"]

    def post(self, path, body):
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=1200) as r:
            return json.loads(r.read())

    def complete(self, ids, n):
        t = time.time()
        r = self.post("/v1/completions", {"model": "m", "prompt": ids, "max_tokens": n, "temperature": 0,
                                          "ignore_eos": True, "logprobs": 0})
        return r["choices"][0]["logprobs"]["tokens"], time.time() - t

    def shard_hwm_mb(self):
        return max([vm_hwm_kb(p) for p in children(self.proc.pid)] + [0]) / 1024

    def close(self):
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
            self.proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)


def source_text():
    import difflib
    import inspect
    import textwrap
    import argparse as ap
    return "".join(open(m.__file__).read() for m in (textwrap, difflib, inspect, ap))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--tokens", default="2000,8000", help="prompt lengths (tokens), comma-separated")
    p.add_argument("--gen", type=int, default=16)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1, help="on/off pairs, alternating")
    p.add_argument("--extra", default="", help="more `tessera serve` arguments (space-separated)")
    p.add_argument("--out", help="append the table to this Markdown file")
    a = p.parse_args()
    lengths = [int(x) for x in a.tokens.split(",")]
    text = source_text()
    rows, outputs = [], {}
    for rnd in range(a.rounds):
        for pool in ("on", "off"):
            s = Serve(a.bin_dir, a.model, pool, a.threads, a.extra.split())
            try:
                ids = s.tokenize(text)
                plan = s.plan()
                for n in lengths:
                    if n > len(ids):
                        sys.exit(f"the text has only {len(ids)} tokens, fewer than {n}")
                    try:
                        toks, secs = s.complete(ids[:n], a.gen)
                    except urllib.error.HTTPError as e:
                        why = json.loads(e.read()).get("error", {}).get("message", str(e))
                        rows.append((rnd, pool, n, plan, None, s.shard_hwm_mb(), "refused: " + why))
                        continue
                    outputs.setdefault(n, {}).setdefault(pool, toks)
                    rows.append((rnd, pool, n, plan, secs, s.shard_hwm_mb(),
                                 "yes" if toks == outputs[n].get("on", toks) else "NO"))
            finally:
                s.close()
    same = all(v.get("on") == v.get("off") for v in outputs.values() if "off" in v and "on" in v)
    lines = [f"CPU: {cpu_name()}", f"Date: {datetime.date.today().isoformat()}",
             "Command: " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]), "",
             "| window pool | prompt tokens | full-layer blocks | window-pool blocks | planned KV MiB | "
             "context tokens planned | request s | shard peak RSS MiB | tokens equal to 'on' |",
             "|---|---|---|---|---|---|---|---|---|"]
    for rnd, pool, n, plan, secs, hwm, eq in rows:
        took = f"{secs:.2f}" if secs is not None else "-"
        lines.append(f"| {pool} | {n} | {plan['blocks']} | {plan['window_blocks']} | {plan['mib']:.0f} | "
                     f"{plan['blocks'] * plan['block']} | {took} | {hwm:.0f} | {eq} |")
    lines.append("")
    lines.append(f"Greedy tokens with and without the window pool: {'identical' if same else 'DIFFERENT'} "
                 f"({a.gen} tokens after each prompt).")
    report = "\n".join(lines)
    print(report)
    if a.out:
        with open(a.out, "a") as f:
            f.write(report + "\n\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
