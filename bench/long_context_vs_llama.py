#!/usr/bin/env python3
"""Long context, Tessera against llama.cpp on the same GGUF file, side by side in one window.

Per context length L (default 1024, 4096, 8192, 16384, 32704): prefill tok/s of an L-token prompt,
decode ms/token for GEN greedy tokens after it, and the process's peak RSS, for
  * llama.cpp (PyPI's llama-cpp-python, low-level API, flash attention on, its default fp16 KV
    cache; one process per length: the timed prefill, then the decodes after it),
  * Tessera dense (tessera-bench-cpu --depth L --sparse-attention off; its prefill figure is the
    context's prefill, timed),
  * Tessera sparse (tessera-bench-cpu --depth L --sparse-attention on --sparse-threshold 1: every
    decode of a global layer attends to the selected blocks; the default budget),
both Tessera runs with an fp16 KV cache (--kv-dtype fp16) as llama.cpp's. The engines alternate
per length, so a change of machine load hits all of them. Token ids are synthetic (timing only;
bench/long_quality.sh measures quality). llama-cpp-python comes from bench/.venv-llama
(bench/llama_cpp_compare.py builds it on first use).

  bench/long_context_vs_llama.py [--lengths 1024,4096] [--gen 32] [--threads 2] [--out FILE]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import llama_cpp_compare as lcc  # noqa: E402

LLAMA_SNIPPET = r"""
import json, resource, sys, time
import numpy as np
import llama_cpp as L
model, L_ctx, gen, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
L.llama_backend_init()
cb = L.llama_log_callback(lambda level, text, data: None)
L.llama_log_set(cb, None)
m = L.llama_model_load_from_file(model.encode(), L.llama_model_default_params())
cp = L.llama_context_default_params()
cp.n_ctx = L_ctx + gen + 64
cp.n_batch = 512
cp.n_ubatch = 512
cp.n_threads = threads
cp.n_threads_batch = threads
cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
ctx = L.llama_init_from_model(m, cp)
vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(m))
def decode(ids):
    for i in range(0, len(ids), 512):
        c = ids[i:i + 512]
        arr = (L.llama_token * len(c))(*c)
        rc = L.llama_decode(ctx, L.llama_batch_get_one(arr, len(c)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
decode([(i * 7919 + 13) % vocab for i in range(64)])  # warm-up
L.llama_memory_clear(L.llama_get_memory(ctx), True)
prompt = [(i * 7919 + 13) % vocab for i in range(L_ctx)]
t0 = time.perf_counter()
decode(prompt)
t1 = time.perf_counter()
tok = 1
for _ in range(gen):
    decode([tok])
    tok = int(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(vocab,)).argmax())
t2 = time.perf_counter()
json.dump({"prompt_tok_s": L_ctx / (t1 - t0), "gen_tok_s": gen / (t2 - t1),
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}, sys.stdout)
"""


def llama(py, model, length, gen, threads):
    out = subprocess.run([py, "-c", LLAMA_SNIPPET, model, str(length), str(gen), str(threads)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def tessera(bin_dir, model, length, gen, threads, sparse):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [os.path.join(bin_dir, "tessera-bench-cpu"), "--model", model, "--threads", str(threads), "--gen", str(gen),
           "--depth", str(length), "--reps", "1", "--no-bandwidth", "--kv-dtype", "fp16", "--json", path]
    # One prefill per run: the context's (depth_prefill_tok_s, timed apart from the decodes).
    cmd += ["--no-prompt"] + (["--sparse-attention", "on", "--sparse-threshold", "1"] if sparse
                              else ["--sparse-attention", "off"])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(path) as f:
        data = json.load(f)
    os.unlink(path)
    return data["runs"][0], data


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--lengths", default="1024,4096,8192,16384,32704")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--python", default=None, help="interpreter with llama_cpp (default: bench/.venv-llama)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    py = lcc.ensure_llama_python(args.python)
    lengths = [int(x) for x in args.lengths.split(",")]
    rows, top = [], None
    start = datetime.datetime.now(datetime.timezone.utc)
    for n in lengths:
        lm = llama(py, args.model, n, args.gen, args.threads)
        dense, meta = tessera(args.bin_dir, args.model, n, args.gen, args.threads, sparse=False)
        sparse, smeta = tessera(args.bin_dir, args.model, n, args.gen, args.threads, sparse=True)
        top = smeta.get("sparse_top_blocks")
        row = (n, lm, dense, sparse)
        rows.append(row)
        print(f"{n}: llama.cpp pp {lm['prompt_tok_s']:.0f} tok/s, {1e3 / lm['gen_tok_s']:.1f} ms/token, "
              f"{lm['peak_rss_mb']:.0f} MB | tessera pp {dense.get('depth_prefill_tok_s', 0):.0f}, dense "
              f"{1e3 / dense['gen_tok_s']:.1f} ms/token, sparse {1e3 / sparse['gen_tok_s']:.1f}, "
              f"{dense['peak_rss_mb']:.0f} / {sparse['peak_rss_mb']:.0f} MB", flush=True)
    end = datetime.datetime.now(datetime.timezone.utc)
    with open("/proc/cpuinfo") as f:
        info = f.read()
    field = lambda k: next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith(k)), "?")
    lines = [
        "# Long context: Tessera (dense, sparse) against llama.cpp (flash attention), Gemma 3 270M Q4_K_M\n",
        f"- Date: {start:%Y-%m-%d %H:%M}-{end:%H:%M} UTC; CPU: {field('model name')} (family {field('cpu family')} "
        f"model {field('model')}), {os.cpu_count()} cores; threads {args.threads}",
        f"- Command: `python3 bench/long_context_vs_llama.py --lengths {args.lengths} --gen {args.gen}` "
        f"(model {os.path.relpath(args.model, ROOT)})",
        "- llama.cpp: llama-cpp-python " + lcc.LLAMA_CPP_PYTHON.split("==")[1] + ", flash attention on, fp16 KV "
        "(its default), n_batch 512; one process per length: a timed prefill, then the decodes after it.",
        f"- Tessera: tessera-bench-cpu, `--kv-dtype fp16`; dense `--sparse-attention off`; sparse `--sparse-attention "
        f"on --sparse-threshold 1` with the default budget (1 sink + 2 recent + {top} selected blocks of 16 tokens; "
        "prefill is dense either way).",
        f"- Decode: {args.gen} greedy tokens after the context; one run each, the engines alternating per length.\n",
        "| context | prefill tok/s llama.cpp | prefill tok/s Tessera | Tessera / llama.cpp | decode ms/token llama.cpp "
        "| Tessera dense | Tessera sparse | llama.cpp / Tessera sparse | peak RSS MB llama.cpp | Tessera dense | "
        "Tessera sparse |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, lm, dense, sparse in rows:
        pp_t = dense.get("depth_prefill_tok_s", 0)
        ms_l, ms_d, ms_s = 1e3 / lm["gen_tok_s"], 1e3 / dense["gen_tok_s"], 1e3 / sparse["gen_tok_s"]
        lines.append(f"| {n} | {lm['prompt_tok_s']:.0f} | {pp_t:.0f} | {pp_t / lm['prompt_tok_s']:.2f} | {ms_l:.1f} | "
                     f"{ms_d:.1f} | {ms_s:.1f} | {ms_l / ms_s:.2f} | {lm['peak_rss_mb']:.0f} | "
                     f"{dense['peak_rss_mb']:.0f} | {sparse['peak_rss_mb']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
