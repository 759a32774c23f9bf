#!/usr/bin/env python3
"""Where does Tessera / llama.cpp disagreement on a low-bit GGUF file come from?

Makes an F32 copy of the file with llama.cpp's quantizer (LLAMA_FTYPE_ALL_F32: every tensor
through ggml's own dequantization; into models/lowbit/f32/), takes llama.cpp's greedy tokens
from one prompt on the file (decode path), and scores that one sequence teacher-forced (one
prefill, log-probability of each next token) four ways: llama.cpp and Tessera on the file and on
the F32 copy. Prints the median / max |d logprob| of every pair:

* llama.cpp(F32) vs Tessera(F32) small: the architecture is the same;
* Tessera(file) vs Tessera(F32) small: Tessera decodes the format as ggml does;
* each engine's (file) vs (F32): what its quantized arithmetic (activations rounded to 8 bits
  for the integer dot products) costs on this model.

Run it with the interpreter that has llama_cpp (bench/.venv-llama):
  bench/.venv-llama/bin/python bench/lowbit_f32_check.py models/lowbit/gemma-3-270m-tq2_0.gguf
"""
import argparse
import os
import statistics
import sys

import numpy as np
import llama_cpp as L

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from llama_cpp_compare import tessera_prompt_logprobs  # noqa: E402

_LOG_CB = L.llama_log_callback(lambda level, text, data: None)  # kept alive while the library runs


def f32_copy(src, out_dir):
    dst = os.path.join(out_dir, os.path.basename(src).replace(".gguf", "-f32.gguf"))
    if not os.path.exists(dst):
        os.makedirs(out_dir, exist_ok=True)
        qp = L.llama_model_quantize_default_params()
        qp.ftype = L.LLAMA_FTYPE_ALL_F32
        qp.allow_requantize = True
        qp.nthread = 2
        if L.llama_model_quantize(src.encode(), dst.encode(), qp) != 0:
            sys.exit(f"llama.cpp could not write an F32 copy of {src}")
    return dst


class Llama:
    """llama.cpp with an fp32 KV cache and flash attention off (Tessera's arithmetic)."""

    def __init__(self, path, threads, n_ctx=512):
        self.model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
        if not self.model:
            sys.exit(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.type_k = cp.type_v = L.GGML_TYPE_F32
        self.ctx = L.llama_init_from_model(self.model, cp)

    def logits(self, i=-1):
        return np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).astype(np.float64)

    def greedy(self, text, n):
        raw = text.encode()
        buf = (L.llama_token * (len(raw) + 16))()
        k = L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, True)
        ids = [int(buf[i]) for i in range(k)]
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        seq = list(ids)
        step = ids
        for _ in range(n):
            arr = (L.llama_token * len(step))(*step)
            if L.llama_decode(self.ctx, L.llama_batch_get_one(arr, len(step))) != 0:
                sys.exit("llama_decode failed")
            step = [int(self.logits().argmax())]
            seq += step
        return seq, len(ids)

    def scores(self, seq):
        """log p(seq[i + 1] | seq[:i + 1]) for every i, from one batch with all logits."""
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        b = L.llama_batch_init(len(seq), 0, 1)
        try:
            for i, t in enumerate(seq):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, i, 1, 1
                b.seq_id[i][0] = 0
            b.n_tokens = len(seq)
            if L.llama_decode(self.ctx, b) != 0:
                sys.exit("llama_decode failed")
        finally:
            L.llama_batch_free(b)
        out = []
        for i in range(len(seq) - 1):
            lg = self.logits(i)
            m = lg.max()
            out.append(float(lg[seq[i + 1]] - m - np.log(np.exp(lg - m).sum())))
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tessera-bin", default=os.path.join(os.path.dirname(HERE), "build", "bin"))
    ap.add_argument("--prompt-text", default="The history of the printing press begins in")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--f32-dir", default=os.path.join(os.path.dirname(HERE), "models", "lowbit", "f32"))
    args = ap.parse_args()
    L.llama_log_set(_LOG_CB, None)
    L.llama_backend_init()
    for path in args.models:
        f32 = f32_copy(path, args.f32_dir)
        seq, n_prompt = Llama(path, args.threads).greedy(args.prompt_text, args.tokens)
        s = {"llama.cpp(file)": Llama(path, args.threads).scores(seq)[n_prompt - 1:],
             "llama.cpp(F32)": Llama(f32, args.threads).scores(seq)[n_prompt - 1:],
             "Tessera(file)": tessera_prompt_logprobs(args.tessera_bin, path, seq, args.threads)[n_prompt - 1:],
             "Tessera(F32)": tessera_prompt_logprobs(args.tessera_bin, f32, seq, args.threads)[n_prompt - 1:]}
        print(f"{os.path.basename(path)}: llama.cpp's {args.tokens} greedy tokens after "
              f"{args.prompt_text!r}, teacher-forced |d logprob| median / max")
        keys = list(s)
        for i in range(len(keys)):
            for j in range(i + 1, len(keys)):
                d = [abs(a - b) for a, b in zip(s[keys[i]], s[keys[j]])]
                print(f"  {keys[i]:16s} vs {keys[j]:16s} {statistics.median(d):.1e} / {max(d):.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
