#!/usr/bin/env python3
"""Decode speed of each low-bit GGUF format: Tessera beside llama.cpp on the same file.

From one source model (default: the default model, Gemma 3 270M Q4_K_M) llama.cpp's own quantizer
(llama-cpp-python's llama_model_quantize, requantizing allowed) makes one GGUF file per format
into --model-dir (models/lowbit/, git-ignored); files already there are reused. For each file:

* Tessera's greedy decode tok/s: `tessera-bench-cpu --gen N --depth P --no-prompt` (P context
  tokens prefilled untimed, default 0, then N tokens decoded one at a time, greedy; one warm-up
  first; and its process CPU time per token),
  with the default ISA and, unless --no-avx2, again capped to AVX2 (`--isa avx2`);
* llama.cpp's greedy decode tok/s on the same file: llama-cpp-python's low-level API, the same
  P context tokens decoded untimed, then the same N single-token decode calls timed with the
  argmax between them (a 16-call warm-up first; and the process CPU time); its default CPU settings (flash attention auto, fp16
  KV cache), n_batch = n_ubatch = 512, the same thread count;
* greedy agreement: both engines greedy from one short text prompt (ids from llama.cpp's
  tokenizer, given to `tessera generate --prompt-ids`, speculation off), llama.cpp with an fp32
  KV cache and flash attention off (Tessera's arithmetic); the count of identical leading tokens.

Every engine run is its own process (model load untimed). Rounds go over all files, engines
alternating (their order flips every round), so that a change of machine load weighs on all of
them; the medians over rounds are reported. A file one engine cannot load is reported as such.

The report goes to bench/results/lowbit-decode-<cpu tag>[-<label>].md and .json.

llama.cpp: llama-cpp-python==0.3.36 from bench/.venv-llama (see bench/README.md; built natively,
git-ignored), or --python.

Examples:
  python3 bench/lowbit_decode_bench.py --label widen
  python3 bench/lowbit_decode_bench.py --tessera-bin ../other/build/bin --formats Q2_K,TQ1_0 --rounds 3
  python3 bench/lowbit_decode_bench.py --make-only          # quantize and list tensor types only
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"

# Format name -> llama.cpp's ftype constant (llama_cpp.LLAMA_FTYPE_MOSTLY_*) with llama.cpp's own
# per-tensor choices. "source" is the source file itself, not requantized. "<type>_pure": the
# quantizer's `pure` flag (every matrix in <type>, except where the row length is not a multiple
# of the type's block: there llama.cpp falls back, Q2_K / Q3_K -> Q4_0), token_embd kept in Q8_0
# as the mixes give it: the way to get Q2_K / Q3_K tensors at all into a model whose width
# (Gemma 3 270M: 640) is no multiple of 256, since the Q2_K and Q3_K_M mixes put Q3_K / Q4_K on
# the only matrices that could take them.
FTYPES = {
    "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "Q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0",
    "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "Q4_K_S": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
    "Q5_K_M": "LLAMA_FTYPE_MOSTLY_Q5_K_M", "Q5_K_S": "LLAMA_FTYPE_MOSTLY_Q5_K_S",
    "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K", "Q3_K_M": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
    "Q3_K_S": "LLAMA_FTYPE_MOSTLY_Q3_K_S", "Q3_K_L": "LLAMA_FTYPE_MOSTLY_Q3_K_L",
    "Q2_K": "LLAMA_FTYPE_MOSTLY_Q2_K", "Q2_K_S": "LLAMA_FTYPE_MOSTLY_Q2_K_S",
    "TQ1_0": "LLAMA_FTYPE_MOSTLY_TQ1_0", "TQ2_0": "LLAMA_FTYPE_MOSTLY_TQ2_0",
    "F32": "LLAMA_FTYPE_ALL_F32", "F16": "LLAMA_FTYPE_MOSTLY_F16",
    "Q2_K_pure": "LLAMA_FTYPE_MOSTLY_Q2_K", "Q3_K_pure": "LLAMA_FTYPE_MOSTLY_Q3_K_S",
    "Q4_K_pure": "LLAMA_FTYPE_MOSTLY_Q4_K_S", "Q5_K_pure": "LLAMA_FTYPE_MOSTLY_Q5_K_S",
    "Q6_K_pure": "LLAMA_FTYPE_MOSTLY_Q6_K",
}
DEFAULT_FORMATS = "source,Q8_0,Q4_0,Q5_K_M,Q5_K_S,Q3_K_M,Q3_K_S,Q2_K,Q2_K_pure,TQ1_0,TQ2_0"
DEFAULT_PROMPT = "The history of the printing press begins in"  # the first of tests/integration/gemma3_llama_cpp_test.py

# ggml type id -> (name, elements per block, bytes per block), for the tensor-type mix.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}


# ----------------------------------------------------------------------------- GGUF tensor types

def gguf_tensor_types(path):
    """The tensors of a GGUF file: [(name, ggml type name, shape, bytes)] (header only)."""
    with open(path, "rb") as f:
        def rd(fmt):
            n = struct.calcsize(fmt)
            return struct.unpack("<" + fmt, f.read(n))

        def rd_str():
            (n,) = rd("Q")
            return f.read(n).decode("utf-8", "replace")

        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

        def skip_value(t):
            if t in scalar:
                rd(scalar[t])
            elif t == 8:
                rd_str()
            elif t == 9:
                (et,) = rd("I")
                (n,) = rd("Q")
                if et in scalar:
                    f.seek(n * struct.calcsize(scalar[et]), 1)
                else:
                    for _ in range(n):
                        skip_value(et)
            else:
                raise ValueError(f"{path}: unknown GGUF value type {t}")

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        (version,) = rd("I")
        n_tensors, n_kv = rd("QQ")
        for _ in range(n_kv):
            rd_str()
            (t,) = rd("I")
            skip_value(t)
        out = []
        for _ in range(n_tensors):
            name = rd_str()
            (nd,) = rd("I")
            shape = list(rd("Q" * nd))
            (t,) = rd("I")
            rd("Q")  # offset
            tname, blk, bb = GGML_TYPES.get(t, (f"type{t}", 0, 0))
            n = 1
            for d in shape:
                n *= d
            out.append((name, tname, shape, n // blk * bb if blk else 0))
        return out


def tensor_mix(path):
    """{type: {"tensors": n, "bytes": b, "roles": {role: count}}} with role = the name less 'blk.N.'."""
    mix = {}
    for name, tname, _shape, nbytes in gguf_tensor_types(path):
        role = name.split(".", 2)[2] if name.startswith("blk.") else name
        role = role.removesuffix(".weight")
        e = mix.setdefault(tname, {"tensors": 0, "bytes": 0, "roles": {}})
        e["tensors"] += 1
        e["bytes"] += nbytes
        e["roles"][role] = e["roles"].get(role, 0) + 1
    return dict(sorted(mix.items(), key=lambda kv: -kv[1]["bytes"]))


def mix_text(mix):
    """'Q3_K 61% (ffn_down x18, ...); Q4_0 ...' by share of the matrix bytes."""
    total = sum(e["bytes"] for e in mix.values()) or 1
    parts = []
    for t, e in mix.items():
        roles = ", ".join(f"{r} x{n}" if n > 1 else r for r, n in sorted(e["roles"].items(), key=lambda kv: -kv[1])
                          if not r.endswith("norm"))
        share = 100.0 * e["bytes"] / total
        if roles:
            parts.append(f"{t} {share:.0f}% ({roles})")
    norms = [t for t, e in mix.items() if all(r.endswith("norm") for r in e["roles"])]
    return "; ".join(parts) + (f"; norms {'/'.join(norms)}" if norms else "")


# ----------------------------------------------------------------------------- llama.cpp side
# Runs inside the interpreter that has llama_cpp (this same file, --llama-worker JOB).

_LOG_CB = None


def _llama_open(L, path, threads, n_ctx, f32_kv):
    global _LOG_CB
    L.llama_backend_init()
    _LOG_CB = L.llama_log_callback(lambda level, text, data: None)  # kept alive while the library runs
    L.llama_log_set(_LOG_CB, None)
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = cp.n_ubatch = 512
    cp.n_threads = cp.n_threads_batch = threads
    if f32_kv:  # Tessera's arithmetic: fp32 K/V, plain attention
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.type_k = cp.type_v = L.GGML_TYPE_F32
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not make a context for {path}")
    return model, ctx


def llama_worker(args):
    import llama_cpp as L
    import numpy as np
    out = {"llama_cpp_python": L.__version__}
    if args.llama_worker == "quantize":
        qp = L.llama_model_quantize_default_params()
        qp.ftype = getattr(L, FTYPES[args.format])
        qp.allow_requantize = True
        if args.format.endswith("_pure"):
            qp.pure = True
            qp.token_embedding_type = L.GGML_TYPE_Q8_0
        qp.nthread = args.threads
        t0 = time.perf_counter()
        rc = L.llama_model_quantize(args.src.encode(), args.dst.encode(), qp)
        out.update(rc=int(rc), seconds=time.perf_counter() - t0)
        json.dump(out, sys.stdout)
        return 0 if rc == 0 else 1

    f32_kv = args.llama_worker == "greedy"
    prompt_bound = len(args.prompt_text.encode()) + 16 if f32_kv else 0  # more than its token count
    model, ctx = _llama_open(L, args.model, args.threads, args.depth + prompt_bound + args.tokens + 64, f32_kv)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    mem = L.llama_get_memory(ctx)

    def decode(ids):
        arr = (L.llama_token * len(ids))(*ids)
        rc = L.llama_decode(ctx, L.llama_batch_get_one(arr, len(ids)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def logits():
        return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))

    if args.llama_worker == "speed":
        # As tessera-bench-cpu --depth D --gen N: context ids (i * 7919 + 13) % vocab, first token 1.
        context = [(i * 7919 + 13) % n_vocab for i in range(args.depth)]

        def run(n):
            L.llama_memory_clear(mem, True)
            if context:
                decode(context)
            tok = 1
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(n):
                decode([tok])
                tok = int(logits().argmax())
            return time.perf_counter() - t0, time.process_time() - c0

        run(min(args.tokens, 16))  # warm-up: weights paged in, threads started
        wall, cpu = run(args.tokens)
        out["gen_tok_s"] = args.tokens / wall
        out["gen_cpu_ms_per_token"] = 1e3 * cpu / args.tokens  # process CPU time, all threads
    else:  # greedy tokens from a text prompt
        raw = args.prompt_text.encode()
        buf = (L.llama_token * (len(raw) + 16))()
        n = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), True, True)
        if n < 0:
            raise RuntimeError(f"llama_tokenize returned {n}")
        prompt = [int(buf[i]) for i in range(n)]
        decode(prompt)
        toks, gaps, lps = [], [], []
        for _ in range(args.tokens):
            lg = logits().astype(np.float64)
            t = int(lg.argmax())
            top2 = np.partition(lg, -2)[-2:]
            toks.append(t)
            gaps.append(float(top2.max() - top2.min()))
            lps.append(float(-np.log(np.exp(lg - lg[t]).sum())))
            decode([t])
        out.update(prompt_ids=prompt, tokens=toks, top2_gaps=gaps, logprobs=lps)
    json.dump(out, sys.stdout)
    return 0


def last_lines(text, n=2):
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return " / ".join(lines[-n:]) if lines else "(no output)"


def short_error(err):
    """The reason of a loader error without the file's path ('...gguf: tensor X has ...')."""
    m = re.search(r"\.gguf: (.*)", err or "")
    return m.group(1) if m else err


