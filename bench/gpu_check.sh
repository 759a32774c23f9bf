#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU (issue 6): builds the CUDA backend for this GPU's
# architecture only, runs the `gpu` tests, then tessera-gpu-ops-bench (per-op timings and the
# device copy bandwidth, and the sparse / dense decode-attention crossover), then
# tessera-gpu-forward-bench (decode-step time of the CUDA forward
# pass on an in-memory Llama-3-8B-shaped model, F16 then INT8 / INT4 while time is left, at
# batch 1, 8, 32 and 128, with CUDA graphs and eagerly, beside the weight-bytes /
# copy-bandwidth floor), then the same shape in PyTorch eager (bench/torch_eager_bench.py,
# when torch is importable), prints a short summary table last and writes everything to
# bench/results/gpu-check-<gpu>-<date>.md.
# Budget: under 8 minutes in all (each step has its own timeout).
#
# Usage: bench/gpu_check.sh            (BUILD_DIR=build-gpu-check by default)
#        bench/gpu_check.sh --prebuilt DIR
#   --prebuilt: run the programs bench/gpu_bundle.sh built elsewhere and gathered in DIR (the
#   lent GPU machine has CUDA, PyTorch and CMake but not Tessera's Debian -dev dependencies, so
#   it cannot build; carry DIR there). The gpu tests then run as one gtest program.
#   GPU_CHECK_CUDA_LIBRARY overrides the backend library the programs load (a dry run of this
#   script on a machine without a GPU: the CPU stand-in, with GPU_CHECK_GTEST_FILTER set to the
#   tests it serves and GPU_CHECK_BENCH=0).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
BUILD_DIR=${BUILD_DIR:-build-gpu-check}
PREBUILT=""
if [ "${1:-}" = "--prebuilt" ]; then
  PREBUILT=${2:-}
  [ -n "$PREBUILT" ] || { echo "gpu_check: --prebuilt needs the folder bench/gpu_bundle.sh wrote" >&2; exit 1; }
fi
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"

step() { echo; echo "== $* ($(( $(date +%s) - START )) s)"; }
die() { echo "gpu_check: $*" >&2; exit 1; }

# Directories holding CUDA's runtime, cuBLAS(Lt) and NCCL: the toolkit's, then any NVIDIA wheels
# of the Python that has PyTorch (the lent machine's NCCL comes only as a wheel).
cuda_lib_dirs() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && echo "$d"
  done
  "${PYTHON:-python3}" - <<'PYEOF' 2>/dev/null
import glob, os, site
for sp in site.getsitepackages():
    for d in sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib"))):
        print(d)
PYEOF
}

[ -n "$PREBUILT" ] || command -v nvcc >/dev/null || die "nvcc not found (install the CUDA toolkit or put it on PATH)"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: is the NVIDIA driver installed?"
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
[[ "$CAP" =~ ^[0-9]+$ ]] || die "could not read the compute capability from nvidia-smi (got '$CAP')"

if [ -n "$PREBUILT" ]; then
  [ -f "$PREBUILT/MANIFEST" ] || die "$PREBUILT/MANIFEST not found: make the folder with bench/gpu_bundle.sh"
  echo "GPU: $GPU_NAME, compute capability $CAP; prebuilt programs from $PREBUILT:"
  sed 's/^/  /' "$PREBUILT/MANIFEST"
  BIN=$(cd "$PREBUILT/bin" && pwd)
  LIBDIR=$(cd "$PREBUILT/lib" && pwd)
  export TESSERA_CUDA_LIBRARY=${GPU_CHECK_CUDA_LIBRARY:-$LIBDIR/libtessera_cuda.so}
  # The bundle's copy of the reference test data: the tests' compiled-in default is a folder of
  # the machine that built them.
  export TESSERA_TESTDATA=$(cd "$PREBUILT/testdata" && pwd)
  # The loader tests' two libraries (their build paths are compiled in).
  export TESSERA_BUILT_CUDA_LIBRARY="$LIBDIR/libtessera_cuda.so" TESSERA_FAKE_CUDA_LIBRARY="$LIBDIR/libtessera_fake_cuda.so"
  export LD_LIBRARY_PATH="$LIBDIR:$(cuda_lib_dirs | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  MISSING=$(for f in "$BIN"/* "$LIBDIR/libtessera_cuda.so" "$TESSERA_CUDA_LIBRARY"; do ldd "$f" | grep 'not found'; done | sort -u)
  [ -z "$MISSING" ] || die "libraries not found (LD_LIBRARY_PATH=$LD_LIBRARY_PATH):
