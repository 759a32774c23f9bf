#include "local/local_model.h"

#include <algorithm>

#include "common/kv_config.h"
#include "common/logging.h"
#include "engine/engine.h"
#include "kernels/weight_codec.h"

namespace tessera {

Result<std::unique_ptr<LocalModel>> LocalModel::load(const LocalModelOptions& options) {
  TESSERA_RETURN_IF_ERROR(validate_block_size(options.block_size));
  std::unique_ptr<LocalModel> m(new LocalModel());
  TESSERA_ASSIGN_OR_RETURN(m->store_, WeightStore::open(options.path));
  const ModelConfig& c = m->store_->config();
  WeightLoadOptions wo;
  wo.codec = &cpu_weight_codec();
  wo.quant = options.runtime.quant;
  wo.quantize_lm_head = options.runtime.quant_lm_head;
  wo.threads = options.runtime.threads;
  wo.importance = options.importance;
  wo.keep_unquantizable = options.keep_unquantizable;
  TESSERA_ASSIGN_OR_RETURN(ModelWeights full, bind_model_weights(*m->store_, wo));
  TESSERA_ASSIGN_OR_RETURN(m->layout_, plan_shard_layout(c, TpConfig{}));
  TESSERA_ASSIGN_OR_RETURN(ShardWeights weights, slice_model_weights(std::move(full), c, m->layout_));
  m->comm_ = make_single_rank_comm();
  m->pool_ = std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = options.runtime.threads});
  CpuBackendOptions bo;
  bo.runtime = options.runtime;
  m->backend_ = std::make_unique<CpuBackend>(c, m->layout_, std::move(weights), m->pool_.get(), m->comm_.get(), bo);
  m->executor_ = std::make_unique<ShardExecutor>(*m->backend_, c, ShardExecutorOptions{});
  const int64_t kv_tokens = options.kv_tokens > 0 ? options.kv_tokens : c.max_positions;
  const int64_t num_blocks = (kv_tokens + options.block_size - 1) / options.block_size;
  TESSERA_RETURN_IF_ERROR(m->executor_->configure(options.block_size, num_blocks, options.runtime.kv_dtype, 0, options.draft));
  m->draft_layers_ = options.draft.layers;
  m->steps_ = std::make_unique<InProcessShard>(*m->executor_);
  // One request at a time from scratch: no prefix cache between calls.
  TESSERA_ASSIGN_OR_RETURN(BlockPool blocks,
                           BlockPool::create({num_blocks, static_cast<int32_t>(options.block_size), false}));
  m->blocks_ = std::make_unique<BlockPool>(std::move(blocks));
  declare_engine_metrics(m->metrics_);
  TESSERA_LOG_DEBUG("loaded {}: {} layers, hidden {}, vocab {}, {} KV blocks of {} tokens", options.path, c.n_layers,
                    c.hidden, c.vocab, num_blocks, options.block_size);
  return m;
}

bool LocalModel::ensure_blocks(std::vector<int32_t>& table, int64_t n_tokens) {
  const int64_t need = (n_tokens + block_size() - 1) / block_size();
  while (static_cast<int64_t>(table.size()) < need) {
    std::optional<int32_t> b = blocks_->allocate();
    if (!b) return false;
    table.push_back(*b);
  }
  return true;
}

void LocalModel::release_blocks(std::vector<int32_t>& table) {
  for (int32_t b : table) blocks_->release(b);
  table.clear();
}

