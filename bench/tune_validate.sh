#!/usr/bin/env bash
# The simulator against the real engine (tune/simulator.h; issue: `tessera tune`).
#
#   bash bench/tune_validate.sh [calibrate|fit|validate|all|window]
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
# window: calibration and validation alternating in one window (WORK/window; see below): the
#   simulator's error without the machine's drift between a calibration and runs taken apart.
#
# Environment: MODEL (default: the Gemma file), TESSERA (the binary), OUT (results directory, default
# bench/results/tune: the tables and the fit's report), WORK (default bench/work/tune-validate, git-ignored:
# the traces, step logs, server logs, each run's and each simulation's JSON, the window's fit),
# THREADS (threads per shard, default 2), TP (shards, default 1: the step model is stored per TP).
# For another model than the Gemma file: CAL_DOCS (the calibration's document prompts, default
# lognormal:1500,0.4), TRACE_SPECS (the validation traces, name|lengths|arrivals|rate|requests,
# space-separated), RESULT (the table's file name in OUT, default sim-vs-real.md) and, for
# `window`, WINDOW (its folder in WORK, default window). Speculation is off on both sides (the
# simulator does not model drafts). The machine should be quiet: the load generator shares its cores.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/gemma-3-270m-q4_k_m.gguf}
TESSERA=${TESSERA:-build/bin/tessera}
OUT=${OUT:-bench/results/tune}
THREADS=${THREADS:-2}
TP=${TP:-1}
CAL_DOCS=${CAL_DOCS:-lognormal:1500,0.4}
RESULT=${RESULT:-sim-vs-real.md}
WORK=${WORK:-bench/work/tune-validate}
mkdir -p "$OUT" "$WORK"
what=${1:-all}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

