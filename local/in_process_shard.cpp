#include "local/in_process_shard.h"

namespace tessera {

Result<StepResult> InProcessShard::run_step(StepPlan plan, const LateMasks& late) {
  plan.step_id = ++next_step_;
  ShardExecutor::MaskSource source;
  if (late) source = [&]() -> Result<StepMasks> { return StepMasks{plan.step_id, late()}; };
  StepResult r = shard_.execute(plan, source);
  if (!r.error.empty()) return Status::internal(r.error);
  return r;
}

}  // namespace tessera
