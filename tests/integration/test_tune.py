"""`tessera tune` end to end, as a user runs it: `tune trace` writes a deterministic request
trace; `tessera serve --step-log` records the engine's steps on stories260K and `tune calibrate`
fits the step-time model on them (stored per card and TP); `tune simulate` runs one setting on
the simulator; `tessera tune` picks a scheduler profile for a named shape on a card preset, and
`serve --scheduler-config` takes its block size and knobs; `serve --block-size auto` chooses a
block for an expected length mix and says why in /metrics; `tune --verify` runs the
recommendation and the built-in profiles on the real engine.

Run by CTest as `tune_cli` (tests/integration/CMakeLists.txt) through run_pytest.sh. The tests
that serve a model read stories260K from the reference test data and fail without it.
"""
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from tessera_server import BIN, STORIES, require_stories, start_serving

TESSERA = os.path.join(BIN, "tessera")
MODEL = os.path.join(STORIES, "stories260K-f32.gguf")
# One thread per shard and no drafts: steps the step model can fit, and room for the test's own
# threads on a 2-core machine.
QUIET = ["--threads", "1", "--speculation", "off"]
STEP_KEYS = ("tokens", "sequences", "context_tokens", "attention_pairs", "blocks", "run_s", "block_size")
COEFFICIENTS = ("fixed_s", "weight_floor_s", "per_token_s", "per_sequence_s", "per_context_token_s",
                "per_attention_pair_s", "per_block_s")


def run(args, timeout=120):
    """Runs `tessera ARGS` in a session of its own; returns (exit status, stdout + stderr). A
    command that is still running at the timeout (a server that should have refused to start)
    is killed with its process group and reported as such."""
    proc = subprocess.Popen([TESSERA, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"`tessera {' '.join(args)}` still running after {timeout} s:\n{out}")
    return proc.returncode, out


def stop(proc):
    if proc.poll() is None:
        for sig, wait in ((signal.SIGINT, 20), (signal.SIGKILL, None)):
            os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                pass


def need_stories():
    require_stories(MODEL)


class Serving:
    """`tessera serve --model stories260K ARGS` on an ephemeral port, healthy; its output is
    drained into `log`."""

    def __init__(self, args):
        cmd = [TESSERA, "serve", "--model", MODEL, "--port", "0", "--model-name", "test-model", *args]
        self.proc, self.log, (ip, port) = start_serving(cmd, timeout_s=120)
        self.base = f"http://{ip}:{port}"
        self._drain = threading.Thread(target=self._read_rest, daemon=True)
        self._drain.start()
        deadline, status = time.time() + 60, None
        while time.time() < deadline and status != "ok" and self.proc.poll() is None:
            try:
                status = json.loads(self.get("/health")).get("status")
            except (urllib.error.URLError, ConnectionError, ValueError):
                time.sleep(0.2)
        if status != "ok":
            self.stop()
            raise AssertionError(f"not healthy ({status}):\n{self.output()}")

    def _read_rest(self):
        for line in self.proc.stdout:
            self.log.append(line)

    def output(self):
        return "".join(self.log)

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=30) as r:
            return r.read().decode()

    def complete(self, prompt_ids, max_tokens):
        body = json.dumps({"model": "test-model", "prompt": prompt_ids, "max_tokens": max_tokens, "ignore_eos": True,
                           "temperature": 0}).encode()
        req = urllib.request.Request(self.base + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read().decode())

    def stop(self):
        stop(self.proc)
        self._drain.join(timeout=10)


@contextlib.contextmanager
def serving(args):
    s = Serving(args)
    try:
        yield s
    finally:
        s.stop()


def metric_lines(text, name):
    return [line for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " ")]


def block_size_metric(text):
    """(source, reason, value) of the tessera_kv_block_size_choice gauge."""
    lines = metric_lines(text, "tessera_kv_block_size_choice")
    assert len(lines) == 1, text
    m = re.fullmatch(r'tessera_kv_block_size_choice\{source="([^"]*)",reason="((?:[^"\\]|\\.)*)"\} (\d+)', lines[0])
    assert m, lines[0]
    return m.group(1), m.group(2), int(m.group(3))


def prompt(n, salt=0):
    """n token ids of stories260K's 512 (none of them special)."""
    return [(7 * i + 13 * salt) % 500 + 3 for i in range(n)]


# ---- tune trace ----

