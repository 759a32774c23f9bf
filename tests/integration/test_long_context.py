"""A long prompt through `tessera serve` (issue: long context and sparse attention).

A prompt of real text (the Python standard library's sources), TESSERA_LONG_PROMPT_TOKENS tokens
of it (3000 by default; 32000 for the full-length run in bench/results), through `serve` at TP 1
and TP 2, where the scheduler prefills it in chunks over several steps, gives the same greedy
tokens as `tessera generate` prefilling it in one piece. At TP 1 both decode with sparse
attention from a fixed threshold below the prompt's length (so the decodes also go through block
selection); at TP 2 both decode densely (see the test). The default model (Gemma 3 270M, 3
global layers of 18) is needed; the test skips without it.
"""
import json
import os
import subprocess
import sys
import tempfile

import pytest

from tessera_server import BIN, DEFAULT_MODEL, Server

N_TOKENS = int(os.environ.get("TESSERA_LONG_PROMPT_TOKENS", "3000"))
GEN = 16
# Sparse decodes from a fixed threshold below the prompt's length (a measured `auto` one could
# differ between processes), or dense.
SPARSE_ON = ["--sparse-attention", "on", "--sparse-threshold", str(min(2048, N_TOKENS // 2))]
SPARSE_OFF = ["--sparse-attention", "off"]


def real_text(n_chars):
    import argparse
    import difflib
    import inspect
    import textwrap
    import typing
    text = ""
    for mod in (textwrap, difflib, argparse, inspect, typing):
        with open(mod.__file__) as f:
            text += f.read()
        if len(text) >= n_chars:
            break
    assert len(text) >= n_chars, f"only {len(text)} characters of text"
    return text[:n_chars]


@pytest.fixture(scope="module")
def model():
    if not os.path.isfile(DEFAULT_MODEL):
        pytest.skip(f"no default model at {DEFAULT_MODEL} (scripts/default_model.sh fetches it)")
    return os.path.abspath(DEFAULT_MODEL)


def serve_completion(model, tp, ids, sparse):
    # Chunks of 512 tokens: the prompt takes several steps.
    s = Server(model, tp=tp, extra=["--speculation", "off", "--prefill-chunk", "512", "--max-kv-gb", "1", *sparse])
    try:
        r = s.client.completions.create(model="test-model", prompt=ids, max_tokens=GEN, temperature=0,
                                        extra_body={"ignore_eos": True}, timeout=3600)
        assert r.usage.prompt_tokens == len(ids)
        assert r.usage.completion_tokens == GEN
        n_sparse = s.metric("tessera_sparse_attention_decodes_total")
        if sparse == SPARSE_ON:
            assert s.metric("tessera_sparse_attention_threshold_tokens") == int(SPARSE_ON[-1])
            # The decodes past the threshold went sparse (3 global layers, GEN - 1 decode steps).
            assert n_sparse >= 3 * (GEN - 1), f"tp {tp}: {n_sparse} sparse decodes"
        else:
            assert s.metric("tessera_sparse_attention_threshold_tokens") == 0
            assert n_sparse == 0
        return r.choices[0].text, s
    except BaseException:
        s.stop()
        raise


def one_long_prefill(model, ids, sparse):
    """`tessera generate`: the whole prompt in one forward pass, then GEN greedy decodes."""
    with tempfile.NamedTemporaryFile("w", suffix=".ids", delete=False) as f:
        f.write(",".join(map(str, ids)))
        ids_file = f.name
    try:
        out = subprocess.run([os.path.join(BIN, "tessera"), "generate", "--model", model, "--prompt-ids", "@" + ids_file,
                              "--max-tokens", str(GEN), "--temperature", "0", "--ignore-eos", "--print-ids",
                              "--speculation", "off", "--prefill-chunk", "0", *sparse],
                             capture_output=True, text=True, timeout=3600)
        assert out.returncode == 0, out.stderr
        ids = [int(x) for x in out.stdout.strip().splitlines()[-1].split(",")]
        assert len(ids) == GEN
        return ids
    finally:
        os.unlink(ids_file)


def test_long_prompt_through_serve_at_tp1_and_tp2_equals_one_long_prefill(model):
    first = Server(model, extra=SPARSE_OFF)
    try:
        body = first.post_raw("/tokenize", json.dumps({"prompt": real_text(N_TOKENS * 6)}).encode())[1]
        ids = json.loads(body)["tokens"][:N_TOKENS]
        assert len(ids) == N_TOKENS
    finally:
        first.stop()
    # TP 1 with sparse decodes; TP 2 dense: its all-reduced partial sums round otherwise than
    # TP 1's, and a block selection can turn on such a difference (the shard test
    # SparseDecodeAtTp2SelectsWhatTp1Selects checks TP 2's selection).
    for tp, sparse in ((1, SPARSE_ON), (2, SPARSE_OFF)):
        want_ids = one_long_prefill(model, ids, sparse)
        text, s = serve_completion(model, tp, ids, sparse)
        try:
            want = json.loads(s.post_raw("/detokenize", json.dumps({"tokens": want_ids}).encode())[1])["prompt"]
        finally:
            s.stop()
        assert text == want, f"tp {tp}: {text!r} != {want!r}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
