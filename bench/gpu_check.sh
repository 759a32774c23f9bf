#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU (issue 6): builds the CUDA backend for this GPU's
# architecture only, runs the `gpu` tests, then tessera-gpu-ops-bench (per-op timings and the
# device copy bandwidth), then tessera-gpu-forward-bench (decode-step time of the CUDA forward
# pass on an in-memory Llama-3-8B-shaped model, F16 then INT8 / INT4 while time is left, at
# batch 1, 8, 32 and 128, with CUDA graphs and eagerly, beside the weight-bytes /
# copy-bandwidth floor), then the same shape in PyTorch eager (bench/torch_eager_bench.py,
# when torch is importable), prints a short summary table last and writes everything to
# bench/results/gpu-check-<gpu>-<date>.md.
# Budget: under 8 minutes in all (each step has its own timeout).
#
# Usage: bench/gpu_check.sh            (BUILD_DIR=build-gpu-check by default)
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
BUILD_DIR=${BUILD_DIR:-build-gpu-check}
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"

step() { echo; echo "== $* ($(( $(date +%s) - START )) s)"; }
die() { echo "gpu_check: $*" >&2; exit 1; }

command -v nvcc >/dev/null || die "nvcc not found (install the CUDA toolkit or put it on PATH)"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: is the NVIDIA driver installed?"
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
[[ "$CAP" =~ ^[0-9]+$ ]] || die "could not read the compute capability from nvidia-smi (got '$CAP')"
echo "GPU: $GPU_NAME, compute capability $CAP; build dir $BUILD_DIR"

step "configure for sm_$CAP only"
mkdir -p "$BUILD_DIR"
LOG_CFG="$BUILD_DIR/gpu_check.configure.log"; LOG_BUILD="$BUILD_DIR/gpu_check.build.log"
timeout 120 cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$CAP" >"$LOG_CFG" 2>&1 \
  || { tail -30 "$LOG_CFG"; die "configure failed (log: $LOG_CFG)"; }
grep -E "Tessera: (CUDA|NCCL)" "$LOG_CFG"

step "build tessera_cuda, tessera_gpu_tests, tessera-gpu-ops-bench, tessera-gpu-forward-bench"
timeout 300 cmake --build "$BUILD_DIR" -j "$(nproc)" --target tessera_cuda tessera_gpu_tests tessera-gpu-ops-bench \
  tessera-gpu-forward-bench \
  >"$LOG_BUILD" 2>&1 || { tail -40 "$LOG_BUILD"; die "build failed (log: $LOG_BUILD)"; }

step "ctest -L gpu"
TESTS_OK=yes
(cd "$BUILD_DIR" && timeout 150 ctest -L gpu -j 4 --output-on-failure) 2>&1 | tee "$BUILD_DIR/gpu_check.ctest.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || TESTS_OK=no
# A skipped GPU test on a GPU machine means the device was not usable: not a pass (except the
# two-rank NCCL test, which needs a second GPU, and the test for machines without a device).
SKIPPED=$(grep '(Skipped)' "$BUILD_DIR/gpu_check.ctest.log" | grep -vcE 'TwoRanksOnTwoDevices|CreateWithoutDevice' || true)
[ "$SKIPPED" -eq 0 ] || TESTS_OK="no ($SKIPPED skipped; see $BUILD_DIR/gpu_check.ctest.log)"

