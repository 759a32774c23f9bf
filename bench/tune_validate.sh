#!/usr/bin/env bash
# The simulator against the real engine (tune/simulator.h; issue: `tessera tune`).
#
#   bash bench/tune_validate.sh [calibrate|fit|validate|all]
#
# calibrate: runs `tessera serve --step-log` on the model at block sizes 16, 64 and 256 under a
#   mixed load (chat-length requests at concurrency 1, 4 and 16; 1.5k-token documents at
#   concurrency 2 and 4; at block 16 also an open-loop chat trace of its own seed) and fits the
#   step-time model and its jitter (`tessera tune calibrate`), stored beside the model.
# fit: only the fit, on the step logs a calibrate run left in WORK.
# validate: for each trace (chat Poisson, chat bursty, 1.2k-token documents Poisson), generated with
#   `tessera tune trace`, replays it REPEATS times (default 3) on a fresh real server (`tessera bench
#   serve --trace`) and on the simulator with five jitter seeds (`tessera tune simulate --trace`),
#   and writes the side-by-side table: medians, ranges, and the simulator's error against the real
#   median beside the real runs' own spread. SIM_ONLY=1 keeps the real runs already in WORK and
#   replays only the simulator (after a new fit of the same logs).
#   Probed level (PROBE=1, the default): right before each real run a short probe of the same
#   traffic (the trace's spec, another seed, a fifth of its requests) runs on a fresh server with
#   its own --step-log; the simulator then also replays the trace at the level that probe
#   measured (`tune simulate --level-from` the probe's log): how well a calibration taken just
#   before the run predicts it on a machine whose speed drifts by +-15% over minutes. The probe
#   never sees the run it predicts.
#
# Environment: MODEL (default: the Gemma file), TESSERA (the binary), OUT (results directory),
# THREADS (shard threads, default 2). Speculation is off on both sides (the simulator does not
# model drafts). The machine should be quiet: the load generator shares its cores.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/gemma-3-270m-q4_k_m.gguf}
TESSERA=${TESSERA:-build/bin/tessera}
OUT=${OUT:-bench/results/tune}
THREADS=${THREADS:-2}
WORK=${WORK:-$OUT/work}
mkdir -p "$OUT" "$WORK"
what=${1:-all}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

SERVER_PID=
start_server() {  # $1 block size, $2 step log, rest: extra serve flags
  local block=$1 log=$2; shift 2
  PORT=$(free_port)
  "$TESSERA" serve --model "$MODEL" --port "$PORT" --threads "$THREADS" --speculation off --block-size "$block" \
    --step-log "$log" "$@" > "$WORK/server-$block.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1; then return 0; fi
    if ! kill -0 "$SERVER_PID" 2> /dev/null; then cat "$WORK/server-$block.log" >&2; return 1; fi
    sleep 0.5
  done
  echo "server did not come up" >&2
  return 1
}
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill -TERM "$SERVER_PID" 2> /dev/null || true
  wait "$SERVER_PID" 2> /dev/null || true
  SERVER_PID=
}
trap stop_server EXIT

bench() { "$TESSERA" bench serve --url "http://127.0.0.1:$PORT" --no-plots --no-progress "$@"; }

if [ "$what" = calibrate ] || [ "$what" = all ]; then
  for block in 16 64 256; do
    log="$WORK/steps-$block.jsonl"
    start_server "$block" "$log"
    # A seed per level: prompts must not repeat, or the prefix cache computes them once.
    for c in 1 4 16; do
      bench -c "$c" -n 32 --prompt-tokens lognormal:200,0.9 --output-tokens lognormal:48,0.6 --seed "$block$c"
    done
    for c in 2 4; do
      bench -c "$c" -n 8 --prompt-tokens lognormal:1500,0.4 --output-tokens 24 --seed "9$block$c"
    done
    if [ "$block" = 16 ]; then
      # Open-loop chat traffic as served (its own seed: the validation traces use 7).
      "$TESSERA" tune trace --lengths chat --arrivals poisson --rate 1.3 -n 100 --seed 101 --out "$WORK/trace-calibrate.jsonl"
      bench --trace "$WORK/trace-calibrate.jsonl"
    fi
    stop_server
  done
fi
if [ "$what" = calibrate ] || [ "$what" = fit ] || [ "$what" = all ]; then
  logs=()
  for block in 16 64 256; do logs+=(--step-log "$WORK/steps-$block.jsonl"); done
  "$TESSERA" tune calibrate --model "$MODEL" --card cpu "${logs[@]}" | tee "$OUT/step-model-cpu.txt"
fi

if [ "$what" = validate ] || [ "$what" = all ]; then
  rows=()
  # name|lengths|arrivals|rate|requests: about half the server's capacity on average (the bursts above it).
  for spec in "chat-poisson|chat|poisson|1.5|150" "chat-bursty|chat|bursty|1.2|120" \
              "docs1k-poisson|lognormal:1200,0.3/lognormal:32,0.5|poisson|0.2|24"; do
    IFS='|' read -r name lengths arrivals rate n <<< "$spec"
    trace="$WORK/trace-$name.jsonl"
    "$TESSERA" tune trace --lengths "$lengths" --arrivals "$arrivals" --rate "$rate" -n "$n" --seed 7 --out "$trace"
    probe="$WORK/probe-$name.jsonl"
    "$TESSERA" tune trace --lengths "$lengths" --arrivals "$arrivals" --rate "$rate" -n $(( n / 5 > 8 ? n / 5 : 8 )) \
      --seed 8 --out "$probe"
    # The same trace REPEATS times on a fresh server (runs already there are kept: FIRST_RUN),
    # each right after its probe.
    for run in $(seq "${FIRST_RUN:-1}" "${REPEATS:-3}"); do
      [ "${SIM_ONLY:-0}" = 1 ] && break
      if [ "${PROBE:-1}" = 1 ]; then
        start_server 16 "$WORK/steps-probe-$name-r$run.jsonl"
        bench --trace "$probe" > /dev/null
        stop_server
      fi
      start_server 16 "$WORK/steps-validate-$name-r$run.jsonl"
      bench --trace "$trace" --json "$WORK/real-$name-r$run.json"
      stop_server
    done
    # The simulator with five seeds of its step jitter.
    for seed in 1 2 3 4 5; do
      "$TESSERA" tune simulate --model "$MODEL" --card cpu --trace "$trace" --block-size 16 --sim-seed "$seed" \
        --json "$WORK/sim-$name-s$seed.json" > /dev/null
    done
    # And at other levels than the calibration's median: the level each real run measured over
    # its own step log (the machine's drift between calibration and run, apart from the
    # simulator's error), and the level its probe measured just before it.
    for kind in validate:simlevel probe:simprobe; do
      for log in "$WORK"/steps-"${kind%%:*}"-"$name"-r*.jsonl; do
        [ -e "$log" ] || continue
        run=${log##*-r}; run=${run%.jsonl}
        "$TESSERA" tune simulate --model "$MODEL" --card cpu --trace "$trace" --block-size 16 --sim-seed "$run" \
          --level-from "$log" --json "$WORK/${kind##*:}-$name-r$run.json" > /dev/null
      done
    done
    rows+=("$name")
  done
  python3 bench/tune_compare.py --work "$WORK" --out "$OUT/sim-vs-real.md" --model "$MODEL" "${rows[@]}"
fi
