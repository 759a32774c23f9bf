"""End-to-end tests of `tessera serve` with the official `openai` Python client.

Run by CTest (tests/integration/CMakeLists.txt) with the project's virtual environment; every
server is a real process tree (coordinator + shards; mpirun for TP 2) on loopback.
"""
import concurrent.futures
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from tessera_server import BIN, DEFAULT_MODEL, HERE, STORIES, Server, require_stories


@pytest.fixture(scope="module")
def synthetic_model():
    d = tempfile.mkdtemp(prefix="tessera_api_test_")
    out = os.path.join(d, "gqa4-f32.gguf")
    subprocess.run([os.path.join(BIN, "tessera-make-model"), "--preset", "gqa4", "--format", "gguf", "--type", "f32",
                    "--out", out], check=True, capture_output=True)
    yield out


@pytest.fixture(scope="module")
def stories_server():
    require_stories(os.path.join(STORIES, "hf"))
    s = Server(os.path.join(STORIES, "hf"),
               extra=["--chat-template", os.path.join(HERE, "data", "stories_chat_template.jinja")])
    yield s
    s.stop()


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def cuda_stories_server(request):
    """stories260K served by shards on the CUDA backend (TP 1 and 2); without a GPU, on the CPU
    stand-in of libtessera_cuda.so that CTest names in TESSERA_FAKE_CUDA_LIBRARY, whose NCCL runs
    through shared memory (the wiring, not the kernels)."""
    require_stories(os.path.join(STORIES, "hf"))
    lib = os.environ.get("TESSERA_FAKE_CUDA_LIBRARY")
    if not lib or not os.path.exists(lib):
        pytest.skip("TESSERA_FAKE_CUDA_LIBRARY does not name the fake CUDA backend")
    s = Server(os.path.join(STORIES, "hf"), tp=request.param, extra=["--device", "cuda"],
               env=dict(os.environ, TESSERA_CUDA_LIBRARY=lib, TESSERA_LOG_LEVEL="info"))
    yield s
    s.stop()


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def synthetic_server(request, synthetic_model):
    s = Server(synthetic_model, tp=request.param)
    yield s
    s.stop()


def reference():
    with open(os.path.join(STORIES, "reference.json")) as f:
        return json.load(f)


# ---- stories260K: exact reference outputs through the API ----

def test_completion_matches_reference_ids(stories_server):
    ref = reference()
    case = ref["cases"][-1]
    r = stories_server.client.completions.create(model="test-model", prompt=case["prompt_ids"], max_tokens=64,
                                                 temperature=0, extra_body={"ignore_eos": True})
    expected = stories_server.post_raw("/detokenize", json.dumps({"tokens": case["greedy_ids"]}).encode())[1]
    assert r.choices[0].text == json.loads(expected)["prompt"]
    assert r.usage.prompt_tokens == len(case["prompt_ids"])
    assert r.usage.completion_tokens == 64
    assert r.choices[0].finish_reason == "length"


