#!/usr/bin/env python3
"""Side-by-side table of the real engine and the simulator on the same traces (bench/tune_validate.sh).

Reads WORK/real-NAME-r*.json (`tessera bench serve --json`, one per real run) and
WORK/sim-NAME-s*.json (`tessera tune simulate --json`, one per jitter seed) for each NAME and
writes a markdown table: throughput, TTFT and ITL at P50 and P99 (median and range over the
runs), the simulator's error against the real median, and the real runs' own spread. Where
WORK/simlevel-NAME-r*.json exist (the simulator at the level each real run measured, `tune
simulate --level-from`), a second pair of rows shows how much of the error is the machine's
drift between calibration and the runs; where WORK/simprobe-NAME-r*.json exist (the simulator at
the level a short probe measured right before each run), a third pair shows how well a calibration
taken just before a run predicts it. Standard library only.
"""
import argparse
import datetime
import glob
import json
import os
import platform
import subprocess


def cpu_line():
    model, family, mod = "?", "?", "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k, v = k.strip(), v.strip()
                if k == "model name" and model == "?":
                    model = v
                elif k == "cpu family" and family == "?":
                    family = v
                elif k == "model" and mod == "?":
                    mod = v
    except OSError:
        pass
    return f"{model} (family {family} model {mod}), {os.cpu_count()} cores, {platform.machine()}"


def logged_preemptions(path):
    """The engine's preemption count at the end of a run: the last record of its step log
    (steps-validate-NAME-rK.jsonl beside real-NAME-rK.json), or None where the log lacks it."""
    stem = os.path.basename(path)[len("real-"):-len(".json")]
    log = os.path.join(os.path.dirname(path), f"steps-validate-{stem}.jsonl")
    last = None
    try:
        with open(log) as f:
            for line in f:
                if line.strip():
                    last = line
    except OSError:
        return None
    return json.loads(last).get("preemptions") if last else None


def real_summary(path):
    with open(path) as f:
        j = json.load(f)
    s = j["levels"][0]["summary"]
    return {
        "out_tok_s": s["output_token_throughput"],
        "req_s": s["request_throughput"],
        "ttft_p50": s["ttft_ms"]["p50"] / 1e3,
        "ttft_p99": s["ttft_ms"]["p99"] / 1e3,
        "itl_p50": s["itl_ms"]["p50"] / 1e3,
        "itl_p99": s["itl_ms"]["p99"] / 1e3,
        "completed": s["completed"],
        "failed": s["failed"],
        "preemptions": logged_preemptions(path),
    }


def sim_summary(path):
    with open(path) as f:
        j = json.load(f)
    return {
        "out_tok_s": j["output_tok_s"],
        "req_s": j["req_s"],
        "ttft_p50": j["ttft_p50_s"],
        "ttft_p99": j["ttft_p99_s"],
        "itl_p50": j["itl_p50_s"],
        "itl_p99": j["itl_p99_s"],
        "completed": j["completed"],
        "failed": j["failed"],
        "preemptions": j["preemptions"],
        "step_model": j.get("step_model", {}),
    }


def err(sim, real):
    return (sim - real) / real * 100 if real else float("nan")


COMMANDS = {
    "apart": "`bash bench/tune_validate.sh all`: calibration at block sizes 16/64/256 (`tessera serve --step-log`, "
             "`tessera tune calibrate`), before the runs.",
    "window": "`bash bench/tune_validate.sh window`: in one window, rounds of [a calibration load on a fresh "
              "block-16 server with `--step-log`, then each trace once], closed by one more calibration load; the "
              "step model is fitted on the calibration loads alone (`tessera tune calibrate`).",
}

