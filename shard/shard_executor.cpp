#include "shard/shard_executor.h"

#include <chrono>
#include <limits>

#include <fmt/format.h>

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t micros_since(Clock::time_point t0) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
}

// The rows a piece's token mask covers: 1, or k + 1 with k proposed drafts that are verified
// (forced drafts are not sampled).
int64_t mask_rows(const ScheduledSequence& s) {
  return s.forced_drafts ? 1 : static_cast<int64_t>(s.draft_tokens.size()) + 1;
}

}  // namespace

ShardExecutor::ShardExecutor(ShardBackend& backend, const ModelConfig& config, const ShardExecutorOptions& options)
    : backend_(backend), config_(config), options_(options) {}

Status ShardExecutor::configure(int64_t block_size, int64_t num_blocks, KvDtype kv_dtype, int64_t num_window_blocks,
                                const SelfDraftConfig& draft) {
  if (num_blocks_ > 0) return Status::invalid_argument("configured twice");
  if (kv_dtype != backend_.kv_dtype())
    return Status::invalid_argument(fmt::format("the coordinator planned a {} KV cache, this shard stores {}",
                                                kv_dtype_name(kv_dtype), kv_dtype_name(backend_.kv_dtype())));
  if (num_window_blocks < 0 || num_window_blocks > std::numeric_limits<int32_t>::max())
    return Status::invalid_argument(fmt::format("a window pool of {} blocks", num_window_blocks));
  if (num_window_blocks > 0 && backend_.kv_window() == 0)
    return Status::invalid_argument(fmt::format(
        "the coordinator planned a window pool of {} blocks, but this model has no sliding-window layers for it",
        num_window_blocks));
  TESSERA_RETURN_IF_ERROR(backend_.configure_kv(block_size, num_blocks, num_window_blocks));
  if (draft.layers > 0) TESSERA_RETURN_IF_ERROR(backend_.configure_draft(draft));
  block_size_ = block_size;
  num_blocks_ = num_blocks;
  num_window_blocks_ = num_window_blocks;
  kv_window_ = num_window_blocks > 0 ? backend_.kv_window() : 0;
  return Status::ok();
}

void ShardExecutor::drop(uint64_t id) {
  sequences_.erase(id);
  if (ShardDrafter* d = backend_.drafter()) d->forget(id);
}

