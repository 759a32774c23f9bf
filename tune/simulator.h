// The simulated executor: the real Scheduler and BlockPool (the same code the engine runs) on a
// ManualClock, driven in virtual time by a step-time model (tune/step_model.h) instead of shards.
//
// It mirrors the engine's loop (engine/engine.h): requests join the scheduler at their
// arrival; each schedule() plan takes the model's predicted time for its features; every piece
// that samples emits one token at the step's end; a sequence that has its output_tokens is
// finished (as `ignore_eos` requests with max_tokens are); when schedule() returns nothing the
// clock moves to the next arrival or the end of a max_wait_ms hold. Drafts (speculation) are not
// simulated. Prompts are distinct token ids per request, so the prefix cache never hits (as with
// `tessera bench serve`'s random prompts). Step times carry the model's measured jitter (seeded).
//
// Per request it reports what `tessera bench serve` measures (loadgen/load_generator.h: TTFT from
// arrival to the first token, the gaps between tokens, end to end), summarized by the same
// functions, so simulated and measured tables compare field by field.
//
// Speed: about a microsecond per sequence per step; 100k chat requests take seconds.
// Thread-safety: simulate() is reentrant (each call has its own scheduler and pool).
#pragma once

#include <cstdint>
#include <vector>

#include "loadgen/load_generator.h"
#include "common/status.h"
#include "engine/scheduler_config.h"
#include "tune/step_model.h"
#include "tune/trace.h"

namespace tessera {

struct SimOptions {
  SchedulerConfig scheduler;
  int64_t block_size = 16;
  int64_t num_blocks = 0;          // the KV pool's blocks (> 0)
  StepTimeModel cost;
  double request_overhead_s = 0;   // added to TTFT and E2E: the client's round trip outside the engine
  SloSpec slo;                     // for goodput
  bool keep_requests = true;       // false: only the summary (sweeps of large traces)
  // Each step's time is the model's prediction times a factor drawn from cost.jitter_quantiles
  // (a seeded generator: the same options give the same result); false: the prediction alone.
  bool jitter = true;
  uint64_t seed = 1;
  // Every step's time times this: the machine's speed against the one the model was fitted on
  // (1.15: a phase 15% slower; step_level() measures it from a step log).
  double level = 1.0;
};

struct SimResult {
  std::vector<RequestRecord> requests;  // by trace index (empty without keep_requests)
  RunSummary summary;
  int64_t steps = 0;               // plans that computed tokens
  int64_t empty_steps = 0;         // plans that only told the shards which sequences finished
  int64_t preemptions = 0;
  int64_t rejected = 0;            // requests that could never fit the pool
  double mean_batch = 0;           // sequences per step
  double mean_step_tokens = 0;
  double busy_fraction = 0;        // share of the span with a step running
  double mean_fragmentation = 0;   // step-weighted BlockPoolStats::fragmentation
  double peak_kv_usage = 0;        // used / total blocks, at most
  double sim_wall_s = 0;           // real seconds the simulation took
};

// InvalidArgument for a bad config (validate_scheduler_config), block size or pool size.
Result<SimResult> simulate(const std::vector<SimRequest>& trace, const SimOptions& options);

}  // namespace tessera
