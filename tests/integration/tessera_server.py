"""What the end-to-end tests share: a `tessera serve` process tree (Server), SSE reading, and
looks at the process table. Imported by test_openai_api.py, test_faults.py and the multi-host
test; the binaries come from TESSERA_BIN_DIR (the build under test: release or sanitizers)."""
import concurrent.futures
import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

import openai
import pytest

BIN = os.environ.get("TESSERA_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build/bin"))
# The reference test data (tests/data/README.md): $TESSERA_TESTDATA when set, else the copy the
# build unpacks from tests/data/*.tar.xz beside its binaries (<build>/bin/../testdata).
TESTDATA = os.environ.get("TESSERA_TESTDATA") or os.path.join(os.path.dirname(os.path.abspath(BIN)), "testdata")
STORIES = os.path.join(TESTDATA, "stories260K")
# The real default model (Gemma 3 270M, Q4_K_M): scripts/test.sh exports its path.
DEFAULT_MODEL = os.environ.get("TESSERA_DEFAULT_MODEL") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "../../models/gemma-3-270m-q4_k_m.gguf")
HERE = os.path.dirname(os.path.abspath(__file__))


def start_serving(cmd, env=None, timeout_s=120):
    """Starts a `tessera serve` / `launch` command line in a session of its own and reads its
    output until it says where it listens. Returns (process, log lines, (ip, port)); the caller
    keeps reading the output. Raises RuntimeError with the output when it exits or never says."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
    log = []
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        log.append(line)
        m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if m:
            return proc, log, (m.group(1), int(m.group(2)))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    raise RuntimeError("the server did not start:\n" + "".join(log))


class Server:
    def __init__(self, model, tp=1, extra=(), env=None):
        # model None: no --model, so the server takes the default model (TESSERA_MODEL, models/...).
        model_args = [] if model is None else ["--model", model]
        self.cmd = [os.path.join(BIN, "tessera"), "serve", *model_args, "--port", "0", "--tp", str(tp),
                    "--model-name", "test-model", *extra]
        self.proc, self.log, (ip, port) = start_serving(self.cmd, env)
        self.base = f"http://{ip}:{port}"
        # Keep draining the output so the server never blocks on a full pipe.
        self._drain = concurrent.futures.ThreadPoolExecutor(1).submit(self._read_rest)
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0, timeout=120)

    def _read_rest(self):
        for line in self.proc.stdout:
            self.log.append(line)

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=30) as r:
            return r.status, r.read().decode()

    def post_raw(self, path, body, content_type="application/json"):
        req = urllib.request.Request(self.base + path, data=body, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name, labels=""):
        _, text = self.get("/metrics")
        for line in text.splitlines():
            if line.startswith(name + labels + " ") or (not labels and line.startswith(name + " ")):
                return float(line.split()[-1])
        raise KeyError(name + labels)

    def stop(self):
        if self.proc.poll() is None:
            # The first signal drains (requests in flight may finish), a second ends them at once.
            for sig, wait in ((signal.SIGINT, 10), (signal.SIGINT, 10), (signal.SIGKILL, None)):
                os.killpg(self.proc.pid, sig)
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    pass


def missing_testdata(path):
    """The failure message for a missing test-data file: names it and where the folder comes from."""
    env = os.environ.get("TESSERA_TESTDATA")
    origin = f"$TESSERA_TESTDATA={env}" if env else \
        "the build unpacks it from tests/data/*.tar.xz: target tessera_testdata"
    return f"missing test data: {path} ({origin})"


def require_stories(*paths):
    """Fails the calling test (or fixture) when stories260K's reference.json or one of `paths` is
    missing, naming the file: the data is part of the repository, so its absence is a failure."""
    for path in (os.path.join(STORIES, "reference.json"), *paths):
        if not os.path.exists(path):
            pytest.fail(missing_testdata(path), pytrace=False)


def sse_events(base, body, started=None):
    """POSTs a streaming completion and returns its SSE data lines; calls `started` at the first."""
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    events = []
    try:
        r = urllib.request.urlopen(req, timeout=60)
    except urllib.error.HTTPError as e:  # refused before it was taken
        return [f"HTTP {e.code}", e.read().decode()]
    except urllib.error.URLError as e:  # came after the server closed its port
        return ["HTTP refused", str(e)]
    with r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: "):
                events.append(line[6:])
                if started is not None and len(events) == 1:
                    started()
    return events


def proc_stat(path):
    """The fields of a /proc stat file after the command name (fields[0]: the state, "Z" a
    zombie; [1]: the parent; [11], [12]: user and system clock ticks), or None when it is gone.
    `path`: "PID" or "PID/task/TID"."""
    try:
        with open(f"/proc/{path}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()


def child_processes(pid):
    """(pid, state) of every process whose parent is `pid` ("Z": a zombie)."""
    out = []
    for d in os.listdir("/proc"):
        fields = proc_stat(d) if d.isdigit() else None
        if fields is not None and int(fields[1]) == pid:
            out.append((int(d), fields[0]))
    return out


def health(server):
    try:
        return json.loads(server.get("/health")[1])
    except urllib.error.HTTPError as e:
        return json.loads(e.read().decode())


def shard_pids(server, rank):
    return [int(p) for p in re.findall(rf"shard rank {rank} ready: .*\(pid (\d+)\)", "".join(server.log))]