def test_streaming_completion_equals_non_streaming(stories_server):
    c = stories_server.client
    whole = c.completions.create(model="test-model", prompt="Once upon a time", max_tokens=40, temperature=0)
    chunks = list(c.completions.create(model="test-model", prompt="Once upon a time", max_tokens=40, temperature=0,
                                       stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text
    assert "there was a little girl named Lily" in text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert len({ch.id for ch in chunks}) == 1


def test_chat_streaming_and_not(stories_server):
    c = stories_server.client
    msgs = [{"role": "user", "content": "Once upon a time"}]
    whole = c.chat.completions.create(model="test-model", messages=msgs, max_tokens=30, temperature=0)
    assert whole.choices[0].message.role == "assistant"
    assert "Lily" in whole.choices[0].message.content
    chunks = list(c.chat.completions.create(model="test-model", messages=msgs, max_completion_tokens=30,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({ch.id for ch in chunks}) == 1
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert content == whole.choices[0].message.content
    finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_sse_wire_format(stories_server):
    req = urllib.request.Request(stories_server.base + "/v1/completions",
                                 data=json.dumps({"prompt": "Hello", "max_tokens": 3, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read().decode()
        assert r.headers["Content-Type"].startswith("text/event-stream")
    events = body.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for e in events[:-1]:
        assert e.startswith("data: ") and "\n" not in e


def test_logprobs(stories_server):
    c = stories_server.client
    r = c.completions.create(model="test-model", prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 5 and len(lp.token_logprobs) == 5
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l <= 0 and len(top) == 3
        assert abs(max(top.values()) - l) < 1e-4  # greedy: the chosen token is the most likely
    chat = c.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "Once upon"}],
                                     max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(t.top_logprobs) == 2 for t in content)
    echo = c.completions.create(model="test-model", prompt="Once upon a time", max_tokens=2, temperature=0,
                                logprobs=1, echo=True)
    assert echo.choices[0].text.startswith("Once upon a time")
    elp = echo.choices[0].logprobs
    assert len(elp.tokens) == echo.usage.prompt_tokens + 2
    assert elp.token_logprobs[0] is None and elp.top_logprobs[0] is None  # nothing predicts the first token
    assert all(isinstance(x, float) for x in elp.token_logprobs[1:])
    assert elp.text_offset == sorted(elp.text_offset) and elp.text_offset[0] == 0


def test_echo_logprobs_cover_a_cached_prompt(stories_server):
    """Prompt logprobs need every prompt position computed: a prompt whose blocks are in the
    prefix cache is recomputed for them, and max_tokens=0 returns the prompt's logprobs alone.
    The prompt logprobs of a prompt + its greedy continuation equal the continuation's own
    logprobs (prefill and decode agree)."""
    c = stories_server.client
    prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
    gen = c.completions.create(model="test-model", prompt=prompt, max_tokens=6, temperature=0, logprobs=1)
    n = gen.usage.prompt_tokens
    assert n > 16  # longer than a KV block: the repeats below find it in the prefix cache
    for max_tokens in (0, 3):
        r = c.completions.create(model="test-model", prompt=prompt, max_tokens=max_tokens, temperature=0, logprobs=1,
                                 echo=True)
        lp = r.choices[0].logprobs
        assert r.choices[0].text.startswith(prompt)
        assert len(lp.tokens) == n + max_tokens, (max_tokens, len(lp.tokens), n)
        assert lp.token_logprobs[0] is None
        assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
        assert r.usage.completion_tokens == max_tokens
        if max_tokens == 0:
            assert r.choices[0].text == prompt and r.choices[0].finish_reason == "length"
            prompt_lps = lp.token_logprobs
        else:
            assert lp.token_logprobs[:n] == pytest.approx(prompt_lps, abs=1e-4)
    # Echo a reference prompt plus its greedy continuation (ids): the continuation's prompt
    # logprobs are the ones the decode steps reported.
    case = reference()["cases"][-1]
    ids, greedy = case["prompt_ids"], case["greedy_ids"][:8]
    dec = c.completions.create(model="test-model", prompt=ids, max_tokens=8, temperature=0, logprobs=0,
                               extra_body={"ignore_eos": True})
    full = c.completions.create(model="test-model", prompt=ids + greedy, max_tokens=0, logprobs=0, echo=True)
    assert full.choices[0].logprobs.token_logprobs[len(ids):] == pytest.approx(
        dec.choices[0].logprobs.token_logprobs, abs=2e-3)


def test_stop_strings(stories_server):
    c = stories_server.client
    full = c.completions.create(model="test-model", prompt="Once upon a time", max_tokens=40, temperature=0)
    text = full.choices[0].text
    stop = "little"
    assert stop in text
    r = c.completions.create(model="test-model", prompt="Once upon a time", max_tokens=40, temperature=0, stop=[stop])
    assert r.choices[0].text == text[:text.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    chunks = list(c.completions.create(model="test-model", prompt="Once upon a time", max_tokens=40, temperature=0,
                                       stop=stop, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == text[:text.index(stop)]


def test_min_tokens_masks_eos(stories_server):
    # stories260K never emits its EOS (id 2), so serve a copy whose EOS is the "." token, which
    # greedy stories emit often: without min_tokens the text ends before the first "."; with
    # min_tokens = n, EOS gets probability 0 for the first n tokens (no "." among them).
    status, body = stories_server.post_raw("/tokenize", json.dumps({"prompt": ".", "add_special_tokens": False}).encode())
    assert status == 200, body
    dot = json.loads(body)["tokens"][-1]
    d = tempfile.mkdtemp(prefix="tessera_eos_dot_")
    for f in os.listdir(os.path.join(STORIES, "hf")):
        shutil.copy(os.path.join(STORIES, "hf", f), d)
    for name in ("config.json", "generation_config.json"):
        with open(os.path.join(d, name)) as f:
            cfg = json.load(f)
        cfg["eos_token_id"] = dot
        with open(os.path.join(d, name), "w") as f:
            json.dump(cfg, f)
    s = Server(d)
    try:
        c = s.client
        kw = dict(model="test-model", prompt="Once upon a time", temperature=0, max_tokens=120)
        free = c.completions.create(**kw)
        assert free.choices[0].finish_reason == "stop"
        n = free.usage.completion_tokens
        forced = c.completions.create(extra_body={"min_tokens": n + 20}, **kw)
        assert forced.usage.completion_tokens >= n + 20
        text = forced.choices[0].text
        assert text.startswith(free.choices[0].text)
        ids = json.loads(s.post_raw("/tokenize", json.dumps({"prompt": text, "add_special_tokens": False}).encode())[1])["tokens"]
        assert dot not in ids[:n + 20], text
    finally:
        s.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_seeds(stories_server):
    c = stories_server.client
    kw = dict(model="test-model", prompt="Once upon a time", max_tokens=30, temperature=1.0, top_p=0.95)
    a = c.completions.create(seed=123, **kw).choices[0].text
    b = c.completions.create(seed=123, **kw).choices[0].text
    d = c.completions.create(seed=999, **kw).choices[0].text
    assert a == b
    assert a != d
    n2 = c.completions.create(seed=123, n=2, **kw)
    assert len(n2.choices) == 2 and n2.choices[0].text == a


def test_models_health_tokenize(stories_server):
    status, body = stories_server.get("/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "test-model"
    assert stories_server.get("/health")[0] == 200
    status, body = stories_server.post_raw("/tokenize", json.dumps({"prompt": "Once upon a time"}).encode())
    assert json.loads(body)["tokens"] == [1, 403, 407, 261, 378]
    status, body = stories_server.post_raw("/detokenize", json.dumps({"tokens": [403, 407, 261, 378]}).encode())
    assert json.loads(body)["prompt"] == "Once upon a time"
    status, body = stories_server.get("/tokenizer_info")
    assert json.loads(body)["vocab_size"] == 512
    status, text = stories_server.get("/metrics")
    for name in ["tessera_time_to_first_token_seconds_bucket", "tessera_inter_token_latency_seconds_count",
                 "tessera_requests_total", "tessera_kv_blocks", "tessera_scheduler_max_batch",
                 "tessera_prefix_cache_hit_rate", "tessera_kv_fragmentation", "tessera_preemptions_total"]:
        assert name in text, name


def class_count(text, metric, cls):
    prefix = f'{metric}_count{{class="{cls}"}} '
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    return int(float(lines[0].split()[-1])) if lines else 0


def test_ttft_and_queue_time_by_priority_class(stories_server):
    s = stories_server
    text = s.get("/metrics")[1]
    before = {c: class_count(text, "tessera_class_time_to_first_token_seconds", c) for c in (0, 1)}
    queued = class_count(text, "tessera_class_queue_time_seconds", 1)
    for priority in (1, 1, 0):
        status, body = s.post_raw("/v1/completions", json.dumps(
            {"prompt": "Once upon a time", "max_tokens": 2, "priority": priority}).encode())
        assert status == 200, body
    text = s.get("/metrics")[1]
    assert class_count(text, "tessera_class_time_to_first_token_seconds", 1) == before[1] + 2
    assert class_count(text, "tessera_class_time_to_first_token_seconds", 0) == before[0] + 1
    assert class_count(text, "tessera_class_queue_time_seconds", 1) == queued + 2


def test_invalid_requests_get_4xx_and_server_keeps_serving(stories_server):
    s = stories_server
    cases = [
        (b"{not json", 400, None),
        (json.dumps({"prompt": "x", "max_tokens": "ten"}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": "x", "max_tokens": -5}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": 42}).encode(), 400, "prompt"),
        (json.dumps({"prompt": "x", "model": "no-such-model"}).encode(), 404, "model"),
        (json.dumps({"prompt": [1] * 600}).encode(), 400, "context"),
        (json.dumps({"prompt": [1, 99999]}).encode(), 400, "99999"),
        (json.dumps({"prompt": "x", "logit_bias": {"99999": 5}}).encode(), 400, "99999"),
        (json.dumps({"prompt": "x", "logit_bias": {"12": 150}}).encode(), 400, "logit_bias"),
        (json.dumps({"prompt": "x", "logit_bias": {"twelve": 1}}).encode(), 400, "twelve"),
        (json.dumps({"prompt": "x", "logit_bias": [1, 2]}).encode(), 400, "logit_bias"),
        (json.dumps({"prompt": "x", "best_of": 3}).encode(), 400, "best_of"),
        (json.dumps({"prompt": "x", "suffix": "end"}).encode(), 400, "suffix"),
        (json.dumps({"prompt": "x", "response_format": {"type": "xml"}}).encode(), 400, "response_format"),
        (json.dumps({"prompt": "x", "response_format": {"type": "json_schema"}}).encode(), 400, "response_format"),
        (json.dumps({"prompt": "x", "response_format": "json"}).encode(), 400, "response_format"),
        (b"x" * (10 * 1024 * 1024), 413, None),
    ]
    for body, status, needle in cases:
        got, text = s.post_raw("/v1/completions", body)
        assert got == status, (body[:60], got, text)
        err = json.loads(text)["error"]
        assert err["message"]
        if needle:
            assert needle in err["message"] or needle == err.get("param"), err
    tools = [{"type": "function", "function": {"parameters": {"type": "object"}}}]  # no name
    got, text = s.post_raw("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                                                 "tools": tools}).encode())
    assert got == 400 and "tools[0].function.name" in json.loads(text)["error"]["message"], text
    ok = s.client.completions.create(model="test-model", prompt="x", max_tokens=2, best_of=1,
                                     extra_body={"response_format": {"type": "text"}})
    assert ok.choices[0].text is not None
    for path, body, needle in [("/tokenize", {"prompt": "x", "model": ["a"]}, "model"),
                               ("/detokenize", {"tokens": [1], "model": 5}, "model"),
                               ("/tokenize", {"messages": [{"role": "user", "content": "hi"}],
                                              "add_generation_prompt": "yes"}, "add_generation_prompt")]:
        got, text = s.post_raw(path, json.dumps(body).encode())
        assert got == 400 and needle in json.loads(text)["error"]["message"], (path, got, text)
    got, text = s.post_raw("/v1/chat/completions", json.dumps({"messages": "hi"}).encode())
    assert got == 400 and "messages" in json.loads(text)["error"]["message"]
    r = s.client.completions.create(model="test-model", prompt="Once upon a time", max_tokens=3, temperature=0)
    assert r.choices[0].text


def concurrent_streams_match_solo_and_free_blocks(server):
    c = server.client
    prompts = [f"Once upon a time, {name} went" for name in
               ["Tom", "Lily", "Ben", "Sue", "Max", "Amy", "Sam", "Mia"]] * 8  # 64 requests
    solo = {}
    for p in set(prompts):
        solo[p] = c.completions.create(model="test-model", prompt=p, max_tokens=24, temperature=0).choices[0].text

    def stream(p):
        return "".join(ch.choices[0].text for ch in c.completions.create(
            model="test-model", prompt=p, max_tokens=24, temperature=0, stream=True) if ch.choices)

    with concurrent.futures.ThreadPoolExecutor(64) as ex:
        outs = list(ex.map(stream, prompts))
    for p, o in zip(prompts, outs):
        assert o == solo[p], p
    deadline = time.time() + 10
    while server.metric("tessera_kv_blocks", '{state="used"}') != 0 and time.time() < deadline:
        time.sleep(0.1)
    assert server.metric("tessera_kv_blocks", '{state="used"}') == 0


def test_concurrent_streams_match_solo_and_free_blocks(stories_server):
    concurrent_streams_match_solo_and_free_blocks(stories_server)


def kv_block_states(server):
    """The KV block states from one scrape of /metrics (they add up to the pool within one)."""
    _, text = server.get("/metrics")
    states = {}
    for line in text.splitlines():
        m = re.match(r'tessera_kv_blocks\{state="(\w+)"\} (\S+)$', line)
        if m:
            states[m.group(1)] = float(m.group(2))
    assert set(states) == {"used", "free", "cached"}, states
    return states


def prefix_cache_hits_and_outputs_unchanged(server):
    c = server.client
    prefix = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. " * 3
    first = c.completions.create(model="test-model", prompt=prefix + "One day", max_tokens=16, temperature=0)
    pool = sum(kv_block_states(server).values())
    before = server.metric("tessera_prefix_cache_hit_rate")
    second = c.completions.create(model="test-model", prompt=prefix + "One day", max_tokens=16, temperature=0)
    third = c.completions.create(model="test-model", prompt=prefix + "The sun", max_tokens=16, temperature=0)
    after = server.metric("tessera_prefix_cache_hit_rate")
    assert after > before
    assert second.choices[0].text == first.choices[0].text
    assert third.choices[0].text
    # The states are disjoint: idle cached blocks are not also counted free.
    deadline = time.time() + 10
    while kv_block_states(server)["used"] != 0 and time.time() < deadline:
        time.sleep(0.05)
    states = kv_block_states(server)
    assert states["cached"] > 0, states
    assert sum(states.values()) == pool, (states, pool)


def test_prefix_cache_hits_and_outputs_unchanged(stories_server):
    prefix_cache_hits_and_outputs_unchanged(stories_server)


# ---- the same through a CUDA shard (graphs for decode, device block copies, device memory plan) ----

def test_cuda_shard_reference_ids(cuda_stories_server):
    s = cuda_stories_server
    for case in reference()["cases"]:
        n = len(case["greedy_ids"])
        r = s.client.completions.create(model="test-model", prompt=case["prompt_ids"], max_tokens=n, temperature=0,
                                        extra_body={"ignore_eos": True})
        expected = s.post_raw("/detokenize", json.dumps({"tokens": case["greedy_ids"]}).encode())[1]
        assert r.choices[0].text == json.loads(expected)["prompt"], case["name"]
        assert r.usage.completion_tokens == n
    assert any("cuda:0 (fake CPU backend" in line and "ready" in line for line in s.log), "".join(s.log[-20:])


def test_cuda_shard_logprobs_sampled_on_the_device(cuda_stories_server, stories_server):
    """Greedy with logprobs and seeded sampling go through the device sampler (only ids and
    logprobs come back): the same tokens and logprobs as the CPU backend's host sampler, within
    the f16 rounding of the CUDA path's activations."""
    kwargs = dict(model="test-model", prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=3)
    got = cuda_stories_server.client.completions.create(**kwargs).choices[0].logprobs
    want = stories_server.client.completions.create(**kwargs).choices[0].logprobs
    assert got.tokens == want.tokens
    for g, w, gtop, wtop in zip(got.token_logprobs, want.token_logprobs, got.top_logprobs, want.top_logprobs):
        assert abs(g - w) < 2e-2 and len(gtop) == 3
        assert max(gtop, key=gtop.get) == max(wtop, key=wtop.get)
        assert abs(max(gtop.values()) - g) < 1e-4  # greedy: the chosen token is the most likely
    sampled = dict(model="test-model", prompt="Once upon", max_tokens=6, temperature=0.9, top_p=0.9, seed=5,
                   logprobs=2, frequency_penalty=0.5)
    first = cuda_stories_server.client.completions.create(**sampled).choices[0]
    again = cuda_stories_server.client.completions.create(**sampled).choices[0]
    assert first.text == again.text  # seeded: the same draw every time
    assert first.logprobs.token_logprobs == again.logprobs.token_logprobs
    assert all(len(top) == 2 and lp <= 0 for lp, top in zip(first.logprobs.token_logprobs, first.logprobs.top_logprobs))


def logit_bias_steers_the_choice(server):
    """+100 forces a token at any temperature, -100 removes the greedy choice; the reference
    prompt's greedy continuation is what the ids are checked against."""
    c = server.client
    case = reference()["cases"][-1]
    ids, greedy = case["prompt_ids"], case["greedy_ids"]
    detok = lambda toks: json.loads(server.post_raw("/detokenize", json.dumps({"tokens": toks}).encode())[1])["prompt"]
    target = 100 if greedy[0] != 100 else 101
    for temperature in (0, 1.0):
        r = c.completions.create(model="test-model", prompt=ids, max_tokens=4, temperature=temperature, seed=3,
                                 logit_bias={str(target): 100}, extra_body={"ignore_eos": True})
        assert r.choices[0].text == detok([target] * 4), (temperature, r.choices[0].text)
    banned = c.completions.create(model="test-model", prompt=ids, max_tokens=1, temperature=0,
                                  logit_bias={str(greedy[0]): -100})
    assert banned.choices[0].text != detok(greedy[:1])
    plain = c.completions.create(model="test-model", prompt=ids, max_tokens=1, temperature=0)
    assert plain.choices[0].text == detok(greedy[:1])  # the bias is per request


def test_logit_bias(stories_server):
    logit_bias_steers_the_choice(stories_server)


def test_cuda_shard_logit_bias(cuda_stories_server):
    logit_bias_steers_the_choice(cuda_stories_server)


def test_cuda_shard_concurrent_streams_match_solo(cuda_stories_server):
    concurrent_streams_match_solo_and_free_blocks(cuda_stories_server)


def test_cuda_shard_prefix_cache(cuda_stories_server):
    prefix_cache_hits_and_outputs_unchanged(cuda_stories_server)


def test_fuzzed_requests_get_an_answer_and_never_a_500(stories_server):
    """Valid requests with 1-4 fields replaced by values of the wrong type or range, on every
    POST endpoint (fixed seed): each gets a 200 or a 4xx with a JSON error, and the server keeps
    serving."""
    s = stories_server
    rng = random.Random(20261130)
    values = [None, True, False, 0, 1, -1, 2**31, 2**63, -2**63, 1.5, -0.0, 1e308, "", "x", [], [1], [[1, 2], [3]],
              {}, {"a": 1}, [-1], [2**40], ["a", "b"], [None], {"1": 5}, {"1": "x"}]
    fields = ["prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop", "seed",
              "logprobs", "top_logprobs", "echo", "stream_options", "logit_bias", "presence_penalty",
              "frequency_penalty", "repetition_penalty", "ignore_eos", "min_tokens", "priority", "model", "best_of",
              "suffix", "response_format", "tools", "max_completion_tokens", "tool_choice", "tokens",
              "add_special_tokens", "add_generation_prompt", "guided_json", "guided_regex", "guided_choice",
              "guided_grammar", "structured_outputs"]
    for _ in range(300):
        path = rng.choice(["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])
        body = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "Once"}
        body["max_tokens"] = 4
        for _ in range(rng.randint(1, 4)):
            body[rng.choice(fields)] = rng.choice(values)
        for key, cap in (("max_tokens", 8), ("n", 2), ("min_tokens", 8)):  # keep each request short
            if isinstance(body.get(key), int) and not isinstance(body[key], bool) and body[key] > cap:
                body[key] = cap
        got, text = s.post_raw(path, json.dumps(body).encode())
        assert got in (200, 400, 404), (path, body, got, text)
        reply = json.loads(text)
        assert got == 200 or reply["error"]["message"], (path, body, text)
    assert s.get("/health")[0] == 200


def test_choices_of_one_prompt_share_its_prefill(stories_server):
    """n choices of a 200-token prompt: one computes the prompt's full blocks, the others wait a
    step and take them from the prefix cache (tessera_prefix_waits_total); each choice still
    samples on its own (seeded: the same as asking again)."""
    s = stories_server
    prompt = [(i * 37) % 500 + 5 for i in range(200)]
    waits = s.metric("tessera_prefix_waits_total")
    kwargs = dict(model="test-model", prompt=prompt, max_tokens=6, n=4, temperature=1.0, seed=11)
    r = s.client.completions.create(**kwargs)
    assert len(r.choices) == 4 and r.usage.prompt_tokens == 200
    assert s.metric("tessera_prefix_waits_total") >= waits + 3
    again = s.client.completions.create(**kwargs)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]


def test_fp16_and_int8_kv_caches_at_tp2_keep_the_reference_and_hold_more_blocks():
    """`--kv-dtype fp16` / `int8` reach both shards (TP 2): the same memory cap holds twice the KV
    blocks in fp16 and 32/12 times in int8 (stories260K's 8-dim heads: 8 bytes and a 4-byte scale
    per row against 32), and the reference prompt still gives its greedy continuation."""
    require_stories(os.path.join(STORIES, "hf"))
    case = reference()["cases"][-1]
    blocks = {}
    for kv in ("fp32", "fp16", "int8"):
        s = Server(os.path.join(STORIES, "hf"), tp=2, extra=["--kv-dtype", kv, "--max-kv-gb", "0.01"])
        try:
            r = s.client.completions.create(model="test-model", prompt=case["prompt_ids"], max_tokens=64,
                                            temperature=0, extra_body={"ignore_eos": True})
            blocks[kv] = sum(s.metric("tessera_kv_blocks", f'{{state="{st}"}}') for st in ("free", "used", "cached"))
            expected = s.post_raw("/detokenize", json.dumps({"tokens": case["greedy_ids"]}).encode())[1]
            assert r.choices[0].text == json.loads(expected)["prompt"], kv
        finally:
            s.stop()
    assert abs(blocks["fp16"] - 2 * blocks["fp32"]) <= 4, blocks  # the same bytes, whole blocks each
    assert abs(blocks["int8"] - blocks["fp32"] * 32 / 12) <= 4, blocks


def test_client_disconnect_mid_stream_frees_blocks(stories_server):
    # stories260K writes 400 tokens in ~50 ms, so the stream may well end before the close reaches
    # the server: either way the request ends (ok or aborted) and gives its blocks back.
    before = {o: metric_or_zero(stories_server, "tessera_requests_total", f'{{outcome="{o}"}}') for o in ("ok", "aborted")}
    req = urllib.request.Request(stories_server.base + "/v1/completions",
                                 data=json.dumps({"prompt": "Once", "max_tokens": 400, "stream": True,
                                                  "ignore_eos": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    r = urllib.request.urlopen(req, timeout=30)
    r.read(100)
    r.close()
    deadline = time.time() + 10
    ended = lambda: sum(metric_or_zero(stories_server, "tessera_requests_total", f'{{outcome="{o}"}}') - before[o]
                        for o in ("ok", "aborted"))
    while (ended() < 1 or stories_server.metric("tessera_kv_blocks", '{state="used"}') != 0) and time.time() < deadline:
        time.sleep(0.05)
    assert ended() == 1
    assert stories_server.metric("tessera_kv_blocks", '{state="used"}') == 0


def metric_or_zero(server, name, labels=""):
    try:
        return server.metric(name, labels)
    except KeyError:
        return 0.0


def test_client_disconnect_while_queued_aborts():
    """A client that leaves while its request waits is noticed at once (EPOLLRDHUP), not at the next
    write: the request is aborted and leaves the queue. --max-wait-ms holds a lone request back for
    a companion for a minute, so the close always comes first."""
    require_stories(os.path.join(STORIES, "hf"))
    s = Server(os.path.join(STORIES, "hf"), extra=["--max-batch", "4", "--max-wait-ms", "60000"])
    try:
        host, port = s.base[len("http://"):].split(":")
        body = json.dumps({"prompt": "Once", "max_tokens": 16, "stream": True}).encode()
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.time() + 10
        while s.metric("tessera_waiting") != 1 and time.time() < deadline:
            time.sleep(0.05)
        assert s.metric("tessera_waiting") == 1
        sock.close()
        deadline = time.time() + 10
        while metric_or_zero(s, "tessera_requests_total", '{outcome="aborted"}') < 1 and time.time() < deadline:
            time.sleep(0.05)
        assert metric_or_zero(s, "tessera_requests_total", '{outcome="aborted"}') == 1
        assert metric_or_zero(s, "tessera_requests_total", '{outcome="ok"}') == 0
        assert s.metric("tessera_waiting") == 0
        assert s.metric("tessera_kv_blocks", '{state="used"}') == 0
    finally:
        s.stop()


# ---- a synthetic model with a chat template, at TP 1 and 2 ----

def test_synthetic_completion_and_chat(synthetic_server):
    c = synthetic_server.client
    r = c.completions.create(model="test-model", prompt="Once upon a time", max_tokens=16, temperature=0,
                             extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16
    s = "".join(ch.choices[0].text for ch in c.completions.create(
        model="test-model", prompt="Once upon a time", max_tokens=16, temperature=0, stream=True,
        extra_body={"ignore_eos": True}) if ch.choices)
    assert s == r.choices[0].text
    chat = c.chat.completions.create(model="test-model", messages=[{"role": "system", "content": "Be brief."},
                                                                   {"role": "user", "content": "Hello!"}],
                                     max_tokens=8, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    chunks = list(c.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "Hello!"}],
                                            max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None


def test_synthetic_same_text_at_tp1_and_tp2(synthetic_model):
    outs = []
    for tp in (1, 2):
        s = Server(synthetic_model, tp=tp)
        try:
            outs.append(s.client.completions.create(model="test-model", prompt="Once upon a time", max_tokens=32,
                                                    temperature=0, extra_body={"ignore_eos": True}).choices[0].text)
        finally:
            s.stop()
    assert outs[0] == outs[1]


# ---- the real default model: Gemma 3 270M with the built-in chat template ----

@pytest.fixture(scope="module")
def gemma_server():
    if not os.path.isfile(DEFAULT_MODEL):
        pytest.skip(f"no default model at {DEFAULT_MODEL} (scripts/default_model.sh fetches it)")
    # No --model: the server finds the model through TESSERA_MODEL, as a user's shell would give it.
    s = Server(None, env={**os.environ, "TESSERA_MODEL": os.path.abspath(DEFAULT_MODEL)})
    yield s
    s.stop()


def test_default_model_chat_uses_the_builtin_gemma_template(gemma_server):
    _, body = gemma_server.get("/v1/models")
    assert json.loads(body)["data"][0]["chat_template"] == "builtin:gemma3"
    c = gemma_server.client
    chat = c.chat.completions.create(model="test-model",
                                     messages=[{"role": "system", "content": "Answer in one word."},
                                               {"role": "user", "content": "What is the capital of France?"}],
                                     max_tokens=24, temperature=0)
    choice = chat.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content.strip() != ""
    assert choice.finish_reason in ("stop", "length")
    assert "<end_of_turn>" not in choice.message.content
    _, info = gemma_server.get("/tokenizer_info")
    info = json.loads(info)
    assert info["chat_template"] == "builtin:gemma3"
    status, tokenized = gemma_server.post_raw("/tokenize", json.dumps(
        {"messages": [{"role": "user", "content": "Hi"}]}).encode())
    assert status == 200
    ids = json.loads(tokenized)["tokens"]
    assert ids[0] == info["bos_token_id"] and ids.count(info["bos_token_id"]) == 1


# ---- the window pool: Gemma 3's local layers hold only their window ----

def long_text(n_chars):
    """Real text written by people: the Python standard library's own sources."""
    import difflib
    import textwrap
    text = ""
    for mod in (textwrap, difflib):
        with open(mod.__file__) as f:
            text += f.read()
    return text[:n_chars]


def window_outputs(server, prompts, max_tokens=12):
    """Greedy completions of each prompt, all in flight together."""
    def one(p):
        r = server.client.completions.create(model="test-model", prompt=p, max_tokens=max_tokens, temperature=0,
                                             extra_body={"ignore_eos": True})
        return r.choices[0].text
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
        return list(ex.map(one, prompts))


def wait_for_window_blocks_free(server):
    deadline = time.time() + 10
    while server.metric("tessera_kv_window_blocks", '{state="used"}') != 0 and time.time() < deadline:
        time.sleep(0.05)
    assert server.metric("tessera_kv_window_blocks", '{state="used"}') == 0


@pytest.fixture(scope="module")
def gemma3_tiny_model():
    d = tempfile.mkdtemp(prefix="tessera_window_test_")
    out = os.path.join(d, "gemma3-tiny.gguf")
    subprocess.run([os.path.join(BIN, "tessera-make-model"), "--preset", "gemma3-tiny", "--format", "gguf",
                    "--type", "f32", "--out", out], check=True, capture_output=True)
    yield out


@pytest.mark.parametrize("tp", [1, 2])
def test_window_pool_gives_the_tokens_of_full_length_kv(gemma3_tiny_model, tp):
    # The synthetic Gemma 3 (window 8, 5 local layers to 1 global): prompts far past the window,
    # in chunks, several at once and sharing prefixes (prefix hits must find their window
    # blocks), with a small pool so that some are preempted and recomputed.
    prompts = [("the quick brown fox jumps over the lazy dog " * 9)[:300 + 37 * i] for i in range(3)]
    prompts += [prompts[0] + " and then", prompts[1][:200]]
    extra = ["--prefill-chunk", "48", "--max-batch", "4", "--max-step-tokens", "64", "--max-kv-gb", "0.002"]
    outs = {}
    for pool in ("on", "off"):
        s = Server(gemma3_tiny_model, extra=extra + ["--kv-window-pool", pool], tp=tp)
        try:
            outs[pool] = window_outputs(s, prompts) + window_outputs(s, prompts[:2])
            if pool == "on":
                assert s.metric("tessera_kv_window_tokens") == 8
                assert s.metric("tessera_kv_window_blocks", '{state="cached"}') > 0
                wait_for_window_blocks_free(s)
            else:
                try:
                    assert s.metric("tessera_kv_window_tokens") == 0
                except KeyError:
                    pass  # never set: no window pool
        finally:
            s.stop()
    assert outs["on"] == outs["off"]


def test_default_model_window_pool_long_context(gemma_server):
    # Gemma-3-270M, 15 of its 18 layers with a 512-token window: a prompt of about 1,500
    # tokens gives the same greedy tokens with and without the window pool.
    assert gemma_server.metric("tessera_kv_window_tokens") == 512
    prompt = long_text(5000)
    on = window_outputs(gemma_server, [prompt, prompt[:3000]], max_tokens=16)
    wait_for_window_blocks_free(gemma_server)
    off_server = Server(None, extra=["--kv-window-pool", "off"],
                        env={**os.environ, "TESSERA_MODEL": os.path.abspath(DEFAULT_MODEL)})
    try:
        off = window_outputs(off_server, [prompt, prompt[:3000]], max_tokens=16)
    finally:
        off_server.stop()
    assert on == off


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
