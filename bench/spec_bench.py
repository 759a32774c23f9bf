#!/usr/bin/env python3
"""Speculative decoding, measured: Tessera's n-gram drafts (off / auto / ngram, per request)
against llama-cpp-python's prompt-lookup decoding on the same GGUF file and prompts.

    python spec_bench.py --model models/gemma-3-270m-q4_k_m.gguf --bin-dir build/bin \
        [--reps 3] [--max-tokens 256] [--threads 2] [--out results.md] [--json run.json] [--plot PREFIX]

Run it with a Python that has llama_cpp (llama-cpp-python) to get the llama.cpp columns;
without it only Tessera is measured. Workloads:

  code   a function from Python's standard library (inspect.getsource), to be reproduced with
         one change (a rename): continuations that copy the prompt, greedy. High acceptance.
  story  a free-running story, sampled at temperature 1 (no top-k / top-p / min-p). Low
         acceptance: the gate should switch drafts off.
  mixed  a trace of requests one after another, code first, then stories: acceptance changes
         half way; the gate's acceptance, state and the decode rate are sampled per request.
  batch  16 concurrent requests of each workload (llama-cpp-python serves one at a time: its
         column is the same 16 requests in sequence).
  greedy-story  the stories at temperature 0 (--workloads code,story,greedy-story).

With --draft-layers N the server has the self-draft (the model's first N layers and a head of
--draft-vocab frequent ids plus the context's; N = all layers: the same model with a cheap
draft head) and the mode draft joins off / auto / ngram.

Decode rate = (tokens - 1) / (time of the last token - time of the first), from streamed
tokens, so prefill is not in it. Engines and modes alternate within each repetition; medians
are reported. The CPU is printed with every table.
"""
import argparse
import datetime
import inspect
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

CODE_FUNCS = [  # pure-Python functions (frozen modules such as posixpath have no source)
    ("textwrap", "dedent", "undent"),
    ("difflib", "get_close_matches", "close_matches"),
    ("heapq", "nsmallest", "smallest_n"),
    ("json", "dumps", "to_json"),
    ("fnmatch", "translate", "pattern_to_regex"),
    ("textwrap", "indent", "add_prefix"),
]

STORIES = [
    "Write a long story about a fox who wants to learn to fly.",
    "Tell me a story about two friends who find a map in an old library.",
    "Write a story about a robot who opens a bakery in a small town.",
    "Tell a story about a girl who can talk to the sea.",
    "Write a story about a lighthouse keeper and a lost ship.",
    "Tell a story about a city where it never stops snowing.",
]


def cpu_line():
    model = family = mdl = "?"
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k, v = k.strip(), v.strip()
                if k == "model name" and model == "?":
                    model = v
                elif k == "cpu family" and family == "?":
                    family = v
                elif k == "model" and mdl == "?":
                    mdl = v
                elif k == "flags" and not flags:
                    flags = v
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8") if f in flags.split()]
    return f"{model} (family {family} model {mdl}; {' '.join(isa)}), {os.cpu_count()} cpus"


def code_prompt(mod, fn, new):
    m = __import__(mod)
    src = inspect.getsource(getattr(m, fn))
    return (f"Here is a function from the Python standard library ({mod}.{fn}):\n\n```python\n{src}```\n\n"
            f"Here is the same function, renamed to `{new}`, with the same body:\n\n```python\ndef {new}(")


def story_prompt(text):
    return f"{text}\n\n"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Tessera:
    def __init__(self, bin_dir, model, threads, mode, log, draft_layers=0, draft_vocab=0):
        self.port = free_port()
        cmd = [os.path.join(bin_dir, "tessera"), "serve", "--model", model, "--port", str(self.port), "--threads",
               str(threads), "--speculation", mode, "--max-batch", "16"]
        if draft_layers > 0:
            cmd += ["--spec-draft-layers", str(draft_layers), "--spec-draft-vocab", str(draft_vocab)]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1).read()
                return
            except Exception:
                if self.proc.poll() is not None:
                    raise RuntimeError("tessera serve exited during start-up (see the log)")
                time.sleep(0.2)
        raise RuntimeError("tessera serve did not come up")

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def metrics(self):
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read().decode()
        out = {}
        # Class 0's figures: counters summed over the proposers, gauges per proposer (the n-gram's
        # under the plain name, the self-draft's as NAME:draft).
        for line in text.splitlines():
            if (line.startswith("tessera_spec_") and 'class="0"' in line) or \
                    line.startswith("tessera_generation_tokens_total"):
                name = line.split("{")[0].split(" ")[0]
                value = float(line.rsplit(" ", 1)[1])
                if name.endswith("_total"):
                    out[name] = out.get(name, 0) + value
                elif 'proposer="draft"' in line:
                    out[name + ":draft"] = value
                else:
                    out[name] = value
        return out

    def complete(self, prompt, max_tokens, temperature, mode, seed=None):
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
                "speculation": mode, "top_p": 1.0, "top_k": 0}
        if seed is not None:
            body["seed"] = seed
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        times, text = [], []
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=600) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                piece = chunk["choices"][0].get("text", "") if chunk.get("choices") else ""
                if piece:
                    times.append(time.perf_counter())
                    text.append(piece)
        return result(t0, times, "".join(text))


