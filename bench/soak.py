#!/usr/bin/env python3
"""Soak benchmark: mixed traffic against one `tessera serve` for a long time, with a shard
SIGKILLed at a fixed interval. A reliability check, not CI.

    python3 bench/soak.py [--minutes 30] [--kill-every-s 300] [--tp 2] [--concurrency 8]
        [--model DIR_OR_GGUF] [--seed 1] [--out-prefix bench/results/soak-<cpu>] [--bin-dir build/bin]

Traffic: --concurrency client threads, closed loop with a short random think time, each
drawing from its own seeded generator: streaming and non-streaming /v1/completions and
/v1/chat/completions, prompts of 1..150 words, max_tokens 1..256 (clipped to the context),
some with n > 1, some with stop strings, some sampled, some streams the client drops after a
few events, some non-streaming requests abandoned before the answer, and a few malformed
requests (bad JSON, missing fields, wrong types, unknown model / path / method, too long).

Every request ends in exactly one outcome:
  completed              200 and a whole answer (non-streaming: JSON with n choices, each with
                         a finish_reason; streaming: every choice finished, then `data: [DONE]`)
  failed_with_error      an error the server sent: an HTTP error status with a JSON error body
                         (503 while the shards restart, 5xx for requests a dying shard held), or
                         a streamed `data: {"error": ...}` event followed by `data: [DONE]`
  lost                   no answer: connection refused / reset, a body or stream cut short with
                         neither an error event nor [DONE], a 200 with missing choices, or no
                         byte for --client-timeout seconds (a hang). Must be 0.
  disconnected_by_client the client dropped the connection on purpose
  rejected_as_expected   a malformed request answered with a 4xx (or 503 during a restart)
Anomalies (reported, not failures): a malformed request that got 2xx or a 5xx other than 503, a
well-formed one that got a 4xx, an error event without [DONE].

Every --kill-every-s seconds one shard process gets SIGKILL (ranks alternate). Recovery time =
from the kill until /health answers 200 {"status": "ok"} after tessera_shard_restarts_total
went up, and a probe completion succeeds. RSS (VmRSS) of every process under the server
(coordinator, mpirun, each shard of each generation) and the KV gauges from /metrics are sampled
every --sample-every-s seconds. At the end traffic stops, the in-flight requests finish, and
tessera_kv_blocks{state="used"} must read 0.

Writes PREFIX.json (everything), PREFIX.md (summary table), PREFIX-rss.png (RSS over time per
process, kills marked; used KV blocks and open requests below). The server's log goes to
--server-log (default: a file in bench/work/soak/, git-ignored; path in the JSON). Exits 1 when a request
was lost or used blocks != 0 at the end (or the server died / did not recover), else 0.
"""
import argparse
import collections
import datetime
import http.client
import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

from soak_report import classify_failure, cpu_line, plot, plot_title, write_md

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# stories260K from the reference test data (tests/data/): $TESSERA_TESTDATA, else the build's unpacked copy.
DEFAULT_MODEL = os.path.join(os.environ.get("TESSERA_TESTDATA") or os.path.join(ROOT, "build", "testdata"),
                             "stories260K", "hf")
DEFAULT_TEMPLATE = os.path.join(ROOT, "tests", "integration", "data", "stories_chat_template.jinja")

WORDS = ("once upon a time there was a little girl named lily she liked to play in the park with "
         "her dog max one day they found a big red ball under the tree and the sun was shining "
         "happy friends went home mom said tom bird cat jump run fast slow blue green flower "
         "garden sky water boat fish swim sing song cake eat share kind help").split()
STOPS = [".", " the", "\n", "!", " and", "ed", "Lily"]


# ---------------------------------------------------------------- machine