def run_llama(py, job, **kw):
    """One llama worker process; (result dict, None) or (None, error text)."""
    cmd = [py, os.path.abspath(__file__), "--llama-worker", job]
    for k, v in kw.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, last_lines(p.stderr or p.stdout)
    return json.loads(p.stdout), None


def find_llama_python(explicit):
    py = explicit or os.path.join(HERE, ".venv-llama", "bin", "python")
    if not os.path.exists(py) or subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode:
        sys.exit(f"{py} cannot import llama_cpp: build it first (bench/README.md, llama_cpp_compare.py), e.g.\n"
                 f"  python3 -m venv bench/.venv-llama && CMAKE_ARGS=\"-DGGML_NATIVE=ON -DLLAMA_CURL=OFF "
                 f"-DLLAVA_BUILD=OFF\" bench/.venv-llama/bin/pip install {LLAMA_CPP_PYTHON}")
    return py


# ----------------------------------------------------------------------------- Tessera side

def tessera_speed_cmd(bin_dir, model, args, isa):
    return [os.path.join(bin_dir, "tessera-bench-cpu"), "--model", model, "--threads", str(args.threads),
            "--gen", str(args.tokens), "--depth", str(args.depth), "--no-prompt", "--batches", "",
            "--no-bandwidth", "--reps", "1"] + (["--isa", isa] if isa else [])