Status ShardExecutor::prepare(const StepPlan& plan) {
  if (num_blocks_ == 0) return Status::invalid_argument("step before configure");
  if (plan.step_id != last_step_ + 1)
    return Status::invalid_argument(fmt::format("step {} arrived after step {}", plan.step_id, last_step_.load()));
  for (uint64_t id : plan.finished) drop(id);
  for (const NewSequence& n : plan.new_sequences) {
    TESSERA_RETURN_IF_ERROR(validate_sampling_params(n.sampling).with_context(fmt::format("sequence {}", n.seq_id)));
    if (sequences_.count(n.seq_id)) return Status::invalid_argument(fmt::format("sequence {} already exists", n.seq_id));
    const int64_t vocab = config_.vocab;
    for (int32_t id : n.prompt_ids)
      if (id < 0 || id >= vocab)
        return Status::out_of_range(
            fmt::format("sequence {}: token id {} is outside the vocabulary (0..{})", n.seq_id, id, vocab - 1));
    SequenceState st;
    st.tokens = n.prompt_ids;
    st.n_prompt = n.prompt_ids.size();
    st.sampler = std::make_unique<Sampler>(n.sampling);
    st.sampler->add_prompt_tokens(n.prompt_ids);
    sequences_.emplace(n.seq_id, std::move(st));
  }
  for (const BlockCopy& bc : plan.block_copies) {
    if (bc.src < 0 || bc.dst < 0 || bc.src >= num_blocks_ || bc.dst >= num_blocks_)
      return Status::out_of_range(fmt::format("block copy {} -> {} outside the cache", bc.src, bc.dst));
  }
  if (!plan.window_block_copies.empty() && num_window_blocks_ == 0)
    return Status::invalid_argument(fmt::format("window_block_copies: {} copies but no window pool is configured",
                                                plan.window_block_copies.size()));
  for (const BlockCopy& bc : plan.window_block_copies) {
    if (bc.src < 0 || bc.dst < 0 || bc.src >= num_window_blocks_ || bc.dst >= num_window_blocks_)
      return Status::out_of_range(fmt::format("window_block_copies: copy {} -> {} outside the window pool (0..{})",
                                              bc.src, bc.dst, num_window_blocks_ - 1));
  }
  for (const ScheduledSequence& s : plan.scheduled) {
    auto it = sequences_.find(s.seq_id);
    if (it == sequences_.end()) return Status::not_found(fmt::format("unknown sequence {}", s.seq_id));
    const auto n_tokens = static_cast<int64_t>(it->second.tokens.size());
    if (!s.draft_tokens.empty()) {
      TESSERA_RETURN_IF_ERROR(validate_draft(s, n_tokens));
    } else if (s.num_tokens <= 0 || s.start_pos < 0 || s.start_pos + s.num_tokens > n_tokens) {
      return Status::invalid_argument(fmt::format("sequence {}: positions [{}, {}) but it has {} tokens", s.seq_id,
                                                  s.start_pos, s.start_pos + s.num_tokens, n_tokens));
    }
    TESSERA_RETURN_IF_ERROR(validate_window_blocks(s, it->second));
    if (s.forced_drafts && (s.draft_tokens.empty() || s.draft_tokens.front() == kShardDraftToken))
      return Status::invalid_argument(
          fmt::format("sequence {}: forced_drafts without proposed draft tokens ({} drafts{})", s.seq_id,
                      s.draft_tokens.size(), s.draft_tokens.empty() ? "" : ", the shard's own"));
    if (s.mask_follows && (!s.sample || !s.token_mask.empty()))
      return Status::invalid_argument(fmt::format(
          "sequence {}: mask_follows on a piece that {}", s.seq_id,
          s.sample ? "carries its token mask already" : "does not sample"));
    if (!s.token_mask.empty()) {
      // One mask per sampled row: the one row, or a speculative piece's k + 1 (proposed drafts
      // only); forced drafts are not sampled: the one row after them.
      const int64_t words = (config_.vocab + 31) / 32;
      const int64_t rows = mask_rows(s);
      if (!s.sample || (!s.draft_tokens.empty() && s.draft_tokens.front() == kShardDraftToken))
        return Status::invalid_argument(
            fmt::format("sequence {}: token masks are for sampled rows (and proposed drafts, not shard drafts)", s.seq_id));
      if (static_cast<int64_t>(s.token_mask.size()) != words * rows)
        return Status::invalid_argument(
            fmt::format("sequence {}: token masks of {} words, its {} sampled row(s) over the vocabulary ({}) need {}",
                        s.seq_id, s.token_mask.size(), rows, config_.vocab, words * rows));
    }
  }
  return Status::ok();
}

