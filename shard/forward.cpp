#include "shard/forward.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "comm/device_comm.h"
#include "common/check.h"
#include "common/env.h"
#include "common/mapped_file.h"
#include "common/thread_pool.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/vec.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/paged_attention.h"
#include "kernels/quant.h"
#include "kernels/rope.h"

namespace tessera {
namespace {

void add_bias(float* y, const TensorView& bias, int64_t n_tokens, int64_t dim) {
  if (!bias.data) return;
  const auto* b = static_cast<const float*>(bias.data);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t i = 0; i < dim; ++i) y[t * dim + i] += b[i];
}

const float* f32(const TensorView& v) { return static_cast<const float*>(v.data); }

}  // namespace

DecoderDims decoder_dims(const ModelConfig& c, const ShardLayout& layout) {
  return DecoderDims{c.hidden, c.head_dim, layout.n_heads, layout.n_kv_heads, layout.ffn};
}

ForwardPass::ForwardPass(const ModelConfig& config, const ShardLayout& layout, const ModelWeights& weights,
                         ThreadPool* pool, KvCache* cache, DeviceComm* comm)
    : ForwardPass(config, layout, weights, pool, cache, comm, describe_architecture(config, weights)) {}

ForwardPass::ForwardPass(const ModelConfig& config, const ShardLayout& layout, const ModelWeights& weights,
                         ThreadPool* pool, KvCache* cache, DeviceComm* comm, ArchSpec arch)
    : config_(config),
      layout_(layout),
      weights_(weights),
      comm_(comm),
      pool_(pool),
      cache_(cache),
      decoder_(std::move(arch), decoder_dims(config, layout)) {
  TESSERA_CHECK(comm != nullptr && comm->size() == layout.tp_size, "communicator does not match the layout");
  TESSERA_CHECK(cache->shape().n_kv_heads == layout.n_kv_heads, "cache holds {} KV heads, layout {}",
                cache->shape().n_kv_heads, layout.n_kv_heads);
  TESSERA_CHECK(static_cast<int64_t>(weights.layers.size()) == config.n_layers, "{} layers bound, {} expected",
                weights.layers.size(), config.n_layers);
  TESSERA_CHECK(cache->shape().n_layers == config.n_layers, "cache layers");
  const Status arch_ok = decoder_.spec().validate(config, &weights);
  TESSERA_CHECK(arch_ok.is_ok(), "{}", arch_ok.to_string());
  // The window pool's layers must be windowed layers with a window (released blocks are never
  // read only because their queries do not reach back to them).
  if (cache->shape().has_window_pool()) {
    const KvWindowLayers w = kv_window_layers(config, decoder_.spec());
    TESSERA_CHECK(w.window > 0 && w.layers == cache->shape().window_layers,
                  "the window pool's layers are not the model's windowed layers");
    kv_window_ = w.window;
  }
  // A tied embedding re-laid for the LM head's kernels is looked up through a row copy.
  if (cpu::is_r16(weights.embed.type)) embed_row_.resize(row_bytes(cpu::r16_base(weights.embed.type), config.hidden));
}

Status ForwardPass::validate(std::span<const SequenceInput> batch) const {
  const int64_t block_size = cache_->shape().block_size;
  const int64_t num_blocks = cache_->shape().num_blocks;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceInput& in = batch[s];
    if (in.tokens.empty()) return Status::invalid_argument(fmt::format("sequence {} has no tokens", s));
    for (int32_t id : in.tokens) {
      if (id < 0 || id >= config_.vocab)
        return Status::out_of_range(
            fmt::format("token id {} is out of range: the vocabulary has {} tokens (0..{})", id,
                        config_.vocab, config_.vocab - 1));
    }
    const int64_t end = in.start_pos + static_cast<int64_t>(in.tokens.size());
    if (in.start_pos < 0 || end > config_.max_positions)
      return Status::out_of_range(fmt::format("positions [{}, {}) exceed the context length {}",
                                              in.start_pos, end, config_.max_positions));
    if (static_cast<int64_t>(in.block_table.size()) * block_size < end)
      return Status::invalid_argument(fmt::format(
          "sequence {}: block table of {} blocks cannot hold {} tokens", s, in.block_table.size(), end));
    for (int32_t b : in.block_table)
      if (b < 0 || b >= num_blocks)
        return Status::out_of_range(fmt::format("block id {} outside the cache (0..{})", b, num_blocks - 1));
    if (!cache_->shape().has_window_pool()) {
      if (!in.window_block_table.empty())
        return Status::invalid_argument(fmt::format("sequence {}: a window table without a window pool", s));
    } else {
      TESSERA_RETURN_IF_ERROR(validate_window_table(in.window_block_table, s, in.start_pos, end - in.start_pos,
                                                    kv_window_, block_size, cache_->shape().num_window_blocks));
    }
  }
  return Status::ok();
}