def cpu_info():
    info = {"model_name": "?", "vendor": "?", "family": None, "model": None, "nproc": os.cpu_count()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            k, v = k.strip(), v.strip()
            if k == "Model name":
                info["model_name"] = v
            elif k == "Vendor ID":
                info["vendor"] = v
            elif k == "CPU family":
                info["family"] = int(v)
            elif k == "Model":
                info["model"] = int(v)
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    if info["family"] is None:
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    k, _, v = line.partition(":")
                    k, v = k.strip(), v.strip()
                    if k == "model name" and info["model_name"] == "?":
                        info["model_name"] = v
                    elif k == "vendor_id":
                        info["vendor"] = v
                    elif k == "cpu family":
                        info["family"] = int(v)
                    elif k == "model":
                        info["model"] = int(v)
                    elif not line.strip():
                        break
        except OSError:
            pass
    info["tag"] = cpu_tag(info)
    return info


def cpu_tag(info):
    fam, mod, vendor = info.get("family"), info.get("model"), info.get("vendor", "")
    if vendor == "AuthenticAMD" and fam is not None and mod is not None:
        if fam == 23:
            return "zen2" if mod >= 0x30 else "zen1"
        if fam == 25:
            return "zen4" if (0x10 <= mod <= 0x1f or 0x60 <= mod <= 0xaf) else "zen3"
        if fam == 26:
            return "zen5"
        return f"amd-f{fam}m{mod}"
    if vendor == "GenuineIntel":
        return "intel"
    return re.sub(r"[^a-z0-9]+", "-", (info.get("model_name") or "cpu").lower()).strip("-") or "cpu"




# ---------------------------------------------------------------- processes

def proc_table():
    """pid -> (ppid, comm, state) for every process."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                s = f.read()
        except OSError:
            continue
        r = s.rfind(")")
        comm = s[s.find("(") + 1:r]
        fields = s[r + 2:].split()
        table[int(name)] = (int(fields[1]), comm, fields[0])
    return table


def descendants(root, table):
    kids = collections.defaultdict(list)
    for pid, (ppid, _, _) in table.items():
        kids[ppid].append(pid)
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        if p in table:
            out.append(p)
        todo.extend(kids.get(p, ()))
    return out


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
        return s[s.rfind(")") + 2] != "Z"
    except OSError:
        return False


def binaries(bin_dir):
    """mtime and sha256 of the programs the run starts (a rebuild during a run shows up here)."""
    import hashlib
    out = {}
    for name in ("tessera", "tessera-shard"):
        p = os.path.join(bin_dir, name)
        try:
            with open(p, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()[:16]
            mtime = datetime.datetime.fromtimestamp(os.stat(p).st_mtime, datetime.timezone.utc)
            out[name] = {"mtime": mtime.strftime("%Y-%m-%d %H:%M:%S UTC"), "sha256_16": digest}
        except OSError as e:
            out[name] = {"error": str(e)}
    return out


# ---------------------------------------------------------------- server

class Server:
    READY = re.compile(r"shard rank (\d+) ready: .*\(pid (\d+)\)")
    LISTEN = re.compile(r"listening on http://([^:/\s]+):(\d+)")

    def __init__(self, cmd, log_path):
        self.cmd = cmd
        self.log_path = log_path
        self.lock = threading.Lock()
        self.generation = 0          # shard group generation: 0 at start, +1 per restart
        self.starts = 0              # "starting shards" lines seen
        self.shards = {}             # pid -> (rank, generation)
        self.gen_ready_t = {}        # generation -> time its last shard reported ready
        self.notable = []            # restart / warning / error lines (capped)
        self.host = self.port = None
        self.listening = threading.Event()
        self.t0 = None
        self.proc = None

    def start(self, t0):
        self.t0 = t0
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=ROOT)
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()
        if not self.listening.wait(120):
            self.stop()
            raise RuntimeError(f"server did not print 'listening on' within 120 s; log: {self.log_path}")

    def _drain(self):
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            now = time.time() - self.t0
            self.log.write(f"[{now:9.3f}] {line}\n")
            self.log.flush()
            m = self.LISTEN.search(line)
            if m and not self.listening.is_set():
                self.host, self.port = m.group(1), int(m.group(2))
                self.listening.set()
            with self.lock:
                if "starting shards:" in line:
                    self.starts += 1
                    self.generation = self.starts - 1
                m = self.READY.search(line)
                if m:
                    self.shards[int(m.group(2))] = (int(m.group(1)), self.generation)
                    self.gen_ready_t[self.generation] = now
                low = line.lower()
                if (("restart" in low or "] e " in low or "] w " in low or "error" in low
                     or "signal" in low or "exited" in low) and len(self.notable) < 400):
                    self.notable.append(f"[{now:9.3f}] {line}")
        self.log.flush()

    def shard_pid(self, rank):
        """The live shard process of this rank in the newest generation."""
        with self.lock:
            cands = [(g, pid) for pid, (r, g) in self.shards.items() if r == rank and alive(pid)]
        if cands:
            return max(cands)[1], max(cands)[0]
        # fall back on the process tree (log format changed?)
        table = proc_table()
        shards = sorted(p for p in descendants(self.proc.pid, table) if table[p][1] == "tessera-shard")
        if len(shards) > rank:
            return shards[rank], None
        return None, None

    def stop(self, grace):
        """SIGINT the process group (drain), a second SIGINT, then SIGKILL. Returns (rc, seconds, how)."""
        t = time.time()
        how = "sigint"
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(grace + 10)
            except subprocess.TimeoutExpired:
                how = "second sigint"
                try:
                    os.killpg(self.proc.pid, signal.SIGINT)
                    self.proc.wait(15)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    how = "sigkill"
                    try:
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    self.proc.wait(15)
        self.reader.join(10)
        self.log.close()
        return self.proc.returncode, time.time() - t, how


# ---------------------------------------------------------------- HTTP

class Http:
    def __init__(self, host, port, timeout):
        self.host, self.port, self.timeout = host, port, timeout

    def conn(self, timeout=None):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def get(self, path, timeout=5.0):
        c = self.conn(timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def post_json(self, path, obj, timeout=None):
        c = self.conn(timeout)
        try:
            c.request("POST", path, body=json.dumps(obj), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def metrics(self, timeout=5.0):
        try:
            st, body = self.get("/metrics", timeout)
        except (OSError, http.client.HTTPException):
            return None
        if st != 200:
            return None
        out = {}
        for line in body.decode("utf-8", "replace").splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, val = line.rpartition(" ")
            try:
                out[name] = float(val)
            except ValueError:
                pass
        return out

    def health(self, timeout=2.0):
        try:
            st, body = self.get("/health", timeout)
            try:
                status = json.loads(body).get("status")
            except ValueError:
                status = None
            return st, status
        except (OSError, http.client.HTTPException):
            return None, None

    def probe(self, model, timeout=30.0):
        try:
            st, body = self.post_json("/v1/completions", {"model": model, "prompt": "Once upon a time",
                                                          "max_tokens": 4}, timeout)
            return st == 200 and bool(json.loads(body).get("choices"))
        except (OSError, http.client.HTTPException, ValueError):
            return False


USED = 'tessera_kv_blocks{state="used"}'


# ---------------------------------------------------------------- traffic

class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_kind = collections.defaultdict(collections.Counter)
        self.detail = collections.Counter()      # finer reason of each outcome
        self.records = []                        # (t_start, t_end, outcome, kind, reason) of errors
        self.lost = []
        self.anomalies = []
        self.error_samples = []
        self.tokens = 0
        self.durations = collections.defaultdict(list)

    def add(self, kind, outcome, reason, t0, t1, info=None, tokens=0):
        with self.lock:
            self.by_kind[kind][outcome] += 1
            self.detail[f"{outcome}:{reason}"] += 1
            self.tokens += tokens
            if outcome == "completed":
                self.durations[kind].append(t1 - t0)
            if outcome == "failed_with_error":
                self.records.append((t0, t1, kind, reason))
                if len(self.error_samples) < 60:
                    self.error_samples.append({"t": round(t0, 3), "t_end": round(t1, 3), "kind": kind,
                                               "reason": reason, "info": info})
            if outcome == "lost":
                self.lost.append({"t": round(t0, 3), "t_end": round(t1, 3), "kind": kind,
                                  "reason": reason, "info": info})

    def anomaly(self, kind, what, t, info=None):
        with self.lock:
            self.detail[f"anomaly:{what}"] += 1
            if len(self.anomalies) < 200:
                self.anomalies.append({"t": round(t, 3), "kind": kind, "what": what, "info": info})


def words(rng, n):
    s = " ".join(rng.choice(WORDS) for _ in range(n))
    return s[:1].upper() + s[1:]


def est_tokens(text):
    return len(text) // 2 + 4   # this vocabulary averages 2.5..2.9 characters a token


class Client(threading.Thread):
    # kind -> weight; chat kinds are dropped when the server has no chat template
    MIX = [("cmpl", 18), ("cmpl_stream", 18), ("chat", 10), ("chat_stream", 10),
           ("cmpl_n", 6), ("cmpl_stream_n", 6), ("chat_stream_n", 4),
           ("drop_stream", 8), ("abandon", 3), ("malformed", 6)]

    def __init__(self, idx, args, http_, stats, stop, t0, chat, model):
        super().__init__(daemon=True, name=f"client-{idx}")
        self.rng = random.Random(f"{args.seed}-{idx}")
        self.args, self.http, self.stats, self.stop, self.t0 = args, http_, stats, stop, t0
        self.model = model
        self.chat = chat
        mix = [(k, w) for k, w in self.MIX if chat or not k.startswith("chat")]
        self.kinds = [k for k, _ in mix]
        self.weights = [w for _, w in mix]

    def now(self):
        return time.time() - self.t0

    def run(self):
        while not self.stop.is_set():
            kind = self.rng.choices(self.kinds, self.weights)[0]
            try:
                if kind == "malformed":
                    self.malformed()
                else:
                    self.valid(kind)
            except Exception as e:  # a bug in this script must not pass as "lost"
                self.stats.anomaly(kind, "client_exception", self.now(), repr(e))
            think = self.rng.expovariate(1 / 0.05)
            self.stop.wait(min(think, 0.5))

    # -- well-formed requests
    def body(self, kind):
        rng = self.rng
        chat = kind.startswith("chat")
        stream = "stream" in kind
        body = {"model": self.model}
        nwords = int(min(150, max(1, rng.lognormvariate(3.0, 1.0))))
        if chat:
            msgs, text = [], ""
            turns = rng.choice([1, 1, 1, 3])
            for i in range(turns):
                role = "user" if i % 2 == 0 else "assistant"
                c = words(rng, max(1, nwords // turns))
                msgs.append({"role": role, "content": c})
                text += c
            body["messages"] = msgs
        else:
            text = words(rng, nwords)
            body["prompt"] = text
        n = 1
        if kind.endswith("_n"):
            n = rng.choice([2, 3, 4])
            body["n"] = n
        room = 512 - est_tokens(text) - 8
        want = rng.choice([rng.randint(1, 16), rng.randint(1, 64), rng.randint(1, 256)])
        mt = max(1, min(want, room))
        if rng.random() < 0.03:
            mt = None                       # server default: to the end of the context
        else:
            body["max_tokens"] = mt
        if rng.random() < 0.25:
            body["stop"] = rng.sample(STOPS, rng.choice([1, 2]))
        if rng.random() < 0.4:
            body["temperature"] = round(rng.uniform(0.2, 1.2), 2)
            if rng.random() < 0.5:
                body["top_p"] = round(rng.uniform(0.5, 1.0), 2)
        else:
            body["temperature"] = 0
        if rng.random() < 0.1:
            body["seed"] = rng.randint(0, 1 << 30)
        if stream:
            body["stream"] = True
        return body, n

    def valid(self, kind):
        base = kind
        if kind == "drop_stream":
            base = self.rng.choice(["cmpl_stream", "chat_stream"]) if self.chat else "cmpl_stream"
        elif kind == "abandon":
            base = self.rng.choice(["cmpl", "chat"]) if self.chat else "cmpl"
        path = "/v1/chat/completions" if base.startswith("chat") else "/v1/completions"
        body, n = self.body(base)
        stream = body.get("stream", False)
        drop_after = self.rng.randint(1, 12) if kind == "drop_stream" else None
        abandon_after = self.rng.uniform(0.0, 0.3) if kind == "abandon" else None
        t0 = self.now()
        c = self.http.conn()
        try:
            try:
                c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
                if abandon_after is not None:
                    time.sleep(abandon_after)
                    self.stats.add(kind, "disconnected_by_client", "abandoned", t0, self.now())
                    return
                r = c.getresponse()
            except socket.timeout:
                self.stats.add(kind, "lost", "timeout_before_response", t0, self.now())
                return
            except (OSError, http.client.HTTPException) as e:
                self.stats.add(kind, "lost", f"no_response:{type(e).__name__}", t0, self.now(), str(e))
                return
            if r.status != 200:
                self.error_status(kind, r, t0, drop_after is not None)
                return
            if stream:
                self.read_stream(kind, r, n, t0, drop_after)
            else:
                self.read_json(kind, r, n, t0)
        finally:
            c.close()

    def error_status(self, kind, r, t0, _drop):
        try:
            raw = r.read()
        except (OSError, http.client.HTTPException) as e:
            self.stats.add(kind, "lost", f"error_body_cut:{type(e).__name__}", t0, self.now(), r.status)
            return
        try:
            err = json.loads(raw).get("error")
        except ValueError:
            err = None
        if not err:
            self.stats.add(kind, "lost", f"status_{r.status}_without_json_error", t0, self.now(),
                           raw[:200].decode("utf-8", "replace"))
            return
        msg = err.get("message") if isinstance(err, dict) else str(err)
        if 400 <= r.status < 500:
            self.stats.anomaly(kind, f"valid_request_got_{r.status}", t0, msg)
        reason = "refused_503" if r.status == 503 else f"http_{r.status}"
        self.stats.add(kind, "failed_with_error", reason, t0, self.now(), f"{r.status}: {msg}")

    def read_json(self, kind, r, n, t0):
        try:
            raw = r.read()
        except socket.timeout:
            self.stats.add(kind, "lost", "timeout_reading_body", t0, self.now())
            return
        except (OSError, http.client.HTTPException) as e:
            self.stats.add(kind, "lost", f"body_cut:{type(e).__name__}", t0, self.now(), str(e))
            return
        try:
            obj = json.loads(raw)
        except ValueError:
            self.stats.add(kind, "lost", "body_not_json", t0, self.now(), raw[-200:].decode("utf-8", "replace"))
            return
        ch = obj.get("choices") or []
        idx = sorted(c.get("index", -1) for c in ch)
        if idx != list(range(n)) or any(c.get("finish_reason") not in ("stop", "length") for c in ch):
            self.stats.add(kind, "lost", "incomplete_choices", t0, self.now(), json.dumps(obj)[:300])
            return
        toks = (obj.get("usage") or {}).get("completion_tokens", 0)
        self.stats.add(kind, "completed", "ok", t0, self.now(), tokens=toks)

    def read_stream(self, kind, r, n, t0, drop_after):
        events = 0
        finished = set()
        error = None
        done = False
        limit = self.args.client_timeout
        try:
            while True:
                if self.now() - t0 > limit:
                    self.stats.add(kind, "lost", "stream_hang_total", t0, self.now(), events)
                    return
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                try:
                    ev = json.loads(data)
                except ValueError:
                    self.stats.anomaly(kind, "event_not_json", t0, data[:200].decode("utf-8", "replace"))
                    continue
                if "error" in ev:
                    error = ev["error"]
                    continue
                events += 1
                for c in ev.get("choices") or []:
                    if c.get("finish_reason") in ("stop", "length"):
                        finished.add(c.get("index"))
                if drop_after is not None and events >= drop_after:
                    self.stats.add(kind, "disconnected_by_client", "dropped_stream", t0, self.now(), tokens=events)
                    return
        except socket.timeout:
            self.stats.add(kind, "lost", "stream_hang_no_bytes", t0, self.now(), events)
            return
        except (OSError, http.client.HTTPException) as e:
            if error is not None:
                self.stats.anomaly(kind, "error_event_then_cut", t0, str(e))
                self.stats.add(kind, "failed_with_error", "stream_error_event", t0, self.now(), error)
            else:
                self.stats.add(kind, "lost", f"stream_cut:{type(e).__name__}", t0, self.now(),
                               f"{events} events; {e!r}")
            return
        if error is not None:
            if not done:
                self.stats.anomaly(kind, "error_event_without_done", t0, error)
            self.stats.add(kind, "failed_with_error", "stream_error_event", t0, self.now(), error)
            return
        if not done:
            self.stats.add(kind, "lost", "stream_ended_without_done", t0, self.now(), events)
            return
        if finished != set(range(n)):
            self.stats.add(kind, "lost", "stream_incomplete_choices", t0, self.now(),
                           f"finished {sorted(finished)} of n={n}")
            return
        self.stats.add(kind, "completed", "ok", t0, self.now(), tokens=events)

    # -- malformed requests
    def malformed(self):
        rng = self.rng
        variants = [
            ("POST", "/v1/completions", b'{"model": "m", "prompt": "Once upon', "bad_json"),
            ("POST", "/v1/completions", json.dumps({"model": self.model, "max_tokens": 4}).encode(), "no_prompt"),
            ("POST", "/v1/completions", json.dumps({"model": "no-such-model", "prompt": "hi",
                                                     "max_tokens": 4}).encode(), "unknown_model"),
            ("POST", "/v1/completions", json.dumps({"model": self.model, "prompt": "hi",
                                                     "max_tokens": -3}).encode(), "negative_max_tokens"),
            ("POST", "/v1/completions", json.dumps({"model": self.model, "prompt": words(rng, 60),
                                                     "max_tokens": 600}).encode(), "too_long"),
            ("POST", "/v1/completions", json.dumps({"model": self.model, "prompt": "hi", "n": 0,
                                                     "max_tokens": 4}).encode(), "n_zero"),
            ("POST", "/v1/completions", json.dumps({"model": self.model, "prompt": "hi",
                                                     "temperature": "hot"}).encode(), "temperature_string"),
            ("POST", "/v1/completions", json.dumps({"model": self.model, "prompt": "hi", "stop": 5,
                                                     "max_tokens": 4}).encode(), "stop_number"),
            ("POST", "/v1/completions", json.dumps([1, 2, 3]).encode(), "body_array"),
            ("POST", "/v1/completions", b"", "empty_body"),
            ("POST", "/v1/chat/completions", json.dumps({"model": self.model, "messages": "hello",
                                                          "max_tokens": 4}).encode(), "messages_string"),
            ("POST", "/v1/chat/completions", json.dumps({"model": self.model, "messages": [],
                                                          "stream": True}).encode(), "messages_empty"),
            ("POST", "/v1/chat/completions", json.dumps({"model": self.model, "messages": [
                {"role": "user", "content": 5}], "max_tokens": 4}).encode(), "content_number"),
            ("POST", "/v1/completions", json.dumps({"model": self.model, "prompt": "hi", "top_p": 7,
                                                     "stream": True}).encode(), "top_p_out_of_range"),
            ("GET", "/v1/completions", None, "wrong_method"),
            ("POST", "/v1/nonexistent", b"{}", "unknown_path"),
        ]
        method, path, body, what = rng.choice(variants)
        kind = f"malformed:{what}"
        t0 = self.now()
        c = self.http.conn()
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            c.request(method, path, body=body, headers=headers)
            r = c.getresponse()
            raw = r.read()
        except (OSError, http.client.HTTPException) as e:
            self.stats.add("malformed", "lost", f"no_response:{type(e).__name__}", t0, self.now(), f"{what}: {e}")
            return
        finally:
            c.close()
        st = r.status
        if 400 <= st < 500 or st == 503:
            self.stats.add("malformed", "rejected_as_expected", f"{what}:{st}", t0, self.now())
        else:
            self.stats.anomaly(kind, f"malformed_got_{st}", t0, raw[:200].decode("utf-8", "replace"))
            if st == 200:
                self.stats.add("malformed", "completed", f"{what}:{st}", t0, self.now())
            else:
                self.stats.add("malformed", "failed_with_error", f"{what}:{st}", t0, self.now(),
                               raw[:200].decode("utf-8", "replace"))


# ---------------------------------------------------------------- sampler and killer

class Sampler(threading.Thread):
    def __init__(self, server, http_, t0, every, stop):
        super().__init__(daemon=True, name="sampler")
        self.server, self.http, self.t0, self.every, self.stop = server, http_, t0, every, stop
        self.series = {}    # pid -> dict
        self.metrics = {"t": [], "used_blocks": [], "open_requests": [], "running": [], "restarts": []}
        self.mpirun_gen = {}

    def label(self, pid, comm, table):
        if pid == self.server.proc.pid:
            return {"role": "coordinator", "rank": None, "generation": None,
                    "label": f"coordinator (pid {pid})"}
        with self.server.lock:
            rg = self.server.shards.get(pid)
            gen = self.server.generation
        if comm == "tessera-shard":
            rank, g = rg if rg else (None, gen)
            r = "?" if rank is None else rank
            return {"role": "shard", "rank": rank, "generation": g, "label": f"shard {r} gen {g} (pid {pid})"}
        if comm in ("mpirun", "orterun", "prterun", "mpiexec"):
            g = self.mpirun_gen.setdefault(pid, gen)
            return {"role": "mpirun", "rank": None, "generation": g, "label": f"{comm} gen {g} (pid {pid})"}
        return {"role": comm, "rank": None, "generation": gen, "label": f"{comm} gen {gen} (pid {pid})"}

    def sample_once(self):
        t = round(time.time() - self.t0, 2)
        table = proc_table()
        for pid in descendants(self.server.proc.pid, table):
            kib = rss_kib(pid)
            if kib is None or table[pid][2] == "Z":
                continue
            s = self.series.get(pid)
            if s is None:
                s = self.label(pid, table[pid][1], table)
                s.update(pid=pid, comm=table[pid][1], t=[], rss_mib=[])
                self.series[pid] = s
            elif s["role"] == "shard" and s["rank"] is None:   # ready line came after the first sample
                with self.server.lock:
                    rg = self.server.shards.get(pid)
                if rg:
                    s["rank"], s["generation"] = rg
                    s["label"] = f"shard {rg[0]} gen {rg[1]} (pid {pid})"
            s["t"].append(t)
            s["rss_mib"].append(round(kib / 1024, 2))
        m = self.http.metrics(timeout=2.0)
        self.metrics["t"].append(t)
        for key, name in (("used_blocks", USED), ("open_requests", "tessera_open_requests"),
                          ("running", "tessera_running"), ("restarts", "tessera_shard_restarts_total")):
            self.metrics[key].append(None if m is None else m.get(name))

    def run(self):
        while not self.stop.is_set():
            t = time.time()
            try:
                self.sample_once()
            except Exception as e:  # never let the sampler die silently
                print(f"sampler: {e!r}", file=sys.stderr)
            self.stop.wait(max(0.0, self.every - (time.time() - t)))


class Killer(threading.Thread):
    def __init__(self, args, server, http_, t0, stop, model):
        super().__init__(daemon=True, name="killer")
        self.args, self.server, self.http, self.t0, self.stop, self.model = args, server, http_, t0, stop, model
        self.kills = []
        self.failed = False

    def now(self):
        return time.time() - self.t0

    def run(self):
        duration = self.args.minutes * 60
        k = 1
        while True:
            at = k * self.args.kill_every_s
            if at > duration - min(30, self.args.kill_every_s / 2):
                return
            if self.stop.wait(max(0.0, at - self.now())):
                return
            rank = (k - 1) % self.args.tp
            self.kill(k, rank, at)
            k += 1

    def kill(self, k, rank, scheduled):
        m = self.http.metrics() or {}
        restarts_before = m.get("tessera_shard_restarts_total", 0)
        pid, gen = self.server.shard_pid(rank)
        rec = {"n": k, "rank": rank, "pid": pid, "generation": gen, "restarts_before": restarts_before,
               "scheduled_t": scheduled}
        if pid is None:
            rec["error"] = "no shard process found"
            self.kills.append(rec)
            self.failed = True
            return
        t_kill = self.now()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            rec["error"] = "shard already gone"
        rec["t"] = round(t_kill, 3)
        print(f"[{t_kill:8.1f}s] kill #{k}: SIGKILL shard rank {rank} pid {pid} (generation {gen})", flush=True)
        t_detect = t_health = t_probe = None
        deadline = t_kill + self.args.recovery_timeout_s
        while self.now() < deadline:
            st, status = self.http.health()
            if st != 200 and t_detect is None:
                t_detect = self.now()
            if st == 200 and status == "ok":
                m = self.http.metrics() or {}
                if m.get("tessera_shard_restarts_total", 0) > restarts_before:
                    t_health = t_health or self.now()
                    if self.http.probe(self.model):
                        t_probe = self.now()
                        break
            time.sleep(0.05)
        if t_probe is None:
            rec["error"] = f"not recovered within {self.args.recovery_timeout_s} s"
            self.failed = True
            print(f"[{self.now():8.1f}s] kill #{k}: NOT recovered", flush=True)
        else:
            rec["recovery_s"] = round(t_probe - t_kill, 3)
            rec["health_ok_s"] = round(t_health - t_kill, 3)
            print(f"[{self.now():8.1f}s] kill #{k}: recovered in {t_probe - t_kill:.2f} s "
                  f"(/health ok after {t_health - t_kill:.2f} s)", flush=True)
        rec["detect_s"] = None if t_detect is None else round(t_detect - t_kill, 3)
        m = self.http.metrics() or {}
        rec["restarts_after"] = m.get("tessera_shard_restarts_total")
        time.sleep(0.5)
        with self.server.lock:
            rec["new_generation"] = self.server.generation
            rec["new_pids"] = sorted(p for p, (_, g) in self.server.shards.items() if g == self.server.generation)
        self.kills.append(rec)


# ---------------------------------------------------------------- main

def main():
    cpu = cpu_info()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--kill-every-s", type=float, default=300)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--model", default=os.environ.get("TESSERA_MODEL", DEFAULT_MODEL))
    ap.add_argument("--chat-template", default=DEFAULT_TEMPLATE if os.path.exists(DEFAULT_TEMPLATE) else None,
                    help="passed to the server (default: the stories test template, so chat traffic runs)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out-prefix", default=os.path.join(ROOT, "bench", "results", f"soak-{cpu['tag']}"))
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--client-timeout", type=float, default=120, help="seconds without a byte (or in all) = a hang = lost")
    ap.add_argument("--recovery-timeout-s", type=float, default=180)
    ap.add_argument("--sample-every-s", type=float, default=2.0)
    ap.add_argument("--shutdown-grace", type=float, default=30)
    ap.add_argument("--server-log", default=None)
    ap.add_argument("--server-arg", action="append", default=[], help="extra argument for tessera serve (repeatable)")
    ap.add_argument("--replot", metavar="JSON", help="only redraw PREFIX-rss.png from a result file")
    args = ap.parse_args()
    if args.replot:
        with open(args.replot) as f:
            res = json.load(f)
        png = res["files"]["png"] if not args.replot.endswith(".json") else args.replot[:-5] + "-rss.png"
        plot(png, res["rss"], res["metrics_series"], res["kills"], plot_title(res))
        print(f"wrote {png}")
        return

    prefix = args.out_prefix
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    files = {"json": prefix + ".json", "md": prefix + ".md", "png": prefix + "-rss.png"}
    log_path = args.server_log or os.path.join(
        HERE, "work", "soak", f"tessera-soak-{datetime.datetime.now():%Y%m%d-%H%M%S}.log")
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    model_name = "m"
    cmd = [os.path.join(args.bin_dir, "tessera"), "serve", "--model", args.model, "--port", "0",
           "--tp", str(args.tp), "--model-name", model_name, "--max-restarts", "1000",
           "--shutdown-grace", f"{args.shutdown_grace:g}"]
    if args.chat_template:
        cmd += ["--chat-template", args.chat_template]
    cmd += args.server_arg
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    print(f"CPU: {cpu_line(cpu)}")
    print(f"server: {shlex.join(cmd)}\nserver log: {log_path}", flush=True)

    bins_start = binaries(args.bin_dir)
    t0 = time.time()
    server = Server(cmd, log_path)
    server.start(t0)
    http_ = Http(server.host, server.port, args.client_timeout)
    for _ in range(600):
        st, status = http_.health()
        if st == 200 and status == "ok" and http_.probe(model_name):
            break
        time.sleep(0.1)
    else:
        server.stop(args.shutdown_grace)
        sys.exit("server never became healthy")
    chat = bool(args.chat_template)
    print(f"listening on {server.host}:{server.port}; chat {'on' if chat else 'off'}; "
          f"running {args.minutes:g} min", flush=True)

    stats = Stats()
    stop_traffic = threading.Event()
    stop_bg = threading.Event()
    sampler = Sampler(server, http_, t0, args.sample_every_s, stop_bg)
    killer = Killer(args, server, http_, t0, stop_bg, model_name)
    clients = [Client(i, args, http_, stats, stop_traffic, t0, chat, model_name) for i in range(args.concurrency)]
    notes = []
    server_died = False
    t_start = time.time()
    try:
        sampler.start()
        killer.start()
        for c in clients:
            c.start()
        end = t_start + args.minutes * 60
        last = 0
        while time.time() < end:
            time.sleep(min(5, max(0.05, end - time.time())))
            if server.proc.poll() is not None:
                server_died = True
                notes.append(f"the server exited with {server.proc.returncode} at {time.time() - t0:.1f} s")
                print(notes[-1], flush=True)
                break
            if time.time() - last >= 30:
                last = time.time()
                with stats.lock:
                    agg = collections.Counter()
                    for c in stats.by_kind.values():
                        agg.update(c)
                mu = sampler.metrics["used_blocks"][-1] if sampler.metrics["used_blocks"] else None
                print(f"[{time.time() - t0:8.1f}s] {dict(agg)} used_blocks={mu} kills={len(killer.kills)}", flush=True)
    except KeyboardInterrupt:
        notes.append("interrupted by the user")
    finally:
        stop_traffic.set()
        for c in clients:
            c.join(args.client_timeout + 15)
        stuck = [c.name for c in clients if c.is_alive()]
        if stuck:
            notes.append(f"client threads still running after the stop: {stuck}")
        # the killer may be measuring a recovery: let it finish
        killer.join(args.recovery_timeout_s + 10 if killer.is_alive() else 0)
        stop_bg.set()
        sampler.join(10)

    elapsed = time.time() - t_start
    final = {}
    if not server_died:
        # in-flight requests are finished client-side; wait for the server to agree
        for _ in range(600):
            m = http_.metrics() or {}
            if m.get("tessera_open_requests", 1) == 0:
                break
            time.sleep(0.1)
        time.sleep(1.0)
        m = http_.metrics() or {}
        final = {"open_requests": m.get("tessera_open_requests"), "used_blocks": m.get(USED),
                 "free_blocks": m.get('tessera_kv_blocks{state="free"}'),
                 "cached_blocks": m.get('tessera_kv_blocks{state="cached"}'),
                 "restarts_total": m.get("tessera_shard_restarts_total"),
                 "server_requests_total": {k.split('"')[1]: v for k, v in m.items()
                                           if k.startswith("tessera_requests_total{")}}
        print(f"final: {final}", flush=True)
        if final.get("used_blocks") not in (0, 0.0):
            # diagnostic only: does one more request (a scheduler step) bring the gauge to 0?
            ok = http_.probe(model_name)
            time.sleep(1.0)
            m2 = http_.metrics() or {}
            final["used_blocks_after_one_probe"] = m2.get(USED)
            final["probe_ok"] = ok
            notes.append(f"{final['used_blocks']} KV blocks used at the end with {final['open_requests']} open "
                         f"requests; after one more request: {final['used_blocks_after_one_probe']}")
    # seen processes, to find any left behind after the stop
    seen_pids = list(sampler.series)
    rc, shut_s, shut_how = server.stop(args.shutdown_grace)
    time.sleep(1.0)
    orphans = []
    for pid in seen_pids:
        if alive(pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cl = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                cl = "?"
            if "tessera" in cl or "mpirun" in cl:
                orphans.append({"pid": pid, "cmdline": cl[:200]})
                try:
                    os.kill(pid, signal.SIGKILL)   # ours: started by this run
                except ProcessLookupError:
                    pass
    if orphans:
        notes.append(f"{len(orphans)} process(es) of the server still alive after it exited (killed): {orphans}")

    # old generations that outlived their replacement
    lingering = []
    with server.lock:
        gen_ready = dict(server.gen_ready_t)
    for s in sampler.series.values():
        g = s.get("generation")
        if s["role"] in ("shard", "mpirun") and g is not None and (g + 1) in gen_ready and s["t"]:
            extra = s["t"][-1] - gen_ready[g + 1]
            if extra > args.sample_every_s * 2:
                lingering.append({"label": s["label"], "seconds_after_next_generation_ready": round(extra, 1)})
    if lingering:
        notes.append(f"processes of an old shard generation alive after the new one was ready: {lingering}")

    bins_end = binaries(args.bin_dir)
    if bins_end != bins_start:
        notes.append(f"the binaries changed during the run (a rebuild): restarted shards may run another "
                     f"build; at the start {bins_start}, at the end {bins_end}")

    agg = collections.Counter()
    for c in stats.by_kind.values():
        agg.update(c)
    totals = {k: agg.get(k, 0) for k in ("completed", "failed_with_error", "lost", "disconnected_by_client",
                                         "rejected_as_expected")}
    totals["issued"] = sum(agg.values())
    totals["anomalies"] = sum(v for k, v in stats.detail.items() if k.startswith("anomaly:"))
    fb = collections.Counter()        # when the failure happened, and how it was reported
    outside = 0
    for (a, b, kind, reason) in stats.records:
        when = classify_failure(a, b, killer.kills)
        how = "stream error event" if reason == "stream_error_event" else (
            "HTTP 503" if reason == "refused_503" else reason.replace("http_", "HTTP "))
        fb[f"{when.replace('_', ' ')}: {how}"] += 1
        if when == "outside_restart":
            outside += 1
    rss_summary = {}
    for s in sampler.series.values():
        if s["role"] == "coordinator" and s["rss_mib"]:
            rss_summary["coordinator"] = f"{s['rss_mib'][0]:.1f} -> {s['rss_mib'][-1]:.1f} (max {max(s['rss_mib']):.1f})"
    shard_max = collections.defaultdict(float)
    for s in sampler.series.values():
        if s["role"] == "shard" and s["rss_mib"]:
            shard_max[s["generation"]] = max(shard_max[s["generation"]], max(s["rss_mib"]))
    if shard_max:
        rss_summary["shards"] = ", ".join(f"g{g}: {v:.1f}" for g, v in sorted(shard_max.items(), key=lambda x: (x[0] is None, x[0])))

    used = final.get("used_blocks")
    res = {
        "kind": "soak",
        "cpu": cpu,
        "date": date,
        "command": shlex.join([os.path.relpath(sys.argv[0], ROOT) if os.path.isabs(sys.argv[0]) else sys.argv[0]]
                              + sys.argv[1:]),
        "server_command": shlex.join(cmd),
        "server_log": log_path,
        "binaries": bins_start,
        "config": {"minutes": args.minutes, "kill_every_s": args.kill_every_s, "tp": args.tp, "model": args.model,
                   "chat_template": args.chat_template, "concurrency": args.concurrency, "seed": args.seed,
                   "client_timeout_s": args.client_timeout, "sample_every_s": args.sample_every_s,
                   "mix": Client.MIX},
        "elapsed_s": round(elapsed, 1),
        "totals": totals,
        "tokens": stats.tokens,
        "failed_breakdown": dict(fb),
        "failed_breakdown_text": ", ".join(f"{k} {v}" for k, v in sorted(fb.items())) or "none",
        "errors_outside_restart_windows": outside,
        "outcomes_detail": dict(sorted(stats.detail.items())),
        "by_kind": {k: dict(v) for k, v in sorted(stats.by_kind.items())},
        "completed_latency_s": {k: {"n": len(v), "p50": round(sorted(v)[len(v) // 2], 3),
                                    "max": round(max(v), 3)} for k, v in sorted(stats.durations.items()) if v},
        "kills": killer.kills,
        "recovery_s": [k.get("recovery_s") for k in killer.kills],
        "final": final,
        "shutdown": {"exit_code": rc, "seconds": round(shut_s, 2), "how": shut_how, "orphans": orphans},
        "lingering_old_generation": lingering,
        "rss_summary": rss_summary,
        "rss": [{k: s[k] for k in ("label", "role", "rank", "generation", "pid", "comm", "t", "rss_mib")}
                for s in sampler.series.values()],
        "metrics_series": sampler.metrics,
        "lost_details": stats.lost,
        "error_samples": stats.error_samples,
        "anomaly_details": stats.anomalies,
        "server_notable_lines": server.notable,
        "notes": notes,
        "files": files,
    }
    res["pass"] = {"lost_zero": totals["lost"] == 0 and not server_died,
                   "blocks_zero": used is not None and used == 0,
                   "recovered": not killer.failed and all(k.get("recovery_s") is not None for k in killer.kills)}
    res["passed"] = all(res["pass"].values())
    with open(files["json"], "w") as f:
        json.dump(res, f, indent=1)
    write_md(files["md"], res)
    try:
        plot(files["png"], res["rss"], res["metrics_series"], res["kills"], plot_title(res))
    except ImportError as e:
        print(f"no plot ({e}); pip install matplotlib", file=sys.stderr)
    print(open(files["md"]).read())
    print(f"wrote {files['json']}, {files['md']}, {files['png']}")
    sys.exit(0 if res["passed"] else 1)


if __name__ == "__main__":
    main()
