// A StepExecutor (engine/step_executor.h) over one shard in this process: the engine's plans go
// straight to a ShardExecutor, no control channel, no codec, no second process. TP 1 only.
#pragma once

#include "engine/step_executor.h"
#include "shard/shard_executor.h"

namespace tessera {

class InProcessShard : public StepExecutor {
 public:
  explicit InProcessShard(ShardExecutor& shard) : shard_(shard) {}

  // A step the shard refuses is an Internal error carrying its message (as ShardGroup reports a
  // rank's step error); the shard stays healthy.
  Result<StepResult> run_step(StepPlan plan) override { return run_step(std::move(plan), LateMasks{}); }
  // `late` runs when the shard is about to sample (after the forward pass, on this thread).
  Result<StepResult> run_step(StepPlan plan, const LateMasks& late) override;
  uint64_t steps_run() const override { return next_step_; }
  Status keep_alive() override { return Status::ok(); }
  bool healthy() const override { return true; }

 private:
  ShardExecutor& shard_;
  uint64_t next_step_ = 0;
};

}  // namespace tessera
