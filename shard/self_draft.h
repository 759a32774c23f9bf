// Draft proposers that run in the shard (engine/README.md, speculation): the
// model-based side of speculative decoding. The coordinator asks for shard drafts by sending a
// speculative piece whose draft tokens are all kShardDraftToken (proto/control_messages.h); the
// step executor has its drafter fill them, then verifies them like any other drafts in the same
// step. Verification keeps a draft exactly when the target's own draw equals it, so a drafter
// changes only the speed, never the tokens: its proposals must be deterministic and identical on
// every rank of a TP group (every rank verifies the same drafts).
//
// ShardDrafter is the interface a separate draft model (a --draft-model file with a KV cache of
// its own, keyed by sequence id) would implement as well. SelfDrafter is the one built in: the
// target's first `layers` layers, its final norm and a cheap head (early exit, as in LayerSkip-
// style self-speculation). No second model and no second download; it writes the KV of those
// layers at the draft positions in the target's own cache (the verify pass over the same
// positions overwrites it, and the positions of rejected drafts are never read again).
//
// The cheap head: the LM head's rows for a fixed set of frequent token ids (the tokenizer's
// frequent_ids: by SentencePiece score, or the first ids of a BPE vocabulary) and for every id
// in the sequence's own context (what a reproduction or an edit needs), the argmax among them
// (ties to the lowest id). On Gemma 3 the full head is 168M of its 268M parameters: with it, a draft
// token would cost most of a full step.
//
// Thread-safety: one thread (the shard's executor) calls everything.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/model_config.h"
#include "model/weight_store.h"
#include "shard/forward.h"
#include "shard/tp_slice.h"

namespace tessera {

class DeviceComm;
class ThreadPool;

// One sequence that wants drafts this step.
struct DraftRequest {
  uint64_t seq_id = 0;
  std::span<const int32_t> tokens;  // its token list, ending with the last known token
  int64_t k = 0;                    // drafts wanted (>= 1)
  // The target's tables, covering positions [0, tokens.size() + k - 1) (the step's own piece).
  std::span<const int32_t> block_table;
  std::span<const int32_t> window_block_table;
};

class ShardDrafter {
 public:
  virtual ~ShardDrafter() = default;
  virtual std::string_view name() const = 0;
  // out[i] = exactly requests[i].k proposed tokens after requests[i].tokens (resized to
  // requests.size()); the same on every rank for the same requests. An error leaves the target's
  // cache usable (the executor then fails the step).
  virtual Status propose(std::span<const DraftRequest> requests, std::vector<std::vector<int32_t>>& out) = 0;
  // The sequence is gone (a drafter with state per sequence drops it).
  virtual void forget(uint64_t /*seq_id*/) {}
  // True when the drafter runs the target itself (a self-draft through every layer): propose()
  // then also computes each request's last draft through the trunk, and target_logits() gives
  // the target's logits for the k + 1 positions of every request of the last propose() (request
  // order, position order): exactly what a verification pass would compute, one token at a
  // time as plain decoding does, with the full LM head read once for all the rows.
  virtual bool computes_target() const { return false; }
  virtual Status target_logits(std::vector<float>& logits);
};

struct SelfDraftConfig {
  int32_t layers = 0;  // the target's first layers the draft runs (1 .. n_layers)
  // The head's fixed rows: `ids` (the tokenizer's frequent_ids, from the coordinator), or where
  // none are given ids 0 .. vocab - 1 (0: the context's ids only; above the vocabulary: all).
  int32_t vocab = 0;
  std::vector<int32_t> ids;
};

// InvalidArgument naming the knob: layers outside 1..n_layers, vocab < 0.
Status validate_self_draft(const SelfDraftConfig& c, const ModelConfig& config);

class SelfDrafter final : public ShardDrafter {
 public:
  // Everything passed in must outlive the drafter; `forward` runs over `weights` (after the CPU
  // re-layout) with this rank's `layout`, `comm` joins the TP group. The config must validate.
  SelfDrafter(const SelfDraftConfig& config, const ModelConfig& model, const ShardLayout& layout,
              const ModelWeights& weights, ForwardPass& forward, ThreadPool* pool, DeviceComm* comm);

  std::string_view name() const override { return "self"; }
  Status propose(std::span<const DraftRequest> requests, std::vector<std::vector<int32_t>>& out) override;
  bool computes_target() const override { return config_.layers == model_.n_layers; }
  Status target_logits(std::vector<float>& logits) override;

  const SelfDraftConfig& config() const { return config_; }
  // This rank's fixed head rows (the fixed ids in its vocabulary slice).
  int64_t head_rows() const { return static_cast<int64_t>(head_ids_.size()); }

 private:
  struct Best {
    float value;
    int32_t id;
  };
  void build_head();
  const float* context_row(int32_t id);  // the fp32 head row of a context id of this rank's slice
  Best best_of(const float* h, int64_t row, std::span<const int32_t> context, std::span<const int32_t> drafts);

  SelfDraftConfig config_;
  const ModelConfig& model_;
  const ShardLayout layout_;
  const ModelWeights& weights_;
  ForwardPass& forward_;
  ThreadPool* pool_;
  DeviceComm* comm_;
  std::vector<int32_t> head_ids_;  // the fixed rows' ids (this rank's slice, ascending)
  std::vector<uint8_t> in_head_;   // per id of this rank's slice: a fixed row
  std::vector<uint8_t> head_bytes_;
  TensorView head_;
  std::vector<uint8_t> row_bytes_;  // one head row in its file layout
  std::vector<float> row_cache_;    // fp32 rows of context ids, by slot
  std::vector<int32_t> row_slot_;   // per id of this rank's slice: its slot in row_cache_, -1
  int64_t cached_rows_ = 0;
  std::vector<uint8_t> seen_;       // per id: seen in the current context (reset after each)
  std::vector<int32_t> marked_;     // the ids seen_ marks
  // Reused every round.
  std::vector<SequenceInput> batch_;
  std::vector<int32_t> round_tokens_;
  std::vector<size_t> round_seq_;
  std::vector<float> hidden_, scores_;
  std::vector<float> target_hidden_;  // computes_target(): every request's k + 1 final states
  std::vector<size_t> target_offset_;  // per request: its first row there
  std::vector<Best> local_, gathered_;
};

}  // namespace tessera
