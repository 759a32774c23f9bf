#!/usr/bin/env python3
"""Tessera vs llama.cpp on the same GGUF files, side by side, in one run.

For every model file: prompt processing (--prompt tokens in one batch) and generation
(--gen tokens decoded one at a time from position --depth, default 0, the context prefilled
untimed; greedy) tokens/s at each thread count,
for Tessera (build/bin/tessera-bench-cpu, which also reports concurrent-sequence throughput
and the fraction of the measured read bandwidth that batch-1 generation reaches) and for
llama.cpp (through PyPI's llama-cpp-python, low-level API, same tokens and thread counts).
The two engines alternate per model, so a change of machine load hits both.

llama-cpp-python is built from source into bench/.venv-llama on first use (several minutes
on two cores); nothing of it is committed. Use --python to point at another interpreter that
has it.

Examples:
  bench/llama_cpp_compare.py --models models/syn-110m-q4_0.gguf --threads 1,2
  bench/llama_cpp_compare.py --models models/*.gguf --out bench/results/cpu_vs_llama_cpp.md
  bench/llama_cpp_compare.py --greedy models/syn-110m-q8_0.gguf --tokens 64
"""
import argparse
import datetime
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENV = os.path.join(HERE, ".venv-llama")
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"


# ----------------------------------------------------------------------------- environment

def venv_python():
    return os.path.join(VENV, "bin", "python")


def ensure_llama_python(explicit):
    """Returns an interpreter that can import llama_cpp, building the venv if needed."""
    if explicit:
        return explicit
    try:
        import llama_cpp  # noqa: F401
        return sys.executable
    except ImportError:
        pass
    py = venv_python()
    if os.path.exists(py) and subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return py
    print(f"building {LLAMA_CPP_PYTHON} into {VENV} (several minutes) ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    env = dict(os.environ)
    # The native build (-march=native) is llama.cpp's fastest CPU configuration here.
    env.setdefault("CMAKE_ARGS", "-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF")
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    subprocess.run([py, "-m", "pip", "install", "--no-cache-dir", LLAMA_CPP_PYTHON], check=True, env=env)
    return py


# ----------------------------------------------------------------------------- llama.cpp side
# Runs inside the interpreter that has llama_cpp (this same file, --llama-worker).

_LOG_CB = None


class Llama:
    def __init__(self, path, threads, n_ctx, f32_kv=False, fa=None):
        import llama_cpp as L
        import numpy as np
        self.L, self.np = L, np
        L.llama_backend_init()
        # Keep the ctypes callback alive as long as the library may call it.
        global _LOG_CB
        _LOG_CB = L.llama_log_callback(lambda level, text, data: None)
        L.llama_log_set(_LOG_CB, None)
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = 512
        cp.n_ubatch = 512
        cp.n_threads = threads
        cp.n_threads_batch = threads
        if fa is not None:
            cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if fa == "on" else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        if f32_kv:
            # Tessera keeps K/V in fp32 and attends in fp32; llama.cpp's defaults (flash
            # attention with an fp16 cache) round K, V and Q to fp16, which is enough to flip
            # near-tied greedy choices of a random-weight model. Its plain fp32 path is the one
            # to compare numerics with.
            cp.flash_attn_type = 0
            cp.type_k = L.GGML_TYPE_F32
            cp.type_v = L.GGML_TYPE_F32
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))

    def clear(self):
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def decode(self, ids):
        L = self.L
        for i in range(0, len(ids), 512):
            chunk = ids[i:i + 512]
            arr = (L.llama_token * len(chunk))(*chunk)
            rc = L.llama_decode(self.ctx, L.llama_batch_get_one(arr, len(chunk)))
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")

    def argmax(self):
        ptr = self.L.llama_get_logits_ith(self.ctx, -1)
        return int(self.np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    def greedy(self, prompt, n):
        """n greedy tokens, with each one's log-probability and the gap between the top two logits."""
        np = self.np
        self.clear()
        self.decode(prompt)
        out, logprobs, gaps = [], [], []
        for _ in range(n):
            ptr = self.L.llama_get_logits_ith(self.ctx, -1)
            logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float64)
            t = int(logits.argmax())
            top2 = np.partition(logits, -2)[-2:]
            m = logits[t]
            out.append(t)
            logprobs.append(float(-np.log(np.exp(logits - m).sum())))
            gaps.append(float(top2.max() - top2.min()))
            self.decode([t])
        return out, logprobs, gaps


