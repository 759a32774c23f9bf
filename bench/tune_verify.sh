#!/usr/bin/env bash
# `tessera tune` end to end on the real engine (issue: `tessera tune`, its third Done-when): a
# chat service where some users paste documents (85% chat lengths, 15% ~900-token prompts with
# ~32-token answers), Poisson arrivals; tune on one trace, then `--verify` replays a held-out
# trace of the same shape (seed + 1000) on fresh `tessera serve` processes with the
# recommendation, the runner-up and both built-in profiles, and reports goodput beside the SLO.
#
#   bash bench/tune_verify.sh [RATE] [SLO]     (default: 1.2 ttft_p99=5s,itl_p99=300ms)
#
# Environment: MODEL (default: the Gemma file; its step model from `bench/tune_validate.sh`),
# TESSERA (the binary), N (requests per trace, default 300), OUT (results directory, default
# bench/results/tune), WORK (default bench/work/tune-verify, git-ignored). Writes OUT/verify-mixed.md and
# the recommended profile beside it; tune's printed report, its table and the verify runs' JSON and
# server logs go to WORK. About 4 minutes per verified setting (three).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/gemma-3-270m-q4_k_m.gguf}
TESSERA=${TESSERA:-build/bin/tessera}
OUT=${OUT:-bench/results/tune}
WORK=${WORK:-bench/work/tune-verify}
N=${N:-300}
RATE=${1:-1.2}
SLO=${2:-ttft_p99=5s,itl_p99=300ms}
LENGTHS="chat*0.85+lognormal:900,0.3/lognormal:32,0.5*0.15"
mkdir -p "$OUT" "$WORK"
cmd=("$TESSERA" tune --model "$MODEL" --card cpu --lengths "$LENGTHS" --rate "$RATE" -n "$N" --seed 11 --slo "$SLO"
     --out "$OUT/gemma-cpu-mixed-profile.json" --table "$WORK/gemma-cpu-mixed-tune-table.md"
     --verify --verify-top 1 --verify-dir "$WORK/verify-mixed" --serve-arg=--threads=2 --serve-arg=--speculation=off)
"${cmd[@]}" | tee "$WORK/gemma-cpu-mixed-tune.txt"
{
  echo "# \`tessera tune\` verified on the real engine: chat with pasted documents"
  echo
  echo "- Date: $(date -u '+%Y-%m-%d %H:%M') UTC"
  echo "- CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ') model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')), $(nproc) cores"
  echo "- Model: $MODEL (step model: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["models"][0]["source"])' "$MODEL.steps.json"))"
  echo "- Command: \`bash bench/tune_verify.sh $RATE $SLO\` (tune trace: $N requests, seed 11; held-out: seed 1011)"
  echo "- Lengths: \`$LENGTHS\`, Poisson arrivals at $RATE req/s; SLO $SLO (P99 targets over the run, met by the simulated"
  echo "  candidate within 85% of them (--slo-margin 0.15); goodput: requests per second whose TTFT and own P99 inter-token gap are within the targets)"
  echo
  echo "## Simulated (the tune trace)"
  echo
  echo '```'
  sed -n '/Recommended and built-in/,/settings simulated/p' "$WORK/gemma-cpu-mixed-tune.txt"
  echo '```'
  echo
  echo "## Real engine (the held-out trace)"
  echo
  echo '```'
  sed -n '/verify on the real engine/,$p' "$WORK/gemma-cpu-mixed-tune.txt"
  echo '```'
} > "$OUT/verify-mixed.md"
echo "wrote $OUT/verify-mixed.md"