// A speculative piece: the last known token and its drafts, sampled, no prompt logprobs, drafts
// inside the vocabulary.
Status ShardExecutor::validate_draft(const ScheduledSequence& s, int64_t n_tokens) const {
  const auto k = static_cast<int64_t>(s.draft_tokens.size());
  if (!s.sample || s.prompt_logprobs)
    return Status::invalid_argument(
        fmt::format("sequence {}: {} draft tokens on a piece that does not sample (or wants prompt logprobs)", s.seq_id, k));
  if (s.start_pos + 1 != n_tokens || s.num_tokens != k + 1)
    return Status::invalid_argument(fmt::format(
        "sequence {}: {} draft tokens need the piece [{}, {}) (its last known token and the drafts), not [{}, {})",
        s.seq_id, k, n_tokens - 1, n_tokens + k, s.start_pos, s.start_pos + s.num_tokens));
  const bool shard = s.draft_tokens.front() == kShardDraftToken;
  if (shard && backend_.drafter() == nullptr)
    return Status::invalid_argument(fmt::format(
        "sequence {}: {} shard drafts asked for, but this shard has no drafter (configured without draft layers)",
        s.seq_id, k));
  for (int32_t id : s.draft_tokens) {
    if (shard && id != kShardDraftToken)
      return Status::invalid_argument(fmt::format(
          "sequence {}: draft tokens mix shard drafts ({}) and proposed ids ({})", s.seq_id, kShardDraftToken, id));
    if (!shard && (id < 0 || id >= config_.vocab))
      return Status::out_of_range(fmt::format("sequence {}: draft token id {} is outside the vocabulary (0..{})",
                                              s.seq_id, id, config_.vocab - 1));
  }
  return Status::ok();
}

// The window-table part of a scheduled piece, checked before any table changes: as many
// entries as append_blocks with a window pool (none without), ids of the pool or -1, and no -1
// in a slot the piece's queries read (first_read_slot .. its last position), counting the
// entries already in the table (none after reset_blocks).
Status ShardExecutor::validate_window_blocks(const ScheduledSequence& s, const SequenceState& st) const {
  const std::vector<int32_t>& append = s.append_window_blocks;
  if (num_window_blocks_ == 0) {
    if (!append.empty())
      return Status::invalid_argument(fmt::format(
          "sequence {}: append_window_blocks has {} entries but no window pool is configured", s.seq_id, append.size()));
    return Status::ok();
  }
  if (append.size() != s.append_blocks.size())
    return Status::invalid_argument(
        fmt::format("sequence {}: append_window_blocks has {} entries, append_blocks {} (they must match)", s.seq_id,
                    append.size(), s.append_blocks.size()));
  for (int32_t b : append)
    if (b < -1 || b >= num_window_blocks_)
      return Status::out_of_range(
          fmt::format("sequence {}: append_window_blocks entry {} is outside the window pool (0..{}, or -1: released)",
                      s.seq_id, b, num_window_blocks_ - 1));
  const size_t kept = s.reset_blocks ? 0 : st.window_block_table.size();
  const auto slot_entry = [&](int64_t slot) {
    const auto i = static_cast<size_t>(slot);
    return i < kept ? st.window_block_table[i] : append[i - kept];
  };
  const int64_t end = s.start_pos + s.num_tokens;
  const int64_t first = first_read_slot(s.start_pos, kv_window_, block_size_);
  const auto slots = static_cast<int64_t>(kept + append.size());
  for (int64_t slot = first; slot <= (end - 1) / block_size_ && slot < slots; ++slot)
    if (slot_entry(slot) < 0)
      return Status::invalid_argument(fmt::format(
          "sequence {}: window table slot {} is released (-1), but positions [{}, {}) read it (window {}, blocks "
          "of {}: slots from {} on must be live)",
          s.seq_id, slot, s.start_pos, end, kv_window_, block_size_, first));
  return Status::ok();
}