def llama_worker(args):
    results = {"runs": []}
    for nt in args.threads:
        m = Llama(args.model, nt, n_ctx=max(args.prompt, args.depth + args.gen) + 64, fa=args.fa)
        vocab = m.n_vocab
        prompt = [(i * 7919 + 13) % vocab for i in range(args.prompt)]
        m.clear()
        m.decode(prompt[:64])  # warm-up
        pp = []
        for _ in range(args.reps):
            m.clear()
            t0 = time.perf_counter()
            m.decode(prompt)
            pp.append(time.perf_counter() - t0)
        tg = []
        for _ in range(args.reps):
            m.clear()
            if args.depth:  # context in the cache first, untimed (as tessera-bench-cpu --depth)
                m.decode([(i * 7919 + 13) % vocab for i in range(args.depth)])
            tok = 1
            t0 = time.perf_counter()
            for _ in range(args.gen):
                m.decode([tok])
                tok = m.argmax()
            tg.append(time.perf_counter() - t0)
        results["runs"].append({"threads": nt, "prompt_tok_s": args.prompt / statistics.median(pp),
                                "gen_tok_s": args.gen / statistics.median(tg)})
    if args.greedy_tokens:
        m = Llama(args.model, args.threads[-1], n_ctx=len(args.greedy_prompt) + args.greedy_tokens + 16, f32_kv=True)
        results["greedy"], results["greedy_logprobs"], results["greedy_gaps"] = m.greedy(args.greedy_prompt,
                                                                                          args.greedy_tokens)
    json.dump(results, sys.stdout)


