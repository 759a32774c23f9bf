#!/usr/bin/env bash
# `--block-size auto` beside measurements (tune/block_size.h):
#  * decode step time at block sizes 16, 64 and 256, measured on this CPU by `tessera plan
#    --measure` (batch 8; the context of a chat request and of a long document);
#  * KV fragmentation at each block size as the real block pool sees it under each mix
#    (`tessera tune simulate`: the scheduler and block pool, step-weighted BlockPoolStats);
#  * what `tessera tune block-size` picks for each mix, with the measured step model (CPU) and the
#    roofline prior (A100-80GB, Llama-2-70B INT4).
#
#   bash bench/tune_block_size.sh      -> bench/results/tune/block-size.md
#
# Environment: MODEL, TESSERA (the binary), OUT (bench/results/tune: the table only), WORK
# (bench/work/tune-block-size: each measurement's and simulation's JSON, git-ignored), CONTEXTS.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/gemma-3-270m-q4_k_m.gguf}
TESSERA=${TESSERA:-build/bin/tessera}
OUT=${OUT:-bench/results/tune}
WORK=${WORK:-bench/work/tune-block-size}
CONTEXTS=${CONTEXTS:-"256 16384"}
mkdir -p "$OUT" "$WORK"
md="$OUT/block-size.md"
{
  echo "# KV block size: measured beside \`--block-size auto\`"
  echo
  echo "- Date: $(date -u '+%Y-%m-%d %H:%M') UTC"
  echo "- CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ') model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')), $(nproc) cores"
  echo "- Model: $MODEL; command: \`bash bench/tune_block_size.sh\`"
  echo
  echo "## Decode step at batch 8, measured (\`tessera plan --card cpu --measure --batch 8 --decode-context C --block-size B\`)"
  echo
  echo "| context | block 16 ms | block 64 ms | block 256 ms |"
  echo "|---|---|---|---|"
} > "$md"
for ctx in $CONTEXTS; do
  row="| $ctx |"
  for b in 16 64 256; do
    j="$WORK/measure-c$ctx-b$b.json"
    "$TESSERA" plan --model "$MODEL" --card cpu --measure --batch 8 --decode-context "$ctx" --block-size "$b" \
      --json > "$j"
    ms=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); m=j.get('measured', j); print('%.2f (min %.2f)' % (m['step_median_s']*1e3, m['step_min_s']*1e3))" "$j")
    row="$row $ms |"
  done
  echo "$row" >> "$md"
done
{
  echo
  echo "## Fragmentation in the block pool (simulated scheduler and block pool, 2000 requests)"
  echo
  echo "| mix | block 16 | block 64 | block 256 |"
  echo "|---|---|---|---|"
} >> "$md"
for mix in chat docs; do
  row="| $mix |"
  rate=$([ "$mix" = chat ] && echo 2 || echo 0.05)
  for b in 16 64 256; do
    j="$WORK/frag-$mix-b$b.json"
    "$TESSERA" tune simulate --model "$MODEL" --card cpu --lengths "$mix" --rate "$rate" -n 2000 --block-size "$b" \
      --kv-gb 64 --json "$j" > /dev/null
    row="$row $(python3 -c "import json,sys; print('%.1f%%' % (100*json.load(open(sys.argv[1]))['mean_fragmentation']))" "$j") |"
  done
  echo "$row" >> "$md"
done
for dep in "cpu|--model $MODEL --card cpu" "A100-80GB prior|--model llama-2-70b --precision INT4 --card A100-80GB --kv-dtype fp16"; do
  IFS='|' read -r label args <<< "$dep"
  for mix in chat docs; do
    {
      echo
      echo "## \`--block-size auto\` for the $mix mix: $label"
      echo
      # shellcheck disable=SC2086
      "$TESSERA" tune block-size $args --lengths "$mix" --markdown | grep -v '^step model\|^  '
    } >> "$md"
  done
done
cat "$md"