def test_trace_is_generated_deterministically_and_bad_specs_are_refused(tmp_path):
    first, second = str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
    args = ["tune", "trace", "--lengths", "chat", "--rate", "5", "-n", "50", "--seed", "3"]
    rc, out = run([*args, "--out", first])
    assert rc == 0, out
    with open(first) as f:
        rows = [json.loads(line) for line in f.read().splitlines()]
    assert len(rows) == 50
    arrivals = [r["arrival_s"] for r in rows]
    assert arrivals[0] >= 0
    assert all(a < b for a, b in zip(arrivals, arrivals[1:])), arrivals
    # 50 Poisson arrivals at 5 / s: about 10 s; far outside means the rate was not applied.
    assert 4 < arrivals[-1] < 25, arrivals[-1]
    for r in rows:
        assert isinstance(r["prompt_tokens"], int) and r["prompt_tokens"] >= 1, r
        assert isinstance(r["output_tokens"], int) and r["output_tokens"] >= 1, r
    assert len({r["prompt_tokens"] for r in rows}) > 10, rows  # a mix, not one length

    rc, out = run([*args, "--out", second])
    assert rc == 0, out
    with open(first, "rb") as a, open(second, "rb") as b:
        assert a.read() == b.read()
    rc, out = run(["tune", "trace", "--lengths", "chat", "--rate", "5", "-n", "50", "--seed", "4",
                   "--out", second])
    assert rc == 0, out
    with open(first, "rb") as a, open(second, "rb") as b:
        assert a.read() != b.read()

    rc, out = run(["tune", "trace", "--lengths", "nonsense", "--rate", "5", "--out", str(tmp_path / "c.jsonl")])
    assert rc != 0, out
    assert "'nonsense'" in out, out
    rc, out = run(["tune", "trace", "--lengths", "chat", "--rate", "5", "--arrivals", "bursty:0.5",
                   "--out", str(tmp_path / "d.jsonl")])
    assert rc != 0, out
    assert "bursty:0.5" in out and "> 1" in out, out
    assert not os.path.exists(tmp_path / "c.jsonl") and not os.path.exists(tmp_path / "d.jsonl")


# ---- serve --step-log, tune calibrate ----

@pytest.fixture(scope="module")
def step_log(tmp_path_factory):
    """A step log of stories260K serving 12 requests: three alone (one-sequence decode steps),
    then nine at once (prefills and decodes of several sequences in a step)."""
    need_stories()
    path = str(tmp_path_factory.mktemp("steplog") / "steps.jsonl")
    with serving(["--step-log", path, *QUIET]) as s:
        # Distinct prompts (no prefix-cache hits), so every prompt token is computed in a step.
        for salt, (n, max_tokens) in enumerate(((4, 16), (60, 24), (200, 16)), start=100):
            r = s.complete(prompt(n, salt), max_tokens)
            assert r["usage"]["completion_tokens"] == max_tokens, r
        lengths = [(8, 40), (24, 12), (48, 30), (96, 20), (150, 36), (230, 24), (300, 40), (12, 28), (70, 16)]
        with concurrent.futures.ThreadPoolExecutor(len(lengths)) as pool:
            futures = [pool.submit(s.complete, prompt(n, salt=i + 1), m) for i, (n, m) in enumerate(lengths)]
            for f, (_, m) in zip(futures, lengths):
                assert f.result()["usage"]["completion_tokens"] == m
        assert any("step log" in line for line in s.log), s.output()
    return path


def test_step_log_has_one_json_line_per_step(step_log):
    with open(step_log) as f:
        lines = f.read().splitlines()
    steps = [json.loads(line) for line in lines]
    assert len(steps) >= 12, lines
    for st in steps:
        for key in STEP_KEYS:
            assert key in st, st
        assert st["block_size"] == 16, st  # the default
        # A plan with no tokens only tells the shards which sequences finished.
        assert st["run_s"] > 0 and (st["tokens"] == 0 or st["sequences"] >= 1), st
        assert st["context_tokens"] >= st["tokens"] and st["blocks"] >= st["sequences"], st
    prefill = [st for st in steps if st["tokens"] > 1]
    decode = [st for st in steps if st["tokens"] == 1]
    assert prefill and decode, steps
    assert max(st["tokens"] for st in steps) >= 200  # the 200-token prompt, in one piece or a batch
    assert max(st["sequences"] for st in steps) >= 2  # the concurrent requests shared steps
    # Every request's tokens went through a step: 12 prompts and their outputs (the first token
    # comes from the prefill step).
    prompt_tokens = 4 + 60 + 200 + 8 + 24 + 48 + 96 + 150 + 230 + 300 + 12 + 70
    output_tokens = 16 + 24 + 16 + 40 + 12 + 30 + 20 + 36 + 24 + 40 + 28 + 16
    # (a BOS the server might add is one token a request either way)
    assert abs(sum(st["tokens"] for st in steps) - (prompt_tokens + output_tokens - 12)) <= 12
    assert all(st["preemptions"] == 0 for st in steps), steps  # a 2 GiB pool never runs out here


