"""`tessera launch` across two hosts that are network namespaces on this machine.

hostA and hostB are two network namespaces joined by a veth pair (TCP between them), each
process tree in one with a UTS namespace of its own (its own host name, so Tessera and Open MPI
see two machines) and an /etc/netns/<ns>/hosts that names both hosts. The coordinator runs on
hostA; mpirun starts shard rank 0 there and reaches hostB through
tests/integration/netns_agent.sh, its launch agent in place of ssh. The tests check that rank 1
really runs on hostB, that the greedy ids equal a TP 1 server's and the llama2.c reference, and
that a shard killed on hostB mid-stream is recovered from (the stream ends with an error event,
the group is restarted through mpirun and the agent again, /health goes restarting -> ok).

Needs root and iproute2 (namespaces) and mpirun; skipped otherwise (under CTest with exit code
77: TESSERA_SKIP_EXIT_CODE). The client talks to hostA from a thread that enters hostA's
network namespace for the connect (setns) only.
"""
import concurrent.futures
import contextlib
import ctypes
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time

import pytest

from tessera_server import BIN, STORIES, proc_stat, require_stories, start_serving

AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns_agent.sh")

HOST_NAMES = ("hostA", "hostB")
ADDRESSES = ("10.231.0.1", "10.231.0.2")  # private to the two namespaces: no route leaves them
SUBNET = "10.231.0.0/24"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def skip(reason):
    code = os.environ.get("TESSERA_SKIP_EXIT_CODE")
    if code:
        pytest.exit("SKIP: " + reason, returncode=int(code))
    pytest.skip(reason)


def unavailable():
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "unshare", "mpirun"):
        if shutil.which(tool) is None:
            return f"no '{tool}' on PATH"
    return None


def run(*argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


@contextlib.contextmanager
def in_netns(path):
    """Sockets created in the block belong to the network namespace at `path` (this thread
    only; a socket keeps its namespace after the block)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
        yield
    finally:
        back = _libc.setns(home, CLONE_NEWNET)
        os.close(home)
        os.close(target)
        assert back == 0, "cannot return to the test's network namespace"


def process_state(pid):
    """The state letter of `pid` ("Z": a zombie), or None once it is gone."""
    fields = proc_stat(str(pid))
    return fields[0] if fields else None


class TwoHosts:
    """hostA and hostB: two network namespaces joined by a veth pair, each with a hosts file
    naming both. cleanup() removes everything, killing what still runs in them first."""

    def __init__(self):
        tag = str(os.getpid())
        self.netns = (f"tessera-mh{tag}-a", f"tessera-mh{tag}-b")
        self.veth = (f"tmh{tag}a", f"tmh{tag}b")  # interface names: 15 characters at most
        self.created = []

    def path(self, i):
        return f"/run/netns/{self.netns[i]}"

    def inode(self, i):
        return os.stat(self.path(i)).st_ino

    def agent_map(self):
        return ",".join(f"{h}={n}" for h, n in zip(HOST_NAMES, self.netns))

    def setup(self):
        try:
            run("ip", "netns", "add", self.netns[0])
        except RuntimeError as e:
            skip(f"cannot make network namespaces here ({e})")
        self.created.append(self.netns[0])
        run("ip", "netns", "add", self.netns[1])
        self.created.append(self.netns[1])
        run("ip", "link", "add", self.veth[0], "type", "veth", "peer", "name", self.veth[1])
        for i in (0, 1):
            run("ip", "link", "set", self.veth[i], "netns", self.netns[i])
            ns = ("ip", "netns", "exec", self.netns[i])
            run(*ns, "ip", "addr", "add", ADDRESSES[i] + "/24", "dev", self.veth[i])
            run(*ns, "ip", "link", "set", self.veth[i], "up")
            run(*ns, "ip", "link", "set", "lo", "up")
            # `ip netns exec` mounts this over /etc/hosts: both hosts resolve to their veth address.
            os.makedirs(f"/etc/netns/{self.netns[i]}", exist_ok=True)
            with open(f"/etc/netns/{self.netns[i]}/hosts", "w") as f:
                f.write("127.0.0.1 localhost\n" + "".join(f"{a} {h}\n" for a, h in zip(ADDRESSES, HOST_NAMES)))

    def processes(self):
        """pids of the processes in either namespace."""
        inodes = set()
        for i in (0, 1):
            with contextlib.suppress(OSError):
                inodes.add(self.inode(i))
        pids = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{d}/ns/net").st_ino in inodes and process_state(d) not in (None, "Z"):
                        pids.append(int(d))
        return pids

    def cleanup(self):
        for pid in self.processes():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for ns in self.created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # takes its end of the veth along
        subprocess.run(["ip", "link", "del", self.veth[0]], capture_output=True)  # only if never moved
        for ns in self.netns:
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir("/etc/netns")  # only when empty


class Server:
    """A serving process (started in a network namespace when `netns` names one) and an HTTP
    client for it."""

    def __init__(self, cmd, netns=None):
        self.cmd, self.netns = cmd, netns
        self.proc, self.log, self.address = start_serving(cmd)
        # Keep draining the output so the server never blocks on a full pipe.
        self._drain = threading.Thread(target=lambda: self.log.extend(self.proc.stdout), daemon=True)
        self._drain.start()

    def text(self):
        return "".join(self.log)

    def connect(self, timeout):
        conn = http.client.HTTPConnection(*self.address, timeout=timeout)
        with in_netns(self.netns) if self.netns else contextlib.nullcontext():
            conn.connect()
        return conn

    def request(self, path, body=None, timeout=60):
        conn = self.connect(timeout)
        try:
            if body is None:
                conn.request("GET", path)
            else:
                conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, r.read().decode()
        finally:
            conn.close()

    def json(self, path, body=None):
        status, text = self.request(path, body)
        assert status == 200, (path, status, text)
        return json.loads(text)

    def health(self):
        return json.loads(self.request("/health")[1])

    def stream(self, body, started):
        """The SSE data lines of a streaming completion; calls `started` at the first."""
        conn = self.connect(60)
        try:
            conn.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            if r.status != 200:
                return [f"HTTP {r.status}", r.read().decode()]
            events = []
            for raw in r:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 1:
                        started()
            return events
        finally:
            conn.close()

    def shard_pids(self, rank, host):
        """pids of the shards of `rank` that said hello from `host`, in order."""
        return [int(p) for p in re.findall(rf"shard rank {rank} ready: .* on {host} \(pid (\d+)\)", self.text())]

    def metric(self, name):
        _, text = self.request("/metrics")
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise KeyError(name)

    def stop(self):
        """SIGINT (drain), again (end what runs), then SIGKILL; returns the exit code."""
        for sig, wait in ((signal.SIGINT, 15), (signal.SIGINT, 10), (signal.SIGKILL, 10)):
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait)
        return self.proc.returncode


def wait_for(predicate, timeout_s, what):
    """Polls `predicate` until it holds; `what` (a string or a function making one) says what
    did not happen."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what() if callable(what) else what}")


