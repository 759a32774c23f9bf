#!/usr/bin/env bash
# Builds the fuzz targets with clang + libFuzzer + ASan/UBSan into build-fuzz/ and fuzzes each
# for a fixed time from its committed seed corpus (fuzz/corpus/<target>.tar.xz), with a fixed seed:
#   TESSERA_FUZZ_SECONDS (per target, default 20), TESSERA_FUZZ_SEED (default 1),
#   TESSERA_FUZZ_TARGETS (default all: gguf safetensors tokenizer_json chat_template
#   control_codec http_request).
# The corpus is unpacked into a scratch folder, build-fuzz/work/<target>/, where new inputs go
# too, never into the tree. A crash, leak, sanitizer report or timeout fails the script and leaves
# the input in build-fuzz/crashes/<target>/; replay it with `build-fuzz/bin/tessera_fuzz_<target>
# FILE` (or the GCC build's replay binary).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${TESSERA_FUZZ_SECONDS:-20}
SEED=${TESSERA_FUZZ_SEED:-1}
TARGETS=${TESSERA_FUZZ_TARGETS:-gguf safetensors tokenizer_json chat_template control_codec http_request structured_request}
command -v clang++ > /dev/null || { echo "error: fuzzing needs clang++ (apt-get install clang)"; exit 1; }

exes=()
for t in $TARGETS; do exes+=("tessera_fuzz_$t"); done
# Build type "Fuzz": -O1 with line tables (CMake takes any name; its flags are given here).
CC=clang CXX=clang++ BUILD_DIR=build-fuzz BUILD_TYPE=Fuzz BUILD_TARGETS="${exes[*]}" bash scripts/build.sh \
  -DTESSERA_SANITIZE=ON -DTESSERA_LIBFUZZER=ON -DTESSERA_CUDA=OFF -DTESSERA_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS_FUZZ="-O1 -g1" -DCMAKE_C_FLAGS_FUZZ="-O1 -g1"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
work=build-fuzz/work
rm -rf "$work"
failed=()
for t in $TARGETS; do
  mkdir -p "$work" "build-fuzz/crashes/$t"
  # The archive holds <target>/<seed>.
  cmake -E chdir "$work" cmake -E tar xf "$PWD/fuzz/corpus/$t.tar.xz"
  echo "== fuzz $t: ${SECONDS_PER_TARGET}s, seed $SEED =="
  # -timeout: one input over 10 s is a hang; -rss_limit_mb: a parser that allocates without
  # bound is a failure too. -max_len: 128 KiB, above the largest seed (a tokenizer.json of ~105 KiB).
  if ! build-fuzz/bin/tessera_fuzz_"$t" "$work/$t" -seed="$SEED" -max_total_time="$SECONDS_PER_TARGET" \
      -timeout=10 -rss_limit_mb=2048 -max_len=131072 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/crashes/$t/" > "$work/$t.log" 2>&1; then
    tail -60 "$work/$t.log"
    failed+=("$t")
  else
    grep -E "^(#[0-9]+ *DONE|stat::number_of_executed_units|stat::new_units_added)" "$work/$t.log" || tail -3 "$work/$t.log"
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "error: fuzzing found failures in: ${failed[*]} (inputs in build-fuzz/crashes/)"
  exit 1
fi
echo "fuzzing: every target ran ${SECONDS_PER_TARGET}s with no failure"
