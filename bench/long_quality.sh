#!/usr/bin/env bash
# Quality of sparse decode attention on long real text (issue: long context and sparse attention):
# teacher-forced KL against dense attention and needle-in-a-haystack retrieval at 2k-32k tokens,
# with `tessera-bench-long-quality` (bench/long_quality.cpp says what each figure is).
#
#   bash bench/long_quality.sh
#
# Texts, from the Python standard library of the venv's (or the system's) Python 3.11, so the
# same on every machine with that Python: the haystack and the prose document are the
# language reference's pydoc topics (pydoc_data.topics, in key order); the code document is
# argparse, typing, dataclasses, enum, functools and inspect's sources, concatenated.
# Environment: MODEL (the Gemma file), BIN (build/bin), THREADS (2), LENGTHS (2048,4096,8192,16384,32704),
# DEPTHS (10), TOPS (16,32,64,128: the top-block budgets, one sparse run each), KL_TOKENS (128),
# OUT (bench/results), WORK (bench/work/long-quality: the two texts, git-ignored). Writes
# OUT/long-quality-<cpu>.md and .json. About 45 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/gemma-3-270m-q4_k_m.gguf}
BIN=${BIN:-build/bin}
THREADS=${THREADS:-2}
LENGTHS=${LENGTHS:-2048,4096,8192,16384,32704}
DEPTHS=${DEPTHS:-10}
TOPS=${TOPS:-16,32,64,128}
KL_TOKENS=${KL_TOKENS:-128}
OUT=${OUT:-bench/results}
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
fam=$(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
mod=$(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
tag=$(echo "$cpu" | tr -c 'A-Za-z0-9\n' '-' | sed 's/--*/-/g; s/-$//' | cut -c1-40)
work=${WORK:-bench/work/long-quality}
mkdir -p "$work"
"$PY" - "$work" <<'PY'
import os, sys, sysconfig
import pydoc_data.topics as t
work = sys.argv[1]
with open(os.path.join(work, "topics.txt"), "w") as f:
    f.write("\n\n".join(t.topics[k] for k in sorted(t.topics)))
lib = sysconfig.get_paths()["stdlib"]
with open(os.path.join(work, "stdlib_code.txt"), "w") as f:
    f.write("\n\n".join(open(os.path.join(lib, m)).read()
                        for m in ["argparse.py", "typing.py", "dataclasses.py", "enum.py", "functools.py", "inspect.py"]))
PY
pyver=$("$PY" -c 'import sys; print(sys.version.split()[0])')
start=$(date -u '+%Y-%m-%d %H:%M')
"$BIN/tessera-bench-long-quality" --model "$MODEL" --threads "$THREADS" --lengths "$LENGTHS" --depths "$DEPTHS" \
  --sparse-top-blocks "$TOPS" --kl-tokens "$KL_TOKENS" --haystack "$work/topics.txt" \
  --kl-text "$work/topics.txt" --kl-text "$work/stdlib_code.txt" --json "$OUT/long-quality-$tag.json" |
  grep --line-buffered -v '^\[tessera\]'
"$PY" - "$OUT/long-quality-$tag.json" "$cpu (family $fam model $mod), $(nproc) cores; threads $THREADS" "$start" \
  "$(date -u '+%H:%M')" "$pyver" > "$OUT/long-quality-$tag.md" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
cpu, start, end, pyver = sys.argv[2:6]
tops = r["top_blocks"]
bs = r["block_size"]
print("# Sparse decode attention on long real text: KL against dense, needle in a haystack\n")
print(f"- Date: {start}-{end} UTC; CPU: {cpu}")
print(f"- Model: {r['model']}; KV {r['kv_dtype']}, block {bs}; command: `bash bench/long_quality.sh`")
print(f"- Sparse: the global layers' decodes attend to {r['sink_blocks']} sink + {r['recent_blocks']} recent blocks "
      f"+ the top T blocks by Quest bound (T = {', '.join(map(str, tops))}: {', '.join(str(t * bs) for t in tops)} "
      "tokens); prefill is always dense. Texts from Python " + pyver + "'s standard library: *topics* = the language "
      "reference's pydoc topics, *code* = argparse, typing, dataclasses, enum, functools, inspect sources.\n")
print(f"## Teacher-forced KL(dense || sparse), last {r['kl_tokens']} tokens of each length\n")
print("Per position: KL of the next-token distributions (nats), whether the top-1 tokens agree, and the log-loss "
      "(nats/token) of the document's real next token.\n")
print("| document | context | T | KL mean | KL p95 | KL max | top-1 agree | loss dense | loss sparse |")
print("|---|---|---|---|---|---|---|---|---|")
for k in r.get("kl", []):
    doc = "topics" if "topics" in k["doc"] else "code"
    print(f"| {doc} | {k['length']} | {k['top_blocks']} | {k['kl_mean']:.4f} | {k['kl_p95']:.4f} | {k['kl_max']:.3f} | "
          f"{100 * k['top1_agree']:.1f}% | {k['nll_dense']:.4f} | {k['nll_sparse']:.4f} |")
print("\n## Needle in a haystack (passes of the depths)\n")
print("*engine*: the prompt prefilled (dense), the answer decoded sparse, as `serve` runs it; *strict*: the "
      "question's tokens decoded sparse too. A pass: the 5-digit passcode within the answer's first 16 characters "
      "(8 greedy tokens).\n")
modes = ["dense"] + [f"sparse{t}_{m}" for t in tops for m in ("engine", "strict")]
print("| context | " + " | ".join(m.replace("sparse", "T=").replace("_", " ") for m in modes) + " |")
print("|---" * (len(modes) + 1) + "|")
for s in r.get("needle_summary", []):
    print(f"| {s['length']} | " + " | ".join(f"{s[m]}/{s['depths']}" for m in modes) + " |")
PY
cat "$OUT/long-quality-$tag.md"