@pytest.fixture(scope="module")
def hosts():
    reason = unavailable()
    if reason:
        skip(reason)
    require_stories(os.path.join(STORIES, "hf"))
    h = TwoHosts()
    try:
        h.setup()
        yield h
    finally:
        h.cleanup()


@pytest.fixture(scope="module")
def launch(hosts):
    """TP 2 over hostA:1,hostB:1, the coordinator and mpirun on hostA (the shard endpoint is
    launch's default, tcp://0.0.0.0:7070, told to the shards as tcp://hostA:7070)."""
    tessera = os.path.join(BIN, "tessera")
    cmd = ["ip", "netns", "exec", hosts.netns[0], "unshare", "--uts",
           "sh", "-c", 'hostname "$1" && shift && exec "$@"', "sh", HOST_NAMES[0],
           tessera, "launch", "--model", os.path.join(STORIES, "hf"), "--model-name", "test-model",
           "--tp", "2", "--hosts", ",".join(h + ":1" for h in HOST_NAMES), "--device", "cpu", "--threads", "1",
           "--port", "0", "--launch-agent", f"{AGENT} {hosts.agent_map()}",
           # Open MPI's daemons and ranks talk over the veth only (loopback is per namespace).
           "--mca", "oob_tcp_if_include", SUBNET, "--mca", "btl_tcp_if_include", SUBNET,
           # Steps slowed to 5 ms: a stream of a few hundred tokens still runs when its shard is killed.
           "--shard-arg=--debug-step-delay-ms=5"]
    s = Server(cmd, netns=hosts.path(0))
    try:
        wait_for(lambda: s.shard_pids(0, HOST_NAMES[0]) and s.shard_pids(1, HOST_NAMES[1]), 30,
                 lambda: "both shards' hellos:\n" + s.text())
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def tp1():
    """The same model at TP 1 (`tessera serve`, on this host's loopback)."""
    if unavailable():
        skip(unavailable())
    require_stories(os.path.join(STORIES, "hf"))
    s = Server([os.path.join(BIN, "tessera"), "serve", "--model", os.path.join(STORIES, "hf"), "--model-name",
                "test-model", "--tp", "1", "--device", "cpu", "--threads", "1", "--port", "0"])
    try:
        yield s
    finally:
        s.stop()