void ForwardPass::ensure_workspace(int64_t n) {
  if (n <= capacity_tokens_) return;
  const int64_t hd = config_.head_dim;
  x_.resize(static_cast<size_t>(n * config_.hidden));
  h_.resize(x_.size());
  proj_.resize(x_.size());
  q_.resize(static_cast<size_t>(n * layout_.n_heads * hd));
  attn_.resize(q_.size());
  k_.resize(static_cast<size_t>(n * layout_.n_kv_heads * hd));
  v_.resize(k_.size());
  gate_.resize(static_cast<size_t>(n * layout_.ffn));
  up_.resize(gate_.size());
  positions_.resize(static_cast<size_t>(n));
  capacity_tokens_ = n;
}

float* ForwardPass::act(Act a) {
  switch (a) {
    case Act::kResidual: return x_.data();
    case Act::kNormed: return h_.data();
    case Act::kQ: return q_.data();
    case Act::kK: return k_.data();
    case Act::kV: return v_.data();
    case Act::kAttn: return attn_.data();
    case Act::kProj: return proj_.data();
    case Act::kGate: return gate_.data();
    case Act::kUp: return up_.data();
  }
  TESSERA_CHECK(false, "unknown activation {}", static_cast<int>(a));
  return nullptr;
}

const TensorView& ForwardPass::weight(WeightRef r) const {
  if (r.layer == WeightRef::kModel) {
    switch (r.tensor) {
      case Tensor::kEmbed: return weights_.embed;
      case Tensor::kFinalNorm: return weights_.final_norm;
      case Tensor::kLmHead: return weights_.lm_head;
      default: break;
    }
    TESSERA_CHECK(false, "{} is not a model tensor", tensor_role_name(r.tensor));
  }
  const LayerWeights& w = weights_.layers[static_cast<size_t>(r.layer)];
  switch (r.tensor) {
    case Tensor::kAttnNorm: return w.attn_norm;
    case Tensor::kWq: return w.wq;
    case Tensor::kWk: return w.wk;
    case Tensor::kWv: return w.wv;
    case Tensor::kBq: return w.bq;
    case Tensor::kBk: return w.bk;
    case Tensor::kBv: return w.bv;
    case Tensor::kQNorm: return w.q_norm;
    case Tensor::kKNorm: return w.k_norm;
    case Tensor::kWo: return w.wo;
    case Tensor::kPostAttnNorm: return w.post_attn_norm;
    case Tensor::kFfnNorm: return w.ffn_norm;
    case Tensor::kWGate: return w.w_gate;
    case Tensor::kWUp: return w.w_up;
    case Tensor::kWDown: return w.w_down;
    case Tensor::kPostFfnNorm: return w.post_ffn_norm;
    default: break;
  }
  TESSERA_CHECK(false, "{} is not a layer tensor", tensor_role_name(r.tensor));
  return weights_.embed;
}

bool ForwardPass::supports(DecoderOp, QuantType) const {
  return true;  // the reference backend: every op, every stored type
}

Status ForwardPass::embed(int64_t) {
  int64_t t = 0;
  const int64_t hidden = config_.hidden;
  for (const SequenceInput& in : batch_) {
    for (size_t i = 0; i < in.tokens.size(); ++i, ++t) {
      float* x = &x_[static_cast<size_t>(t * hidden)];
      if (embed_row_.empty()) {
        dequantize_row(weights_.embed.type, weights_.embed.row_ptr(in.tokens[i]), x, hidden);
      } else {
        cpu::unpack_r16_row(weights_.embed.type, static_cast<const uint8_t*>(weights_.embed.data), in.tokens[i], hidden,
                            embed_row_.data());
        dequantize_row(cpu::r16_base(weights_.embed.type), embed_row_.data(), x, hidden);
      }
      positions_[static_cast<size_t>(t)] = static_cast<int32_t>(in.start_pos + static_cast<int64_t>(i));
    }
  }
  return Status::ok();
}

