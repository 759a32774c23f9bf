// `tessera bench scale`: the engine at several tensor-parallel degrees on one fixed workload.
//
// For each TP degree it starts the shards (one tessera-shard for TP = 1, mpirun for more; the
// launcher adds --oversubscribe when ranks outnumber cores) and drives a ShardGroup directly,
// as bench/step_roundtrip.cpp does: one prefill step of `batch` prompts, `warmup_steps`
// untimed decode steps, then `decode_steps` timed decode steps of `batch` sequences. Each
// step's wall time (coordinator side) is split with rank 0's StepResult into
//   compute    = compute_micros - comm_micros   (the forward pass and sampling),
//   all-reduce = comm_micros                    (time inside collectives),
//   host       = wall - compute_micros          (control plane, encoding, wake-ups, scheduling).
// Throughput is decode tokens per second (batch x steps / decode wall). Speedup is against the
// first TP in the list; efficiency = speedup / (tp / first tp).
//
// Thread-safety: single-threaded; runs the shards as child processes.
#pragma once

#include <string>
#include <vector>

#include "loadgen/load_generator.h"
#include "common/status.h"

namespace tessera {

struct ScaleBenchOptions {
  std::string model;              // "" : a synthetic model from preset/type, made once and cached
  std::string preset = "110m";    // tessera-make-model --preset
  std::string type = "q8_0";      // tessera-make-model --type
  std::string model_cache_dir;    // "" : <temp>/tessera-bench-models
  std::vector<int> tp_list = {1, 2};
  int batch = 8;                  // sequences per step
  int prompt_tokens = 32;
  int decode_steps = 64;          // timed
  int warmup_steps = 4;           // untimed decode steps first
  int threads = 0;                // CPU threads per shard (0: the shard's default)
  std::string device = "cpu";     // cpu | cuda | auto
  std::string title;
  std::string json_path;
  std::string plot_prefix;        // "" : the JSON path without ".json"
  bool plots = true;
  bool install_plot_deps = true;
  std::string markdown_path;      // "" : none; else a section is appended
  std::string command_line;
};

struct ScalePoint {
  int tp = 1;
  std::string shard_device;       // rank 0's description ("cpu (2 threads ...)")
  double decode_tokens_per_s = 0;
  double prefill_ms = 0;          // the prefill step's wall time
  LatencyStats step_ms;           // decode-step wall time, milliseconds
  double compute_ms = 0;          // means per decode step
  double allreduce_ms = 0;
  double host_ms = 0;
  double speedup = 1;
  double efficiency = 1;
};

// Fills speedup and efficiency from the first point.
void compute_scaling(std::vector<ScalePoint>& points);
std::string format_scale_table(const std::vector<ScalePoint>& points, bool markdown);

// Parses "1,2,4" (each >= 1, no repeats).
Result<std::vector<int>> parse_tp_list(std::string_view text);

// Returns the process exit code.
int run_scale_bench(const ScaleBenchOptions& options);

}  // namespace tessera