// The masks that follow the plan (StepMasks): one per mask_follows piece, in order, each empty or
// as long as the piece's rows need. Masks of an earlier step (left when that step failed before
// its sampling) are the source's to skip.
Status ShardExecutor::receive_late_masks(const StepPlan& plan, const MaskSource& source) {
  late_masks_.clear();
  size_t wanted = 0;
  for (const ScheduledSequence& q : plan.scheduled) wanted += q.mask_follows ? 1 : 0;
  if (wanted == 0) return Status::ok();
  if (!source)
    return Status::invalid_argument(
        fmt::format("{} pieces wait for token masks (mask_follows) but this shard has no way to receive them", wanted));
  TESSERA_ASSIGN_OR_RETURN(StepMasks m, source());
  if (m.step_id != plan.step_id)
    return Status::invalid_argument(fmt::format("token masks for step {} arrived during step {}", m.step_id, plan.step_id));
  if (m.masks.size() != wanted)
    return Status::invalid_argument(
        fmt::format("{} token masks arrived for the {} pieces marked mask_follows", m.masks.size(), wanted));
  const int64_t words = (config_.vocab + 31) / 32;
  size_t next = 0;
  for (const ScheduledSequence& q : plan.scheduled) {
    if (!q.mask_follows) continue;
    SequenceMask& sm = m.masks[next++];
    if (sm.seq_id != q.seq_id)
      return Status::invalid_argument(
          fmt::format("token mask {} is for sequence {}, the plan's piece is sequence {}", next - 1, sm.seq_id, q.seq_id));
    if (!sm.token_mask.empty() && static_cast<int64_t>(sm.token_mask.size()) != words * mask_rows(q))
      return Status::invalid_argument(fmt::format(
          "sequence {}: a token mask of {} words, its {} sampled row(s) over the vocabulary ({}) need {}", q.seq_id,
          sm.token_mask.size(), mask_rows(q), config_.vocab, words * mask_rows(q)));
    late_masks_[q.seq_id] = std::move(sm.token_mask);
  }
  return Status::ok();
}

std::span<const uint32_t> ShardExecutor::mask_of(const ScheduledSequence& q) const {
  if (!q.mask_follows) return q.token_mask;
  auto it = late_masks_.find(q.seq_id);
  return it == late_masks_.end() ? std::span<const uint32_t>() : std::span<const uint32_t>(it->second);
}

StepResult ShardExecutor::execute(const StepPlan& plan, const MaskSource& late_masks) {
  const auto t0 = Clock::now();
  StepResult r;
  r.step_id = plan.step_id;
  r.rank = options_.rank;
  Status s = prepare(plan);
  if (s.is_ok()) {
    for (const BlockCopy& bc : plan.block_copies) {
      if (s.is_ok()) s = backend_.copy_block(bc.src, bc.dst, KvPool::kMain);
    }
    for (const BlockCopy& bc : plan.window_block_copies) {
      if (s.is_ok()) s = backend_.copy_block(bc.src, bc.dst, KvPool::kWindow);
    }
    drafts_.resize(plan.scheduled.size());
    for (size_t i = 0; i < plan.scheduled.size(); ++i) {
      const ScheduledSequence& q = plan.scheduled[i];
      SequenceState& st = sequences_.at(q.seq_id);
      if (q.reset_blocks) {
        st.block_table.clear();
        st.window_block_table.clear();
      }
      st.block_table.insert(st.block_table.end(), q.append_blocks.begin(), q.append_blocks.end());
      st.window_block_table.insert(st.window_block_table.end(), q.append_window_blocks.begin(),
                                   q.append_window_blocks.end());
      drafts_[i] = q.draft_tokens;
    }
    const auto d0 = Clock::now();
    if (s.is_ok()) s = shard_drafts(plan);
    if (!draft_requests_.empty()) r.draft_micros = micros_since(d0);
    batch_.clear();
    for (size_t i = 0; i < plan.scheduled.size() && s.is_ok(); ++i) {
      const ScheduledSequence& q = plan.scheduled[i];
      SequenceState& st = sequences_.at(q.seq_id);
      // The drafts join the token list for this step's input; sample() takes them out again.
      st.tokens.insert(st.tokens.end(), drafts_[i].begin(), drafts_[i].end());
      if (target_row_[i] >= 0) continue;  // the drafter computed its rows
      SequenceInput in;
      in.tokens = std::span<const int32_t>(st.tokens.data() + q.start_pos, static_cast<size_t>(q.num_tokens));
      in.start_pos = q.start_pos;
      in.block_table = st.block_table;
      in.window_block_table = st.window_block_table;  // empty without a window pool
      in.want_logits = q.sample;
      in.all_logits = q.prompt_logprobs || (!q.draft_tokens.empty() && !q.forced_drafts);
      batch_.push_back(in);
    }
    // Steps whose every sampled row is plain greedy take the argmax on the device when the
    // backend can; other steps sample on the device when they can: either way no logits cross
    // to the host. Otherwise the host samples the logits.
    const bool greedy = backend_.greedy_on_device() && plain_greedy(plan);
    const bool on_device =
        !greedy && options_.device_sampling && backend_.samples_on_device() && device_sampling_rows(plan);
    const uint64_t comm_before = backend_.comm_micros();
    const ShardBackend::SparseStats sparse_before = backend_.sparse_stats();
    if (s.is_ok() && batch_.empty() && !target_logits_.empty()) {
      logits_.clear();  // every row came from the drafter
    } else if (s.is_ok() && !batch_.empty()) {
      if (greedy)
        s = backend_.run_greedy(batch_, greedy_ids_);
      else if (on_device)
        s = backend_.run_sampled(batch_, sampled_);
      else
        s = backend_.run(batch_, logits_);
    }
    r.comm_micros = backend_.comm_micros() - comm_before;
    const ShardBackend::SparseStats sparse_after = backend_.sparse_stats();
    r.sparse_threshold_tokens = sparse_after.threshold_tokens;
    r.sparse_decodes = sparse_after.sparse - sparse_before.sparse;
    r.dense_global_decodes = sparse_after.dense - sparse_before.dense;
    if (s.is_ok()) s = receive_late_masks(plan, late_masks);
    if (!s.is_ok()) drop_drafts(plan);
    if (s.is_ok()) {
      if (greedy)
        take_greedy(plan, r);
      else if (on_device)
        take_sampled(plan, r);
      else
        sample(plan, r);
    }
  }
  if (!s.is_ok()) r.error = fmt::format("rank {}: step {}: {}", options_.rank, plan.step_id, s.to_string());
  last_step_ = plan.step_id;
  r.compute_micros = micros_since(t0);
  return r;
}

