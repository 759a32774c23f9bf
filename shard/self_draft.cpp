#include "shard/self_draft.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "comm/device_comm.h"
#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/gemm.h"
#include "kernels/quant.h"

namespace tessera {
namespace {

constexpr size_t kRowCacheBytes = size_t{32} << 20;  // fp32 head rows of context ids kept between steps

}  // namespace

Status validate_self_draft(const SelfDraftConfig& c, const ModelConfig& m) {
  if (c.layers < 1 || c.layers > m.n_layers)
    return Status::invalid_argument(
        fmt::format("spec_draft_layers = {}: the self-draft runs 1..{} of the model's layers", c.layers, m.n_layers));
  if (c.vocab < 0)
    return Status::invalid_argument(fmt::format(
        "spec_draft_vocab = {}: the self-draft's head takes 0 or more fixed ids (at most the vocabulary's {})",
        c.vocab, m.vocab));
  return Status::ok();
}

SelfDrafter::SelfDrafter(const SelfDraftConfig& config, const ModelConfig& model, const ShardLayout& layout,
                         const ModelWeights& weights, ForwardPass& forward, ThreadPool* pool, DeviceComm* comm)
    : config_(config), model_(model), layout_(layout), weights_(weights), forward_(forward), pool_(pool), comm_(comm) {
  const int64_t local = layout_.vocab_end - layout_.vocab_begin;
  row_slot_.assign(static_cast<size_t>(std::max<int64_t>(0, local)), -1);
  seen_.assign(row_slot_.size(), 0);
  row_bytes_.resize(row_bytes(cpu::r16_base(weights_.lm_head.type), model_.hidden));
  build_head();
}

// The fixed rows: the fixed ids of this rank's slice, copied out of the LM head (back in their
// file layout where the head is re-laid) and re-laid in 16-row groups where the kernels take them.
void SelfDrafter::build_head() {
  const TensorView& w = weights_.lm_head;
  const int64_t hidden = model_.hidden;
  const int64_t begin = layout_.vocab_begin, end = layout_.vocab_end;
  in_head_.assign(row_slot_.size(), 0);
  auto take = [&](int64_t id) {
    if (id >= begin && id < end) in_head_[static_cast<size_t>(id - begin)] = 1;
  };
  if (!config_.ids.empty()) {
    for (const int32_t id : config_.ids) take(id);
  } else {
    for (int64_t id = begin; id < std::min<int64_t>(end, config_.vocab); ++id) take(id);
  }
  head_ids_.clear();
  for (size_t i = 0; i < in_head_.size(); ++i)
    if (in_head_[i]) head_ids_.push_back(static_cast<int32_t>(begin + static_cast<int64_t>(i)));
  const auto rows = static_cast<int64_t>(head_ids_.size());
  if (rows == 0) return;
  const QuantType base = cpu::r16_base(w.type);
  const size_t stride = row_bytes(base, hidden);
  head_bytes_.resize(static_cast<size_t>(rows) * stride);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* dst = head_bytes_.data() + static_cast<size_t>(r) * stride;
    const int64_t local = head_ids_[static_cast<size_t>(r)] - begin;
    if (cpu::is_r16(w.type))
      cpu::unpack_r16_row(w.type, static_cast<const uint8_t*>(w.data), local, hidden, dst);
    else
      std::memcpy(dst, w.row_ptr(local), stride);
  }
  QuantType type = base;
  if (cpu::is_r16(w.type)) {
    if (const std::optional<QuantType> r16 = cpu::r16_of(base, rows)) {
      std::vector<uint8_t> packed(head_bytes_.size());
      cpu::repack_r16(base, head_bytes_.data(), rows, hidden, packed.data());
      head_bytes_ = std::move(packed);
      type = *r16;
    }
  }
  head_ = make_view(head_bytes_.data(), type, {rows, hidden});
}

