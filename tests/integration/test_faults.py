"""Fault tests of a running `tessera serve`: signals to the coordinator and to shards (SIGTERM,
SIGKILL, SIGSTOP), during streams, at TP 1 and 2. Every stream must end with an event (tokens
to its finish_reason, or an error event) and `[DONE]`; no process may be left behind.

Run by CTest twice: against the release build (openai_api_faults) and against the ASan + UBSan
build (scripts/test.sh runs the `faults` label there), where every server's output is also
checked for sanitizer reports when it stops (FaultServer).
"""
import concurrent.futures
import json
import os
import re
import signal
import threading
import time
import urllib.error

import pytest

from tessera_server import (STORIES, Server, child_processes, health, proc_stat, require_stories, shard_pids,
                            sse_events)

# What AddressSanitizer, LeakSanitizer and UndefinedBehaviorSanitizer print when they find something.
SANITIZER_REPORT = re.compile(r"ERROR: (Address|Leak)Sanitizer|runtime error: |SUMMARY: \w+Sanitizer")


class FaultServer(Server):
    """A Server whose output, once it has stopped, must hold no sanitizer report."""

    def stop(self):
        super().stop()
        if getattr(self, "_drain", None) is not None:
            self._drain.result(timeout=30)  # the whole output, up to the process tree's end
        reports = [line for line in self.log if SANITIZER_REPORT.search(line)]
        assert not reports, "sanitizer report:\n" + "".join(self.log[-80:])


def need_stories():
    require_stories(os.path.join(STORIES, "hf"))


def wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def streams_while(server, n, body, action):
    """Opens n streams; when every one has its first event, runs action(); returns the events
    of each stream."""
    lock, streaming, all_streaming = threading.Lock(), [0], threading.Event()

    def started():
        with lock:
            streaming[0] += 1
            if streaming[0] == n:
                all_streaming.set()

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(sse_events, server.base, body, started) for _ in range(n)]
        assert all_streaming.wait(60), "the streams did not start"
        action()
        return [f.result(timeout=120) for f in futures]


def stream_text(events):
    return "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1] if "choices" in json.loads(e))


SLOW_STREAM = {"model": "test-model", "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0,
               "ignore_eos": True}


def ready_pid(server, rank):
    return wait_for(lambda: (shard_pids(server, rank) or [None])[-1], 20, f"shard rank {rank} ready")


def test_sigterm_drains_then_ends_every_stream_with_an_event():
    """SIGTERM: the server stops taking requests (503, /health "draining") while those it took
    run on; with --shutdown-grace 0 the ones still running end with an error event and [DONE]
    (never cut mid-stream), and the server exits 0."""
    need_stories()
    import threading
    for grace in ("30", "0"):
        # Six streams, all streaming when the signal comes (steps slowed to 5 ms: ~2.4 s a stream).
        s = FaultServer(os.path.join(STORIES, "hf"), extra=["--max-batch", "6", "--shutdown-grace", grace,
                                                       "--shard-arg=--debug-step-delay-ms=5"])
        try:
            lock, streaming, all_streaming = threading.Lock(), [0], threading.Event()

            def started():
                with lock:
                    streaming[0] += 1
                    if streaming[0] == 6:
                        all_streaming.set()

            body = {"model": "test-model", "prompt": "Once upon a time", "max_tokens": 480, "temperature": 0,
                    "ignore_eos": True}
            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                futures = [pool.submit(sse_events, s.base, body, started) for _ in range(6)]
                assert all_streaming.wait(60)
                os.kill(s.proc.pid, signal.SIGTERM)  # the coordinator only, as an orchestrator would
                refused = health = None
                try:
                    deadline = time.time() + 10
                    while health is None and time.time() < deadline:  # the signal is handled asynchronously
                        try:
                            s.get("/health")
                        except urllib.error.HTTPError as e:
                            health = (e.code, e.read().decode())
                    refused = s.post_raw("/v1/completions", json.dumps(body).encode())
                except (urllib.error.URLError, ConnectionError):
                    pass  # already gone: every request finished first
                results = [f.result(timeout=60) for f in futures]
            assert s.proc.wait(timeout=60) == 0, "".join(s.log)
        finally:
            s.stop()
        if health is not None:
            assert health[0] == 503 and "draining" in health[1], health
        if refused is not None:
            assert health is not None
            assert refused[0] == 503, refused
            assert "shutting down" in refused[1]
        errors = 0
        for events in results:
            if events and events[0].startswith("HTTP "):  # sent after the signal: refused, never taken
                assert events[0] == "HTTP refused" or (events[0] == "HTTP 503" and "shutting down" in events[1]), events
                continue
            assert events and events[-1] == "[DONE]", events[-3:]
            last = json.loads(events[-2])
            if "error" in last:
                assert "shutting down" in last["error"]["message"]
                errors += 1
            else:
                assert last["choices"][0]["finish_reason"] == "length"
        if grace == "30":
            assert errors == 0, "every request taken finishes within the grace period"
        else:
            assert errors > 0, "with no grace the streams still running end with an error event"


