#!/usr/bin/env bash
# The KV cache's element type at long context on the CPU (issue: long context; `--kv-dtype
# fp32|fp16|int8`): prefill tok/s, dense decode ms/token, peak RSS and KV bytes per token, with
# `tessera-bench-cpu`, the three types side by side at each depth (their order rotates from depth
# to depth, so drift of the machine does not favour one type).
#
#   bash bench/kv_dtype.sh [DEPTH ...]      (default: 4096 16384 32704)
#
# Per depth and type: one process, a prefill of DEPTH tokens in one piece (timed: its tok/s) and
# GEN decoded tokens after that context (--depth DEPTH), dense attention (the quality of
# the types is `tessera eval --precisions file:kv-fp16,file:kv-int8 --reference file`).
# Environment: MODEL (default: the Gemma file), BIN (build/bin), THREADS (2), GEN (32),
# TYPES ("fp32 fp16 int8"), OUT (bench/results), WORK (bench/work/kv-dtype: each run's JSON and
# output, git-ignored). Writes OUT/kv-dtype-<cpu>.md.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/gemma-3-270m-q4_k_m.gguf}
BIN=${BIN:-build/bin}
THREADS=${THREADS:-2}
GEN=${GEN:-32}
OUT=${OUT:-bench/results}
read -r -a types <<< "${TYPES:-fp32 fp16 int8}"
depths=("$@")
[ ${#depths[@]} -gt 0 ] || depths=(4096 16384 32704)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
fam=$(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
mod=$(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
tag=$(echo "$cpu" | tr -c 'A-Za-z0-9\n' '-' | sed 's/--*/-/g; s/-$//' | cut -c1-40)
work=${WORK:-bench/work/kv-dtype}
mkdir -p "$work"
md="$OUT/kv-dtype-$tag.md"
start=$(date -u '+%Y-%m-%d %H:%M')
n=${#types[@]}
i=0
for d in "${depths[@]}"; do
  for ((j = 0; j < n; ++j)); do
    t=${types[$(((i + j) % n))]}
    "$BIN/tessera-bench-cpu" --model "$MODEL" --threads "$THREADS" --no-prompt --gen "$GEN" --depth "$d" --reps 1 \
      --no-bandwidth --sparse-attention off --kv-dtype "$t" --json "$work/$t-$d.json" > "$work/$t-$d.txt" 2>&1
    echo "depth $d $t done" >&2
  done
  i=$((i + 1))
done
python3 - "$work" "$cpu (family $fam model $mod), $(nproc) cores; threads $THREADS" "$start-$(date -u '+%H:%M')" \
  "$MODEL" "$GEN" "${types[*]}" "${depths[*]}" > "$md" <<'PY'
import json, sys
work, cpu, when, model, gen, types, depths = sys.argv[1:8]
types, depths = types.split(), depths.split()
print("# KV cache element types at long context (CPU, dense attention)\n")
print(f"- Date: {when} UTC; CPU: {cpu}")
print(f"- Model: {model}; command: `bash bench/kv_dtype.sh {' '.join(depths)}` (GEN={gen}); one process per depth and")
print("  type, the types' order rotating per depth; prefill: the context, one timed piece of DEPTH tokens; decode: "
      f"{gen} tokens after DEPTH tokens of context (median of 1 run).")
print("- KV bytes per token: every layer's K and V (int8: head_dim values and a 4-byte scale per token and KV head); this")
print("  bench's model keeps every layer's positions in one pool (`serve` keeps the sliding-window layers' in the window")
print("  pool, so there the global layers' share is what grows with the context). Peak RSS: the whole process.\n")
print("| context tokens | KV type | prefill tok/s | decode ms/token | peak RSS MB | KV bytes/token | decode vs fp32 | RSS vs fp32 |")
print("|---|---|---|---|---|---|---|---|")
for d in depths:
    runs = {t: json.load(open(f"{work}/{t}-{d}.json")) for t in types}
    base = runs.get("fp32", runs[types[0]])["runs"][0]
    for t in types:
        r = runs[t]["runs"][0]
        ms, base_ms = 1e3 / r["gen_tok_s"], 1e3 / base["gen_tok_s"]
        kvb = r.get("kv_bytes_per_token", 0)
        print(f"| {d} | {t} | {r.get('depth_prefill_tok_s', 0):.0f} | {ms:.1f} | {r['peak_rss_mb']:.0f} | {kvb} | "
              f"{ms / base_ms:.2f} | {r['peak_rss_mb'] / base['peak_rss_mb']:.2f} |")
PY
cat "$md"
echo "wrote $md"
