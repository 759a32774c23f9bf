#!/usr/bin/env bash
# Long context on the CPU (issue: long context and sparse attention): prefill throughput, decode
# ms/token and peak RSS at 1k-32k tokens of context, dense against sparse decode attention for
# the global layers (kernels/sparse_attention.h), with `tessera-bench-cpu`.
#
#   bash bench/long_context.sh [DEPTH ...]      (default: 1024 4096 8192 16384 32704: Gemma 3 reads 32768
#   positions, the decoded tokens included)
#
# Per depth: one process dense (--prompt DEPTH: a timed prefill of that many tokens; --depth
# DEPTH --gen GEN: decode GEN tokens after DEPTH tokens of context), one sparse (--sparse-attention
# on --sparse-threshold 1: every decode of a global layer attends to 1 + 2 + TOP blocks). Prefill
# is dense in both (the sparse run skips its prompt figure). Context ids are synthetic (timing
# only; quality is measured apart).
# Environment: MODEL (default: the Gemma file), BIN (build/bin), THREADS (2), GEN (32), TOP (128),
# OUT (bench/results), APPEND=1 (add rows to an existing table), WORK (bench/work/long-context: each
# run's JSON and output, git-ignored). Writes OUT/long-context-<cpu>.md.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/gemma-3-270m-q4_k_m.gguf}
BIN=${BIN:-build/bin}
THREADS=${THREADS:-2}
GEN=${GEN:-32}
TOP=${TOP:-128}
OUT=${OUT:-bench/results}
depths=("$@")
[ ${#depths[@]} -gt 0 ] || depths=(1024 4096 8192 16384 32704)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
fam=$(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
mod=$(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
tag=$(echo "$cpu" | tr -c 'A-Za-z0-9\n' '-' | sed 's/--*/-/g; s/-$//' | cut -c1-40)
work=${WORK:-bench/work/long-context}
mkdir -p "$work"
md="$OUT/long-context-$tag.md"
[ "${APPEND:-0}" = 1 ] && [ -e "$md" ] || {
  echo "# Long context on the CPU: dense against sparse decode attention"
  echo
  echo "- Date: $(date -u '+%Y-%m-%d %H:%M') UTC"
  echo "- CPU: $cpu (family $fam model $mod), $(nproc) cores; threads $THREADS"
  echo "- Model: $MODEL; command: \`bash bench/long_context.sh ${depths[*]}\` (GEN=$GEN TOP=$TOP)"
  echo "- Sparse: \`--sparse-attention on --sparse-threshold 1 --sparse-top-blocks $TOP\`: the global layers' decodes"
  echo "  attend to the first block, the last two and the $TOP best-scoring 16-token blocks; the sliding-window"
  echo "  layers are unchanged. Decode ms/token: $GEN tokens after the context (median of 1 run; each process runs"
  echo "  one depth). Peak RSS: the whole process, dense run (the sparse one adds the key summaries)."
  echo
  echo "| context tokens | prefill tok/s | decode ms/token dense | decode ms/token sparse | sparse / dense | peak RSS MB dense | peak RSS MB sparse |"
  echo "|---|---|---|---|---|---|---|"
} > "$md"
for d in "${depths[@]}"; do
  "$BIN/tessera-bench-cpu" --model "$MODEL" --threads "$THREADS" --prompt "$d" --gen "$GEN" --depth "$d" --reps 1 \
    --no-bandwidth --sparse-attention off --json "$work/dense-$d.json" > "$work/dense-$d.txt"
  "$BIN/tessera-bench-cpu" --model "$MODEL" --threads "$THREADS" --no-prompt --gen "$GEN" --depth "$d" --reps 1 \
    --no-bandwidth --sparse-attention on --sparse-threshold 1 --sparse-top-blocks "$TOP" \
    --json "$work/sparse-$d.json" > "$work/sparse-$d.txt"
  python3 - "$work" "$d" >> "$md" <<'PY'
import json, sys
work, d = sys.argv[1], sys.argv[2]
dense = json.load(open(f"{work}/dense-{d}.json"))["runs"][0]
sparse = json.load(open(f"{work}/sparse-{d}.json"))["runs"][0]
md, ms = 1e3 / dense["gen_tok_s"], 1e3 / sparse["gen_tok_s"]
print(f"| {d} | {dense.get('prompt_tok_s', 0):.0f} | {md:.1f} | {ms:.1f} | {ms / md:.2f} | "
      f"{dense['peak_rss_mb']:.0f} | {sparse['peak_rss_mb']:.0f} |")
PY
  tail -1 "$md"
done
echo "wrote $md"
