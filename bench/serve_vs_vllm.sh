#!/usr/bin/env bash
# Tessera beside vLLM's CPU backend under the same `tessera bench serve` closed-loop loads
# (issue 21): each engine in turn (one server at a time, alternating, RUNS rounds) at every
# concurrency of LEVELS, same model directory, same prompts (token ids), greedy, ignore-EOS
# lengths. Writes one JSON per engine, round and model (and the servers' logs) into $WORK, then
# the table and plot into $OUT with bench/serve_vs_vllm.py.
#
#   bench/serve_vs_vllm.sh MODEL_DIR NAME
#       MODEL_DIR: a Hugging Face directory (tessera-make-model --preset 110m --format hf --type f16)
#
# Knobs (environment): BIN (build/bin), OUT (bench/results/serve-vs-vllm: the table and plot only),
# WORK (bench/work/serve-vs-vllm: the per-run JSON and server logs, git-ignored), RUNS (3),
# LEVELS ("1 4 16 32"), PROMPT / OUTPUT tokens (128 / 128), REQ_FACTOR (requests per level =
# max(REQ_MIN, REQ_FACTOR x concurrency); 4), REQ_MIN (16), THREADS (2), ENGINES ("tessera vllm"),
# TESSERA_ARGS (extra `tessera serve` flags), VLLM_VENV (bench/.venv-vllm: bench/vllm_setup.sh
# makes it; without it only Tessera runs).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: bench/serve_vs_vllm.sh MODEL_DIR NAME}
NAME=${2:?usage: bench/serve_vs_vllm.sh MODEL_DIR NAME}
BIN=${BIN:-build/bin}
OUT=${OUT:-bench/results/serve-vs-vllm}
WORK=${WORK:-bench/work/serve-vs-vllm}
RUNS=${RUNS:-3}
LEVELS=${LEVELS:-"1 4 16 32"}
PROMPT=${PROMPT:-128}
OUTPUT=${OUTPUT:-128}
REQ_FACTOR=${REQ_FACTOR:-4}
REQ_MIN=${REQ_MIN:-16}
THREADS=${THREADS:-2}
ENGINES=${ENGINES:-"tessera vllm"}
VLLM_VENV=${VLLM_VENV:-bench/.venv-vllm}
mkdir -p "$OUT" "$WORK"

server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill -INT "$server_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
  # vLLM leaves an engine-core child process behind a killed API server.
  pkill -f 'vllm.entrypoints|VLLM::EngineCore|EngineCore_' 2>/dev/null || true
}
trap stop_server EXIT

wait_ready() {  # URL LOG: waits until GET /v1/models answers
  local url=$1 log=$2
  for _ in $(seq 1 1800); do
    curl -sf "$url/v1/models" >/dev/null 2>&1 && return 0
    kill -0 "$server_pid" 2>/dev/null || { tail -30 "$log"; echo "server exited" >&2; return 1; }
    sleep 0.2
  done
  echo "server did not start: $log" >&2
  return 1
}

start_tessera() {
  local log=$1 port=18731
  # shellcheck disable=SC2086
  "$BIN/tessera" serve --model "$MODEL" --threads "$THREADS" --port "$port" ${TESSERA_ARGS:-} >"$log" 2>&1 &
  server_pid=$!
  url="http://127.0.0.1:$port"
  wait_ready "$url" "$log"
}

start_vllm() {
  local log=$1 port=18732
  VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND="0-$((THREADS - 1))" \
    "$VLLM_VENV/bin/vllm" serve "$MODEL" --dtype bfloat16 --max-model-len 1024 --port "$port" \
    --served-model-name model >"$log" 2>&1 &
  server_pid=$!
  url="http://127.0.0.1:$port"
  wait_ready "$url" "$log"
}

for run in $(seq 1 "$RUNS"); do
  for engine in $ENGINES; do
    if [ "$engine" = vllm ] && [ ! -x "$VLLM_VENV/bin/vllm" ]; then
      echo "serve_vs_vllm: no $VLLM_VENV (bench/vllm_setup.sh makes it): vLLM skipped" >&2
      continue
    fi
    log="$WORK/$NAME-$engine-r$run.log"
    "start_$engine" "$log"
    for c in $LEVELS; do
      n=$((REQ_FACTOR * c)); [ "$n" -lt "$REQ_MIN" ] && n=$REQ_MIN
      # A seed per round and level: each level's prompts are new to the server (a level that
      # reused the previous level's prompts would measure Tessera's prefix cache, not prefill).
      # One warm-up request per level (first-request costs: vLLM compiles, pages fault in).
      "$BIN/tessera" bench serve --url "$url" -c 1 -n 1 --prompt-tokens "$PROMPT" --output-tokens 8 \
        --seed 999 --no-plots --no-progress --metrics-interval-ms 0 >/dev/null 2>&1 || true
      "$BIN/tessera" bench serve --url "$url" -c "$c" -n "$n" --prompt-tokens "$PROMPT" \
        --output-tokens "$OUTPUT" --temperature 0 --seed "$((1000 * run + c))" --metrics-interval-ms 0 \
        --title "$engine c$c r$run" --json "$WORK/$NAME-$engine-c$c-r$run.json" --no-plots --no-progress
    done
    stop_server
  done
done
"${PYTHON:-.venv/bin/python}" bench/serve_vs_vllm.py --name "$NAME" --work "$WORK" \
  --out "$OUT/$NAME" --command "bench/serve_vs_vllm.sh $MODEL $NAME (RUNS=$RUNS LEVELS='$LEVELS')"