def test_step_log_counts_the_preemptions_that_metrics_counts(tmp_path):
    """A pool of a few blocks and eight requests at once: sequences are preempted, and the step
    log's running count ends where /metrics' counter does (what the simulator is compared with)."""
    need_stories()
    path = str(tmp_path / "steps.jsonl")
    # stories260K keeps 2.5 KiB of fp32 KV per token: 0.0004 GiB is ~160 tokens, ~2 requests' worth.
    with serving(["--step-log", path, "--max-kv-gb", "0.0004", *QUIET]) as s:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(s.complete, prompt(40, salt=200 + i), 32) for i in range(8)]
            for f in futures:
                assert f.result()["usage"]["completion_tokens"] == 32
        metrics = s.get("/metrics")
    total = metric_lines(metrics, "tessera_preemptions_total")
    assert len(total) == 1, metrics
    preempted = int(float(total[0].split()[-1]))
    assert preempted > 0, metrics
    with open(path) as f:
        counts = [json.loads(line)["preemptions"] for line in f.read().splitlines()]
    assert counts == sorted(counts) and counts[-1] == preempted, counts


@pytest.fixture(scope="module")
def store(step_log, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("store") / "stories.steps.json")
    rc, out = run(["tune", "calibrate", "--model", MODEL, "--card", "cpu", "--step-log", step_log, "--out", path])
    assert rc == 0, out
    assert f"stored in {path}" in out, out
    return path


def load_models(path):
    with open(path) as f:
        return json.load(f)["models"]


def test_calibrate_fits_and_stores_the_step_model(store):
    models = load_models(store)
    assert len(models) == 1, models
    m = models[0]
    assert m["card"] == "cpu" and m["tp"] == 1, m
    assert m["model"] == os.path.basename(MODEL), m
    for key in COEFFICIENTS:
        assert m[key] >= 0, (key, m)
    assert any(m[key] > 0 for key in COEFFICIENTS), m
    assert m["fitted_steps"] >= 8, m
    assert m["source"].startswith("fitted"), m


def test_calibrate_keeps_other_entries_of_the_store(store, step_log, tmp_path):
    both = str(tmp_path / "both.steps.json")
    shutil.copyfile(store, both)
    rc, out = run(["tune", "calibrate", "--model", MODEL, "--card", "cpu", "--tp", "2", "--step-log", step_log,
                   "--out", both])
    assert rc == 0, out
    models = load_models(both)
    assert sorted((m["card"], m["tp"]) for m in models) == [("cpu", 1), ("cpu", 2)], models
    assert next(m for m in models if m["tp"] == 1) == load_models(store)[0]
    # Calibrating the same card and TP again replaces its entry.
    rc, out = run(["tune", "calibrate", "--model", MODEL, "--card", "cpu", "--tp", "2", "--step-log", step_log,
                   "--out", both])
    assert rc == 0, out
    assert len(load_models(both)) == 2


