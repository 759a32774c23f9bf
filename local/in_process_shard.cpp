#include "local/in_process_shard.h"

namespace tessera {

Result<StepResult> InProcessShard::run_step(StepPlan plan) {
  plan.step_id = ++next_step_;
  StepResult r = shard_.execute(plan);
  if (!r.error.empty()) return Status::internal(r.error);
  return r;
}

}  // namespace tessera