namespace {

// The logits at the last prompt position from one forward pass (max_tokens 0: nothing to
// generate, so the engine runs no step).
Result<std::vector<float>> prompt_logits(LocalModel& m, const std::vector<int32_t>& prompt, int64_t chunk) {
  std::vector<int32_t> table;
  if (!m.ensure_blocks(table, static_cast<int64_t>(prompt.size()))) {
    m.release_blocks(table);
    return Status::resource_exhausted(fmt::format("not enough KV blocks for {} tokens", prompt.size()));
  }
  std::vector<float> logits;
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t step = chunk > 0 ? chunk : n;
  Status s;
  for (int64_t start = 0; start < n && s.is_ok(); start += step) {
    const int64_t len = std::min(step, n - start);
    SequenceInput in;
    in.tokens = std::span<const int32_t>(prompt.data() + start, static_cast<size_t>(len));
    in.start_pos = start;
    in.block_table = table;
    in.want_logits = start + len == n;
    s = m.forward().run(std::span<const SequenceInput>(&in, 1), logits);
  }
  m.release_blocks(table);
  TESSERA_RETURN_IF_ERROR(s);
  return logits;
}

}  // namespace

Result<GenerateOutput> generate(LocalModel& model, const std::vector<int32_t>& prompt,
                                const GenerateOptions& options,
                                const std::function<void(const SampledToken&)>& on_token) {
  if (prompt.empty()) return Status::invalid_argument("the prompt is empty");
  if (options.max_tokens < 0) return Status::invalid_argument("max_tokens must be >= 0");
  const ModelConfig& c = model.config();
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt >= c.max_positions)
    return Status::invalid_argument(
        fmt::format("the prompt has {} tokens; the context length is {}", prompt.size(), c.max_positions));
  for (int32_t id : prompt)
    if (id < 0 || id >= c.vocab)
      return Status::out_of_range(fmt::format("token id {} is out of range: the vocabulary has {} tokens (0..{})", id,
                                              c.vocab, c.vocab - 1));
  TESSERA_RETURN_IF_ERROR(validate_sampling_params(options.sampling));
  const int64_t limit = std::min(n_prompt + options.max_tokens, c.max_positions);
  if ((limit + model.block_size() - 1) / model.block_size() > model.blocks().num_free())
    return Status::resource_exhausted(fmt::format("not enough KV blocks for {} tokens", limit));

  GenerateOutput out;
  if (options.max_tokens == 0) {
    TESSERA_ASSIGN_OR_RETURN(out.prompt_last_logits, prompt_logits(model, prompt, options.prefill_chunk));
    return out;
  }

  SingleRequest r;
  r.prompt = prompt;
  r.sampling = options.sampling;
  r.max_tokens = options.max_tokens;
  r.ignore_eos = options.ignore_eos;
  r.prefill_chunk = options.prefill_chunk;
  r.speculation = options.speculation;
  r.speculation.draft_layers = model.draft_layers();
  r.eos_ids = c.eos_ids;
  r.max_positions = c.max_positions;
  r.seq_id = model.next_seq_id_++;
  // The logits of the sequence's first sampled row: those at the last prompt position.
  model.executor().set_row_observer([&](uint64_t, std::span<const float> row) {
    if (out.prompt_last_logits.empty()) out.prompt_last_logits.assign(row.begin(), row.end());
  });
  Result<std::string> finish =
      run_single_request(model.steps(), model.blocks(), {}, model.metrics(), r, [&](const JobEvent& ev) {
        for (size_t i = 0; i < ev.tokens.size(); ++i) {
          out.ids.push_back(ev.tokens[i]);
          if (!on_token) continue;
          SampledToken t;
          t.id = ev.tokens[i];
          if (i < ev.token_logprobs.size()) t.logprob = ev.token_logprobs[i].second;
          if (i < ev.top_logprobs.size()) t.top_logprobs = ev.top_logprobs[i];
          on_token(t);
        }
      });
  model.executor().set_row_observer({});
  // The engine is gone before a next step could tell the shard the sequence finished.
  model.executor().drop(r.seq_id);
  TESSERA_RETURN_IF_ERROR(finish.status());
  const bool eos = !out.ids.empty() && std::find(c.eos_ids.begin(), c.eos_ids.end(), out.ids.back()) != c.eos_ids.end();
  out.stopped_at_eos = *finish == "stop" && eos && !options.ignore_eos;
  return out;
}

}  // namespace tessera
