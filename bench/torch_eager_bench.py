#!/usr/bin/env python3
"""PyTorch eager decode-step time on the shape tessera-gpu-forward-bench uses (issue 6's
comparison): a Llama model with random fp16 weights, B sequences prefilled with --context
tokens, then --steps decode steps of one token per sequence through the KV cache, timed with
torch.cuda.synchronize() around each step (the logits stay on the device: PyTorch's best case).

The model is Hugging Face transformers' LlamaForCausalLM when transformers is importable, else
a plain-PyTorch Llama of the same math (RMSNorm, rotate-half RoPE, GQA attention through
scaled_dot_product_attention, SiLU MLP) with a preallocated KV cache; the table says which.
Without torch (or without a GPU when --device cuda) it prints one line saying so and exits 0,
so bench/gpu_check.sh can call it on any machine.

Usage: torch_eager_bench.py [--batches 1,8,32,128] [--steps 10] [--context 128] [--layers 32]
                            [--hidden 4096 --heads 32 --kv-heads 8 --ffn 14336 --vocab 128256]
                            [--device cuda] [--budget-s 90] [--impl auto|hf|plain]
Prints a markdown table: | impl | layers | batch | decode step ms | tokens/s |.
"""
import argparse
import math
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="1,8,32,128")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget-s", type=float, default=90.0, help="skip further batch sizes after this long")
    p.add_argument("--impl", choices=["auto", "hf", "plain"], default="auto")
    return p.parse_args()


def plain_llama(torch, a, dtype, device, max_batch, max_len):
    """A Llama decoder in plain PyTorch eager ops, with a preallocated [layer][B, kv, T, hd] cache."""
    F = torch.nn.functional
    hd = a.hidden // a.heads
    group = a.heads // a.kv_heads
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape):
        return (torch.rand(*shape, generator=gen, device=device, dtype=torch.float32) * 0.04 - 0.02).to(dtype)

    embed = rand(a.vocab, a.hidden)
    layers = []
    for _ in range(a.layers):
        layers.append(dict(
            wq=rand(a.heads * hd, a.hidden), wk=rand(a.kv_heads * hd, a.hidden), wv=rand(a.kv_heads * hd, a.hidden),
            wo=rand(a.hidden, a.heads * hd), wg=rand(a.ffn, a.hidden), wu=rand(a.ffn, a.hidden),
            wd=rand(a.hidden, a.ffn), n1=torch.ones(a.hidden, device=device, dtype=dtype),
            n2=torch.ones(a.hidden, device=device, dtype=dtype)))
    norm = torch.ones(a.hidden, device=device, dtype=dtype)
    head = rand(a.vocab, a.hidden)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
    k_cache = [torch.zeros(max_batch, a.kv_heads, max_len, hd, device=device, dtype=dtype) for _ in range(a.layers)]
    v_cache = [torch.zeros_like(k) for k in k_cache]

    def rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype) * w

    def rope(x, pos):  # x [B, h, T, hd], pos [T]
        ang = pos.float()[:, None] * inv_freq[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1).to(dtype)
        sin = torch.cat([ang.sin(), ang.sin()], -1).to(dtype)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def attention(q, k, v, causal):
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch >= 2.0
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        s = (q @ k.transpose(-1, -2)).float() / math.sqrt(hd)
        if causal:
            T = q.shape[-2]
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=device).triu(1), float("-inf"))
        return (s.softmax(-1).to(dtype)) @ v

    def forward(ids, start):  # ids [B, T]; positions start .. start + T - 1 for every sequence
        B, T = ids.shape
        pos = torch.arange(start, start + T, device=device)
        x = embed[ids]
        for l, w in enumerate(layers):
            h = rms(x, w["n1"])
            q = (h @ w["wq"].T).view(B, T, a.heads, hd).transpose(1, 2)
            k = (h @ w["wk"].T).view(B, T, a.kv_heads, hd).transpose(1, 2)
            v = (h @ w["wv"].T).view(B, T, a.kv_heads, hd).transpose(1, 2)
            q, k = rope(q, pos), rope(k, pos)
            k_cache[l][:B, :, start:start + T] = k
            v_cache[l][:B, :, start:start + T] = v
            kk = k_cache[l][:B, :, : start + T].repeat_interleave(group, dim=1)
            vv = v_cache[l][:B, :, : start + T].repeat_interleave(group, dim=1)
            o = attention(q, kk, vv, T > 1 and start == 0)
            x = x + o.transpose(1, 2).reshape(B, T, a.heads * hd) @ w["wo"].T
            h = rms(x, w["n2"])
            x = x + (F.silu(h @ w["wg"].T) * (h @ w["wu"].T)) @ w["wd"].T
        return rms(x[:, -1], norm) @ head.T  # logits of the last position [B, vocab]

    def prefill(ids):
        return forward(ids, 0)

    def decode(tokens, pos):
        return forward(tokens, pos)

    return prefill, decode


