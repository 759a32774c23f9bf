#!/usr/bin/env bash
# The chat-service scenario on the 70B INT4 / A100-80GB cost model (the planner's roofline prior,
# tune/step_model.h): what max_wait 50 ms / max_batch 32 against 5 ms / 16 does to throughput and
# P99 latency at a stated load, and what `tessera tune` recommends for a 500 ms P99 TTFT SLO.
#
#   bash bench/tune_chat_scenario.sh [RATE ...]     (default: 3 4 5 requests/s)
#
# Writes bench/results/tune/chat-70b-a100.md, the two profiles and the Pareto plot beside it (OUT);
# the traces, each setting's JSON, tune's printed report, its table and its every-candidate JSON
# (the plot's input) go to WORK (bench/work/tune-chat-scenario, git-ignored). Simulation only:
# no model, no device; a few seconds per setting.
set -euo pipefail
cd "$(dirname "$0")/.."
TESSERA=${TESSERA:-build/bin/tessera}
OUT=${OUT:-bench/results/tune}
WORK=${WORK:-bench/work/tune-chat-scenario}
mkdir -p "$OUT" "$WORK"
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(3 4 5)
DEP=(--model llama-2-70b --precision INT4 --card A100-80GB --kv-dtype fp16)
SLO="ttft_p99=500ms,itl_p99=150ms"
md="$OUT/chat-70b-a100.md"
{
  echo "# Chat service on Llama-2-70B INT4, one A100-80GB (simulated)"
  echo
  cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  cpu+=" (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')"
  cpu+=" model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' '))"
  echo "- Date: $(date -u '+%Y-%m-%d %H:%M') UTC; simulated on $cpu (the tables do not depend on its speed)"
  echo "- Command: \`bash bench/tune_chat_scenario.sh ${rates[*]}\`"
  echo "- Trace: \`tessera tune trace --lengths chat --arrivals poisson -n 20000\` at each rate (prompts log-normal mean 160,"
  echo "  outputs log-normal mean 96 tokens); KV fp16, block 16; speculation not simulated."
  "$TESSERA" tune simulate "${DEP[@]}" --lengths chat --rate 1 -n 10 | sed -n '1,3p' | sed 's/^/    /'
  echo
  echo "| load req/s | setting | out tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | goodput req/s ($SLO) |"
  echo "|---|---|---|---|---|---|---|---|"
} > "$md"
for rate in "${rates[@]}"; do
  trace="$WORK/chat-70b-rate$rate.jsonl"
  "$TESSERA" tune trace --lengths chat --arrivals poisson --rate "$rate" -n 20000 --seed 11 --out "$trace" > /dev/null
  for setting in "50:32" "5:16"; do
    IFS=: read -r wait batch <<< "$setting"
    j="$WORK/chat-70b-rate$rate-w$wait-b$batch.json"
    "$TESSERA" tune simulate "${DEP[@]}" --trace "$trace" --max-wait-ms "$wait" --max-batch "$batch" --slo "$SLO" \
      --json "$j" > /dev/null
    python3 - "$j" "$rate" "$wait" "$batch" >> "$md" << 'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"| {sys.argv[2]} | wait {sys.argv[3]} ms, batch {sys.argv[4]} | {j['output_tok_s']:.0f} | {j['ttft_p50_s']*1e3:.0f} | "
      f"{j['ttft_p99_s']*1e3:.0f} | {j['itl_p50_s']*1e3:.1f} | {j['itl_p99_s']*1e3:.1f} | {j['goodput']:.2f} |")
PY
  done
done
rate=${TUNE_RATE:-${rates[$(( ${#rates[@]} / 2 ))]}}
{
  echo
  echo "## \`tessera tune\` at $rate req/s for $SLO"
  echo
  echo "\`tessera tune ${DEP[*]} --lengths chat --rate $rate -n 5000 --slo $SLO --out $OUT/chat-70b-a100-profile.json\`"
  echo
} >> "$md"
"$TESSERA" tune "${DEP[@]}" --lengths chat --rate "$rate" -n 5000 --seed 5 --slo "$SLO" \
  --out "$OUT/chat-70b-a100-profile.json" --table "$WORK/chat-70b-tune-table.md" --json "$WORK/chat-70b-a100-tune.json" \
  > "$WORK/chat-70b-tune.txt"
cat "$WORK/chat-70b-tune-table.md" >> "$md"
{
  echo
  grep '^recommended:' "$WORK/chat-70b-tune.txt" || true
  echo
  echo "Profile written: \`$OUT/chat-70b-a100-profile.json\`"
} >> "$md"
# The SLO the scenario names, P99 TTFT alone (the one above also bounds the gaps between tokens),
# at the lowest rate (TTFT_RATE): at the middle one no setting keeps P99 TTFT within 500 ms.
SLO_TTFT=${SLO_TTFT:-ttft_p99=500ms}
rate=${TTFT_RATE:-${rates[0]}}
{
  echo
  echo "## \`tessera tune\` at $rate req/s for $SLO_TTFT alone"
  echo
  echo "\`tessera tune ${DEP[*]} --lengths chat --rate $rate -n 5000 --slo $SLO_TTFT" \
    "--out $OUT/chat-70b-a100-profile-ttft.json\`"
  echo
} >> "$md"
"$TESSERA" tune "${DEP[@]}" --lengths chat --rate "$rate" -n 5000 --seed 5 --slo "$SLO_TTFT" \
  --out "$OUT/chat-70b-a100-profile-ttft.json" > "$WORK/chat-70b-tune-ttft.txt"
{
  echo '```'
  sed -n '/Recommended and built-in/,/settings simulated/p' "$WORK/chat-70b-tune-ttft.txt"
  echo '```'
  echo
  grep '^recommended:' "$WORK/chat-70b-tune-ttft.txt" || true
} >> "$md"
if [ -x .venv/bin/python ] && .venv/bin/python -c 'import matplotlib' 2> /dev/null; then
  .venv/bin/python tools/plot_tune.py "$WORK/chat-70b-a100-tune.json" "$OUT/chat-70b-a100-pareto.png" && \
    echo "![throughput against P99 TTFT](chat-70b-a100-pareto.png)" >> "$md"
fi
cat "$md"