def test_calibrate_measures_the_block_term_apart(step_log, tmp_path):
    # A one-layer model with 2048 positions (stories260K's 512 are too few to tell blocks of 16 from
    # blocks of 256): decode steps at both sizes, alternating; the block term is taken from them.
    small = str(tmp_path / "small.gguf")
    subprocess.run([os.path.join(BIN, "tessera-make-model"), "--format", "gguf", "--type", "f32", "--out", small,
                    "--preset", "110m", "--layers", "1", "--hidden", "256", "--heads", "4", "--kv-heads", "4",
                    "--ffn", "512", "--vocab", "512"], check=True, capture_output=True)
    path = str(tmp_path / "small.steps.json")
    rc, out = run(["tune", "calibrate", "--model", small, "--card", "cpu", "--step-log", step_log, "--out", path,
                   "--block-context", "1024", "--threads", "1"])
    assert rc == 0, out
    assert len(re.findall(r"round \d: 1024-token context, 8 sequences: block 16 [\d.]+ ms, block 256 [\d.]+ ms",
                          out)) == 3, out
    m = load_models(path)[0]
    assert "measured apart" in m["source"], m
    assert m["per_block_s"] >= 0, m
    # Off: the block term comes from the logs (as with stories260K, whose context is too short).
    rc, out = run(["tune", "calibrate", "--model", small, "--card", "cpu", "--step-log", step_log, "--out", path,
                   "--measure-blocks", "off"])
    assert rc == 0, out
    assert "measured apart" not in load_models(path)[0]["source"]


def test_calibrate_says_why_it_cannot_measure_blocks(store, step_log, tmp_path):
    assert "measured apart" not in load_models(store)[0]["source"]
    rc, out = run(["tune", "calibrate", "--model", MODEL, "--card", "cpu", "--step-log", step_log,
                   "--out", str(tmp_path / "x.json"), "--measure-blocks", "on"])
    assert rc != 0, out
    assert "512 positions" in out, out
    rc, out = run(["tune", "calibrate", "--model", "llama-2-70b", "--precision", "INT4", "--card", "A100-80GB",
                   "--step-log", step_log, "--out", str(tmp_path / "y.json"), "--measure-blocks", "on"])
    assert rc != 0, out
    assert "--card cpu" in out, out


def test_calibrate_refuses_a_step_log_that_is_not_json(step_log, tmp_path):
    bad = str(tmp_path / "bad.jsonl")
    with open(step_log) as f:
        first = f.readline()
    with open(bad, "w") as f:
        f.write(first + "this is not a step\n")
    out_store = str(tmp_path / "none.steps.json")
    rc, out = run(["tune", "calibrate", "--model", MODEL, "--card", "cpu", "--step-log", bad, "--out", out_store])
    assert rc != 0, out
    assert f"{bad}:2" in out, out
    assert not os.path.exists(out_store)


# ---- tune simulate ----

def test_simulate_runs_a_chat_trace_on_the_fitted_model(store, tmp_path):
    j = str(tmp_path / "sim.json")
    rc, out = run(["tune", "simulate", "--model", MODEL, "--card", "cpu", "--step-models", store, "--lengths", "chat",
                   "--rate", "2", "-n", "200", "--json", j])
    assert rc == 0, out
    assert "simulated" in out, out
    with open(j) as f:
        r = json.load(f)
    assert r["completed"] == 200 and r["failed"] == 0, r
    assert r["ttft_p99_s"] >= r["ttft_p50_s"] > 0, r
    assert r["step_model"]["source"].startswith("fitted"), r  # the store's model, not the prior
    assert r["block_size"] == 16 and r["kv_blocks"] > 0, r


# ---- tessera tune on a card preset; serve --scheduler-config with its profile ----