step "tessera-gpu-ops-bench"
mkdir -p bench/results
SAFE_NAME=$(echo "$GPU_NAME" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')
RESULT=bench/results/gpu-check-${SAFE_NAME}-$(date -u +%Y%m%d-%H%M%S).md
BENCH_OUT=$(timeout 120 "$BUILD_DIR/bin/tessera-gpu-ops-bench" 2>&1)
BENCH_RC=$?

# The forward pass gets what is left of the 8 minutes but 100 s for PyTorch (at most 200 s,
# at least 60 s); the bench starts a further weight type only while its budget lasts.
step "tessera-gpu-forward-bench"
LEFT=$(( 370 - ($(date +%s) - START) ))
FWD_TIMEOUT=$(( LEFT > 200 ? 200 : (LEFT < 60 ? 60 : LEFT) ))
FWD_OUT=$(timeout "$FWD_TIMEOUT" "$BUILD_DIR/bin/tessera-gpu-forward-bench" --types f16,int4,int8 \
  --batches 1,8,32,128 --steps 10 --context 128 --budget-s $(( FWD_TIMEOUT - 80 )) 2>&1)
FWD_RC=$?
[ "$FWD_RC" -eq 124 ] && FWD_OUT="$FWD_OUT
(timed out after $FWD_TIMEOUT s)"

step "PyTorch eager (bench/torch_eager_bench.py)"
LEFT=$(( 470 - ($(date +%s) - START) ))
TORCH_TIMEOUT=$(( LEFT > 100 ? 100 : (LEFT < 30 ? 30 : LEFT) ))
PY=${PYTHON:-python3}
TORCH_OUT=$(timeout "$TORCH_TIMEOUT" "$PY" bench/torch_eager_bench.py --batches 1,8,32,128 --steps 10 --context 128 \
  --budget-s $(( TORCH_TIMEOUT - 45 )) 2>&1 | tail -12)
[ "${PIPESTATUS[0]}" -eq 124 ] && TORCH_OUT="$TORCH_OUT
(timed out after $TORCH_TIMEOUT s)"

# The summary: per batch, Tessera F16 / INT4 decode step (graphs) against PyTorch eager, the
# INT4 step against its bandwidth floor, and the host share of a graphed INT4 step.
SUMMARY=$(printf '%s\n@@TORCH@@\n%s\n' "$FWD_OUT" "$TORCH_OUT" | awk -F'|' '
  /^@@TORCH@@/ { torch = 1; next }
  !torch && $2 ~ /^ (f16|int8|int4) $/ {
    t = $2; gsub(/ /, "", t); b = $4 + 0; ms[t, b] = $5 + 0; floorp[t, b] = $9; host[t, b] = $12; seen[b] = 1 }
  torch && $2 ~ /^ (hf|plain) $/ && $5 + 0 > 0 { b = $4 + 0; pt[b] = $5 + 0; seen[b] = 1 }
  END {
    print "| batch | Tessera F16 ms | Tessera INT4 ms | INT4 floor/step | INT4 host share eager -> graph | PyTorch eager F16 ms | PyTorch / Tessera INT4 |"
    print "|---|---|---|---|---|---|---|"
    n = split("1 8 32 128", bs, " ")
    for (i = 1; i <= n; ++i) { b = bs[i]; if (!(b in seen)) continue
      f = ((("f16", b) in ms) ? sprintf("%.2f", ms["f16", b]) : "-")
      q = ((("int4", b) in ms) ? sprintf("%.2f", ms["int4", b]) : "-")
      r = ((b in pt) && (("int4", b) in ms) && ms["int4", b] > 0 ? sprintf("%.1fx", pt[b] / ms["int4", b]) : "-")
      printf "| %d | %s | %s | %s | %s | %s | %s |\n", b, f, q, (("int4", b) in floorp ? floorp["int4", b] : "-"),
        (("int4", b) in host ? host["int4", b] : "-"), ((b in pt) ? sprintf("%.2f", pt[b]) : "-"), r }
  }')
{
  echo "# GPU check: $GPU_NAME"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); host: $(hostname)"
  echo "- command: bench/gpu_check.sh (BUILD_DIR=$BUILD_DIR, CMAKE_CUDA_ARCHITECTURES=$CAP)"
  echo "- driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1); $(nvcc --version | tail -1)"
  echo "- gpu tests passed: $TESTS_OK"
  echo
  echo "$BENCH_OUT"
  echo
  echo "## CUDA forward pass, decode step (tessera-gpu-forward-bench, synthetic Llama-3-8B shape)"
  echo
  echo "$FWD_OUT"
  echo
  echo "## PyTorch eager, same shape (bench/torch_eager_bench.py)"
  echo
  echo "$TORCH_OUT"
  echo
  echo "## Summary (targets: INT4 batch 1 at >= 75% of the floor, >= 3x PyTorch eager at batch 1, graphed host share < 10%)"
  echo
  echo "$SUMMARY"
} >"$RESULT"

step "results ($RESULT)"
echo "$BENCH_OUT"
echo
echo "$FWD_OUT"
echo
echo "$TORCH_OUT"
echo
echo "$SUMMARY"
echo
echo "gpu tests passed: $TESTS_OK; bench exit code: $BENCH_RC; forward bench exit code: $FWD_RC;" \
  "total $(( $(date +%s) - START )) s"
[ "$TESTS_OK" = yes ] && [ "$BENCH_RC" -eq 0 ] && [ "$FWD_RC" -eq 0 ]