// True when every sequence that samples this step wants the plain argmax: temperature 0, no
// logprobs, no penalties or logit bias, no banned tokens, no prompt logprobs (what Sampler would
// do with the logits is then exactly the device's greedy choice).
// A speculative piece with proposed drafts qualifies too: its k + 1 rows' argmaxes verify it
// (take_greedy); one with shard drafts does not (the drafter computed its rows on the host).
bool ShardExecutor::plain_greedy(const StepPlan& plan) const {
  for (const ScheduledSequence& q : plan.scheduled) {
    if (q.prompt_logprobs || !q.banned_tokens.empty() || !q.token_mask.empty() || q.forced_drafts || q.mask_follows)
      return false;
    if (!q.draft_tokens.empty() && q.draft_tokens.front() == kShardDraftToken) return false;
    if (!q.sample) continue;
    auto it = sequences_.find(q.seq_id);
    if (it == sequences_.end()) return false;
    const SamplingParams& p = it->second.sampler->params();
    if (p.temperature != 0.0f || p.n_logprobs != 0 || p.return_logprob || p.repetition_penalty != 1.0f ||
        p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f || !p.logit_bias.empty())
      return false;
  }
  return true;
}

// Asks the backend to sample every row of the step (batch order) on the device; false when a
// row needs the logits on the host (prompt logprobs) or the backend cannot take the rows.
bool ShardExecutor::device_sampling_rows(const StepPlan& plan) {
  sample_requests_.clear();
  for (const ScheduledSequence& q : plan.scheduled) {
    // A token mask is applied on the host for now (the device sampler takes banned ids only).
    if (q.prompt_logprobs || !q.draft_tokens.empty() || !q.token_mask.empty() || q.mask_follows) return false;
    if (!q.sample) continue;
    auto it = sequences_.find(q.seq_id);
    if (it == sequences_.end()) return false;
    sample_requests_.push_back(DeviceSampleRequest{it->second.sampler.get(), q.banned_tokens});
  }
  return backend_.prepare_device_sampling(sample_requests_);
}