@pytest.fixture(scope="module")
def tuned_70b(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune70b")
    profile, table = str(d / "P.json"), str(d / "TAB.md")
    rc, out = run(["tune", "--model", "llama-2-70b", "--precision", "INT4", "--card", "A100-80GB", "--kv-dtype", "fp16",
                   "--lengths", "chat", "--rate", "3", "-n", "300", "--slo", "ttft_p99=500ms,itl_p99=200ms", "--quick",
                   "--out", profile, "--table", table], timeout=300)
    return rc, out, profile, table


def test_tune_recommends_a_profile_for_a_named_shape(tuned_70b):
    rc, out, profile, table = tuned_70b
    assert rc == 0, out
    assert "recommended" in out, out
    assert f"wrote {profile}" in out, out
    with open(profile) as f:
        p = json.load(f)
    for key in ("block_size", "max_batch", "max_step_tokens", "max_wait_ms", "prefill_chunk"):
        assert key in p, p
    assert p["block_size"] in (16, 64), p  # --quick's block sizes
    assert p["max_batch"] in (8, 32), p
    assert p["max_step_tokens"] in (512, 2048), p
    with open(table) as f:
        md = f.read()
    assert md.count("\n|") >= 3, md


def test_serve_takes_the_tuned_profile(tuned_70b):
    need_stories()
    rc, out, profile, _ = tuned_70b
    assert rc == 0, out
    with open(profile) as f:
        p = json.load(f)
    with serving(["--scheduler-config", profile, *QUIET]) as s:
        metrics = s.get("/metrics")
        source, _, block = block_size_metric(metrics)
        assert source == "scheduler-config", metrics
        assert block == p["block_size"], (block, p)
        batch = metric_lines(metrics, "tessera_scheduler_max_batch")
        assert len(batch) == 1 and float(batch[0].split()[-1]) == p["max_batch"], (batch, p)
        assert s.complete(prompt(20), 8)["usage"]["completion_tokens"] == 8
    # An explicit --block-size wins over the profile's.
    with serving(["--scheduler-config", profile, "--block-size", "32", *QUIET]) as s:
        assert block_size_metric(s.get("/metrics"))[::2] == ("flag", 32)


def test_a_scheduler_config_with_a_bad_block_size_is_refused(tmp_path):
    need_stories()
    bad = str(tmp_path / "bad.json")
    with open(bad, "w") as f:
        json.dump({"profile": "interactive", "max_batch": 8, "block_size": 8}, f)
    rc, out = run(["serve", "--model", MODEL, "--scheduler-config", bad, "--port", "0", *QUIET], timeout=60)
    assert rc != 0, out
    assert "block_size" in out and "16..1024" in out, out
    assert "listening on" not in out, out


# ---- serve --block-size auto ----

def auto_block_size(lengths):
    with serving(["--block-size", "auto", "--expected-lengths", lengths, *QUIET]) as s:
        metrics = s.get("/metrics")
        source, reason, block = block_size_metric(metrics)
        assert source == "auto", metrics
        m = re.match(r"block size (\d+) ", reason)
        assert m and int(m.group(1)) == block, reason
        assert f"--expected-lengths {lengths}" in reason, reason
        assert s.complete(prompt(20), 8)["usage"]["completion_tokens"] == 8
        return block


def test_block_size_auto_follows_the_expected_lengths():
    need_stories()
    chat = auto_block_size("chat")
    docs = auto_block_size("docs")
    print(f"--block-size auto: chat {chat}, docs {docs}")
    assert 16 <= chat <= docs <= 1024, (chat, docs)


def test_bad_block_sizes_are_refused():
    need_stories()
    rc, out = run(["serve", "--model", MODEL, "--block-size", "7", "--port", "0", *QUIET], timeout=60)
    assert rc != 0, out
    assert "16..1024" in out, out
    rc, out = run(["serve", "--model", MODEL, "--block-size", "abc", "--port", "0", *QUIET], timeout=60)
    assert rc != 0, out
    assert "'abc'" in out, out
    rc, out = run(["serve", "--model", MODEL, "--block-size", "auto", "--expected-lengths", "nonsense", "--port", "0",
                   *QUIET], timeout=60)
    assert rc != 0, out
    assert "'nonsense'" in out, out
    assert "listening on" not in out, out


# ---- tessera tune --verify on the real engine ----

def test_tune_verifies_on_the_real_engine(store, tmp_path):
    profile = str(tmp_path / "P2.json")
    # Lengths that fit stories260K's 512-token context.
    rc, out = run(["tune", "--model", MODEL, "--card", "cpu", "--step-models", store, "--lengths",
                   "lognormal:60,0.5/lognormal:24,0.5", "--rate", "3",
                   "-n", "40", "--slo", "ttft_p99=2s", "--quick", "--out", profile, "--verify", "--verify-top", "1",
                   "--serve-arg=--threads=1", "--serve-arg=--speculation=off"], timeout=420)
    assert rc == 0, out
    assert os.path.exists(profile), out
    assert "verify on the real engine: 40 held-out requests, 3 settings" in out, out
    table = out[out.index("verify on the real engine"):]
    for name in ("recommended", "interactive", "offline"):
        assert re.search(rf"^{name}: ", table, re.M), table
    with open(profile + ".verify/verify.json") as f:
        runs = json.load(f)
    assert [r["name"] for r in runs] == ["recommended", "interactive", "offline"], runs
    for r in runs:
        assert r["real"]["completed"] == 40 and r["real"]["failed"] == 0, r
        assert r["simulated"]["completed"] == 40, r
    # The verifying servers had the flags passed through.
    with open(profile + ".verify/recommended.log") as f:
        log = f.read()
    assert "listening on" in log, log