$MISSING"
  ARCHS=$(sed -n 's/^cuda_archs: //p' "$PREBUILT/MANIFEST")
  [[ ";$ARCHS;" == *";$CAP;"* ]] || echo "note: built for sm_$ARCHS, this GPU is sm_$CAP (the PTX is compiled at load)"
  BUILD_DIR="$PREBUILT"
else
  echo "GPU: $GPU_NAME, compute capability $CAP; build dir $BUILD_DIR"
  BIN="$BUILD_DIR/bin"
fi

if [ -z "$PREBUILT" ]; then
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
fi

# A skipped GPU test on a GPU machine means the device was not usable: not a pass (except the
# two-rank NCCL test, which needs a second GPU, and the test for machines without a device).
TESTS_OK=yes
TEST_LOG="$BUILD_DIR/gpu_check.tests.log"
if [ -z "$PREBUILT" ]; then
  step "ctest -L gpu"
  (cd "$BUILD_DIR" && timeout 150 ctest -L gpu -j 4 --output-on-failure) 2>&1 | tee "$TEST_LOG"
  [ "${PIPESTATUS[0]}" -eq 0 ] || TESTS_OK=no
  SKIPPED=$(grep '(Skipped)' "$TEST_LOG" | grep -vcE 'TwoRanksOnTwoDevices|CreateWithoutDevice' || true)
else
  step "tessera_gpu_tests (the gpu-label tests, one program)"
  timeout 150 "$BIN/tessera_gpu_tests" --gtest_filter="${GPU_CHECK_GTEST_FILTER:-*}" 2>&1 | tee "$TEST_LOG" |
    grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|Failure|error' | grep -v '^\[       OK \]'
  [ "${PIPESTATUS[0]}" -eq 0 ] || TESTS_OK=no
  SKIPPED=$(grep -E '^\[  SKIPPED \] [A-Za-z_/]+\.' "$TEST_LOG" | awk '{print $4}' | sort -u |
            grep -vcE 'TwoRanksOnTwoDevices|CreateWithoutDevice' || true)
  echo "tests: $(grep -cE '^\[       OK \]' "$TEST_LOG") passed, $(grep -cE '^\[  FAILED  \] [A-Za-z_/]+\.[^ ]+ \(' "$TEST_LOG") failed," \
    "$SKIPPED skipped (not counting the two-GPU / no-device tests); log: $TEST_LOG"
fi
[ "$SKIPPED" -eq 0 ] || TESTS_OK="no ($SKIPPED skipped; see $TEST_LOG)"

