"""The quality gate end to end, as a user runs it: `tessera eval` measures stories260K at q8_0
and q4_0 on the eval corpus (TESSERA_EVAL_CORPUS, else the checkout's models/eval-corpus, else
one written here by scripts/eval_corpus.sh), then `tessera serve --quality-budget` starts with
the precision under budget and refuses the one over it (exit 1, naming the precision, the class,
the measured KL and the budget), refuses without a report, and `tessera plan` shows the report.

Run by CTest as `quality_gate` (tests/integration/CMakeLists.txt) through run_pytest.sh.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tessera_server import BIN, STORIES, require_stories, start_serving

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../.."))
TESSERA = os.path.join(BIN, "tessera")
MODEL = os.path.join(STORIES, "stories260K-f32.gguf")


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
        for sig, wait in ((signal.SIGINT, 10), (signal.SIGKILL, None)):
            os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                pass


def eval_corpus(tmp_dir):
    corpus = os.environ.get("TESSERA_EVAL_CORPUS") or os.path.join(ROOT, "models/eval-corpus")
    if os.path.exists(os.path.join(corpus, "manifest.json")):
        return corpus
    # What CI does: install the packages the corpus comes from (into .venv) and write it.
    r = subprocess.run(["bash", "scripts/eval_corpus.sh", os.path.join(tmp_dir, "eval-corpus")], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"scripts/eval_corpus.sh failed:\n{r.stdout}\n{r.stderr}"
    corpus = r.stdout.strip().splitlines()[-1]
    assert os.path.exists(os.path.join(corpus, "manifest.json")), r.stdout + r.stderr
    return corpus


class Measured:
    """The report of one `tessera eval` run and what the tests derive from it."""

    def __init__(self, path, output):
        self.path, self.output = path, output
        with open(path) as f:
            self.json = json.load(f)
        with open(MODEL, "rb") as f:
            self.sha = hashlib.sha256(f.read()).hexdigest()
        self.model = self.json["models"][self.sha]
        self.rows = {p["precision"]: p for p in self.model["precisions"]}
        self.classes = self.model["classes"]
        self.skipped = self.model.get("skipped_classes", {})

    def kl(self, precision, cls):
        return self.rows[precision]["classes"][cls]["kl_mean"]

    def budget_between(self, cls):
        """A budget strictly between q8_0's and q4_0's mean KL, written with 4 significant digits
        (as the message will print it back)."""
        lo, hi = self.kl("q8_0", cls), self.kl("q4_0", cls)
        assert lo < hi, f"{cls}: q8_0 KL {lo} not below q4_0 KL {hi}"
        text = f"{(lo * hi) ** 0.5 if lo > 0 else hi / 2:.4g}"
        assert lo < float(text) < hi, (lo, text, hi)
        return text


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    require_stories(MODEL)
    tmp = str(tmp_path_factory.mktemp("quality"))
    corpus = eval_corpus(tmp)
    report = os.path.join(tmp, "stories.eval.json")
    rc, out = run(["eval", "--model", MODEL, "--corpus", corpus, "--precisions", "q8_0,q4_0",
                   "--tokens-per-class", "256", "--window", "128", "--code-canaries", "0", "--math-canaries", "4",
                   "--threads", "2", "--json", report], timeout=300)
    assert rc == 0, out
    assert os.path.exists(report), out
    return Measured(report, out)


def test_eval_measures_each_precision_against_the_reference(measured):
    m = measured
    assert m.model["reference"] == "f32"
    assert m.model["model"] == MODEL
    assert m.model["file_bytes"] == os.path.getsize(MODEL)
    assert [p["precision"] for p in m.model["precisions"]] == ["f32", "q8_0", "q4_0"]
    assert m.rows["f32"]["reference"] is True
    # stories260K keeps its best-predicted class; the others are named with the reason.
    assert m.classes, m.output
    assert set(m.classes) | set(m.skipped) == {"code", "math", "prose"}
    assert not set(m.classes) & set(m.skipped)
    for cls in m.classes:
        assert m.kl("f32", cls) == 0
        assert m.rows["f32"]["classes"][cls]["top1"] == 1
        assert 0 < m.kl("q8_0", cls) < m.kl("q4_0", cls)
        for p in ("q8_0", "q4_0"):
            assert 0 <= m.rows[p]["classes"][cls]["top1"] <= 1
    # The printed table has the rows too.
    assert re.search(r"\| q8_0 \|", m.output) and re.search(r"\| q4_0 \|", m.output), m.output


def serve_args(measured, quant, budget):
    return ["serve", "--model", MODEL, "--quant", quant, "--quality-budget", budget, "--quality-report",
            measured.path, "--port", "0", "--model-name", "test-model"]


def test_within_budget_passes_the_gate(measured):
    cls = measured.classes[0]
    budget = f"{cls}={measured.budget_between(cls)}"
    proc = subprocess.Popen([TESSERA, *serve_args(measured, "q8_0", budget)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log = []
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            log.append(line)
            if "quality gate" in line or "listening on" in line:
                break
        text = "".join(log)
        assert re.search(r"quality gate: precision 'q8_0' within budget", text), text
        assert f"{cls} KL {measured.kl('q8_0', cls):.4f} <= {measured.budget_between(cls)}" in text, text
        assert measured.path in text
    finally:
        stop(proc)


# tessera eval measures "q8_0" with the matrices whose columns fill no 32-block kept as stored
# (eval/evaluator.cpp sets keep_unquantizable; stories260K's down projections have 172 columns),
# but the shards of `tessera serve --quant q8_0` load without it and refuse those matrices, so the
# precision the gate lets through cannot be served. Strict: this fails once that is fixed, and
# the marker should then go.
def test_within_budget_serves(measured):
    cls = measured.classes[0]
    cmd = [TESSERA, *serve_args(measured, "q8_0", f"{cls}={measured.budget_between(cls)}")]
    proc, log, (ip, port) = start_serving(cmd, timeout_s=60)
    try:
        assert any("within budget" in line for line in log), "".join(log)
        base = f"http://{ip}:{port}"
        deadline, status = time.time() + 30, None
        while time.time() < deadline and status != "ok":
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    status = json.loads(r.read().decode()).get("status")
            except (urllib.error.URLError, ConnectionError, ValueError):
                time.sleep(0.2)
        assert status == "ok", "".join(log)
        body = json.dumps({"model": "test-model", "prompt": "Once upon a time", "max_tokens": 8,
                           "temperature": 0}).encode()
        req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert json.loads(r.read().decode())["choices"][0]["text"]
        assert proc.poll() is None
    finally:
        stop(proc)


def test_over_budget_is_refused_naming_the_numbers(measured):
    cls = measured.classes[0]
    budget = measured.budget_between(cls)
    rc, out = run(serve_args(measured, "q4_0", f"{cls}={budget}"))
    assert rc == 1, out
    assert "precision 'q4_0'" in out, out
    assert f"{measured.kl('q4_0', cls):.4f} nats/token" in out, out  # the measured KL
    assert f"on {cls}" in out, out
    assert f"budget {cls}={budget}" in out, out
    assert measured.path in out, out
    assert "within budget" not in out and "listening on" not in out, out


def test_chat_budget(measured):
    if "prose" in measured.classes:
        # chat is budgeted on the prose measurement.
        budget = measured.budget_between("prose")
        rc, out = run(serve_args(measured, "q4_0", f"chat={budget}"))
        assert rc == 1, out
        assert "precision 'q4_0'" in out and "on prose" in out and f"chat={budget}" in out, out
        assert f"{measured.kl('q4_0', 'prose'):.4f}" in out, out
    else:
        # Not measured on this model: refused whatever the budget, saying why it was skipped.
        assert "prose" in measured.skipped, measured.model
        rc, out = run(serve_args(measured, "q8_0", "chat=1000"))
        assert rc == 1, out
        assert "class 'chat' was not measured for precision 'q8_0'" in out, out
        assert f"(skipped: {measured.skipped['prose']})" in out, out


def test_unmeasured_precision_is_refused(measured):
    cls = measured.classes[0]
    rc, out = run(serve_args(measured, "q5_0", f"{cls}=1000"))
    assert rc == 1, out
    assert "not precision 'q5_0'" in out and "tessera eval" in out, out


def test_no_report_is_refused_saying_to_run_tessera_eval(measured, tmp_path):
    cls = measured.classes[0]
    missing = str(tmp_path / "none.eval.json")
    rc, out = run(["serve", "--model", MODEL, "--quant", "q8_0", "--quality-budget", f"{cls}=1000",
                   "--quality-report", missing, "--port", "0"])
    assert rc == 1, out
    assert "tessera eval" in out and missing in out, out
    assert "--precisions q8_0" in out, out


def test_report_of_other_weights_is_refused(measured, tmp_path):
    # The same model with one byte more: another hash, so the report does not apply to it.
    other = str(tmp_path / "stories-copy.gguf")
    shutil.copyfile(MODEL, other)
    with open(other, "ab") as f:
        f.write(b"\0")
    cls = measured.classes[0]
    rc, out = run(["serve", "--model", other, "--quant", "q8_0", "--quality-budget", f"{cls}=1000",
                   "--quality-report", measured.path, "--port", "0"])
    assert rc == 1, out
    assert "no measurement of this model file" in out and "tessera eval" in out, out


def test_bad_flags_are_refused(measured):
    rc, out = run(serve_args(measured, "q8_0", "poetry=0.1"))
    assert rc == 1 and "'poetry=0.1'" in out, out
    rc, out = run(["serve", "--model", MODEL, "--quant", "q8_0", "--quality-report", measured.path, "--port", "0"])
    assert rc == 1 and "--quality-report without --quality-budget" in out, out


def test_plan_shows_quality_by_precision(measured):
    rc, out = run(["plan", "--model", MODEL, "--quality-report", measured.path])
    assert rc == 0, out
    assert "Quality by precision" in out, out
    section = out[out.index("Quality by precision"):]
    for cls in measured.classes:
        assert f"{cls} KL" in section, section
    rows = {line.split()[0]: line for line in section.splitlines()[2:] if line.startswith("  ") and line.split()}
    assert "f32*" in rows and "q8_0" in rows and "q4_0" in rows, section
    cls = measured.classes[0]
    assert f"{measured.kl('q4_0', cls):.4f}" in rows["q4_0"], section
    assert f"{measured.kl('q8_0', cls):.4f}" in rows["q8_0"], section
    for skipped in measured.skipped:
        assert f"(class {skipped} not measured" in section, section
