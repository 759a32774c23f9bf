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
        "preemptions": None,
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
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="")
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

    lines = [
        "# Simulator against the real engine",
        "",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- CPU: {cpu_line()}",
        f"- Model: {a.model}",
        "- Command: `bash bench/tune_validate.sh all`: calibration at block sizes 16/64/256 "
        "(`tessera serve --step-log`, `tessera tune calibrate`), then each trace replayed on a fresh "
        "`tessera serve --threads 2 --speculation off --block-size 16` by `tessera bench serve --trace` "
        "(real; several runs) and on `tessera tune simulate --trace` (five seeds of the step jitter).",
        f"- Step model: {step_model.get('source', '?')}; fit |relative error| median "
        f"{100 * step_model.get('median_abs_rel_error', 0):.1f}%, p90 {100 * step_model.get('p90_abs_rel_error', 0):.1f}%",
        "- Cells: median over the runs (range). Error: simulated median against real median. "
        "Real spread: (max - min) / median of the real runs, the engine's own run-to-run variation on this machine.",
        "",
        "| trace | side | runs | out tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r, s, at in rows:
        for side, v in (("real", r), ("simulated", s)):
            lines.append(
                f"| {name} | {side} | {v['runs']} | {cell(v, 'out_tok_s', 1, '.1f')} | {cell(v, 'ttft_p50', 1e3, '.0f')} | "
                f"{cell(v, 'ttft_p99', 1e3, '.0f')} | {cell(v, 'itl_p50', 1e3, '.1f')} | {cell(v, 'itl_p99', 1e3, '.0f')} |")
        lines.append(
            f"| {name} | error | | {err(s['out_tok_s'], r['out_tok_s']):+.1f}% | {err(s['ttft_p50'], r['ttft_p50']):+.1f}% | "
            f"{err(s['ttft_p99'], r['ttft_p99']):+.1f}% | {err(s['itl_p50'], r['itl_p50']):+.1f}% | "
            f"{err(s['itl_p99'], r['itl_p99']):+.1f}% |")
        spread = {k: (r["range"][k][1] - r["range"][k][0]) / r[k] * 100 if r[k] else 0 for k in KEYS}
        lines.append(
            f"| {name} | real spread | | {spread['out_tok_s']:.0f}% | {spread['ttft_p50']:.0f}% | {spread['ttft_p99']:.0f}% | "
            f"{spread['itl_p50']:.0f}% | {spread['itl_p99']:.0f}% |")
        for kind, lv in at.items():
            label = level_kinds[kind][0]
            levels = "/".join(f"{x:.2f}" for x in lv["levels"])
            lines.append(
                f"| {name} | simulated at {label} ({levels}) | {lv['runs']} | {cell(lv, 'out_tok_s', 1, '.1f')} | "
                f"{cell(lv, 'ttft_p50', 1e3, '.0f')} | {cell(lv, 'ttft_p99', 1e3, '.0f')} | {cell(lv, 'itl_p50', 1e3, '.1f')} | "
                f"{cell(lv, 'itl_p99', 1e3, '.0f')} |")
            lines.append(
                f"| {name} | error at {label} | | {err(lv['out_tok_s'], r['out_tok_s']):+.1f}% | "
                f"{err(lv['ttft_p50'], r['ttft_p50']):+.1f}% | {err(lv['ttft_p99'], r['ttft_p99']):+.1f}% | "
                f"{err(lv['itl_p50'], r['itl_p50']):+.1f}% | {err(lv['itl_p99'], r['itl_p99']):+.1f}% |")
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