KEYS = ("out_tok_s", "req_s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99")


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def combine(runs):
    """Median of each metric over the runs, and its range."""
    out = {k: median([r[k] for r in runs]) for k in KEYS}
    out["range"] = {k: (min(r[k] for r in runs), max(r[k] for r in runs)) for k in KEYS}
    out["runs"] = len(runs)
    out["completed"] = min(r["completed"] for r in runs)
    out["failed"] = max(r["failed"] for r in runs)
    counts = [r["preemptions"] for r in runs]
    out["preemptions"] = None if None in counts else (median(counts), min(counts), max(counts))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--serve", default="--tp 1 --threads 2", help="the servers' flags, for the Command line")
    ap.add_argument("--method", choices=("apart", "window"), default="apart",
                    help="apart: calibrated beforehand (`tune_validate.sh all`); window: calibration loads "
                    "alternating with the runs in one window (`tune_validate.sh window`)")
    ap.add_argument("names", nargs="+")
    a = ap.parse_args()
    rows, worst = [], {k: 0.0 for k in KEYS}
    # The simulator at other levels than the calibration's: file prefix -> (row label, summary
    # sentence, worst errors).
    level_kinds = {
        "simlevel": ["the runs' levels",
                     "At the levels the real runs measured (the median of measured / predicted step time over each "
                     "run's own `--step-log`; the simulator otherwise runs at the calibration's median level)",
                     {k: 0.0 for k in KEYS}],
        "simprobe": ["the probed levels",
                     "At the levels probed right before each run (a fifth of the trace's requests, another seed, on "
                     "a fresh server, its `--step-log` against the model; the probe never sees the run)",
                     {k: 0.0 for k in KEYS}],
    }
    step_model = {}
    for name in a.names:
        reals = sorted(glob.glob(os.path.join(a.work, f"real-{name}-r*.json")))
        sims = sorted(glob.glob(os.path.join(a.work, f"sim-{name}-s*.json")))
        if not reals or not sims:
            raise SystemExit(f"{name}: no real-{name}-r*.json or sim-{name}-s*.json in {a.work}")
        r = combine([real_summary(p) for p in reals])
        sim_runs = [sim_summary(p) for p in sims]
        step_model = sim_runs[0].get("step_model", step_model)
        s = combine(sim_runs)
        for k in KEYS:
            worst[k] = max(worst[k], abs(err(s[k], r[k])))
        at = {}
        for kind, (_, _, worst_kind) in level_kinds.items():
            files = sorted(glob.glob(os.path.join(a.work, f"{kind}-{name}-r*.json")))
            if not files:
                continue
            lv = combine([sim_summary(p) for p in files])
            lv["levels"] = []
            for p in files:
                with open(p) as f:
                    lv["levels"].append(json.load(f).get("level", 1.0))
            for k in KEYS:
                worst_kind[k] = max(worst_kind[k], abs(err(lv[k], r[k])))
            at[kind] = lv
        rows.append((name, r, s, at))

    def cell(v, k, scale, fmt):
        lo, hi = v["range"][k]
        return f"{v[k] * scale:{fmt}} ({lo * scale:{fmt}}-{hi * scale:{fmt}})"

    def preempt(v):
        if v["preemptions"] is None:
            return "not logged"
        mid, lo, hi = v["preemptions"]
        return f"{mid:g} ({lo:g}-{hi:g})"

    lines = [
        "# Simulator against the real engine",
        "",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- CPU: {cpu_line()}",
        f"- Model: {a.model}",
        f"- Command: {COMMANDS[a.method]} Each trace is replayed on a fresh "
        f"`tessera serve {a.serve} --speculation off --block-size 16` by `tessera bench serve --trace` "
        "(real) and on `tessera tune simulate --trace` (seeds of the step jitter); `runs` counts each.",
        f"- Step model: {step_model.get('source', '?')}; fit |relative error| median "
        f"{100 * step_model.get('median_abs_rel_error', 0):.1f}%, "
        f"p90 {100 * step_model.get('p90_abs_rel_error', 0):.1f}%",
        "- Cells: median over the runs (range). Error: simulated median against real median. "
        "Real spread: (max - min) / median of the real runs, the engine's own run-to-run variation on this machine.",
        "",
        "| trace | side | runs | out tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | preemptions |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    metrics = (("out_tok_s", 1, ".1f"), ("ttft_p50", 1e3, ".0f"), ("ttft_p99", 1e3, ".0f"), ("itl_p50", 1e3, ".1f"),
               ("itl_p99", 1e3, ".0f"))

    def row(*cells):
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")

    def values(v):
        return [cell(v, k, scale, fmt) for k, scale, fmt in metrics] + [preempt(v)]

    def errors(v, r):
        return [f"{err(v[k], r[k]):+.1f}%" for k, _, _ in metrics] + [""]

    for name, r, s, at in rows:
        row(name, "real", r["runs"], *values(r))
        row(name, "simulated", s["runs"], *values(s))
        row(name, "error", "", *errors(s, r))
        row(name, "real spread", "",
            *[f"{(r['range'][k][1] - r['range'][k][0]) / r[k] * 100 if r[k] else 0:.0f}%" for k, _, _ in metrics], "")
        for kind, lv in at.items():
            label = level_kinds[kind][0]
            levels = "/".join(f"{x:.2f}" for x in lv["levels"])
            row(name, f"simulated at {label} ({levels})", lv["runs"], *values(lv))
            row(name, f"error at {label}", "", *errors(lv, r))
    lines += [
        "",
        f"Largest |error| of the medians: P99 TTFT {worst['ttft_p99']:.1f}% (target 15%), P99 ITL "
        f"{worst['itl_p99']:.1f}% (target 15%), output throughput {worst['out_tok_s']:.1f}% (target 10%).",
        "",
    ]
    seen = {kind for *_, at in rows for kind in at}
    for kind, (_, text, w) in level_kinds.items():
        if kind not in seen:
            continue
        lines[-1:-1] = [
            f"{text}: P99 TTFT {w['ttft_p99']:.1f}%, P99 ITL {w['itl_p99']:.1f}%, output throughput "
            f"{w['out_tok_s']:.1f}%.",
            "",
        ]
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