// The tokens of a device-sampled step, one per sampling sequence in batch order: what sample()
// does with the host's Sampler, the draw made on the device.
void ShardExecutor::take_sampled(const StepPlan& plan, StepResult& r) {
  size_t row = 0;
  for (const ScheduledSequence& q : plan.scheduled) {
    if (!q.sample) continue;
    SequenceState& st = sequences_.at(q.seq_id);
    SampledToken& tok = sampled_[row++];
    st.sampler->accept(tok.id);
    if (q.start_pos + q.num_tokens == static_cast<int64_t>(st.tokens.size())) st.tokens.push_back(tok.id);
    if (options_.rank == 0) r.tokens.push_back({q.seq_id, tok.id, tok.logprob, std::move(tok.top_logprobs)});
  }
}

// The tokens of a plain_greedy step: one id per sampling sequence, in batch order, and k + 1
// for a speculative piece (the argmax of each of its rows, verified against its drafts).
void ShardExecutor::take_greedy(const StepPlan& plan, StepResult& r) {
  size_t row = 0;
  for (size_t i = 0; i < plan.scheduled.size(); ++i) {
    const ScheduledSequence& q = plan.scheduled[i];
    if (!q.sample) continue;
    SequenceState& st = sequences_.at(q.seq_id);
    if (!q.draft_tokens.empty()) {
      const int32_t* ids = &greedy_ids_[row];
      row += static_cast<size_t>(q.num_tokens);
      verify(q, drafts_[i], st, r, [&](int64_t j) {
        st.sampler->accept(ids[j]);
        return SampledToken{ids[j], 0.0f, {}};
      });
      continue;
    }
    const int32_t id = greedy_ids_[row++];
    st.sampler->accept(id);  // as sample() does: the sampler's history stays complete
    if (q.start_pos + q.num_tokens == static_cast<int64_t>(st.tokens.size())) st.tokens.push_back(id);
    if (options_.rank == 0) r.tokens.push_back({q.seq_id, id, 0.0f, {}});
  }
}

// Every rank samples from the same gathered logits with the same seeded state, so every rank
// appends the same token; rank 0 reports it.
void ShardExecutor::sample(const StepPlan& plan, StepResult& r) {
  const int64_t vocab = config_.vocab;
  int64_t row = 0;
  for (const ScheduledSequence& q : plan.scheduled) {
    SequenceState& st = sequences_.at(q.seq_id);
    if (q.prompt_logprobs) {
      // Row i predicts the token at start_pos + i + 1; report those inside the prompt.
      const auto n_prompt = static_cast<int64_t>(st.n_prompt);
      for (int64_t i = 0; i < q.num_tokens; ++i) {
        const int64_t pos = q.start_pos + i + 1;
        if (options_.rank == 0 && pos < n_prompt) {
          const int32_t token = st.tokens[static_cast<size_t>(pos)];
          SampledToken lp = token_logprobs(&logits_[static_cast<size_t>((row + i) * vocab)], vocab, token,
                                           st.sampler->params().n_logprobs);
          r.prompt_logprobs.push_back({q.seq_id, pos, token, lp.logprob, std::move(lp.top_logprobs)});
        }
      }
      row += q.num_tokens - 1;  // the last row is the sampling row below
      if (!q.sample) {
        ++row;
        continue;
      }
    } else if (!q.sample) {
      continue;
    }
    if (q.forced_drafts) {
      take_forced(q, st, &logits_[static_cast<size_t>(row * vocab)], r);
      ++row;
      continue;
    }
    if (!q.draft_tokens.empty()) {
      const auto i = static_cast<size_t>(&q - plan.scheduled.data());
      float* rows = target_row_[i] >= 0 ? &target_logits_[static_cast<size_t>(target_row_[i] * vocab)]
                                        : &logits_[static_cast<size_t>(row * vocab)];
      if (target_row_[i] < 0) row += q.num_tokens;  // the drafter's rows are not in logits_
      verify(q, drafts_[i], st, r, [&](int64_t j) { return sample_row(q, st, rows + j * vocab, j); });
      continue;
    }
    SampledToken tok = sample_row(q, st, &logits_[static_cast<size_t>(row * vocab)], 0);
    ++row;
    // Recompute after preemption re-samples only when the plan covers every known token.
    if (q.start_pos + q.num_tokens == static_cast<int64_t>(st.tokens.size())) st.tokens.push_back(tok.id);
    if (options_.rank == 0) r.tokens.push_back({q.seq_id, tok.id, tok.logprob, std::move(tok.top_logprobs)});
  }
}