Status ForwardPass::scale(Act a, int64_t count, float s) {
  scale_f32(act(a), s, count);
  return Status::ok();
}

Status ForwardPass::rms_norm(Act in, WeightRef w, Act out, int64_t rows, int64_t dim) {
  tessera::rms_norm(act(in), f32(weight(w)), act(out), rows, dim, decoder_.spec().rms_eps);
  return Status::ok();
}

Status ForwardPass::add_rms_norm(Act delta, WeightRef w, int64_t n) {
  tessera::add_rms_norm(x_.data(), act(delta), f32(weight(w)), h_.data(), n, config_.hidden, decoder_.spec().rms_eps);
  return Status::ok();
}

Status ForwardPass::project(Act in, std::span<const Projection> outs, int64_t n) {
  for (const Projection& p : outs) {
    if (observer_) observer_(p.weight, act(in), n, weight(p.weight).cols());
    matmul(weight(p.weight), act(in), n, act(p.out), pool_);
  }
  return Status::ok();
}

Status ForwardPass::add_bias(Act a, WeightRef bias, int64_t n, int64_t dim) {
  tessera::add_bias(act(a), weight(bias), n, dim);
  return Status::ok();
}

Status ForwardPass::attention(int64_t l, const LayerSpec& spec, float scale, int64_t n) {
  (void)n;
  const int64_t hd = config_.head_dim;
  const int64_t n_heads = layout_.n_heads;
  const int64_t n_kv = layout_.n_kv_heads;
  const int64_t q_dim = n_heads * hd;
  const int64_t kv_dim = n_kv * hd;
  const float* inv_freq = decoder_.spec().rope_inv_freq[static_cast<size_t>(spec.rope_table)].data();
  rope_apply(q_.data(), positions_.data(), n, n_heads, hd, inv_freq);
  rope_apply(k_.data(), positions_.data(), n, n_kv, hd, inv_freq);

  // A windowed layer with a window pool keeps its KV there, addressed by the window tables.
  const bool windowed = cache_->shape().pool_of(l) == KvPool::kWindow;
  PagedKvLayer kv = cache_->layer(l);
  // Key summaries (a global layer of a cache that keeps them; a windowed layer never selects):
  // updated with every write; a decode piece past the threshold attends to the blocks they select.
  const KvBlockSummaries sums = spec.sliding_window == 0 ? cache_->summaries(l) : KvBlockSummaries{};
  const bool sparse_layer = sums.kmin != nullptr && sparse_.enabled;
  if (sparse_layer && sparse_scratch_.size() < batch_.size()) sparse_scratch_.resize(batch_.size());
  int64_t t = 0;
  attention_args_.clear();
  for (size_t i = 0; i < batch_.size(); ++i) {
    const SequenceInput& in = batch_[i];
    const auto len = static_cast<int64_t>(in.tokens.size());
    const int32_t* table = windowed ? in.window_block_table.data() : in.block_table.data();
    kv_write(kv, table, in.start_pos, len, &k_[static_cast<size_t>(t * kv_dim)],
             &v_[static_cast<size_t>(t * kv_dim)]);
    if (sums.kmin != nullptr) kv_summary_update(kv, sums, table, in.start_pos, len);
    AttentionArgs args;
    args.q = &q_[static_cast<size_t>(t * q_dim)];
    args.out = &attn_[static_cast<size_t>(t * q_dim)];
    args.n_tokens = len;
    args.start_pos = in.start_pos;
    args.n_heads = n_heads;
    args.scale = scale;
    args.sliding_window = spec.sliding_window;
    args.block_table = table;
    if (sparse_layer && len == 1) {
      if (in.start_pos + 1 >= sparse_.threshold_tokens) {
        sparse_seqs_.push_back({i, sparse_score_blocks(kv, sums, args, sparse_.select, pool_, sparse_scratch_[i])});
        ++sparse_attentions;
      } else {
        ++dense_global_decodes;
      }
    }
    attention_args_.push_back(args);
    t += len;
  }
  if (!sparse_seqs_.empty()) {
    const Status combined = combine_sparse_scores();
    if (combined.is_ok())
      for (const ScoredSeq& q : sparse_seqs_)
        attention_args_[q.index] =
            sparse_args_from_scores(kv, attention_args_[q.index], sparse_.select, sparse_scratch_[q.index]);
    sparse_seqs_.clear();
    TESSERA_RETURN_IF_ERROR(combined);
  }
  // All sequences in one pass over the pool (every kv_write above is done first).
  paged_attention_batch(kv, attention_args_, pool_);
  return Status::ok();
}