const float* SelfDrafter::context_row(int32_t id) {
  const auto local = static_cast<size_t>(id - layout_.vocab_begin);
  const int64_t hidden = model_.hidden;
  if (row_slot_[local] >= 0) return &row_cache_[static_cast<size_t>(row_slot_[local] * hidden)];
  const auto cap = static_cast<int64_t>(kRowCacheBytes / (sizeof(float) * static_cast<size_t>(hidden)));
  if (cached_rows_ >= cap) {  // full: start over (the rows are recomputed on demand)
    std::fill(row_slot_.begin(), row_slot_.end(), -1);
    cached_rows_ = 0;
  }
  row_cache_.resize(static_cast<size_t>((cached_rows_ + 1) * hidden));
  float* out = &row_cache_[static_cast<size_t>(cached_rows_ * hidden)];
  const TensorView& w = weights_.lm_head;
  const QuantType base = cpu::r16_base(w.type);
  if (cpu::is_r16(w.type)) {
    cpu::unpack_r16_row(w.type, static_cast<const uint8_t*>(w.data), static_cast<int64_t>(local), hidden,
                        row_bytes_.data());
    dequantize_row(base, row_bytes_.data(), out, hidden);
  } else {
    dequantize_row(base, w.row_ptr(static_cast<int64_t>(local)), out, hidden);
  }
  row_slot_[local] = static_cast<int32_t>(cached_rows_++);
  return out;
}

// The best of this rank's candidates for one hidden state: the fixed rows' scores (row `row` of
// scores_), then every id of this rank's slice in the context or the drafts so far that is not
// a fixed row. Ties go to the lowest id.
SelfDrafter::Best SelfDrafter::best_of(const float* h, int64_t row, std::span<const int32_t> context,
                                       std::span<const int32_t> drafts) {
  Best best{-std::numeric_limits<float>::infinity(), std::numeric_limits<int32_t>::max()};
  auto offer = [&](float v, int32_t id) {
    if (v > best.value || (v == best.value && id < best.id)) best = {v, id};
  };
  const int64_t rows = head_rows();
  const float* s = scores_.data() + static_cast<size_t>(row * rows);
  for (int64_t r = 0; r < rows; ++r) offer(s[r], head_ids_[static_cast<size_t>(r)]);
  const int64_t lo = layout_.vocab_begin, hi = layout_.vocab_end;
  const int64_t hidden = model_.hidden;
  std::vector<int32_t>& marked = marked_;
  marked.clear();
  for (std::span<const int32_t> list : {context, drafts}) {
    for (const int32_t id : list) {
      if (id < lo || id >= hi || in_head_[static_cast<size_t>(id - lo)]) continue;
      uint8_t& seen = seen_[static_cast<size_t>(id - lo)];
      if (seen) continue;
      seen = 1;
      marked.push_back(id);
      const float* w = context_row(id);
      float dot = 0;
      for (int64_t i = 0; i < hidden; ++i) dot += w[i] * h[i];
      offer(dot, id);
    }
  }
  for (const int32_t id : marked) seen_[static_cast<size_t>(id - layout_.vocab_begin)] = 0;
  return best;
}

