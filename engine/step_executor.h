// Where the engine's step plans run (ARCHITECTURE.md): the coordinator's engine (engine/engine.h)
// drives one StepExecutor, whatever is behind it: shard processes over the control channel
// (server/shard_group.h) or a shard in this very process (local/in_process_shard.h, for
// `tessera generate`, tests and benchmarks). Either way a plan goes out, every rank computes
// it, and rank 0's result comes back.
//
// Thread-safety: one thread (the engine's) calls every method.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "proto/control_messages.h"
#include "common/status.h"

namespace tessera {

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // Numbers the plan (step ids are consecutive from 1), runs it on every rank and returns rank
  // 0's result (the sampled tokens); the first rank error becomes the returned Status.
  virtual Result<StepResult> run_step(StepPlan plan) = 0;
  // The same for a plan whose pieces marked mask_follows get their token masks from `late` (one
  // SequenceMask per such piece, in the plan's order), called on this thread once the plan is
  // out: executors that can overlap it with the ranks' forward pass do (ShardGroup sends the
  // masks after the plan). This default computes the masks first and puts them into the plan.
  using LateMasks = std::function<std::vector<SequenceMask>()>;
  virtual Result<StepResult> run_step(StepPlan plan, const LateMasks& late);
  // Steps run so far.
  virtual uint64_t steps_run() const = 0;
  // Call while idle: keeps the ranks alive and checks their liveness.
  virtual Status keep_alive() = 0;
  // False once a rank failed or stopped answering; no more steps run then.
  virtual bool healthy() const = 0;
};

inline Result<StepResult> StepExecutor::run_step(StepPlan plan, const LateMasks& late) {
  std::vector<SequenceMask> masks = late();
  size_t next = 0;
  for (ScheduledSequence& q : plan.scheduled) {
    if (!q.mask_follows) continue;
    if (next < masks.size()) q.token_mask = std::move(masks[next++].token_mask);
    q.mask_follows = false;
  }
  return run_step(std::move(plan));
}

}  // namespace tessera
