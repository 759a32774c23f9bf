// `tessera tune`: from a trace (or a length mix and a rate) and an SLO to a scheduler profile.
// Every candidate setting of the knobs runs the trace on the simulator (tune/simulator.h); the
// recommendation is the candidate with the most goodput (requests per second that meet the SLO:
// TTFT <= ttft and the P99 of the request's own inter-token gaps <= itl, so that a stream stalled
// behind a long prefill step counts as missed) among those whose P99 TTFT and P99 ITL meet the
// SLO's targets; ties (within 1%) go to the higher throughput. When no candidate meets the SLO,
// the one with the most goodput is recommended and `meets_slo` is false.
//
// The search: a grid over max_batch x max_step_tokens x max_wait_ms x block size (prefill chunk
// = min(512, step tokens)), then, around the best few, prefill chunk and aging (aging only when
// the trace has more than one priority class). Each candidate is one simulation; about 300 in
// all.
//
// Thread-safety: run_tune runs simulations on `threads` threads; values otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loadgen/load_generator.h"
#include "engine/scheduler_config.h"
#include "tune/simulator.h"

namespace tessera {

struct TuneCandidate {
  SchedulerConfig scheduler;
  int64_t block_size = 16;
  std::string label;  // "batch 32, step 2048, wait 2 ms, block 16, chunk 512"
  SimResult result;   // summary only
  bool meets_slo = false;
  bool pareto = false;  // on the throughput / P99 TTFT front
};

struct TuneOptions {
  SchedulerConfig base;             // knobs the search does not touch come from here
  int64_t kv_bytes = 0;             // the KV budget: blocks = kv_bytes / (block * kv_bytes_per_token)
  uint64_t kv_bytes_per_token = 0;  // all layers, this rank
  StepTimeModel cost;
  SloSpec slo;                      // ttft and itl are P99 targets
  // A candidate meets the SLO when its simulated P99s are within the targets x (1 - slo_margin):
  // the simulator's P99s are off by up to 15-25% against real runs (bench/results/tune/
  // sim-vs-real.md), so a setting that meets them with nothing to spare fails as often as not.
  double slo_margin = 0.15;
  std::vector<int32_t> max_batch = {8, 16, 32, 64, 128};
  std::vector<int32_t> max_step_tokens = {256, 512, 1024, 2048, 4096};
  std::vector<double> max_wait_ms = {0, 2, 5, 20, 50, 100};
  std::vector<int64_t> block_sizes = {16, 64, 256};
  std::vector<int32_t> prefill_chunk = {128, 256, 512, 1024, 2048};
  std::vector<double> aging_ms = {500, 2000, 5000, 20000};
  int threads = 0;                  // 0: hardware concurrency
  double request_overhead_s = 0;
};

struct TuneResult {
  std::vector<TuneCandidate> candidates;  // every simulated candidate, in search order
  size_t recommended = 0;                 // index into candidates
  bool meets_slo = false;
  std::vector<size_t> builtin;            // the built-in profiles (interactive, offline) as simulated
  double sim_seconds = 0;                 // wall time of all simulations
};

// InvalidArgument for an empty trace or SLO, a KV budget that holds no block.
Result<TuneResult> run_tune(const std::vector<SimRequest>& trace, const TuneOptions& options);

// Whether a summary meets the SLO's P99 targets (TTFT, ITL) and lost no request; with margin m,
// the targets x (1 - m).
bool meets_p99_slo(const RunSummary& summary, const SloSpec& slo, double margin = 0);

// Blocks of a KV budget at a block size (at least 0).
int64_t kv_blocks_for(int64_t kv_bytes, uint64_t kv_bytes_per_token, int64_t block_size);

// The Pareto table: candidates on the throughput / P99 TTFT front, best throughput first, each
// marked with whether it meets the SLO; the recommendation and the built-in profiles after it.
std::string format_tune_table(const TuneResult& result, const SloSpec& slo, bool markdown);

// The recommendation as a scheduler-config JSON (`serve --scheduler-config`), block size included.
std::string tuned_profile_json(const TuneCandidate& candidate, const std::string& comment);

// Every candidate as JSON lines for plotting (tools/plot_tune.py).
std::string tune_candidates_json(const TuneResult& result, const SloSpec& slo);

}  // namespace tessera
