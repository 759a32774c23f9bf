// Decode steps of a model timed on this machine's CPU (`tessera plan --measure`, `tessera tune
// calibrate`'s block measurement): TP ranks as threads (in-process communicators), each with its
// own slice of the weights, KV cache and thread pool, exactly as `tessera generate` builds them.
// The batch's KV cache is filled to the context with placeholder values (attention costs the same
// whatever the keys hold), so no prefill is timed; then `steps` decode steps of `batch`
// sequences, one token each, are timed after two warm-up steps. A context that leaves no room for
// those steps within the model's positions (the plan's default: the whole context) is measured
// that many positions shorter; Measured::context is the one measured.
#pragma once

#include <cstdint>
#include <string>

#include "common/kv_config.h"
#include "common/status.h"

namespace tessera::cli {

struct MeasureArgs {
  std::string model;  // a model file or directory
  int tp = 1;
  int threads = 0;    // all of them, split over the ranks: 0 = the hardware's
  int64_t batch = 1;
  int64_t block_size = 16;
  KvDtype kv_dtype = KvDtype::kF32;  // one the CPU KV cache stores (common/kv_config.h: fp32, fp16, int8)
  int steps = 16;
};

struct Measured {  // what one measure_decode_steps call timed
  int tp = 1;
  int threads_per_rank = 1;
  int64_t batch = 0;
  int64_t context = 0;
  int steps = 0;
  uint64_t weight_bytes = 0;       // rank 0: matrices + embedding + LM-head slice + vectors
  uint64_t kv_bytes_per_token = 0;
  double step_median_s = 0;
  double step_mean_s = 0;
  double step_min_s = 0;
  double comm_s = 0;               // rank 0's time in collectives per step
};

// Errors: a model that does not load, a context plus the steps past the model's positions, a
// KV dtype the CPU backend does not store (Unimplemented, naming those it does).
Result<Measured> measure_decode_steps(const MeasureArgs& a, int64_t context);

}  // namespace tessera::cli