// Speculation: rows row .. row + k of the logits are the last known token's and the k drafts'.
// Each row is sampled exactly as a plain decode step at that output position would sample it
// (same sampler state, same seeded uniform), and draft i is kept while the draw equals it, so
// the tokens are the ones decoding without drafts would produce: the output distribution is
// unchanged at any temperature (the drafts are deterministic proposals). Then the tables keep
// only the blocks of the computed positions: the rejected drafts' slots go back to the pool.
// `draw(i)` is row i's token: the host sampler on its logits, or the device's greedy id.
void ShardExecutor::verify(const ScheduledSequence& q, std::span<const int32_t> drafts, SequenceState& st,
                           StepResult& r, const std::function<SampledToken(int64_t)>& draw) {
  const auto k = static_cast<int64_t>(drafts.size());
  st.tokens.resize(static_cast<size_t>(q.start_pos + 1));
  int64_t drawn = 0;
  for (int64_t i = 0; i <= k; ++i) {
    SampledToken tok = draw(i);
    st.tokens.push_back(tok.id);
    ++drawn;
    const bool accepted = i < k && tok.id == drafts[static_cast<size_t>(i)];
    if (options_.rank == 0) r.tokens.push_back({q.seq_id, tok.id, tok.logprob, std::move(tok.top_logprobs)});
    if (!accepted) break;
  }
  const auto keep = static_cast<size_t>((q.start_pos + drawn + block_size_ - 1) / block_size_);
  if (st.block_table.size() > keep) st.block_table.resize(keep);
  if (st.window_block_table.size() > keep) st.window_block_table.resize(keep);
}

// Forced drafts (jump-forward): st.tokens already ends with them (execute appended them as a
// speculative piece's drafts), so only the sampler counts them; they are reported with logprob 0
// (the grammar left no other choice), then the row after them is sampled as a plain decode's.
void ShardExecutor::take_forced(const ScheduledSequence& q, SequenceState& st, float* logits, StepResult& r) {
  const int32_t n_logprobs = st.sampler->params().n_logprobs;
  for (const int32_t id : q.draft_tokens) {
    st.sampler->accept(id);
    if (options_.rank != 0) continue;
    std::vector<std::pair<int32_t, float>> top;
    if (n_logprobs > 0) top.push_back({id, 0.0f});
    r.tokens.push_back({q.seq_id, id, 0.0f, std::move(top)});
  }
  SampledToken tok = sample_row(q, st, logits, 0);
  st.tokens.push_back(tok.id);
  if (options_.rank == 0) r.tokens.push_back({q.seq_id, tok.id, tok.logprob, std::move(tok.top_logprobs)});
}