def reference_cases():
    with open(os.path.join(STORIES, "reference.json")) as f:
        return json.load(f)["cases"]


def greedy(server, prompt, max_tokens=64):
    body = {"model": "test-model", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "logprobs": 1}
    choice = server.json("/v1/completions", body)["choices"][0]
    return choice["text"], choice["logprobs"]["tokens"], choice["logprobs"]["token_logprobs"]


def assert_reference_ids(server, cases):
    """The greedy continuations of the reference cases (sent together: they share the steps)."""
    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(lambda case: greedy(server, case["prompt_ids"]), cases))
    for case, (text, tokens, _) in zip(cases, results):
        expected = server.json("/detokenize", {"tokens": case["greedy_ids"]})["prompt"]
        assert len(tokens) == len(case["greedy_ids"]), case["name"]
        assert text == expected, f"{case['name']}: {text!r} != {expected!r}"


# The tests share one launch and run in this order: the last two kill a shard and stop it all.

def test_each_shard_runs_on_its_own_host(hosts, launch):
    """Rank 0 said hello from hostA and runs in its namespace; rank 1 from hostB, started there
    through the launch agent (its process is in hostB's network namespace)."""
    log = launch.text()
    assert f"--mca plm_rsh_agent '{AGENT} {hosts.agent_map()}'" in log, log
    assert "--coordinator tcp://hostA:7070" in log, log
    for rank in (0, 1):
        pid = launch.shard_pids(rank, HOST_NAMES[rank])[-1]
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == hosts.inode(rank), f"rank {rank} (pid {pid})"
    assert launch.health()["status"] == "ok"


def test_greedy_ids_equal_tp1_and_the_reference(launch, tp1):
    cases = reference_cases()
    assert_reference_ids(launch, cases)
    prompts = ["Once upon a time", cases[2]["prompt_ids"]]
    with concurrent.futures.ThreadPoolExecutor(2 * len(prompts)) as pool:
        tp2_runs = [pool.submit(greedy, launch, p, 48) for p in prompts]
        tp1_runs = [pool.submit(greedy, tp1, p, 48) for p in prompts]
        for prompt, tp2_run, tp1_run in zip(prompts, tp2_runs, tp1_runs):
            text, tokens, logprobs = tp2_run.result()
            text1, tokens1, logprobs1 = tp1_run.result()
            assert (text, tokens) == (text1, tokens1), prompt
            assert logprobs == pytest.approx(logprobs1, abs=1e-3), prompt


def test_a_shard_killed_on_hostB_mid_stream_is_restarted(hosts, launch):
    """kill -9 of rank 1 on hostB while a stream runs: the stream ends with an error event and
    [DONE], /health goes "restarting" then "ok", the new rank 1 is again on hostB (through
    mpirun and the agent), the old generation is gone, and the ids are the reference's again."""
    old = {r: launch.shard_pids(r, HOST_NAMES[r])[-1] for r in (0, 1)}
    started = threading.Event()
    body = {"model": "test-model", "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0,
            "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        stream = pool.submit(launch.stream, body, started.set)
        assert started.wait(30), launch.text()
        os.kill(old[1], signal.SIGKILL)
        states = []

        def restarted():
            states.append(launch.health()["status"])
            return states[-1] == "ok" and len(launch.shard_pids(1, HOST_NAMES[1])) == 2

        wait_for(restarted, 60, lambda: "the restarted group:\n" + launch.text())
        events = stream.result(timeout=60)
    assert events[-1] == "[DONE]", events[-3:]
    last = json.loads(events[-2])
    assert "error" in last, events[-3:]
    assert len(events) < 400, "the stream ran to its end although its shard was killed"
    assert "restarting" in states and states[-1] == "ok", states

    new = {r: launch.shard_pids(r, HOST_NAMES[r])[-1] for r in (0, 1)}
    for rank in (0, 1):
        assert new[rank] != old[rank]
        assert os.stat(f"/proc/{new[rank]}/ns/net").st_ino == hosts.inode(rank), f"rank {rank} (pid {new[rank]})"
    wait_for(lambda: all(process_state(p) in (None, "Z") for p in old.values()), 10, f"the old shards {old} to end")
    assert launch.metric("tessera_shard_restarts_total") == 1
    assert_reference_ids(launch, reference_cases()[-1:])


def test_stopping_leaves_no_process_on_either_host(hosts, launch):
    """SIGINT: the coordinator stops mpirun, which stops its daemon and shard on hostB."""
    assert launch.stop() == 0, launch.text()[-3000:]
    wait_for(lambda: not hosts.processes(), 15, "the namespaces to empty")
