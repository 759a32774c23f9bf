#include "coordinator/batch_engine.h"

#include <algorithm>
#include <random>

#include "common/logging.h"

namespace tessera {
namespace {

struct Active {
  size_t index;
  uint64_t seq_id;
  int64_t computed = 0;          // tokens whose KV is in the cache
  int64_t total = 0;             // prompt + sampled tokens
  int64_t blocks = 0;
  bool done = false;
};

}  // namespace

Result<std::vector<BatchOutput>> run_batch(ShardGroup& shards, const std::vector<BatchRequest>& requests,
                                           const BatchEngineOptions& o, const TokenCallback& on_token) {
  const int64_t block_size = shards.plan().block_size;
  int64_t free_blocks = shards.plan().num_blocks;
  std::vector<int32_t> free_list;
  for (int64_t b = free_blocks - 1; b >= 0; --b) free_list.push_back(static_cast<int32_t>(b));

  std::vector<BatchOutput> outputs(requests.size());
  std::vector<Active> active;
  StepPlan plan;
  static uint64_t next_seq_id = 1;
  std::random_device rd;
  for (size_t i = 0; i < requests.size(); ++i) {
    const BatchRequest& r = requests[i];
    if (r.prompt.empty()) return Status::invalid_argument(fmt::format("request {}: empty prompt", i));
    if (o.max_positions > 0 && static_cast<int64_t>(r.prompt.size()) >= o.max_positions)
      return Status::invalid_argument(fmt::format("request {}: the prompt has {} tokens; the context length is {}", i,
                                                  r.prompt.size(), o.max_positions));
    TESSERA_RETURN_IF_ERROR(validate_sampling_params(r.sampling).with_context(fmt::format("request {}", i)));
    NewSequence n;
    n.seq_id = next_seq_id++;
    n.prompt_ids = r.prompt;
    n.sampling = r.sampling;
    // Every rank samples with the same seed, so a request without one gets one here.
    if (!n.sampling.has_seed) {
      n.sampling.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
      n.sampling.has_seed = true;
    }
    plan.new_sequences.push_back(std::move(n));
    active.push_back({i, plan.new_sequences.back().seq_id, 0, static_cast<int64_t>(r.prompt.size())});
    if (r.max_tokens == 0) active.back().done = true;
  }

  auto all_done = [&] { return std::all_of(active.begin(), active.end(), [](const Active& a) { return a.done; }); };
  while (!all_done()) {
    plan.scheduled.clear();
    for (Active& a : active) {
      if (a.done) continue;
      const int64_t todo = a.total - a.computed;
      const int64_t n = std::min<int64_t>(todo, o.prefill_chunk > 0 ? o.prefill_chunk : todo);
      ScheduledSequence s;
      s.seq_id = a.seq_id;
      s.start_pos = a.computed;
      s.num_tokens = static_cast<int32_t>(n);
      s.sample = a.computed + n == a.total;
      const int64_t need = (a.computed + n + block_size - 1) / block_size;
      while (a.blocks < need) {
        if (free_list.empty())
          return Status::resource_exhausted(fmt::format("out of KV blocks ({} blocks of {} tokens)",
                                                        shards.plan().num_blocks, block_size));
        s.append_blocks.push_back(free_list.back());
        free_list.pop_back();
        ++a.blocks;
      }
      plan.scheduled.push_back(std::move(s));
    }
    TESSERA_ASSIGN_OR_RETURN(StepResult result, shards.run_step(plan));
    plan.new_sequences.clear();
    plan.finished.clear();
    for (const ScheduledSequence& s : plan.scheduled) {
      Active& a = *std::find_if(active.begin(), active.end(), [&](const Active& x) { return x.seq_id == s.seq_id; });
      a.computed += s.num_tokens;
    }
    for (const StepToken& t : result.tokens) {
      auto it = std::find_if(active.begin(), active.end(), [&](const Active& x) { return x.seq_id == t.seq_id; });
      if (it == active.end() || it->done) continue;
      Active& a = *it;
      const BatchRequest& r = requests[a.index];
      BatchOutput& out = outputs[a.index];
      out.ids.push_back(t.token);
      out.top_logprobs.push_back(t.top_logprobs);
      ++a.total;
      if (on_token) on_token(a.index, t);
      const bool eos = std::find(o.eos_ids.begin(), o.eos_ids.end(), t.token) != o.eos_ids.end();
      if ((eos && !r.ignore_eos) || static_cast<int64_t>(out.ids.size()) >= r.max_tokens ||
          (o.max_positions > 0 && a.total >= o.max_positions)) {
        a.done = true;
        out.stopped_at_eos = eos && !r.ignore_eos;
        plan.finished.push_back(a.seq_id);
      }
    }
  }
  if (!plan.finished.empty()) {
    // Let the shards drop the last finished sequences' state with an empty step.
    plan.scheduled.clear();
    TESSERA_RETURN_IF_ERROR(shards.run_step(plan).status());
  }
  return outputs;
}

}  // namespace tessera
