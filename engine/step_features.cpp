#include "engine/step_features.h"

#include <fmt/format.h>

namespace tessera {

StepFeatures step_features(const StepPlan& plan, int64_t block_size) {
  StepFeatures f;
  for (const ScheduledSequence& q : plan.scheduled) {
    const int64_t n = q.num_tokens;
    const int64_t s = q.start_pos;
    if (n <= 0) continue;
    f.tokens += n;
    f.sequences += 1;
    if (n == 1 && s > 0) f.decode_seqs += 1;
    f.context_tokens += s + n;
    f.attention_pairs += n * s + n * (n + 1) / 2;
    f.blocks += (s + n + block_size - 1) / block_size;
  }
  f.prefill_tokens = f.tokens - f.decode_seqs;
  return f;
}

std::string step_record_json(const StepRecord& r) {
  const StepFeatures& f = r.features;
  return fmt::format(
      "{{\"step\":{},\"start_s\":{:.6f},\"schedule_s\":{:.6e},\"run_s\":{:.6e},\"commit_s\":{:.6e},"
      "\"block_size\":{},\"running\":{},\"waiting\":{},\"tokens\":{},\"sequences\":{},\"decode_seqs\":{},"
      "\"prefill_tokens\":{},\"context_tokens\":{},\"attention_pairs\":{},\"blocks\":{},\"preemptions\":{}}}",
      r.step_id, r.start_s, r.schedule_s, r.run_s, r.commit_s, r.block_size, r.running, r.waiting, f.tokens,
      f.sequences, f.decode_seqs, f.prefill_tokens, f.context_tokens, f.attention_pairs, f.blocks, r.preemptions);
}

}  // namespace tessera