def test_a_stopped_shard_or_coordinator_is_slow_not_dead():
    """A shard or coordinator that stops answering for a while (SIGSTOP for 4 s: longer than the
    2 s heartbeat timeout and the shard's 3 s coordinator timeout, as a loaded host can do) but
    whose process is alive is waited for: after SIGCONT the server is healthy and serves."""
    need_stories()
    s = FaultServer(os.path.join(STORIES, "hf"))
    try:
        m = re.search(r"shard rank 0 ready: .*\(pid (\d+)\)", "".join(s.log))
        deadline = time.time() + 10
        while m is None and time.time() < deadline:
            time.sleep(0.1)
            m = re.search(r"shard rank 0 ready: .*\(pid (\d+)\)", "".join(s.log))
        assert m, "".join(s.log)
        shard = int(m.group(1))
        for pid in (shard, s.proc.pid):
            os.kill(pid, signal.SIGSTOP)
            time.sleep(4)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.5)
            assert s.get("/health")[0] == 200, "".join(s.log)
            r = s.client.completions.create(model="test-model", prompt="Once upon a time", max_tokens=8,
                                            temperature=0)
            assert r.usage.completion_tokens == 8
        log = "".join(s.log)
        assert "its process is alive" in log, log
    finally:
        s.stop()


def test_a_killed_shard_leaves_no_zombie_and_health_says_why():
    """kill -9 of one rank at TP 2: /health turns 503 naming the rank, and mpirun (which exits
    when a rank dies) is reaped, not left a zombie under the server."""
    need_stories()
    s = FaultServer(os.path.join(STORIES, "hf"), tp=2, extra=["--max-restarts", "0"])  # no new generation
    try:
        pattern = r"shard rank 1 ready: .*\(pid (\d+)\)"
        deadline = time.time() + 10
        while re.search(pattern, "".join(s.log)) is None and time.time() < deadline:
            time.sleep(0.1)
        m = re.search(pattern, "".join(s.log))
        assert m, "".join(s.log)
        os.kill(int(m.group(1)), signal.SIGKILL)
        health = None
        deadline = time.time() + 10
        while health is None and time.time() < deadline:
            try:
                s.get("/health")
                time.sleep(0.1)
            except urllib.error.HTTPError as e:
                health = (e.code, e.read().decode())
        assert health and health[0] == 503 and "rank 1" in health[1], health
        # mpirun exits when a rank dies; the server reaps it (no zombie is left under it).
        deadline = time.time() + 10
        while child_processes(s.proc.pid) and time.time() < deadline:
            time.sleep(0.1)
        assert not child_processes(s.proc.pid), s.log[-5:]
    finally:
        s.stop()