Status ForwardPass::combine_sparse_scores() {
  if (layout_.tp_size == 1) return Status::ok();
  // Every rank scored the same blocks of the same sequences with its own query heads; the
  // element-wise max over ranks is the score over all heads, so every rank (and a TP 1 run)
  // selects the same blocks.
  int64_t n = 0;
  for (const ScoredSeq& q : sparse_seqs_) n += static_cast<int64_t>(q.scores.size());
  if (n == 0) return Status::ok();
  local_logits_.resize(static_cast<size_t>(n));
  gathered_logits_.resize(static_cast<size_t>(n * layout_.tp_size));
  size_t off = 0;
  for (const ScoredSeq& q : sparse_seqs_) {
    std::copy(q.scores.begin(), q.scores.end(), local_logits_.begin() + static_cast<std::ptrdiff_t>(off));
    off += q.scores.size();
  }
  const auto t0 = std::chrono::steady_clock::now();
  TESSERA_RETURN_IF_ERROR(
      comm_->all_gather(local_logits_.data(), gathered_logits_.data(), n * static_cast<int64_t>(sizeof(float))));
  comm_micros += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
  off = 0;
  for (const ScoredSeq& q : sparse_seqs_)
    for (float& s : q.scores) {
      float m = gathered_logits_[off];
      for (int r = 1; r < layout_.tp_size; ++r) {
        const float v = gathered_logits_[static_cast<size_t>(r * n) + off];
        m = std::isnan(m) || v > m ? v : m;  // a NaN bound counts as -inf (sparse_block_scores)
      }
      s = m;
      ++off;
    }
  return Status::ok();
}

Status ForwardPass::set_sparse_attention(const SparseAttentionConfig& config) {
  if (config.enabled && !cache_->shape().key_summaries)
    return Status::invalid_argument("sparse attention needs a KV cache with key summaries (KvCacheShape::key_summaries)");
  if (config.threshold_tokens < 1 || config.select.recent_blocks < 1 || config.select.sink_blocks < 0 ||
      config.select.top_blocks < 0)
    return Status::invalid_argument(fmt::format(
        "sparse attention: threshold {} tokens (>= 1), sink {} / recent {} (>= 1) / top {} blocks", config.threshold_tokens,
        config.select.sink_blocks, config.select.recent_blocks, config.select.top_blocks));
  sparse_ = config;
  return Status::ok();
}

Status ForwardPass::gated_activation(GluActivation a, int64_t n) {
  switch (a) {
    case GluActivation::kSilu:
      silu_mul(gate_.data(), up_.data(), gate_.data(), n, layout_.ffn);
      return Status::ok();
    case GluActivation::kGeluTanh:
      gelu_tanh_mul_fp16_grid(gate_.data(), up_.data(), gate_.data(), n, layout_.ffn);
      return Status::ok();
  }
  return Status::internal("unknown activation");
}

Status ForwardPass::all_reduce(Act a, int64_t count) { return sum_over_ranks(act(a), count); }

Status ForwardPass::gather_logits(int64_t n_out, std::vector<float>& logits) {
  const int64_t vocab = config_.vocab;
  const int64_t local = layout_.vocab_end - layout_.vocab_begin;
  logits.resize(static_cast<size_t>(n_out * vocab));
  if (layout_.tp_size == 1) {
    matmul(weights_.lm_head, proj_.data(), n_out, logits.data(), pool_);
    return Status::ok();
  }
  // Each rank computes its vocabulary slice [n_out, per_rank] (padded), the slices are
  // gathered [rank][n_out][per_rank] and interleaved into [n_out][vocab].
  const int64_t per = layout_.vocab_per_rank;
  local_logits_.assign(static_cast<size_t>(n_out * per), 0.0f);
  if (local > 0) matmul_rows(weights_.lm_head, 0, local, proj_.data(), n_out, local_logits_.data(), per, pool_);
  gathered_logits_.resize(static_cast<size_t>(n_out * per * layout_.tp_size));
  const auto t0 = std::chrono::steady_clock::now();
  TESSERA_RETURN_IF_ERROR(comm_->all_gather(local_logits_.data(), gathered_logits_.data(),
                                            n_out * per * static_cast<int64_t>(sizeof(float))));
  comm_micros += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
  for (int r = 0; r < layout_.tp_size; ++r) {
    const int64_t begin = std::min<int64_t>(vocab, per * r);
    const int64_t count = std::min<int64_t>(vocab, begin + per) - begin;
    for (int64_t t = 0; t < n_out; ++t)
      std::copy_n(&gathered_logits_[static_cast<size_t>((r * n_out + t) * per)], count,
                  &logits[static_cast<size_t>(t * vocab + begin)]);
  }
  return Status::ok();
}