def run_tessera_speed(bin_dir, model, args, isa):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        p = subprocess.run(tessera_speed_cmd(bin_dir, model, args, isa) + ["--json", path],
                           capture_output=True, text=True)
        if p.returncode != 0:
            return None, last_lines(p.stderr or p.stdout)
        with open(path) as f:
            data = json.load(f)
    finally:
        os.unlink(path)
    r = data["runs"][0]
    return {"gen_tok_s": r["gen_tok_s"], "gen_cpu_ms_per_token": r.get("gen_cpu_ms_per_token"),
            "weight_bytes_per_token": r["weight_bytes_per_token"],
            "peak_rss_mb": r.get("peak_rss_mb"), "isa": data.get("isa"), "cpu": data.get("cpu")}, None


def tessera_greedy_cmd(bin_dir, model, prompt_ids, args):
    return [os.path.join(bin_dir, "tessera"), "generate", "--model", model, "--prompt-ids",
            ",".join(map(str, prompt_ids)), "--max-tokens", str(args.agree_tokens), "--temperature", "0",
            "--print-ids", "--ignore-eos", "--speculation", "off", "--threads", str(args.threads)]


def run_tessera_greedy(bin_dir, model, prompt_ids, args):
    p = subprocess.run(tessera_greedy_cmd(bin_dir, model, prompt_ids, args), capture_output=True, text=True)
    if p.returncode != 0:
        return None, last_lines(p.stderr or p.stdout)
    lines = p.stdout.strip().splitlines()
    return [int(t) for t in lines[-1].split(",") if t], None