def run_llama(py, model, threads, prompt, gen, reps, greedy_prompt=None, greedy_tokens=0, fa=None, depth=0):
    cmd = [py, os.path.abspath(__file__), "--llama-worker", "--model", model, "--threads",
           ",".join(map(str, threads)), "--prompt", str(prompt), "--gen", str(gen), "--reps", str(reps),
           "--depth", str(depth)]
    if fa is not None:
        cmd += ["--fa", fa]
    if greedy_tokens:
        cmd += ["--greedy-prompt", ",".join(map(str, greedy_prompt)), "--greedy-tokens", str(greedy_tokens)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


# ----------------------------------------------------------------------------- Tessera side

def merge_runs(runs):
    """Median of every numeric figure over repetitions (nested dicts too)."""
    out = {}
    for key, v in runs[0].items():
        vals = [r[key] for r in runs if key in r]
        if isinstance(v, dict):
            out[key] = {k: statistics.median([x[k] for x in vals if k in x]) for k in v}
        elif isinstance(v, (int, float)):
            med = statistics.median(vals)
            out[key] = int(med) if isinstance(v, int) and med == int(med) else med
        else:
            out[key] = v
    return out


def run_tessera(bin_dir, model, threads, prompt, gen, reps, batches, batch_gen, bandwidth=True, isa=None, depth=0,
                kv_dtype=None):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [os.path.join(bin_dir, "tessera-bench-cpu"), "--model", model, "--threads", ",".join(map(str, threads)),
           "--prompt", str(prompt), "--gen", str(gen), "--reps", str(reps), "--batches", batches,
           "--batch-gen", str(batch_gen), "--json", path] + ([] if bandwidth else ["--no-bandwidth"]) + \
          (["--isa", isa] if isa else []) + (["--depth", str(depth)] if depth else []) + \
          (["--kv-dtype", kv_dtype] if kv_dtype else [])
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    with open(path) as f:
        data = json.load(f)
    os.unlink(path)
    return data


def tessera_greedy(bin_dir, model, prompt, n, threads):
    cmd = [os.path.join(bin_dir, "tessera"), "generate", "--model", model, "--prompt-ids", ",".join(map(str, prompt)),
           "--max-tokens", str(n), "--temperature", "0", "--print-ids", "--ignore-eos", "--threads", str(threads),
           "--matmul-precision", "fp32"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()
    return [int(t) for t in out[-1].split(",") if t]


class TesseraServer:
    """One `tessera serve` process for teacher-forced scoring (close() stops it)."""

    def __init__(self, bin_dir, model, threads):
        # fp32 matmuls, as llama.cpp's CPU backend computes them (`auto` would take bf16 dot products
        # for 16-bit weights on CPUs with AVX512_BF16).
        cmd = [os.path.join(bin_dir, "tessera"), "serve", "--model", model, "--port", "0", "--model-name", "m",
               "--threads", str(threads), "--matmul-precision", "fp32"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.base, log = None, []
        for line in self.proc.stdout:
            log.append(line)
            m = re.search(r"listening on (http://[\d.]+:\d+)", line)
            if m:
                self.base = m.group(1)
                break
        if self.base is None:
            self.close()
            raise RuntimeError("tessera serve did not start:\n" + "".join(log))

    def logprobs(self, ids):
        """Log-probabilities of ids[1:] given their prefixes: one prefill (echo with logprobs and
        max_tokens 0), Tessera's teacher-forced scores of a token sequence."""
        import urllib.request
        body = json.dumps({"model": "m", "prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0}).encode()
        req = urllib.request.Request(self.base + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            lps = json.loads(r.read())["choices"][0]["logprobs"]["token_logprobs"]
        if len(lps) != len(ids):
            raise RuntimeError(f"echo returned {len(lps)} logprobs for {len(ids)} tokens")
        return lps[1:]

    def close(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait()


def tessera_prompt_logprobs(bin_dir, model, ids, threads):
    """Tessera's teacher-forced scores of ids[1:], from a server started for this one call."""
    server = TesseraServer(bin_dir, model, threads)
    try:
        return server.logprobs(ids)
    finally:
        server.close()


def greedy_compare(bin_dir, py, model, n, threads=2, prompt=(1, 450, 4086, 29871, 13, 3421, 338, 263)):
    """Greedy tokens of both engines, and how far apart their scores are along llama.cpp's sequence:
    Tessera's teacher-forced log-probability of each llama.cpp token against llama.cpp's own."""
    r = run_llama(py, model, [threads], 1, 1, 1, list(prompt), n)
    llama, llama_lps, gaps = r["greedy"], r["greedy_logprobs"], r["greedy_gaps"]
    mine = tessera_greedy(bin_dir, model, list(prompt), n, threads)
    same = 0
    while same < min(len(llama), len(mine)) and llama[same] == mine[same]:
        same += 1
    forced = tessera_prompt_logprobs(bin_dir, model, list(prompt) + llama, threads)[len(prompt) - 1:]
    diffs = [abs(a - b) for a, b in zip(forced, llama_lps)]
    return {"model": model, "tokens": n, "first_divergence": None if same == n else same,
            "agree": sum(a == b for a, b in zip(llama, mine)), "tessera": mine, "llama_cpp": llama,
            "logprob_diff_median": statistics.median(diffs), "logprob_diff_max": max(diffs),
            "min_top2_gap": min(gaps),
            "gap_at_divergence": None if same == n else gaps[same]}


# ----------------------------------------------------------------------------- report

def cpu_identity():
    """Model name, vendor, family / model and the SIMD flags that pick kernels, from /proc/cpuinfo."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                k, _, v = line.partition(":")
                fields[k.strip()] = v.strip()
    except OSError:
        pass
    flags = fields.get("flags", "").split()
    keep = [x for x in flags if x in ("avx2", "fma", "f16c", "avx_vnni") or x.startswith(("avx512", "amx"))]
    return (f"{fields.get('model name', 'unknown CPU')} ({fields.get('vendor_id', '?')} family "
            f"{fields.get('cpu family', '?')} model {fields.get('model', '?')}; {' '.join(keep) or 'no AVX2'})")


def machine_note():
    load = os.getloadavg()
    return (f"{cpu_identity()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; "
            f"load average at start {load[0]:.1f}")


def fmt(v, nd=1):
    return "-" if v is None else f"{v:.{nd}f}"


def write_report(rows, greedy, args, load_end):
    lines = []
    lines.append("# Tessera vs llama.cpp on the CPU, same GGUF files\n")
    lines.append(f"Date: {datetime.date.today().isoformat()}. Machine: {machine_note()}, "
                 f"at end {load_end:.1f}.\n")
    lines.append(f"Command: `bench/llama_cpp_compare.py {' '.join(sys.argv[1:])}`\n")
    kv = f" Tessera's KV cache: {args.kv_dtype}." if args.kv_dtype else ""
    lines.append(f"Prompt processing: {args.prompt} tokens in one batch; generation: {args.gen} tokens one at a "
                 f"time from position {args.depth} (greedy{'; the context prefilled untimed' if args.depth else ''});{kv} medians of {args.reps} runs (each after a warm-up), the "
                 f"engines alternating run by run. llama.cpp is "
                 f"{LLAMA_CPP_PYTHON} from the interpreter given ({args.python or 'bench/.venv-llama, built natively'}) "
                 f"with its default CPU settings except flash attention.\n")
    lines.append(f"CPU: {cpu_identity()}. Tessera's kernels: {rows[0]['tessera'].get('cpu', '?') if rows else '?'}.\n")
    lines.append("llama.cpp runs with flash attention off and on (alternating with Tessera); the ratios are "
                 "against its better of the two.\n")
    lines.append("| model | threads | Tessera prompt tok/s | llama.cpp prompt tok/s (FA off / on) | ratio | "
                 "Tessera gen tok/s | llama.cpp gen tok/s (FA off / on) | ratio |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        for i, t in enumerate(r["tessera"]["runs"]):
            off, on = r["llama_off"]["runs"][i], r["llama_on"]["runs"][i]
            best_p = max(off["prompt_tok_s"], on["prompt_tok_s"])
            best_g = max(off["gen_tok_s"], on["gen_tok_s"])
            pr = t.get("prompt_tok_s") / best_p if t.get("prompt_tok_s") else None
            gr = t["gen_tok_s"] / best_g
            lines.append(f"| {os.path.basename(r['model'])} | {t['threads']} | {fmt(t.get('prompt_tok_s'))} | "
                         f"{fmt(off['prompt_tok_s'])} / {fmt(on['prompt_tok_s'])} | {fmt(pr, 2)} | "
                         f"{fmt(t['gen_tok_s'])} | {fmt(off['gen_tok_s'])} / {fmt(on['gen_tok_s'])} | {fmt(gr, 2)} |")
    lines.append("\nTessera, concurrent sequences (aggregate generation tok/s, one token per sequence per step) "
                 f"and memory bandwidth (CPU: {cpu_identity()}):\n")
    lines.append("| model | threads | x1 | x4 | x16 | x16 / x1 | weights MB/token | read GB/s (measured) | "
                 "batch-1 share of bandwidth |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for t in r["tessera"]["runs"]:
            c = t.get("concurrent_tok_s", {})
            x1, x4, x16 = c.get("1"), c.get("4"), c.get("16")
            ratio = x16 / x1 if x1 and x16 else None
            lines.append(f"| {os.path.basename(r['model'])} | {t['threads']} | {fmt(x1)} | {fmt(x4)} | {fmt(x16)} | "
                         f"{fmt(ratio, 2)} | {t['weight_bytes_per_token'] / 1e6:.0f} | "
                         f"{fmt(t.get('read_bandwidth_gb_s'))} | "
                         f"{fmt(100 * t['bandwidth_fraction'] if 'bandwidth_fraction' in t else None, 0)}% |")
    if greedy:
        lines.append(f"\nGreedy tokens, Tessera vs llama.cpp (CPU: {cpu_identity()}):\n")
        lines.append("| model | tokens | identical | first divergence | llama.cpp top-2 gap there | "
                     "teacher-forced |d logprob| median / max |")
        lines.append("|---|---|---|---|---|---|")
        for g in greedy:
            div = "none" if g["first_divergence"] is None else str(g["first_divergence"])
            gap = "-" if g["gap_at_divergence"] is None else f"{g['gap_at_divergence']:.3g}"
            lines.append(f"| {os.path.basename(g['model'])} | {g['tokens']} | {g['agree']} | {div} | {gap} | "
                         f"{g['logprob_diff_median']:.1e} / {g['logprob_diff_max']:.1e} |")
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=[])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--batch-gen", type=int, default=64)
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--python", default=None, help="interpreter with llama_cpp (default: bench/.venv-llama)")
    ap.add_argument("--out", default=None, help="markdown report path")
    ap.add_argument("--greedy", nargs="*", default=[], help="models to compare greedy tokens on")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--isa", default=None, help="cap Tessera's kernels: avx2 or avx512 (tessera-bench-cpu --isa)")
    ap.add_argument("--depth", type=int, default=0,
                    help="context tokens in the cache before generation is timed (decode attention at that depth)")
    ap.add_argument("--kv-dtype", default=None, help="Tessera's KV cache elements: fp32 or fp16 (llama.cpp: its "
                                                     "default fp16 cache)")
    # worker mode (internal)
    ap.add_argument("--llama-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--greedy-prompt", default="", help=argparse.SUPPRESS)
    ap.add_argument("--greedy-tokens", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--fa", choices=["off", "on"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_worker:
        args.threads = [int(t) for t in args.threads.split(",")]
        args.greedy_prompt = [int(t) for t in args.greedy_prompt.split(",") if t]
        return llama_worker(args)

    threads = [int(t) for t in args.threads.split(",")]
    py = ensure_llama_python(args.python)
    rows = []
    for m in args.models:
        print(f"== {m}", file=sys.stderr)
        # Repetitions alternate between the engines (one run each, per thread count), so that
        # the load of a shared machine, which changes over minutes, weighs on both alike; the
        # medians over repetitions are reported.
        tess_reps, llama_reps = [], {"off": [], "on": []}
        tess_cpu = "?"
        for rep in range(args.reps):
            for nt in threads:
                data = run_tessera(args.bin_dir, m, [nt], args.prompt, args.gen, 1, args.batches, args.batch_gen,
                                   bandwidth=(rep == 0), isa=args.isa, depth=args.depth, kv_dtype=args.kv_dtype)
                tess_cpu = data.get("cpu", tess_cpu)
                tess_reps.append(data["runs"][0])
                for fa in ("off", "on"):
                    llama_reps[fa].append(run_llama(py, m, [nt], args.prompt, args.gen, 1, fa=fa,
                                                          depth=args.depth)["runs"][0])
                t, lo, ln = tess_reps[-1], llama_reps["off"][-1], llama_reps["on"][-1]
                print(f"   rep {rep} threads {nt}: prompt {t.get('prompt_tok_s', 0):.1f} vs {lo['prompt_tok_s']:.1f} / "
                      f"{ln['prompt_tok_s']:.1f}, gen {t['gen_tok_s']:.1f} vs {lo['gen_tok_s']:.1f} / "
                      f"{ln['gen_tok_s']:.1f} tok/s (load {os.getloadavg()[0]:.1f})", file=sys.stderr)
        row = {"model": m, "tessera": {"cpu": tess_cpu, "runs": [merge_runs([r for r in tess_reps if r["threads"] == nt])
                                                                 for nt in threads]}}
        for fa in ("off", "on"):
            row["llama_" + fa] = {"runs": [merge_runs([r for r in llama_reps[fa] if r["threads"] == nt])
                                           for nt in threads]}
        rows.append(row)
    greedy = [greedy_compare(args.bin_dir, py, m, args.tokens) for m in args.greedy]
    write_report(rows, greedy, args, os.getloadavg()[0])


if __name__ == "__main__":
    sys.exit(main())