def hf_llama(torch, a, dtype, device):
    import transformers
    cfg = transformers.LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, max_position_embeddings=8192,
        rope_theta=500000.0, tie_word_embeddings=False)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(cfg).to(dtype).eval()
    state = {}

    def prefill(ids):
        out = model(input_ids=ids, use_cache=True)
        state["past"] = out.past_key_values
        return out.logits[:, -1]

    def decode(tokens, pos):
        out = model(input_ids=tokens, past_key_values=state["past"], use_cache=True)
        state["past"] = out.past_key_values
        return out.logits[:, -1]

    return prefill, decode, transformers.__version__


def main():
    a = parse_args()
    try:
        import torch
    except ImportError:
        print(f"PyTorch eager: not run (torch is not importable by {sys.executable})")
        return 0
    if a.device == "cuda" and not torch.cuda.is_available():
        print(f"PyTorch eager: not run (torch {torch.__version__} sees no CUDA device)")
        return 0
    device = torch.device(a.device)
    dtype = torch.float16 if a.device == "cuda" else torch.float32
    batches = [int(b) for b in a.batches.split(",") if b]
    impl = a.impl
    if impl == "auto":
        try:
            import transformers  # noqa: F401
            impl = "hf"
        except ImportError:
            impl = "plain"
    t_build = time.time()
    note = ""
    if impl == "hf":
        try:
            prefill, decode, version = hf_llama(torch, a, dtype, device)
            label = f"transformers {version} LlamaForCausalLM"
        except Exception as e:  # an API this transformers lacks: measure the plain model instead
            note = f" (transformers failed: {type(e).__name__}: {str(e)[:120]})"
            impl = "plain"
            if a.device == "cuda":
                torch.cuda.empty_cache()
    if impl == "plain":
        prefill, decode = plain_llama(torch, a, dtype, device, max(batches), a.context + a.steps + 8)
        label = "plain PyTorch Llama" + note
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    sync()
    print(f"PyTorch {torch.__version__} eager, {label}, {str(dtype).replace('torch.', '')} random weights on "
          f"{torch.cuda.get_device_name() if a.device == 'cuda' else 'cpu'}; built in {time.time() - t_build:.1f} s")
    print()
    print("| impl | layers | batch | decode step ms | tokens/s |")
    print("|---|---|---|---|---|")
    start = time.time()
    gen = torch.Generator(device="cpu").manual_seed(1)
    with torch.inference_mode():
        for b in batches:
            if time.time() - start > a.budget_s:
                print(f"| {impl} | {a.layers} | {b} | skipped: time budget of {a.budget_s:.0f} s spent | |")
                continue
            ids = torch.randint(0, a.vocab, (b, a.context), generator=gen).to(device)
            logits = prefill(ids)
            tokens = logits.argmax(-1, keepdim=True)
            pos = a.context
            for _ in range(2):  # warm-up
                tokens = decode(tokens, pos).argmax(-1, keepdim=True)
                pos += 1
            sync()
            times = []
            for _ in range(a.steps):
                t0 = time.perf_counter()
                tokens = decode(tokens, pos).argmax(-1, keepdim=True)
                sync()
                times.append(time.perf_counter() - t0)
                pos += 1
            times.sort()
            ms = times[len(times) // 2] * 1e3
            print(f"| {impl} | {a.layers} | {b} | {ms:.2f} | {b * 1e3 / ms:.0f} |")
            sys.stdout.flush()
            if a.device == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
