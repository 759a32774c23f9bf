#include "shard/local_model.h"

#include <algorithm>

#include "common/logging.h"

namespace tessera {

Result<std::unique_ptr<LocalModel>> LocalModel::load(const LocalModelOptions& options) {
  std::unique_ptr<LocalModel> m(new LocalModel());
  TESSERA_ASSIGN_OR_RETURN(m->store_, WeightStore::open(options.path));
  const ModelConfig& c = m->store_->config();
  WeightLoadOptions wo;
  wo.quant = options.quant;
  wo.quantize_lm_head = options.quantize_lm_head;
  wo.threads = options.threads;
  TESSERA_ASSIGN_OR_RETURN(ModelWeights full, bind_model_weights(*m->store_, wo));
  TESSERA_ASSIGN_OR_RETURN(m->layout_, plan_shard_layout(c, TpConfig{}));
  TESSERA_ASSIGN_OR_RETURN(m->weights_, slice_model_weights(std::move(full), c, m->layout_));
  m->comm_ = make_single_rank_comm();
  if (options.block_size < 1 || options.block_size > 1024)
    return Status::invalid_argument(fmt::format("block size must be in 1..1024, got {}", options.block_size));
  const int64_t kv_tokens = options.kv_tokens > 0 ? options.kv_tokens : c.max_positions;
  KvCacheShape shape;
  shape.n_layers = c.n_layers;
  shape.n_kv_heads = c.n_kv_heads;
  shape.head_dim = c.head_dim;
  shape.block_size = options.block_size;
  shape.num_blocks = (kv_tokens + options.block_size - 1) / options.block_size;
  shape.f16 = options.kv_f16;
  TESSERA_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(shape));
  m->cache_ = std::make_unique<KvCache>(std::move(cache));
  m->pool_ = std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = options.threads});
  relayout_for_cpu_kernels(m->weights_, m->pool_.get());
  m->forward_ = std::make_unique<ForwardPass>(m->store_->config(), m->layout_, m->weights_.weights, m->pool_.get(),
                                              m->cache_.get(), m->comm_.get());
  m->allocator_ = std::make_unique<SimpleBlockAllocator>(shape.num_blocks);
  TESSERA_LOG_DEBUG("loaded {}: {} layers, hidden {}, vocab {}, {} KV blocks of {} tokens", options.path,
                    c.n_layers, c.hidden, c.vocab, shape.num_blocks, shape.block_size);
  return m;
}

Result<GenerateOutput> generate(LocalModel& model, const std::vector<int32_t>& prompt,
                                const GenerateOptions& options,
                                const std::function<void(const SampledToken&)>& on_token) {
  if (prompt.empty()) return Status::invalid_argument("the prompt is empty");
  if (options.max_tokens < 0) return Status::invalid_argument("max_tokens must be >= 0");
  const ModelConfig& c = model.config();
  const int64_t total = static_cast<int64_t>(prompt.size()) + options.max_tokens;
  if (static_cast<int64_t>(prompt.size()) >= c.max_positions)
    return Status::invalid_argument(fmt::format("the prompt has {} tokens; the context length is {}",
                                                prompt.size(), c.max_positions));
  std::vector<int32_t> table;
  struct Release {
    LocalModel& m;
    std::vector<int32_t>& t;
    ~Release() { m.allocator().release(t); }
  } release{model, table};
  const int64_t limit = std::min(total, c.max_positions);
  if (!model.allocator().ensure(table, limit, model.block_size()))
    return Status::resource_exhausted(fmt::format("not enough KV blocks for {} tokens", limit));

  TESSERA_RETURN_IF_ERROR(validate_sampling_params(options.sampling));
  GenerateOutput out;
  std::vector<float> logits;

  // Prefill, optionally in chunks.
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  const int64_t chunk = options.prefill_chunk > 0 ? options.prefill_chunk : n_prompt;
  for (int64_t start = 0; start < n_prompt; start += chunk) {
    const int64_t len = std::min(chunk, n_prompt - start);
    SequenceInput in;
    in.tokens = std::span<const int32_t>(prompt.data() + start, static_cast<size_t>(len));
    in.start_pos = start;
    in.block_table = table;
    in.want_logits = start + len == n_prompt;
    TESSERA_RETURN_IF_ERROR(model.forward().run(std::span<const SequenceInput>(&in, 1), logits));
  }
  out.prompt_last_logits = logits;
  // The prefill validated the prompt's ids; the sampler may now count them.
  Sampler sampler(options.sampling);
  sampler.add_prompt_tokens(prompt);

  int64_t pos = n_prompt;
  for (int64_t i = 0; i < options.max_tokens; ++i) {
    SampledToken tok = sampler.sample(logits.data(), c.vocab);
    out.ids.push_back(tok.id);
    if (on_token) on_token(tok);
    const bool is_eos = std::find(c.eos_ids.begin(), c.eos_ids.end(), tok.id) != c.eos_ids.end();
    if (is_eos && !options.ignore_eos) {
      out.stopped_at_eos = true;
      break;
    }
    // Stop at max_tokens, or when the next token would not fit in the context.
    if (i + 1 == options.max_tokens || pos >= c.max_positions) break;
    SequenceInput in;
    in.tokens = std::span<const int32_t>(&out.ids.back(), 1);
    in.start_pos = pos;
    in.block_table = table;
    TESSERA_RETURN_IF_ERROR(model.forward().run(std::span<const SequenceInput>(&in, 1), logits));
    ++pos;
  }
  return out;
}

}  // namespace tessera
