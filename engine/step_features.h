// What a step costs is a function of what it computes: the features of one StepPlan that the
// step-time model (tune/step_model.h) is fitted on and predicts from. The engine logs them with
// each step's measured time (EngineOptions::on_step, `serve --step-log`); the simulator
// (tune/simulator.h) computes them from the plans of the same scheduler. One definition, here,
// so that the fit and the prediction read the same numbers.
//
// For a piece computing n positions from start s (keys 0 .. s + n - 1 exist once it is done):
//   tokens          += n                           (matrix work: every position goes through every layer)
//   sequences       += 1                           (per-sequence work: a row of logits, sampling, bookkeeping)
//   decode_seqs     += 1 if n == 1 and s > 0       (a one-token decode piece)
//   context_tokens  += s + n                       (keys read once per piece: the memory term of attention)
//   attention_pairs += n * s + n * (n + 1) / 2     (query-key products: the compute term of attention)
//   blocks          += ceil((s + n) / block_size)  (block-table entries the piece's attention walks)
//
// Thread-safety: values.
#pragma once

#include <cstdint>
#include <string>

#include "proto/control_messages.h"

namespace tessera {

struct StepFeatures {
  int64_t tokens = 0;
  int64_t sequences = 0;
  int64_t decode_seqs = 0;
  int64_t prefill_tokens = 0;  // tokens - decode_seqs
  int64_t context_tokens = 0;
  int64_t attention_pairs = 0;
  int64_t blocks = 0;
};

// Precondition: block_size >= 1.
StepFeatures step_features(const StepPlan& plan, int64_t block_size);

// One step as the engine measured it (EngineOptions::on_step). Times in seconds.
struct StepRecord {
  uint64_t step_id = 0;
  double start_s = 0;     // run_step's start, from the engine's start
  double schedule_s = 0;  // schedule() and drafting before run_step
  double run_s = 0;       // run_step: the shards' compute and the round trip
  double commit_s = 0;    // on_result and turning tokens into events after it
  int64_t block_size = 0;
  int64_t running = 0;      // sequences holding blocks after the step
  int64_t waiting = 0;
  int64_t preemptions = 0;  // sequences preempted since the engine started, this step's included
  StepFeatures features;
  double total_s() const { return schedule_s + run_s + commit_s; }
};

// One JSON object on one line (no newline): the `--step-log` format.
std::string step_record_json(const StepRecord& record);

}  // namespace tessera