step "tessera-gpu-ops-bench"
mkdir -p bench/results
SAFE_NAME=$(echo "$GPU_NAME" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')
RESULT=bench/results/gpu-check-${SAFE_NAME}-$(date -u +%Y%m%d-%H%M%S).md
if [ "${GPU_CHECK_BENCH:-1}" = 0 ]; then
  BENCH_OUT="(benchmarks skipped: GPU_CHECK_BENCH=0)"; BENCH_RC=0
else
  BENCH_OUT=$(timeout 180 "$BIN/tessera-gpu-ops-bench" 2>&1)
  BENCH_RC=$?
fi

# The forward pass gets what is left of the 8 minutes but 100 s for PyTorch (at most 200 s,
# at least 60 s); the bench starts a further weight type only while its budget lasts.
step "tessera-gpu-forward-bench"
LEFT=$(( 370 - ($(date +%s) - START) ))
FWD_TIMEOUT=$(( LEFT > 200 ? 200 : (LEFT < 60 ? 60 : LEFT) ))
if [ "${GPU_CHECK_BENCH:-1}" = 0 ]; then
  FWD_OUT="(skipped)"; FWD_RC=0
else
  FWD_OUT=$(timeout "$FWD_TIMEOUT" "$BIN/tessera-gpu-forward-bench" --types f16,int4,int8 \
    --batches 1,8,32,128 --steps 10 --context 128 --budget-s $(( FWD_TIMEOUT - 80 )) 2>&1)
  FWD_RC=$?
fi
[ "$FWD_RC" -eq 124 ] && FWD_OUT="$FWD_OUT
(timed out after $FWD_TIMEOUT s)"

step "PyTorch eager (bench/torch_eager_bench.py)"
LEFT=$(( 470 - ($(date +%s) - START) ))
TORCH_TIMEOUT=$(( LEFT > 100 ? 100 : (LEFT < 30 ? 30 : LEFT) ))
PY=${PYTHON:-python3}
if [ "${GPU_CHECK_BENCH:-1}" = 0 ]; then
  TORCH_OUT="(skipped)"
else
  TORCH_OUT=$(timeout "$TORCH_TIMEOUT" "$PY" bench/torch_eager_bench.py --batches 1,8,32,128 --steps 10 --context 128 \
    --budget-s $(( TORCH_TIMEOUT - 45 )) 2>&1 | tail -12)
  [ "${PIPESTATUS[0]}" -eq 124 ] && TORCH_OUT="$TORCH_OUT
(timed out after $TORCH_TIMEOUT s)"
fi

# The KV cache's element type at a long context: fp32 against fp16 keys and values (8 layers of
# the same shape, F16 weights, 4,096 tokens a sequence), the decode step where attention reads
# most of the bytes.
step "KV cache fp32 vs fp16 at 4k context (tessera-gpu-forward-bench --kv-dtype)"
KV_OUT=""
for KV in fp32 fp16; do
  if [ "${GPU_CHECK_BENCH:-1}" = 0 ]; then KV_OUT="(skipped)"; break; fi
  KV_OUT="$KV_OUT
$(timeout 60 "$BIN/tessera-gpu-forward-bench" --types f16 --layers 8 --batches 1,32 --steps 10 --context 4096 \
    --kv-dtype "$KV" 2>&1 | grep -E '^\||KV cache|timed out')"
done

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
  if [ -n "$PREBUILT" ]; then
    echo "- command: bench/gpu_check.sh --prebuilt $PREBUILT ($(sed -n 's/^commit: //p' "$PREBUILT/MANIFEST"), sm_$(sed -n 's/^cuda_archs: //p' "$PREBUILT/MANIFEST"))"
  else
    echo "- command: bench/gpu_check.sh (BUILD_DIR=$BUILD_DIR, CMAKE_CUDA_ARCHITECTURES=$CAP)"
  fi
  echo "- driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1); $(nvcc --version 2>/dev/null | tail -1)"
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
  echo "## KV cache fp32 vs fp16, 8 layers, context 4096 (tessera-gpu-forward-bench --kv-dtype)"
  echo
  echo "$KV_OUT"
  echo
  echo "## Summary (targets: INT4 batch 1 at >= 75% of the floor, >= 3x PyTorch eager at batch 1, graphed host share < 10%)"
  echo
  echo "$SUMMARY"
} >"$RESULT"

# On the device tool's machine, $OUT is the folder that comes back.
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then cp "$RESULT" "$TEST_LOG" "$OUT/" 2>/dev/null; fi

step "results ($RESULT)"
echo "$BENCH_OUT"
echo
echo "$FWD_OUT"
echo
echo "$TORCH_OUT"
echo
echo "$KV_OUT"
echo
echo "$SUMMARY"
echo
echo "gpu tests passed: $TESTS_OK; bench exit code: $BENCH_RC; forward bench exit code: $FWD_RC;" \
  "total $(( $(date +%s) - START )) s"
[ "$TESTS_OK" = yes ] && [ "$BENCH_RC" -eq 0 ] && [ "$FWD_RC" -eq 0 ]