# ----------------------------------------------------------------------------- machine

def cpu_fields():
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
    return fields


def cpu_identity(fields):
    flags = fields.get("flags", "").split()
    keep = [x for x in flags if x in ("avx2", "fma", "f16c", "avx_vnni") or x.startswith(("avx512", "amx"))]
    return (f"{fields.get('model name', 'unknown CPU')} ({fields.get('vendor_id', '?')} family "
            f"{fields.get('cpu family', '?')} model {fields.get('model', '?')} stepping "
            f"{fields.get('stepping', '?')}; {' '.join(keep) or 'no AVX2'})")


def cpu_tag(fields):
    """zen3 / zen4 / zen5 for AMD families 25-26, else vendor-family-model."""
    vendor, fam, model = fields.get("vendor_id", "?"), fields.get("cpu family", "?"), fields.get("model", "?")
    if vendor == "AuthenticAMD" and fam in ("25", "26"):
        if fam == "26":
            return "zen5"
        m = int(model)
        return "zen4" if (0x10 <= m <= 0x1F or 0x60 <= m <= 0x7F or 0xA0 <= m <= 0xAF) else "zen3"
    return f"{'intel' if vendor == 'GenuineIntel' else vendor.lower()}-{fam}-{model}"


# ----------------------------------------------------------------------------- files

def model_path(fmt, args):
    if fmt == "source":
        return args.source
    stem = os.path.splitext(os.path.basename(args.source))[0]
    base = re.sub(r"-(q\d\w*|tq\d\w*|f16|f32|bf16)$", "", stem, flags=re.I)  # gemma-3-270m-q4_k_m -> gemma-3-270m
    return os.path.join(args.model_dir, f"{base}-{fmt.lower()}.gguf")