@pytest.mark.parametrize("tp", [1, 2])
def test_a_lost_shard_group_is_restarted_and_a_crash_loop_stops(tp):
    """kill -9 of a shard: its requests end with an error, the group is torn down and started
    again (/health "restarting", then "ok"; a new KV pool; no process of the old generation
    left); with --max-restarts 1 the second loss in a row is final: /health "failed" with the
    reason, requests get 503, and the server still stops cleanly."""
    need_stories()
    s = FaultServer(os.path.join(STORIES, "hf"), tp=tp, extra=["--max-restarts", "1"])
    try:
        deadline = time.time() + 10
        while len(shard_pids(s, tp - 1)) < 1 and time.time() < deadline:
            time.sleep(0.1)
        first = shard_pids(s, tp - 1)[-1]
        os.kill(first, signal.SIGKILL)
        states = set()
        deadline = time.time() + 30
        while time.time() < deadline:
            h = health(s)
            states.add(h["status"])
            if h["status"] == "ok" and len(shard_pids(s, tp - 1)) == 2:
                break
            time.sleep(0.1)
        assert health(s)["status"] == "ok", "".join(s.log)
        assert "restarting" in states, states
        r = s.client.completions.create(model="test-model", prompt="Once upon a time", max_tokens=8, temperature=0)
        assert r.usage.completion_tokens == 8
        assert s.metric("tessera_shard_restarts_total") == 1
        assert not any(st == "Z" for _, st in child_processes(s.proc.pid))
        # The second loss in a row: recovery gives up.
        os.kill(shard_pids(s, tp - 1)[-1], signal.SIGKILL)
        deadline = time.time() + 30
        while health(s)["status"] != "failed" and time.time() < deadline:
            time.sleep(0.1)
        h = health(s)
        assert h["status"] == "failed" and f"rank {tp - 1}" in h["error"], h
        code, body = s.post_raw("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 2}).encode())
        assert code == 503, body
        assert "not restarting them again" in "".join(s.log)
    finally:
        s.stop()
    assert s.proc.returncode == 0, "".join(s.log)




@pytest.mark.parametrize("tp", [1, 2])
def test_a_shard_killed_during_streams_ends_them_with_an_error_then_serves(tp):
    """kill -9 of the last rank while six streams run: each ends with an error event naming the
    lost shard and [DONE] (never cut off), the group restarts, the same greedy text comes back,
    and no KV block stays used."""
    need_stories()
    s = FaultServer(os.path.join(STORIES, "hf"), tp=tp, extra=["--max-batch", "6", "--shard-arg=--debug-step-delay-ms=5"])
    try:
        before = s.client.completions.create(model="test-model", prompt="Once upon a time", max_tokens=24,
                                             temperature=0).choices[0].text
        victim = ready_pid(s, tp - 1)
        results = streams_while(s, 6, SLOW_STREAM, lambda: os.kill(victim, signal.SIGKILL))
        for events in results:
            assert events and events[-1] == "[DONE]", events[-3:]
            last = json.loads(events[-2])
            assert "error" in last, last
            assert "shard" in last["error"]["message"], last
            assert last["error"]["code"] == 503, last  # as a whole response would get
        wait_for(lambda: health(s)["status"] == "ok" and len(shard_pids(s, tp - 1)) == 2, 60, "the restart")
        # The gauges are the new generation's before any new request (not the lost one's load).
        for name, labels in (("tessera_kv_blocks", '{state="used"}'), ("tessera_running", ""),
                             ("tessera_open_requests", ""), ("tessera_batch_size", "")):
            assert s.metric(name, labels) == 0, (name, s.metric(name, labels))
        after = s.client.completions.create(model="test-model", prompt="Once upon a time", max_tokens=24,
                                            temperature=0).choices[0].text
        assert after == before
        wait_for(lambda: s.metric("tessera_kv_blocks", '{state="used"}') == 0, 10, "no KV block used")
        assert not any(st == "Z" for _, st in child_processes(s.proc.pid))
    finally:
        s.stop()
    assert s.proc.returncode == 0, "".join(s.log)


def test_a_shard_stopped_during_streams_finishes_them_with_the_same_text():
    """SIGSTOP of rank 1 for 3 s (past the 2 s heartbeat timeout) while streams run, then SIGCONT:
    nothing is failed or restarted, and every stream finishes with the text of an undisturbed run."""
    need_stories()
    s = FaultServer(os.path.join(STORIES, "hf"), tp=2, extra=["--max-batch", "4", "--shard-arg=--debug-step-delay-ms=5"])
    try:
        body = {**SLOW_STREAM, "max_tokens": 200}
        alone = stream_text(sse_events(s.base, body))
        victim = ready_pid(s, 1)

        def pause():
            os.kill(victim, signal.SIGSTOP)
            time.sleep(3)
            os.kill(victim, signal.SIGCONT)

        results = streams_while(s, 4, body, pause)
        for events in results:
            assert events[-1] == "[DONE]", events[-3:]
            assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length", events[-2]
            assert stream_text(events) == alone
        assert s.metric("tessera_shard_restarts_total") == 0
        assert health(s)["status"] == "ok"
    finally:
        s.stop()
    assert s.proc.returncode == 0, "".join(s.log)


def descendants(pid):
    """Pids of the live (not zombie) processes under pid: its children, theirs, and so on."""
    out, todo = [], [pid]
    while todo:
        children = [(c, st) for c, st in child_processes(todo.pop()) if st != "Z"]
        out += [c for c, _ in children]
        todo += [c for c, _ in children]
    return out


def alive(pids):
    return [pid for pid in pids if (proc_stat(str(pid)) or ["Z"])[0] != "Z"]


@pytest.mark.parametrize("tp", [1, 2])
def test_a_killed_coordinator_takes_its_shards_with_it(tp):
    """kill -9 of the coordinator while streams run: the clients see their connections end, and
    every shard (and mpirun) exits on its own: nothing of the group is left running."""
    need_stories()
    s = FaultServer(os.path.join(STORIES, "hf"), tp=tp, extra=["--shard-arg=--debug-step-delay-ms=5"])
    group = []
    try:
        ready_pid(s, tp - 1)
        group = descendants(s.proc.pid)  # the shards (and mpirun, at TP 2)
        assert len(group) >= tp, group
        results = streams_while(s, 3, SLOW_STREAM, lambda: os.kill(s.proc.pid, signal.SIGKILL))
        for events in results:
            assert not events or events[-1] != "[DONE]" or "error" in events[-2]  # cut: the server is gone
        s.proc.wait(timeout=10)
        wait_for(lambda: not alive(group), 30, "the shards to exit after their coordinator")
    finally:
        s.stop()
        for pid in alive(group):  # a failed check leaves nothing running either
            os.kill(pid, signal.SIGKILL)


def cpu_seconds(pid):
    """User + system CPU time of a process so far."""
    fields = proc_stat(str(pid))
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_state(pid, tid):
    return proc_stat(f"{pid}/task/{tid}")[0]


def test_a_rank_waiting_on_a_stopped_peer_costs_no_core_and_exits_with_its_coordinator():
    """TP 2, rank 1 stopped (SIGSTOP) mid-stream: rank 0 waits inside a collective without
    burning a core (a spinning MPI wait used ~90% of one), and when the coordinator is then
    killed, rank 0 exits on its own (its watchdog aborts the collective) instead of waiting for
    the stopped peer for ever."""
    need_stories()
    s = FaultServer(os.path.join(STORIES, "hf"), tp=2, extra=["--shard-arg=--debug-step-delay-ms=5"])
    r0 = r1 = None
    try:
        r0, r1 = ready_pid(s, 0), ready_pid(s, 1)
        first = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            stream = pool.submit(sse_events, s.base, SLOW_STREAM, first.set)
            assert first.wait(60)
            os.kill(r1, signal.SIGSTOP)
            time.sleep(0.5)  # rank 0 is in the step's first collective now
            # A spinning wait is always runnable ("R"), and takes a whole core when one is free; a
            # loaded host hides the CPU time, not the state. A sleeping wait is mostly "S".
            before = cpu_seconds(r0)
            states = ""
            for _ in range(60):
                states += thread_state(r0, r0)
                time.sleep(0.05)
            used = cpu_seconds(r0) - before
            assert states.count("R") < 0.6 * len(states), f"rank 0's step thread spins in its collective: {states}"
            assert used < 1.5, f"rank 0 used {used:.2f} s of CPU in 3 s waiting for its stopped peer"
            os.kill(s.proc.pid, signal.SIGKILL)
            wait_for(lambda: not alive([r0]), 20, "rank 0 to exit after its coordinator")
            stream.result(timeout=60)
        s.proc.wait(timeout=10)
    finally:
        if r1 is not None and alive([r1]):
            os.kill(r1, signal.SIGCONT)
        s.stop()
        for pid in alive([p for p in (r0, r1) if p]):
            os.kill(pid, signal.SIGKILL)