Status ForwardPass::sum_over_ranks(float* data, int64_t count) {
  if (layout_.tp_size == 1) return Status::ok();
  const auto t0 = std::chrono::steady_clock::now();
  Status s = comm_->all_reduce_sum(data, count);
  comm_micros += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
  return s;
}

Status ForwardPass::run_trunk(std::span<const SequenceInput> batch, int64_t n_layers, int64_t& n) {
  TESSERA_RETURN_IF_ERROR(validate(batch));
  n = 0;
  for (const SequenceInput& in : batch) n += static_cast<int64_t>(in.tokens.size());
  ensure_workspace(n);
  batch_ = batch;
  const Status s = decoder_.forward(*this, n, n_layers);
  batch_ = {};
  return s;
}

Status ForwardPass::run(std::span<const SequenceInput> batch, std::vector<float>& logits) {
  int64_t n = 0;
  TESSERA_RETURN_IF_ERROR(run_trunk(batch, 0, n));
  int64_t n_out = 0;
  for (const SequenceInput& in : batch)
    n_out += in.all_logits ? static_cast<int64_t>(in.tokens.size()) : in.want_logits ? 1 : 0;

  // Gather the last hidden state of every piece that wants logits, then the LM head.
  const int64_t hidden = config_.hidden;
  int64_t t = 0, row = 0;
  for (const SequenceInput& in : batch) {
    const auto len = static_cast<int64_t>(in.tokens.size());
    t += len;
    const int64_t first = in.all_logits ? t - len : in.want_logits ? t - 1 : t;
    for (int64_t i = first; i < t; ++i, ++row)
      std::copy_n(&h_[static_cast<size_t>(i * hidden)], hidden, &proj_[static_cast<size_t>(row * hidden)]);
  }
  if (n_out == 0) {
    logits.clear();
    return Status::ok();
  }
  return gather_logits(n_out, logits);
}

Status ForwardPass::run_hidden(std::span<const SequenceInput> batch, int64_t n_layers, std::vector<float>& hidden) {
  int64_t n = 0;
  TESSERA_RETURN_IF_ERROR(run_trunk(batch, n_layers, n));
  const int64_t dim = config_.hidden;
  hidden.resize(batch.size() * static_cast<size_t>(dim));
  int64_t t = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    t += static_cast<int64_t>(batch[i].tokens.size());
    std::copy_n(&h_[static_cast<size_t>((t - 1) * dim)], dim, &hidden[i * static_cast<size_t>(dim)]);
  }
  return Status::ok();
}

Status ForwardPass::head(const float* hidden, int64_t n, std::vector<float>& logits) {
  if (n == 0) {
    logits.clear();
    return Status::ok();
  }
  ensure_workspace(n);
  std::copy_n(hidden, n * config_.hidden, proj_.data());
  return gather_logits(n, logits);
}

