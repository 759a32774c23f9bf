// The scheduler's knobs (ARCHITECTURE.md "One step", step 2) as ONE table. Each row is a fact every other place reads:
// the config struct's field and its default (the interactive profile), the offline profile's
// value, the valid range, and the help text. From it come the fields of SchedulerConfig and
// SpeculationConfig, the JSON keys of a scheduler-config file, the command-line flags of
// `serve`, `launch`, `tessera-coordinator` and `tune simulate` (`--max-batch` for max_batch),
// validation, the Prometheus gauges and the start-up log line (engine/scheduler_config.cpp).
//
// A new knob is a row here plus the code that reads it (the scheduler, usually). Rules that
// tie two knobs together (max_step_tokens >= max_batch) live in validate_scheduler_config.
//
// The two knobs that are not numbers stay outside the table: `profile` (it resets every knob)
// and `speculation` (the mode, engine/speculation.h's SpecMode).
#pragma once

#include <cstdint>
#include <limits>

namespace tessera {

// One end of a knob's valid range.
struct KnobBound {
  double value = 0;
  bool open = false;  // the value itself is outside the range
  bool none = true;   // no bound on this side
};
constexpr KnobBound at_least(double v) { return {v, false, false}; }
constexpr KnobBound above(double v) { return {v, true, false}; }
constexpr KnobBound at_most(double v) { return {v, false, false}; }
constexpr KnobBound below(double v) { return {v, true, false}; }
constexpr KnobBound kUnbounded{};

// X(key, member, type, lo, hi, interactive, offline, help)
//   key          JSON key and gauge suffix (tessera_scheduler_<key>); the flag is --<key> with '-' for '_'
//   member       the field of SchedulerConfig
//   type         int32_t (whole numbers only) or double
//   lo, hi       KnobBound: the valid range
//   interactive  the default, and the interactive profile's value
//   offline      the offline profile's value
//
// Why these numbers (one 7-13B model on one A100/H100-class card as the reference point):
// interactive, latency first. max_batch 32: a decode step stays bound by reading the weights
// (about the time of batch 1) up to a few dozen sequences. max_step_tokens 2048: room for the 32
// decodes plus about three prefill chunks, so a burst starts within one step while a step never
// grows past a few chunks' compute. max_wait_ms 2: far below one decode step (10-30 ms), so
// waiting is invisible in time to first token, yet requests that arrive together (a client's
// parallel calls, n > 1) prefill in one step. max_burst_wait_ms 50: a burst (arrivals each within
// a fifth of it of the one before) is gathered into one prefill step; cut after max_wait_ms, its
// stragglers would prefill beside the first ones' decodes and stall them all (a 1.1B model's
// 32-client burst on a CPU: a 4 s step beside 28 decoders, bench/results/serve-vs-vllm/
// m1b-bf16-20261205.md). prefill_chunk 512: big enough for the GEMMs to run near peak, small
// enough that a long prompt delays the others' next token by one modest step. aging 5 s: a
// batch-class request competes as interactive after at most 5 s per class.
// offline, throughput first: max_batch 256 and max_step_tokens 8192 for large GEMMs; max_wait_ms
// 50 gathers many arrivals into one prefill step; prefill_chunk 2048 cuts per-chunk overhead;
// aging 30 s.
#define TESSERA_SCHEDULER_KNOBS(X)                                                                                   \
  X(max_batch, max_batch, int32_t, at_least(1), kUnbounded, 32, 256,                                                 \
    "Most sequences in one step (and most running at once).")                                                        \
  X(max_step_tokens, max_step_tokens, int32_t, at_least(1), kUnbounded, 2048, 8192,                                  \
    "Token budget per step (decode tokens plus prefill pieces); at least max_batch.")                                \
  X(max_wait_ms, max_wait_ms, double, at_least(0), kUnbounded, 2.0, 50.0,                                            \
    "Longest a new prefill waits for companions, in milliseconds.")                                                  \
  X(max_burst_wait_ms, max_burst_wait_ms, double, at_least(0), kUnbounded, 50.0, 50.0,                               \
    "While requests keep arriving close together (within a fifth of this), the wait for companions extends up to "  \
    "this long after the first, in milliseconds (<= max_wait_ms: no extension).")                                    \
  X(prefill_chunk, prefill_chunk, int32_t, at_least(1), kUnbounded, 512, 2048,                                       \
    "Longest prefill (or recompute) piece per step, in tokens.")                                                     \
  X(mixed_prefill_tokens, mixed_prefill_tokens, int32_t, at_least(0), kUnbounded, 0, 0,                              \
    "Most prefill tokens in a step that also decodes (0: no limit but max_step_tokens).")                            \
  X(priority_classes, priority_classes, int32_t, at_least(1), at_most(16), 2, 2,                                     \
    "Number of request priority classes (0 is served first).")                                                      \
  X(aging_ms, aging_ms, double, above(0), kUnbounded, 5000.0, 30000.0,                                               \
    "Milliseconds in the system after which a request's class improves by one.")                                    \
  X(jump_forward_tokens, jump_forward_tokens, int32_t, at_least(0), kUnbounded, 64, 64,                              \
    "Structured outputs: most tokens a step takes without sampling where the grammar allows one continuation "       \
    "(jump-forward; 0: off).")

// The speculation knobs: the same columns, `member` a field of SpeculationConfig
// (engine/speculation.h says what each does).
#define TESSERA_SPECULATION_KNOBS(X)                                                                                 \
  X(spec_depth, max_depth, int32_t, at_least(0), at_most(16), 4, 4,                                                  \
    "Most speculative drafts per sequence per step (0: never).")                                                     \
  X(spec_ngram_max, ngram_max, int32_t, at_least(1), at_most(16), 3, 3,                                              \
    "Longest suffix the n-gram proposer looks up (at least spec_ngram_min).")                                        \
  X(spec_ngram_min, ngram_min, int32_t, at_least(1), at_most(16), 1, 1,                                              \
    "Shortest suffix the n-gram proposer looks up.")                                                                 \
  X(spec_probe_interval, probe_interval, int32_t, at_least(1), kUnbounded, 64, 64,                                   \
    "Steps between probes of a traffic class whose speculation is off.")                                             \
  X(spec_probe_steps, probe_steps, int32_t, at_least(1), kUnbounded, 4, 4, "Steps of a speculation probe.")          \
  X(spec_hysteresis, hysteresis, double, at_least(0), below(0.5), 0.03, 0.03,                                        \
    "Speculation goes off below 1 - h of plain speed and on again above 1 + h.")                                     \
  X(spec_draft_layers, draft_layers, int32_t, at_least(0), at_most(1024), 0, 0,                                      \
    "Layers of the shards' self-draft (0: none; the draft proposer).")                                               \
  X(spec_draft_vocab, draft_vocab, int32_t, at_least(0), kUnbounded, 16384, 16384,                                   \
    "Fixed head rows of the self-draft (token ids below it, plus each context's ids).")

// A config struct's fields from a knob list: `type member = interactive;`.
#define TESSERA_KNOB_FIELD(key, member, type, lo, hi, interactive, offline, help) type member = interactive;

}  // namespace tessera
