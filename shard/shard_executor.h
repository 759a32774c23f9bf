// Executes StepPlans on one shard (ARCHITECTURE.md "One step", step 3 on the shard's side): the
// per-sequence state a shard keeps between steps (tokens, block table, sampler), the plan's
// bookkeeping (new sequences, finished ones, block copies), the forward pass on the backend and
// the choice of each sampled token. Every rank of a TP group runs the same plan on the same
// state, so every rank appends the same tokens; rank 0 reports them.
//
// It is the whole shard minus the transport: the shard process's worker loop
// (shard/shard_worker.h) feeds it plans from the control channel, and an in-process shard
// (local/in_process_shard.h) feeds it the engine's plans directly.
//
// Thread-safety: one thread calls everything except last_step(), which any thread may read.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>
#include <memory>
#include <span>
#include <vector>

#include "proto/control_messages.h"
#include "common/status.h"
#include "kernels/sampling.h"
#include "model/model_config.h"
#include "shard/shard_backend.h"

namespace tessera {

struct ShardExecutorOptions {
  int rank = 0;                 // this shard's rank in the TP group (rank 0 reports tokens)
  // Let the backend sample on the device when it can (only ids and logprobs cross to the host);
  // off: every non-greedy step samples the downloaded logits on the host.
  bool device_sampling = true;
};

class ShardExecutor {
 public:
  // `backend` and `config` must outlive the executor.
  ShardExecutor(ShardBackend& backend, const ModelConfig& config, const ShardExecutorOptions& options);

  // The KV pool of the coordinator's plan (ConfigureMsg); before any step, once. With
  // num_window_blocks > 0 also the window pool: the windowed layers' KV in a pool of its own,
  // addressed by each sequence's window table (ScheduledSequence::append_window_blocks).
  // InvalidArgument when the plan's KV dtype is not the one the backend stores, or for a window
  // pool on a model without windowed layers (ShardBackend::kv_window() 0).
  // With draft.layers > 0 also speculation's self-draft (ShardBackend::configure_draft), which
  // then proposes the shard drafts of speculative pieces (kShardDraftToken); Unimplemented on a
  // backend without one.
  Status configure(int64_t block_size, int64_t num_blocks, KvDtype kv_dtype, int64_t num_window_blocks = 0,
                   const SelfDraftConfig& draft = {});
  bool configured() const { return num_blocks_ > 0; }

  // Runs one plan (step ids consecutive from 1). Any error is in StepResult::error (naming the
  // rank and the step) and leaves the computation undone: every rank checks the same plan the
  // same way before any collective, so all reject it together.
  // Pieces marked mask_follows get their token masks from `late_masks` once the forward pass is
  // done, right before sampling (the coordinator computes them meanwhile): the step's StepMasks,
  // checked against the plan. Without it such a plan is refused.
  using MaskSource = std::function<Result<StepMasks>()>;
  StepResult execute(const StepPlan& plan, const MaskSource& late_masks = {});
  // Forgets a sequence (aborted by the coordinator).
  void drop(uint64_t seq_id);
  uint64_t last_step() const { return last_step_.load(); }

  // In-process callers only: sees every logits row the host samples from, before the draw
  // (sequence id, its fp32 row of the full vocabulary). E.g. `generate` keeps the logits at
  // the last prompt position.
  using RowObserver = std::function<void(uint64_t seq_id, std::span<const float> logits)>;
  void set_row_observer(RowObserver observer) { observer_ = std::move(observer); }

 private:
  struct SequenceState {
    std::vector<int32_t> tokens;  // prompt, then every sampled token
    size_t n_prompt = 0;
    std::vector<int32_t> block_table;
    std::vector<int32_t> window_block_table;  // with a window pool: same length, -1 = released
    std::unique_ptr<Sampler> sampler;
  };

  Status prepare(const StepPlan& plan);
  Status validate_window_blocks(const ScheduledSequence& s, const SequenceState& st) const;
  Status validate_draft(const ScheduledSequence& s, int64_t n_tokens) const;
  Status shard_drafts(const StepPlan& plan);
  Status receive_late_masks(const StepPlan& plan, const MaskSource& source);
  // The token mask in effect for a piece (its own, or the one that followed the plan).
  std::span<const uint32_t> mask_of(const ScheduledSequence& q) const;
  void take_forced(const ScheduledSequence& q, SequenceState& st, float* logits, StepResult& r);
  void verify(const ScheduledSequence& q, std::span<const int32_t> drafts, SequenceState& st, StepResult& r,
              const std::function<SampledToken(int64_t)>& draw);
  // `row`: the piece's sampled row (0, or 0 .. k of a speculative piece): which token mask applies.
  SampledToken sample_row(const ScheduledSequence& q, SequenceState& st, float* logits, int64_t row);
  void drop_drafts(const StepPlan& plan);
  bool plain_greedy(const StepPlan& plan) const;
  bool device_sampling_rows(const StepPlan& plan);
  void take_greedy(const StepPlan& plan, StepResult& r);
  void take_sampled(const StepPlan& plan, StepResult& r);
  void sample(const StepPlan& plan, StepResult& r);

  ShardBackend& backend_;
  const ModelConfig& config_;
  ShardExecutorOptions options_;
  int64_t block_size_ = 0;
  int64_t num_blocks_ = 0;
  int64_t num_window_blocks_ = 0;  // 0: no window pool
  int64_t kv_window_ = 0;          // with one: the backend's kv_window()
  std::map<uint64_t, SequenceState> sequences_;
  std::atomic<uint64_t> last_step_{0};
  RowObserver observer_;
  // Reused every step.
  std::vector<SequenceInput> batch_;
  std::vector<float> logits_;
  std::vector<int32_t> greedy_ids_;
  std::vector<DeviceSampleRequest> sample_requests_;
  std::vector<SampledToken> sampled_;
  std::vector<std::vector<int32_t>> drafts_;  // per scheduled piece: its drafts (the shard's filled in)
  std::vector<DraftRequest> draft_requests_;
  std::vector<size_t> draft_pieces_;
  std::vector<std::vector<int32_t>> proposed_;
  // Pieces whose verification logits the drafter computed (ShardDrafter::computes_target):
  // per scheduled piece its first row in target_logits_, or -1 (its rows are in logits_).
  std::vector<int64_t> target_row_;
  std::vector<float> target_logits_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> late_masks_;  // this step's, by sequence
};

}  // namespace tessera