int64_t relayout_for_cpu_kernels(ShardWeights& sw, ThreadPool* pool) {
  if (cpu::active_isa() < cpu::Isa::kAvx2 || env_int("TESSERA_CPU_REPACK", 1) == 0) return 0;
  ModelWeights& w = sw.weights;
  // The buffers this ShardWeights owns (re-laid in place); anything else (a mapped file) is copied.
  auto owned = [&](const TensorView& v) -> bool {
    const auto* p = static_cast<const uint8_t*>(v.data);
    auto inside = [&](const WeightBytes& b) { return p >= b.data() && p + v.nbytes() <= b.data() + b.size(); };
    for (const auto* list : {&sw.owned, &sw.full.owned_bytes, &w.owned_bytes})
      for (const WeightBytes& b : *list)
        if (inside(b)) return true;
    return false;
  };
  int64_t count = 0;
  const int threads = pool != nullptr ? pool->size() : 1;
  std::vector<std::vector<uint8_t>> scratch(static_cast<size_t>(threads));  // one group per thread
  // fn(first group, end group, thread) over the matrix's 16-row groups, on the pool if any.
  auto for_groups = [&](int64_t n_groups, const std::function<void(int64_t, int64_t, int)>& fn) {
    if (pool != nullptr && n_groups > 1)
      pool->parallel_for(n_groups, 1, fn);
    else
      fn(0, n_groups, 0);
  };
  auto relayout = [&](TensorView& v, bool shared) {
    const std::optional<QuantType> r16 = cpu::r16_of(v.type, v.rows());
    if (!r16 || v.data == nullptr) return;
    const size_t group_bytes = static_cast<size_t>(cpu::kQRowGroup) * v.row_stride_bytes();
    const int64_t n_groups = v.rows() / cpu::kQRowGroup;
    if (!shared && owned(v)) {
      auto* data = static_cast<uint8_t*>(const_cast<void*>(v.data));
      for_groups(n_groups, [&](int64_t g0, int64_t g1, int t) {
        std::vector<uint8_t>& group = scratch[static_cast<size_t>(t)];
        for (int64_t g = g0; g < g1; ++g) {
          uint8_t* at = data + static_cast<size_t>(g) * group_bytes;
          group.assign(at, at + group_bytes);
          cpu::repack_r16(v.type, group.data(), cpu::kQRowGroup, v.cols(), at);
        }
      });
    } else {
      WeightBytes& bytes = sw.owned.emplace_back(v.nbytes());
      const auto* src = static_cast<const uint8_t*>(v.data);
      // In slices of a few MB: a mapped matrix used by nothing else has its file pages dropped
      // slice by slice, so the load's peak holds the copy and one slice of the file, not both
      // whole (the 178 MB tied embedding of Gemma 3 270M: peak RSS 451 -> ~290 MB).
      constexpr int64_t kSliceGroups = 256;
      for (int64_t s0 = 0; s0 < n_groups; s0 += kSliceGroups) {
        const int64_t s1 = std::min(n_groups, s0 + kSliceGroups);
        for_groups(s1 - s0, [&](int64_t g0, int64_t g1, int) {
          const size_t at = static_cast<size_t>(s0 + g0) * group_bytes;
          cpu::repack_r16(v.type, src + at, (g1 - g0) * cpu::kQRowGroup, v.cols(), bytes.data() + at);
        });
        if (!shared)
          release_mapped_range(src + static_cast<size_t>(s0) * group_bytes, static_cast<size_t>(s1 - s0) * group_bytes);
      }
      // Mapped from the file and used by nothing else: its pages are not read again.
      if (!shared) release_mapped_range(v.data, v.nbytes());
      v.data = bytes.data();
    }
    v.type = *r16;
    ++count;
  };
  for (LayerWeights& l : w.layers)
    for (TensorView* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) relayout(*m, false);
  // A tied head shares the embedding's bytes (at TP > 1 it is the rank's slice of them). Where
  // the slice starts and ends on 16-row groups, the whole embedding is re-laid once and the
  // lookup reads its rows back out of the groups (ForwardPass::embed): one copy of the matrix,
  // not two. Otherwise the head gets a re-laid copy of its own.
  const auto* head = static_cast<const uint8_t*>(w.lm_head.data);
  const auto* embed = static_cast<const uint8_t*>(w.embed.data);
  const bool tied = head != nullptr && embed != nullptr && head >= embed && head < embed + w.embed.nbytes();
  const size_t stride = w.embed.row_stride_bytes();
  const int64_t first = tied ? static_cast<int64_t>(static_cast<size_t>(head - embed) / stride) : 0;
  if (tied && w.lm_head.type == w.embed.type && first % cpu::kQRowGroup == 0 &&
      w.lm_head.rows() % cpu::kQRowGroup == 0 && cpu::r16_of(w.embed.type, w.embed.rows())) {
    relayout(w.embed, false);
    w.lm_head.data = static_cast<const uint8_t*>(w.embed.data) + static_cast<size_t>(first) * stride;
    w.lm_head.type = w.embed.type;
  } else {
    relayout(w.lm_head, tied);
  }
  return count;
}

}  // namespace tessera