Status SelfDrafter::propose(std::span<const DraftRequest> requests, std::vector<std::vector<int32_t>>& out) {
  out.assign(requests.size(), {});
  int64_t rounds = 0;
  for (const DraftRequest& r : requests) {
    if (r.k < 1 || r.tokens.empty())
      return Status::invalid_argument(fmt::format("sequence {}: a draft request for {} tokens after {} tokens",
                                                  r.seq_id, r.k, r.tokens.size()));
    rounds = std::max(rounds, r.k);
  }
  const int64_t hidden = model_.hidden;
  // Through every layer, one more round: the trunk of each request's last draft (the target's
  // state there, for target_logits).
  const bool target = computes_target();
  if (target) {
    target_offset_.resize(requests.size());
    size_t rows = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      target_offset_[i] = rows;
      rows += static_cast<size_t>(requests[i].k + 1);
    }
    target_hidden_.resize(rows * static_cast<size_t>(hidden));
  }
  for (int64_t round = 0; round < rounds + (target ? 1 : 0); ++round) {
    // Round r: every sequence that wants more than r drafts feeds its newest token (the last
    // known one, then its own drafts) at its position through the first layers.
    batch_.clear();
    round_seq_.clear();
    round_tokens_.resize(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const DraftRequest& r = requests[i];
      if (r.k < round || (r.k == round && !target)) continue;
      round_tokens_[i] = round == 0 ? r.tokens.back() : out[i].back();
      SequenceInput in;
      in.tokens = std::span<const int32_t>(&round_tokens_[i], 1);
      in.start_pos = static_cast<int64_t>(r.tokens.size()) - 1 + round;
      in.block_table = r.block_table;
      in.window_block_table = r.window_block_table;
      in.want_logits = true;
      batch_.push_back(in);
      round_seq_.push_back(i);
    }
    TESSERA_RETURN_IF_ERROR(forward_.run_hidden(batch_, config_.layers, hidden_));
    if (target) {
      for (size_t j = 0; j < round_seq_.size(); ++j)
        std::copy_n(&hidden_[j * static_cast<size_t>(hidden)], hidden,
                    &target_hidden_[(target_offset_[round_seq_[j]] + static_cast<size_t>(round)) *
                                    static_cast<size_t>(hidden)]);
      // The last round only completes the target's states: its drafts are not wanted.
      size_t w = 0;
      for (size_t j = 0; j < round_seq_.size(); ++j) {
        if (requests[round_seq_[j]].k == round) continue;
        if (w != j)
          std::copy_n(&hidden_[j * static_cast<size_t>(hidden)], hidden, &hidden_[w * static_cast<size_t>(hidden)]);
        round_seq_[w++] = round_seq_[j];
      }
      round_seq_.resize(w);
      // Every rank runs the same rounds, so every rank skips the same (empty) gathers.
      if (w == 0) continue;
    }
    const auto n = static_cast<int64_t>(round_seq_.size());
    scores_.resize(static_cast<size_t>(n * head_rows()));
    if (head_rows() > 0) matmul(head_, hidden_.data(), n, scores_.data(), pool_);
    local_.resize(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      const DraftRequest& r = requests[round_seq_[static_cast<size_t>(j)]];
      local_[static_cast<size_t>(j)] = best_of(&hidden_[static_cast<size_t>(j * hidden)], j, r.tokens,
                                               out[round_seq_[static_cast<size_t>(j)]]);
    }
    const std::vector<Best>* all = &local_;
    if (layout_.tp_size > 1) {
      // Every rank's best of its slice, gathered [rank][row]; every rank picks the same winner.
      gathered_.resize(local_.size() * static_cast<size_t>(layout_.tp_size));
      TESSERA_RETURN_IF_ERROR(
          comm_->all_gather(local_.data(), gathered_.data(), n * static_cast<int64_t>(sizeof(Best))));
      for (int64_t j = 0; j < n; ++j) {
        Best& b = local_[static_cast<size_t>(j)];
        for (int rk = 0; rk < layout_.tp_size; ++rk) {
          const Best& o = gathered_[static_cast<size_t>(rk * n + j)];
          if (o.value > b.value || (o.value == b.value && o.id < b.id)) b = o;
        }
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      Best b = (*all)[static_cast<size_t>(j)];
      // No candidate anywhere (a NaN state): propose the last token again (verification decides).
      if (b.id < 0 || b.id >= model_.vocab) b.id = round_tokens_[round_seq_[static_cast<size_t>(j)]];
      out[round_seq_[static_cast<size_t>(j)]].push_back(b.id);
    }
  }
  return Status::ok();
}

Status SelfDrafter::target_logits(std::vector<float>& logits) {
  if (!computes_target()) return ShardDrafter::target_logits(logits);
  return forward_.head(target_hidden_.data(),
                       static_cast<int64_t>(target_hidden_.size() / static_cast<size_t>(model_.hidden)), logits);
}

Status ShardDrafter::target_logits(std::vector<float>&) {
  return Status::unimplemented(fmt::format("the {} drafter does not compute the target's logits", name()));
}

}  // namespace tessera