// One row's token drawn on the host: the row observer sees the logits, banned ids and the ids a
// token mask leaves out go to -inf, then the sequence's sampler draws (and counts) the token.
SampledToken ShardExecutor::sample_row(const ScheduledSequence& q, SequenceState& st, float* logits, int64_t row) {
  const int64_t vocab = config_.vocab;
  if (observer_) observer_(q.seq_id, std::span<const float>(logits, static_cast<size_t>(vocab)));
  for (const int32_t id : q.banned_tokens) {
    if (id >= 0 && id < vocab) logits[id] = -std::numeric_limits<float>::infinity();
  }
  const std::span<const uint32_t> mask = mask_of(q);
  if (!mask.empty()) {
    const auto words = static_cast<size_t>((vocab + 31) / 32);
    apply_token_mask(mask.subspan(static_cast<size_t>(row) * words, words), std::span<float>(logits, static_cast<size_t>(vocab)));
  }
  return st.sampler->sample(logits, vocab, backend_.host_pool());
}

// The shard drafts of the step's pieces (kShardDraftToken throughout), proposed by the backend's
// drafter into drafts_ before the verification; every rank proposes the same.
Status ShardExecutor::shard_drafts(const StepPlan& plan) {
  draft_requests_.clear();
  draft_pieces_.clear();
  target_row_.assign(plan.scheduled.size(), -1);
  target_logits_.clear();
  for (size_t i = 0; i < plan.scheduled.size(); ++i) {
    const ScheduledSequence& q = plan.scheduled[i];
    if (q.draft_tokens.empty() || q.draft_tokens.front() != kShardDraftToken) continue;
    const SequenceState& st = sequences_.at(q.seq_id);
    DraftRequest d;
    d.seq_id = q.seq_id;
    d.tokens = st.tokens;
    d.k = static_cast<int64_t>(q.draft_tokens.size());
    d.block_table = st.block_table;
    d.window_block_table = st.window_block_table;
    draft_requests_.push_back(d);
    draft_pieces_.push_back(i);
  }
  if (draft_requests_.empty()) return Status::ok();
  TESSERA_RETURN_IF_ERROR(backend_.drafter()->propose(draft_requests_, proposed_).with_context("the self-draft"));
  for (size_t j = 0; j < draft_pieces_.size(); ++j) {
    std::vector<int32_t>& d = drafts_[draft_pieces_[j]];
    if (proposed_[j].size() != d.size())
      return Status::internal(fmt::format("the drafter proposed {} tokens for sequence {}, {} were asked for",
                                          proposed_[j].size(), draft_requests_[j].seq_id, d.size()));
    d = proposed_[j];
  }
  ShardDrafter& drafter = *backend_.drafter();
  if (!drafter.computes_target()) return Status::ok();
  // Its states are the target's: the verification's logits come from it, k + 1 rows a piece.
  TESSERA_RETURN_IF_ERROR(drafter.target_logits(target_logits_).with_context("the self-draft's verification"));
  int64_t row = 0;
  for (size_t j = 0; j < draft_pieces_.size(); ++j) {
    target_row_[draft_pieces_[j]] = row;
    row += draft_requests_[j].k + 1;
  }
  return Status::ok();
}

// A failed step: the drafts leave the token lists again (nothing was verified).
void ShardExecutor::drop_drafts(const StepPlan& plan) {
  for (const ScheduledSequence& q : plan.scheduled) {
    if (q.draft_tokens.empty()) continue;
    auto it = sequences_.find(q.seq_id);
    if (it != sequences_.end() && static_cast<int64_t>(it->second.tokens.size()) > q.start_pos + 1)
      it->second.tokens.resize(static_cast<size_t>(q.start_pos + 1));
  }
}

Status ShardBackend::configure_draft(const SelfDraftConfig&) {
  return Status::unimplemented("this backend has no self-draft for speculative decoding (the CPU backend has)");
}

Status ShardBackend::run_greedy(std::span<const SequenceInput>, std::vector<int32_t>&) {
  return Status::unimplemented("this backend takes no greedy argmax on the device");
}

Status ShardBackend::run_sampled(std::span<const SequenceInput>, std::vector<SampledToken>&) {
  return Status::unimplemented("this backend does not sample on the device");
}

}  // namespace tessera
