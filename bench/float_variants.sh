#!/usr/bin/env bash
# The float-weight matmul's per-CPU variants and precisions on a whole model
# (kernels/cpu/cpu_info.h, kernels/gemm.h): prefill, batch-1 decode and 16 / 32 concurrent
# decodes with `tessera-bench-cpu`, each configuration in turn, ROUNDS rounds alternating (so
# drift of the machine does not favour one), every figure listed (no averaging).
#
#   bash bench/float_variants.sh [MODEL]      (default: models/m110-f16)
#
# Configurations (CONFIGS, space-separated NAME=precision:prefetch:panels):
#   fp32-nta-stored  the fp32 kernels as tuned on AMD (non-temporal prefetch, 16-bit panels)
#   fp32-l2-stored   rows ahead prefetched into L2
#   fp32-l2-fp32     and panels widened to fp32 (the Intel default)
#   bf16             the bf16 dot products (AVX512_BF16)
# Environment: BIN (build/bin), THREADS (2), ROUNDS (2). Prints a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/m110-f16}
BIN=${BIN:-build/bin}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-2}
read -r -a configs <<< "${CONFIGS:-fp32-nta-stored=fp32:nta:stored fp32-l2-stored=fp32:l2:stored fp32-l2-fp32=fp32:l2:fp32 bf16=bf16:l2:fp32}"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ') model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), $(nproc) cores"
echo "Date: $(date -u '+%Y-%m-%d %H:%M') UTC; model $MODEL; $THREADS threads; $ROUNDS rounds"
echo
echo "| round | configuration | prompt 128 tok/s | gen tok/s | 16 seqs tok/s | 32 seqs tok/s |"
echo "|---|---|---:|---:|---:|---:|"
for ((r = 1; r <= ROUNDS; ++r)); do
  for c in "${configs[@]}"; do
    name=${c%%=*}
    IFS=: read -r prec pf panels <<< "${c#*=}"
    line=$(TESSERA_CPU_FLOAT_PREFETCH=$pf TESSERA_CPU_FLOAT_PANELS=$panels "$BIN/tessera-bench-cpu" --model "$MODEL" \
      --threads "$THREADS" --prompt 128 --gen 32 --batches 16,32 --batch-gen 16 --reps 3 --no-bandwidth \
      --matmul-precision "$prec" 2>&1 | grep "^threads")
    num() { echo "$line" | grep -o "$1 [0-9.]* tok/s" | awk '{print $2}'; }
    echo "| $r | $name | $(num prompt) | $(num gen) | $(num x16) | $(num x32) |"
  done
done
