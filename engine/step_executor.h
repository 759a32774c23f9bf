// Where the engine's step plans run (ARCHITECTURE.md): the coordinator's engine (engine/engine.h)
// drives one StepExecutor, whatever is behind it: shard processes over the control channel
// (server/shard_group.h) or a shard in this very process (local/in_process_shard.h, for
// `tessera generate`, tests and benchmarks). Either way a plan goes out, every rank computes
// it, and rank 0's result comes back.
//
// Thread-safety: one thread (the engine's) calls every method.
#pragma once

#include <cstdint>

#include "proto/control_messages.h"
#include "common/status.h"

namespace tessera {

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // Numbers the plan (step ids are consecutive from 1), runs it on every rank and returns rank
  // 0's result (the sampled tokens); the first rank error becomes the returned Status.
  virtual Result<StepResult> run_step(StepPlan plan) = 0;
  // Steps run so far.
  virtual uint64_t steps_run() const = 0;
  // Call while idle: keeps the ranks alive and checks their liveness.
  virtual Status keep_alive() = 0;
  // False once a rank failed or stopped answering; no more steps run then.
  virtual bool healthy() const = 0;
};

}  // namespace tessera