SERVER_PID=
start_server() {  # $1 block size, $2 step log, rest: extra serve flags
  local block=$1 log=$2; shift 2
  PORT=$(free_port)
  "$TESSERA" serve --model "$MODEL" --port "$PORT" --tp "$TP" --threads "$THREADS" --speculation off \
    --block-size "$block" --step-log "$log" "$@" > "$WORK/server-$block.log" 2>&1 &
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

# The calibration load on a running server: $1 block size, $2 a tag that makes its seeds its own.
calibration_load() {
  local block=$1 tag=$2
  # A seed per level: prompts must not repeat, or the prefix cache computes them once.
  for c in 1 4 16; do
    bench -c "$c" -n 32 --prompt-tokens lognormal:200,0.9 --output-tokens lognormal:48,0.6 --seed "$tag$block$c"
  done
  for c in 2 4; do
    bench -c "$c" -n 8 --prompt-tokens "$CAL_DOCS" --output-tokens 24 --seed "9$tag$block$c"
  done
  if [ "$block" = 16 ]; then
    # Open-loop chat traffic as served (its own seed: the validation traces use 7).
    "$TESSERA" tune trace --lengths chat --arrivals poisson --rate 1.3 -n 100 --seed "10$tag"1 \
      --out "$WORK/trace-calibrate$tag.jsonl"
    bench --trace "$WORK/trace-calibrate$tag.jsonl"
  fi
}

# The validation traces, name|lengths|arrivals|rate|requests: about half the server's capacity on
# average (the bursts above it).
TRACES=("chat-poisson|chat|poisson|1.5|150" "chat-bursty|chat|bursty|1.2|120"
        "docs1k-poisson|lognormal:1200,0.3/lognormal:32,0.5|poisson|0.2|24")
if [ -n "${TRACE_SPECS:-}" ]; then read -r -a TRACES <<< "$TRACE_SPECS"; fi
make_trace() {  # $1 spec, $2 output: the trace of seed 7
  local name lengths arrivals rate n
  IFS='|' read -r name lengths arrivals rate n <<< "$1"
  "$TESSERA" tune trace --lengths "$lengths" --arrivals "$arrivals" --rate "$rate" -n "$n" --seed 7 --out "$2"
}
calibrate() {  # the fit; $@: --step-log files and other flags (CALIBRATE_ARGS: more, e.g. --block-context 1024)
  # shellcheck disable=SC2086
  "$TESSERA" tune calibrate --model "$MODEL" --card cpu --tp "$TP" ${CALIBRATE_ARGS:-} "$@"
}
compare() {  # $1 method, rest: trace names
  local method=$1; shift
  python3 bench/tune_compare.py --work "$WORK" --out "$OUT/$RESULT" --model "$MODEL" \
    --serve "--tp $TP --threads $THREADS" --method "$method" "$@"
}
simulate() {  # $1 trace name, $2 step-model store, rest: extra flags (--sim-seed / --level-from, --json)
  local name=$1 store=$2; shift 2
  "$TESSERA" tune simulate --model "$MODEL" --card cpu --tp "$TP" --step-models "$store" \
    --trace "$WORK/trace-$name.jsonl" --block-size 16 "$@" > /dev/null
}

if [ "$what" = calibrate ] || [ "$what" = all ]; then
  for block in 16 64 256; do
    start_server "$block" "$WORK/steps-$block.jsonl"
    calibration_load "$block" ""
    stop_server
  done
fi
if [ "$what" = calibrate ] || [ "$what" = fit ] || [ "$what" = all ]; then
  logs=()
  for block in 16 64 256; do logs+=(--step-log "$WORK/steps-$block.jsonl"); done
  calibrate "${logs[@]}" | tee "$OUT/step-model-cpu.txt"
fi

if [ "$what" = window ]; then
  # Calibration and validation in one window: ROUNDS rounds (default 3) of [a block-16 calibration
  # load on a fresh server, then each trace once on a fresh server], closed by one more calibration
  # load, so the calibration brackets the runs in time as the runs alternate with it. The step
  # model is then fitted on those calibration logs alone (stored in WORK, not beside the model)
  # and the simulator replays each trace with SIM_SEEDS seeds of its step jitter (default 25: its
  # P99 ITL moves by +-20% between seeds, as a jitter spike lands in a burst or not); it never sees
  # a validation run's steps. SIM_ONLY=1 keeps the window's runs and fit and replays the simulator.
  rounds=${ROUNDS:-3}
  WORK=$WORK/${WINDOW:-window}
  mkdir -p "$WORK"
  for spec in "${TRACES[@]}"; do make_trace "$spec" "$WORK/trace-${spec%%|*}.jsonl"; done
  for round in $(seq 1 $(( rounds + 1 ))); do
    [ "${SIM_ONLY:-0}" = 1 ] && break
    start_server 16 "$WORK/steps-window-cal-r$round.jsonl"
    calibration_load 16 "$round"
    stop_server
    [ "$round" -le "$rounds" ] || break
    for spec in "${TRACES[@]}"; do
      name=${spec%%|*}
      start_server 16 "$WORK/steps-validate-$name-r$round.jsonl"
      bench --trace "$WORK/trace-$name.jsonl" --json "$WORK/real-$name-r$round.json"
      stop_server
    done
  done
  if [ "${SIM_ONLY:-0}" != 1 ]; then
    logs=()
    for log in "$WORK"/steps-window-cal-r*.jsonl; do logs+=(--step-log "$log"); done
    # The fit's report is a summary: it goes beside the table too (sim-vs-real.md -> sim-vs-real-step-model.txt).
    calibrate "${logs[@]}" --out "$WORK/window.steps.json" | tee "$WORK/window-step-model.txt" "$OUT/${RESULT%.md}-step-model.txt"
  fi
  rows=()
  for spec in "${TRACES[@]}"; do
    name=${spec%%|*}
    rm -f "$WORK"/sim-"$name"-s*.json
    for seed in $(seq 1 "${SIM_SEEDS:-25}"); do
      simulate "$name" "$WORK/window.steps.json" --sim-seed "$seed" --json "$WORK/sim-$name-s$seed.json"
    done
    # The level each real run measured over its own step log: how much of the error is the drift
    # within the window (a diagnostic row; the headline uses the window's fit alone).
    for run in $(seq 1 "$rounds"); do
      simulate "$name" "$WORK/window.steps.json" --sim-seed "$run" \
        --level-from "$WORK/steps-validate-$name-r$run.jsonl" --json "$WORK/simlevel-$name-r$run.json"
    done
    rows+=("$name")
  done
  compare window "${rows[@]}"
fi

if [ "$what" = validate ] || [ "$what" = all ]; then
  rows=()
  for spec in "${TRACES[@]}"; do
    IFS='|' read -r name lengths arrivals rate n <<< "$spec"
    trace="$WORK/trace-$name.jsonl"
    make_trace "$spec" "$trace"
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
      simulate "$name" "$MODEL.steps.json" --sim-seed "$seed" --json "$WORK/sim-$name-s$seed.json"
    done
    # And at other levels than the calibration's median: the level each real run measured over
    # its own step log (the machine's drift between calibration and run, apart from the
    # simulator's error), and the level its probe measured just before it.
    for kind in validate:simlevel probe:simprobe; do
      for log in "$WORK"/steps-"${kind%%:*}"-"$name"-r*.jsonl; do
        [ -e "$log" ] || continue
        run=${log##*-r}; run=${run%.jsonl}
        simulate "$name" "$MODEL.steps.json" --sim-seed "$run" --level-from "$log" \
          --json "$WORK/${kind##*:}-$name-r$run.json"
      done
    done
    rows+=("$name")
  done
  compare apart "${rows[@]}"
fi