def result(t0, times, text):
    n = len(times)
    decode = (n - 1) / (times[-1] - times[0]) if n > 1 and times[-1] > times[0] else float("nan")
    return {"chunks": n, "decode_tps": decode, "e2e_s": (times[-1] - t0) if times else float("nan"), "text": text}


class LlamaCpp:
    def __init__(self, model, threads, lookup):
        from llama_cpp import Llama
        kw = {}
        if lookup:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
            kw["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=lookup)
            # Its verification writes a row of scores per drafted position: with logits_all off the
            # score buffer holds one batch only and overflows past position n_batch.
            kw["logits_all"] = True
        self.llm = Llama(model_path=model, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False, **kw)

    def complete(self, prompt, max_tokens, temperature, seed=None):
        times, text = [], []
        t0 = time.perf_counter()
        for chunk in self.llm.create_completion(prompt, max_tokens=max_tokens, temperature=temperature, top_k=0,
                                                top_p=1.0, min_p=0.0, repeat_penalty=1.0, stream=True,
                                                seed=seed if seed is not None else -1):
            piece = chunk["choices"][0]["text"]
            if piece:
                times.append(time.perf_counter())
                text.append(piece)
        return result(t0, times, "".join(text))


def med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--bin-dir", default="build/bin")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=3, help="prompts per workload at batch 1")
    ap.add_argument("--lookup", type=int, default=10, help="llama.cpp prompt-lookup num_pred_tokens")
    ap.add_argument("--batch-reps", type=int, default=2, help="repetitions of the 16-concurrent runs (llama.cpp: 1)")
    ap.add_argument("--no-llama-batch", action="store_true", help="leave llama.cpp out of the 16-concurrent runs")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: batch1,mixed,batch")
    ap.add_argument("--draft-layers", type=int, default=0,
                    help="> 0: serve with the self-draft over this many layers and add the mode draft")
    ap.add_argument("--draft-vocab", type=int, default=16384, help="the self-draft head's fixed rows")
    ap.add_argument("--modes", default="", help="Tessera modes to run (default: off,auto,ngram and draft with --draft-layers)")
    ap.add_argument("--workloads", default="code,story", help="batch-1 and batch workloads: code,story,greedy-story")
    ap.add_argument("--out", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--plot", default="", help="PREFIX: PREFIX-mixed.png (acceptance, state, rate over the trace)")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))

    cpu = cpu_line()
    lines = [f"cpu: {cpu}", f"date: {datetime.datetime.now().isoformat(timespec='seconds')}",
             f"command: {' '.join(sys.argv)}", f"model: {a.model}, max_tokens {a.max_tokens}, threads {a.threads}"]
    print("\n".join(lines), flush=True)
    log_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "work", "spec-bench")
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, f"spec_bench_server_{os.getpid()}.log")
    log = open(log_path, "w")
    print(f"server log: {log_path} (the gate's switches are logged there)")
    server = Tessera(a.bin_dir, a.model, a.threads, "auto", log, a.draft_layers, a.draft_vocab)
    llamas = {}
    try:
        import llama_cpp  # noqa: F401
        llamas = {"llama.cpp": LlamaCpp(a.model, a.threads, 0), "llama.cpp lookup": LlamaCpp(a.model, a.threads, a.lookup)}
    except ImportError:
        print("(no llama_cpp in this Python: Tessera only)")
    report = {"cpu": cpu, "args": vars(a), "batch1": {}, "mixed": [], "batch": {}}
    try:
        code = [code_prompt(*f) for f in CODE_FUNCS]
        stories = [story_prompt(s) for s in STORIES]
        workloads = {"code": (code[:a.prompts], 0.0), "story": (stories[:a.prompts], 1.0),
                     "greedy-story": (stories[:a.prompts], 0.0)}
        workloads = {k: v for k, v in workloads.items() if k in a.workloads.split(",")}
        modes = ["off", "auto", "ngram"] + (["draft"] if a.draft_layers > 0 else [])
        if a.modes:
            modes = a.modes.split(",")
        if "batch1" not in skip:
            for wname, (prompts, temp) in workloads.items():
                rows = {m: [] for m in modes + list(llamas)}
                acc = {}
                for rep in range(a.reps):
                    for i, p in enumerate(prompts):
                        seed = 1000 * rep + i
                        for m in modes:
                            before = server.metrics()
                            r = server.complete(p, a.max_tokens, temp, m, seed)
                            after = server.metrics()
                            rows[m].append(r["decode_tps"])
                            prop = after.get("tessera_spec_proposed_tokens_total", 0) - before.get(
                                "tessera_spec_proposed_tokens_total", 0)
                            kept = after.get("tessera_spec_accepted_tokens_total", 0) - before.get(
                                "tessera_spec_accepted_tokens_total", 0)
                            acc.setdefault(m, [0, 0])
                            acc[m][0] += prop
                            acc[m][1] += kept
                        for name, llm in llamas.items():
                            rows[name].append(llm.complete(p, a.max_tokens, temp, seed)["decode_tps"])
                        print(f"  {wname} rep {rep} prompt {i}: " +
                              ", ".join(f"{k} {v[-1]:.1f}" for k, v in rows.items()), flush=True)
                report["batch1"][wname] = {"rates": rows, "drafts": acc}
        if "mixed" not in skip:
            # The gate's view over a trace: code requests, then stories (auto), sampled per request.
            trace = [(p, 0.0, "code") for p in code] + [(p, 1.0, "story") for p in stories]
            t_start = time.perf_counter()
            # /metrics sampled every 0.2 s while the trace runs: the gate over time.
            sampling = {"on": True}
            def sampler():
                while sampling["on"]:
                    try:
                        m = server.metrics()
                        report.setdefault("timeline", []).append({"t": time.perf_counter() - t_start, **m})
                    except Exception:
                        pass
                    time.sleep(0.2)
            sampler_thread = threading.Thread(target=sampler, daemon=True)
            sampler_thread.start()
            for mode in ("auto", "off"):
                for i, (p, temp, kind) in enumerate(trace):
                    before = server.metrics()
                    t_req = time.perf_counter() - t_start
                    r = server.complete(p, a.max_tokens, temp, mode, 77 + i)
                    m = server.metrics()
                    report["mixed"].append({
                        "mode": mode, "i": i, "kind": kind, "t0": t_req, "t": time.perf_counter() - t_start,
                        "decode_tps": r["decode_tps"], "acceptance": m.get("tessera_spec_acceptance", 0),
                        "enabled": m.get("tessera_spec_enabled", 0),
                        "proposed": m.get("tessera_spec_proposed_tokens_total", 0) -
                                    before.get("tessera_spec_proposed_tokens_total", 0),
                        "kept": m.get("tessera_spec_accepted_tokens_total", 0) -
                                before.get("tessera_spec_accepted_tokens_total", 0)})
                    e = report["mixed"][-1]
                    print(f"  mixed {mode} {i} {kind}: {e['decode_tps']:.1f} tok/s, acceptance {e['acceptance']:.2f}, "
                          f"gate {'on' if e['enabled'] else 'off'}, drafts {e['proposed']:.0f}/{e['kept']:.0f}",
                          flush=True)
            sampling["on"] = False
            sampler_thread.join()
        if "batch" not in skip:
            for wname, (prompts, temp) in workloads.items():
                batch_prompts = [workloads[wname][0][i % len(workloads[wname][0])] for i in range(16)]
                out = {}
                for rep in range(a.batch_reps):
                    for m in modes:
                        res = [None] * 16
                        def go(j):
                            res[j] = server.complete(batch_prompts[j], a.max_tokens, temp, m, 500 + j)
                        th = [threading.Thread(target=go, args=(j,)) for j in range(16)]
                        t0 = time.perf_counter()
                        for t in th:
                            t.start()
                        for t in th:
                            t.join()
                        wall = time.perf_counter() - t0
                        out.setdefault(m, []).append(sum(x["chunks"] for x in res) / wall)
                    for name, llm in llamas.items() if rep == 0 and not a.no_llama_batch else []:
                        t0 = time.perf_counter()
                        n = sum(llm.complete(p, a.max_tokens, temp, 500 + j)["chunks"] for j, p in enumerate(batch_prompts))
                        out.setdefault(name + " (sequential)", []).append(n / (time.perf_counter() - t0))
                    print(f"  batch16 {wname} rep {rep}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in out.items()),
                          flush=True)
                report["batch"][wname] = out
    finally:
        server.close()

    md = ["```", *lines, "```", ""]
    for wname, d in report["batch1"].items():
        rows = d["rates"]
        md.append(f"#### Batch 1, {wname} (decode tok/s, median of {len(rows['off'])} requests)")
        md.append("")
        md.append("| engine / mode | tok/s | vs Tessera off | drafts proposed / kept |")
        md.append("|---|---|---|---|")
        off = med(rows["off"])
        for k, v in rows.items():
            dr = d["drafts"].get(k)
            dtext = f"{dr[0]:.0f} / {dr[1]:.0f} ({100 * dr[1] / dr[0]:.0f}%)" if dr and dr[0] else ("-" if k in d["drafts"] else "")
            md.append(f"| {k} | {med(v):.1f} | {med(v) / off:.2f} | {dtext} |")
        md.append("")
    for wname, d in report["batch"].items():
        md.append(f"#### 16 concurrent, {wname} (output tok/s over the batch's wall time, median of {a.batch_reps}"
                  + ("" if a.no_llama_batch or not llamas else "; llama.cpp: one run") + ")")
        md.append("")
        md.append("| engine / mode | tok/s | vs Tessera off |")
        md.append("|---|---|---|")
        off = med(d["off"])
        for k, v in d.items():
            md.append(f"| {k} | {med(v):.1f} | {med(v) / off:.2f} |")
        md.append("")
    if report["mixed"]:
        md.append("#### Mixed trace (code requests, then stories), per request")
        md.append("")
        md.append("| mode | # | kind | decode tok/s | gate acceptance | gate | drafts proposed / kept |")
        md.append("|---|---|---|---|---|---|---|")
        for e in report["mixed"]:
            md.append(f"| {e['mode']} | {e['i']} | {e['kind']} | {e['decode_tps']:.1f} | {e['acceptance']:.2f} | "
                      f"{'on' if e['enabled'] else 'off'} | {e['proposed']:.0f} / {e['kept']:.0f} |")
        md.append("")
    text = "\n".join(md)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    if a.plot and report["mixed"]:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("(no matplotlib: no plot)")
            return
        tl = report.get("timeline", [])
        if tl:
            # Over time: tok/s from the generated-token counter, the gate's acceptance and state;
            # the trace runs once with auto, then once with off (the boundaries marked).
            fig, ax = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
            ts = [x["t"] for x in tl]
            rate = [float("nan")] + [
                (b.get("tessera_generation_tokens_total", 0) - a_.get("tessera_generation_tokens_total", 0)) /
                max(1e-9, b["t"] - a_["t"]) for a_, b in zip(tl, tl[1:])]
            ax[0].plot(ts, rate, lw=0.8)
            ax[1].plot(ts, [x.get("tessera_spec_acceptance", 0) for x in tl], lw=0.8)
            ax[2].step(ts, [x.get("tessera_spec_enabled", 0) for x in tl], where="post", lw=0.8)
            for e in report["mixed"]:
                if e["i"] == 0 or e["i"] == len(CODE_FUNCS):
                    for x in ax:
                        x.axvline(e["t0"], color="grey", lw=0.5, ls=":")
            first_off = next((e for e in report["mixed"] if e["mode"] == "off"), None)
            for x in ax:
                if first_off:
                    x.axvspan(first_off["t0"], ts[-1], color="0.93")
            ax[0].set_ylabel("tokens/s")
            ax[1].set_ylabel("acceptance (gate)")
            ax[2].set_ylabel("gate on")
            ax[2].set_xlabel("seconds (white: the trace with auto: code, then stories; grey: the same trace with off)")
            fig.suptitle(f"Speculation gate over a mixed trace, /metrics every 0.2 s\n{cpu}", fontsize=9)
            fig.tight_layout()
            fig.savefig(a.plot + "-timeline.png", dpi=110)
        fig, ax = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
        for mode, style in (("auto", "o-"), ("off", "s--")):
            es = [e for e in report["mixed"] if e["mode"] == mode]
            xs = [e["i"] for e in es]
            ax[0].plot(xs, [e["decode_tps"] for e in es], style, label=f"tessera {mode}")
            if mode == "auto":
                ax[1].plot(xs, [e["acceptance"] for e in es], style, label="acceptance (gate, decayed)")
                ax[1].plot(xs, [e["kept"] / e["proposed"] if e["proposed"] else float("nan") for e in es], "x",
                           label="kept / proposed in the request")
                ax[2].step(xs, [e["enabled"] for e in es], where="mid", label="gate on")
        n_code = len(CODE_FUNCS)
        for x in ax:
            x.axvline(n_code - 0.5, color="grey", lw=0.8)
            x.legend(fontsize=8)
        ax[0].set_ylabel("decode tok/s")
        ax[1].set_ylabel("acceptance")
        ax[2].set_ylabel("state")
        ax[2].set_xlabel(f"request (0..{n_code - 1} code, then stories at temperature 1)")
        fig.suptitle(f"Speculation gate over a mixed trace\n{cpu}", fontsize=9)
        fig.tight_layout()
        fig.savefig(a.plot + "-mixed.png", dpi=110)


if __name__ == "__main__":
    main()
