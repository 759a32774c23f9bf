#!/usr/bin/env bash
# The serving results of bench/results/serve.md: `tessera serve` with each scheduler profile
# under 1, 8, 32 and 128 concurrent clients, then the wait-threshold trade-off (max_wait_ms
# 0, 5, 50 under the same open-loop Poisson loads). Each server is started here, measured with
# `tessera bench serve`, and stopped with SIGINT.
#
#   bench/serve_matrix.sh [MODEL]      (default: stories260K's HF directory from the reference test
#                                       data: $TESSERA_TESTDATA, else the build's copy beside BIN)
#
# Knobs (environment): BIN (build/bin), OUT (bench/results), TP (1), REQUESTS per level (512),
# PROMPT / OUTPUT token counts (64 / 64), KV_GB (KV pool cap per shard, 0.05: small enough that
# the KV-usage timeline shows something with stories260K), WAIT_RATES (requests/s of the wait
# sweep, 25,100,200), WAIT_REQUESTS (400 per rate), WORK (bench/work/serve-matrix: the servers'
# logs, git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin}
MODEL=${1:-${TESSERA_TESTDATA:-$(dirname "$BIN")/testdata}/stories260K/hf}
OUT=${OUT:-bench/results}
TP=${TP:-1}
REQUESTS=${REQUESTS:-512}
PROMPT=${PROMPT:-64}
OUTPUT=${OUTPUT:-64}
KV_GB=${KV_GB:-0.05}
WAIT_RATES=${WAIT_RATES:-25,100,200}
WAIT_REQUESTS=${WAIT_REQUESTS:-400}
WORK=${WORK:-bench/work/serve-matrix}
MD="$OUT/serve.md"
mkdir -p "$OUT" "$WORK"

server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill -INT "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap stop_server EXIT

# start_server LOGFILE ARGS... : starts `tessera serve` on an ephemeral port, sets $url.
start_server() {
  local log=$1
  shift
  "$BIN/tessera" serve --model "$MODEL" --tp "$TP" --port 0 --max-kv-gb "$KV_GB" "$@" >"$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 600); do
    url=$(grep -o 'listening on http://[^ ]*' "$log" | head -1 | sed 's/listening on //') || true
    [ -n "$url" ] && return 0
    kill -0 "$server_pid" 2>/dev/null || { cat "$log"; echo "server exited" >&2; exit 1; }
    sleep 0.2
  done
  echo "server did not start" >&2
  exit 1
}

common=(--prompt-tokens "$PROMPT" --output-tokens "$OUTPUT" --slo ttft=200ms,itl=50ms --metrics-interval-ms 50
        --md "$MD")

for profile in interactive offline; do
  start_server "$WORK/server-$profile.log" --profile "$profile"
  "$BIN/tessera" bench serve --url "$url" --sweep-concurrency 1,8,32,128 --num-requests "$REQUESTS" \
    --title "profile $profile, TP $TP" --json "$OUT/serve-$profile.json" "${common[@]}"
  stop_server
done
"${PYTHON:-.venv/bin/python}" bench/plot_serve.py --out "$OUT/serve-profiles" --no-timeline \
  "$OUT/serve-interactive.json" "$OUT/serve-offline.json" || echo "note: no comparison plot"

files=()
for wait_ms in 0 5 50; do
  start_server "$WORK/server-wait$wait_ms.log" --profile interactive --max-wait-ms "$wait_ms"
  "$BIN/tessera" bench serve --url "$url" --sweep-rate "$WAIT_RATES" --num-requests "$WAIT_REQUESTS" \
    --title "max_wait_ms $wait_ms" --json "$OUT/serve-wait$wait_ms.json" --no-plots "${common[@]}"
  files+=("$OUT/serve-wait$wait_ms.json")
  stop_server
done
"${PYTHON:-.venv/bin/python}" bench/plot_serve.py --out "$OUT/serve-wait" --no-timeline "${files[@]}" ||
  echo "note: no comparison plot"