def ensure_files(formats, args, py):
    files = []
    os.makedirs(args.model_dir, exist_ok=True)
    for fmt in formats:
        path = model_path(fmt, args)
        entry = {"format": fmt, "path": path, "made": None, "error": None}
        if fmt != "source" and not os.path.exists(path):
            if fmt not in FTYPES:
                entry["error"] = f"unknown format {fmt} (known: {', '.join(FTYPES)})"
                files.append(entry)
                continue
            print(f"== quantizing {args.source} -> {path} ({FTYPES[fmt]})", file=sys.stderr)
            r, err = run_llama(py, "quantize", src=args.source, dst=path, format=fmt, threads=args.threads)
            if err:
                entry["error"] = f"llama.cpp quantizer failed: {err}"
                if os.path.exists(path):
                    os.unlink(path)
                files.append(entry)
                continue
            entry["made"] = {"ftype": FTYPES[fmt], "pure": fmt.endswith("_pure"), "seconds": round(r["seconds"], 1)}
        entry["bytes"] = os.path.getsize(path)
        entry["mix"] = tensor_mix(path)
        files.append(entry)
    return files


# ----------------------------------------------------------------------------- report

def fmt_num(v, nd=1):
    return "-" if v is None else f"{v:.{nd}f}"


def median_or_none(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def write_report(files, args, meta, out_md, out_json):
    L = []
    L.append("# Decode speed of each low-bit GGUF format: Tessera beside llama.cpp, same file\n")
    L.append(f"Date: {meta['date']}. Machine: {meta['cpu']}, {meta['cores']} cores, {meta['os']}; "
             f"load average {meta['load_start']:.1f} at start, {meta['load_end']:.1f} at end. "
             f"Tessera: `{meta['tessera_bin']}` (commit {meta['commit']}), kernels: {meta['tessera_cpu']}. "
             f"llama.cpp: {meta['llama_cpp']}.\n")
    if args.note:
        L.append(args.note + "\n")
    L.append("Command:\n\n```\n" + meta["command"] + "\n```\n")
    L.append("Each engine run is a process of its own (load untimed):\n")
    L.append(f"- Tessera: `{' '.join(meta['tessera_cmd'])}` (and the same with `--isa avx2`);")
    L.append(f"- llama.cpp: `{meta['llama_cmd']}`: llama-cpp-python's low-level API, n_threads = n_threads_batch = "
             f"{args.threads}, n_batch = n_ubatch = 512, flash attention auto, fp16 KV cache (its defaults); "
             + (f"the same {args.depth} context tokens ((i * 7919 + 13) % vocab) decoded untimed, then "
                if args.depth else "from position 0, ") +
             f"{args.tokens} single-token llama_decode calls (the first token id 1, as tessera-bench-cpu) timed, greedy argmax between them; a warm-up of 16 calls first;")
    L.append(f"- agreement: `{' '.join(meta['greedy_cmd'])}` against llama.cpp greedy on the same prompt ids "
             f"(prompt {json.dumps(args.prompt_text)}, tokenized by llama.cpp), llama.cpp with an fp32 KV cache "
             f"and flash attention off: the count of identical leading tokens (gap: llama.cpp's top-2 logit gap "
             f"where they part); and along llama.cpp's tokens, Tessera's teacher-forced log-probability of each "
             f"(`tessera serve`, one prefill with echo) against llama.cpp's.\n")
    L.append(f"Greedy decode, {args.tokens} tokens from position {args.depth}, {args.threads} threads, "
             f"one request; medians of {args.rounds} rounds, each round over every file with the engines "
             f"alternating (order reversed every other round).\n")
    avx2 = not args.no_avx2
    head = "| format | file MB | Tessera tok/s |" + (" Tessera AVX2 tok/s |" if avx2 else "") + \
           " llama.cpp tok/s | Tessera / llama.cpp | Tessera weights MB/token | greedy agreement | teacher-forced \\|d logprob\\| median / max |"
    L.append(head)
    L.append("|" + "---|" * (head.replace("\\|", "").count("|") - 1))
    for f in files:
        label = f["format"] + (f" ({os.path.basename(f['path'])})" if f["format"] == "source" else "")
        if f.get("error"):
            L.append(f"| {label} | - | {f['error']} |")
            continue
        t, a, l = f.get("tessera"), f.get("tessera_avx2"), f.get("llama")
        cell = lambda r: (fmt_num(r["median"]) if r and r["median"] is not None else
                          f"refused: {short_error(r['error'])}" if r else "-")
        ratio = t["median"] / l["median"] if t and l and t["median"] and l["median"] else None
        ag = f.get("agreement", {})
        if ag.get("error"):
            agree = short_error(ag["error"]) if t and t["median"] else "-"
        elif ag:
            agree = (f"{ag['same_prefix']}/{ag['tokens']}" +
                     ("" if ag["same_prefix"] == ag["tokens"] else f" (gap {ag['gap_at_divergence']:.3g})"))
        else:
            agree = "-"
        lp = (f"{ag['logprob_diff_median']:.1e} / {ag['logprob_diff_max']:.1e}"
              if ag.get("logprob_diff_median") is not None else "-")
        wmb = t.get("weight_bytes_per_token") if t else None
        L.append(f"| {label} | {f['bytes'] / 1e6:.1f} | {cell(t)} |" + (f" {cell(a)} |" if avx2 else "") +
                 f" {cell(l)} | {fmt_num(ratio, 2)} | {fmt_num(wmb / 1e6 if wmb else None, 0)} | {agree} | {lp} |")
    L.append("\nThe least disturbed round of each engine (its best tok/s; on a shared machine the figure "
             "nearest an idle one), and the process CPU time per generated token (all threads, median; "
             "time spent descheduled excluded, threads spinning while they wait for a descheduled peer "
             "included; Tessera's only at --depth 0):\n")
    head2 = ("| format | Tessera best tok/s |" + (" Tessera AVX2 best tok/s |" if avx2 else "") +
             " llama.cpp best tok/s | ratio of bests | Tessera cpu-ms/token |" +
             (" Tessera AVX2 cpu-ms/token |" if avx2 else "") + " llama.cpp cpu-ms/token | ratio (llama.cpp / Tessera) |")
    L.append(head2)
    L.append("|" + "---|" * (head2.count("|") - 1))
    for f in files:
        if f.get("error"):
            continue
        t, a, l = f.get("tessera"), f.get("tessera_avx2"), f.get("llama")
        best = lambda r: fmt_num(r["best"]) if r and r.get("best") is not None else "-"
        cms = lambda r: fmt_num(r["cpu_ms_median"], 2) if r and r.get("cpu_ms_median") is not None else "-"
        rb = t["best"] / l["best"] if t.get("best") and l.get("best") else None
        rc = l["cpu_ms_median"] / t["cpu_ms_median"] if t.get("cpu_ms_median") and l.get("cpu_ms_median") else None
        L.append(f"| {f['format']} | {best(t)} |" + (f" {best(a)} |" if avx2 else "") + f" {best(l)} | {fmt_num(rb, 2)} |"
                 f" {cms(t)} |" + (f" {cms(a)} |" if avx2 else "") + f" {cms(l)} | {fmt_num(rc, 2)} |")
    L.append("\nPer-round tok/s (Tessera / " + ("Tessera AVX2 / " if avx2 else "") + "llama.cpp):\n")
    for f in files:
        if f.get("error"):
            continue
        series = [f[k]["rounds"] for k in (["tessera"] + (["tessera_avx2"] if avx2 else []) + ["llama"])]
        L.append(f"- {f['format']}: " + "; ".join(" / ".join(fmt_num(s[i]) for s in series)
                                                  for i in range(len(series[0]))))
    L.append("\nTensor types of each file (share of the tensor bytes; roles = tensor names less `blk.N.`; "
             "`token_embd` is also the tied LM head):\n")
    L.append("| format | path | types |")
    L.append("|---|---|---|")
    for f in files:
        if f.get("mix"):
            L.append(f"| {f['format']} | `{os.path.relpath(f['path'], ROOT)}` | {mix_text(f['mix'])} |")
    text = "\n".join(L) + "\n"
    with open(out_md, "w") as fh:
        fh.write(text)
    with open(out_json, "w") as fh:
        json.dump({"meta": meta, "args": vars(args), "files": files}, fh, indent=1)
    print(text)


# ----------------------------------------------------------------------------- main

def measure(files, args, py):
    avx2 = not args.no_avx2
    engines = ["tessera", "llama"] + (["tessera_avx2"] if avx2 else [])
    for f in files:
        if not f.get("error"):
            for e in engines:
                f[e] = {"rounds": [], "cpu_ms_rounds": [], "error": None}
    for rnd in range(args.rounds):
        order = engines if rnd % 2 == 0 else engines[::-1]
        for f in files:
            if f.get("error"):
                continue
            line = []
            for e in order:
                if f[e]["error"]:  # refused once: not again
                    f[e]["rounds"].append(None)
                    continue
                if e == "llama":
                    r, err = run_llama(py, "speed", model=f["path"], threads=args.threads, depth=args.depth,
                                       tokens=args.tokens)
                else:
                    r, err = run_tessera_speed(args.tessera_bin, f["path"], args, "avx2" if e == "tessera_avx2" else None)
                    if r:
                        f[e]["weight_bytes_per_token"] = r["weight_bytes_per_token"]
                        f[e]["peak_rss_mb"] = r["peak_rss_mb"]
                        args._tessera_cpu = args._tessera_cpu or (r["cpu"] if e == "tessera" else None)
                f[e]["error"] = err
                f[e]["rounds"].append(r["gen_tok_s"] if r else None)
                f[e]["cpu_ms_rounds"].append(r.get("gen_cpu_ms_per_token") if r else None)
                line.append(f"{e} {fmt_num(r['gen_tok_s']) if r else 'failed: ' + err}")
            print(f"   round {rnd} {f['format']}: " + ", ".join(line) + f" (load {os.getloadavg()[0]:.1f})",
                  file=sys.stderr)
    for f in files:
        for e in engines:
            if e in f:
                f[e]["median"] = median_or_none(f[e]["rounds"])
                f[e]["best"] = max([v for v in f[e]["rounds"] if v is not None], default=None)
                f[e]["cpu_ms_median"] = median_or_none(f[e]["cpu_ms_rounds"])


def agreement(files, args, py):
    for f in files:
        if f.get("error") or not args.agree_tokens:
            continue
        ref, err = run_llama(py, "greedy", model=f["path"], threads=args.threads, depth=0,
                             tokens=args.agree_tokens, prompt_text=args.prompt_text)
        if err:
            f["agreement"] = {"error": f"llama.cpp: {err}"}
            continue
        mine, err = run_tessera_greedy(args.tessera_bin, f["path"], ref["prompt_ids"], args)
        if err:
            f["agreement"] = {"error": f"Tessera: {err}"}
            continue
        llama = ref["tokens"]
        same = 0
        while same < min(len(llama), len(mine)) and llama[same] == mine[same]:
            same += 1
        lp_diff = None
        try:  # Tessera's teacher-forced log-probabilities of llama.cpp's tokens against llama.cpp's own
            from llama_cpp_compare import tessera_prompt_logprobs
            forced = tessera_prompt_logprobs(args.tessera_bin, f["path"], ref["prompt_ids"] + llama,
                                             args.threads)[len(ref["prompt_ids"]) - 1:]
            lp_diff = [abs(a - b) for a, b in zip(forced, ref["logprobs"])]
        except Exception as e:  # noqa: BLE001 - a report line, not a stop
            print(f"   teacher-forced scores of {f['format']} failed: {e}", file=sys.stderr)
        f["agreement"] = {"tokens": len(llama), "same_prefix": same,
                          "logprob_diff_median": statistics.median(lp_diff) if lp_diff else None,
                          "logprob_diff_max": max(lp_diff) if lp_diff else None,
                          "same_positions": sum(a == b for a, b in zip(llama, mine)),
                          "gap_at_divergence": ref["top2_gaps"][same] if same < len(llama) else None,
                          "prompt_ids": ref["prompt_ids"], "llama_cpp": llama, "tessera": mine}
        print(f"   agreement {f['format']}: {same}/{len(llama)}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera-bin", default=os.path.join(ROOT, "build", "bin"),
                    help="directory with tessera and tessera-bench-cpu (default: build/bin)")
    ap.add_argument("--formats", default=DEFAULT_FORMATS,
                    help=f"comma-separated: 'source' (the source file as is) or llama.cpp formats "
                         f"({', '.join(FTYPES)}); default {DEFAULT_FORMATS}")
    ap.add_argument("--rounds", type=int, default=5, help="rounds over every file and engine (median reported)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens decoded per timed run")
    ap.add_argument("--depth", type=int, default=0,
                    help="context tokens prefilled untimed before the decode (0: decode from position 0, first "
                         "token id 1; Tessera's CPU time per token is reported only then)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--agree-tokens", type=int, default=64, help="greedy tokens compared (0: skip)")
    ap.add_argument("--prompt-text", default=DEFAULT_PROMPT, help="prompt of the agreement run")
    ap.add_argument("--no-avx2", action="store_true", help="skip the Tessera --isa avx2 runs")
    ap.add_argument("--source", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--model-dir", default=os.path.join(ROOT, "models", "lowbit"))
    ap.add_argument("--python", default=None, help="interpreter with llama_cpp (default: bench/.venv-llama)")
    ap.add_argument("--label", default="", help="suffix of the result name, e.g. 'widen'")
    ap.add_argument("--out", default=None, help="report path without extension (default: "
                                                "bench/results/lowbit-decode-<cpu tag>[-<label>])")
    ap.add_argument("--note", default="", help="a sentence for the report's head")
    ap.add_argument("--make-only", action="store_true", help="make the files and print their tensor types only")
    # worker mode (internal)
    ap.add_argument("--llama-worker", choices=["quantize", "speed", "greedy"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--dst", help=argparse.SUPPRESS)
    ap.add_argument("--format", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_worker:
        return llama_worker(args)

    args.tessera_bin = os.path.abspath(args.tessera_bin)
    args.source = os.path.abspath(args.source)
    args._tessera_cpu = None
    py = find_llama_python(args.python)
    formats = [x.strip() for x in args.formats.split(",") if x.strip()]
    fields = cpu_fields()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": cpu_identity(fields), "cpu_tag": cpu_tag(fields), "cores": os.cpu_count(),
            "os": f"{platform.system()} {platform.release()}", "load_start": os.getloadavg()[0],
            "command": "python3 bench/lowbit_decode_bench.py " + " ".join(sys.argv[1:]),
            "tessera_bin": os.path.relpath(args.tessera_bin, ROOT)}
    files = ensure_files(formats, args, py)
    if args.make_only:
        for f in files:
            print(f"{f['format']}: {f['path']} " +
                  (f["error"] if f.get("error") else f"{f['bytes'] / 1e6:.1f} MB: {mix_text(f['mix'])}"))
        return 0
    for t in ("tessera", "tessera-bench-cpu", "tessera-shard"):
        if not os.access(os.path.join(args.tessera_bin, t), os.X_OK):
            sys.exit(f"{args.tessera_bin}/{t} missing (BUILD_TARGETS=\"tessera tessera-bench-cpu tessera-shard\" scripts/build.sh)")
    commit = subprocess.run(["git", "-C", os.path.dirname(args.tessera_bin), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", os.path.dirname(args.tessera_bin), "status", "--porcelain",
                            "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
    meta["commit"] = (commit or "?") + (" with uncommitted changes" if dirty else "")
    meta["llama_cpp"] = subprocess.run([py, "-c", "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, "
                                        "llama_cpp.llama_print_system_info().decode().strip())"],
                                       capture_output=True, text=True).stdout.strip()
    rel = lambda p: os.path.relpath(p, ROOT)
    meta["tessera_cmd"] = [rel(x) if x.startswith("/") else x for x in
                           tessera_speed_cmd(args.tessera_bin, "FILE", args, None)]
    meta["tessera_cmd"] = [("\"\"" if x == "" else x) for x in meta["tessera_cmd"]]
    meta["llama_cmd"] = (f"bench/lowbit_decode_bench.py --llama-worker speed --model FILE --threads {args.threads} "
                         f"--depth {args.depth} --tokens {args.tokens}")
    meta["greedy_cmd"] = [rel(x) if x.startswith("/") else x for x in
                          tessera_greedy_cmd(args.tessera_bin, "FILE", ["IDS"], args)]
    measure(files, args, py)
    agreement(files, args, py)
    meta["tessera_cpu"] = args._tessera_cpu or "?"
    meta["load_end"] = os.getloadavg()[0]
    out = args.out or os.path.join(HERE, "results", f"lowbit-decode-{meta['cpu_tag']}"
                                   + (f"-{args.label}" if args.label else ""))
    del args._tessera_cpu
    write_report(files, args, meta, out + ".md", out + ".json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
