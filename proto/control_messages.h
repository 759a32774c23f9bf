// The control-plane messages (proto/tessera.capnp) as plain C++ values. Only
// comm/control_codec.cpp knows Cap'n Proto; everything else uses these structs.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "common/kv_config.h"
#include "common/sampling_params.h"

namespace tessera {

inline constexpr uint32_t kProtocolVersion = 2;  // 2: StepMasks (a shard of version 1 would ignore maskFollows)

struct ShardHello {
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t tp_size = 1;
  std::string device;
  uint64_t memory_available_bytes = 0;
  uint64_t kv_bytes_per_token = 0;
  std::string model_fingerprint;
  std::string hostname;
  int32_t pid = 0;
  uint64_t weight_bytes = 0;
  int64_t max_step_tokens = 0;  // a GPU shard's workspace limits (0: none, the CPU backend)
  int64_t max_step_seqs = 0;
  KvDtype kv_dtype = KvDtype::kF32;  // its KV cache's elements (kv_bytes_per_token is in them)
  // Sliding-window layers (Gemma 3's local layers): their window in tokens, and their share of
  // kv_bytes_per_token. 0 and 0: no layer has a window shorter than the context (one pool).
  int64_t kv_window = 0;
  uint64_t kv_window_bytes_per_token = 0;
  uint64_t kv_summary_bytes_per_block = 0;  // BackendMemory::kv_summary_bytes_per_block
};

struct ConfigureMsg {
  int64_t num_blocks = 0;
  int32_t block_size = 16;
  KvDtype kv_dtype = KvDtype::kF32;  // the coordinator planned with it; the shard must store it
  // > 0: the windowed layers' KV lives in a pool of its own, num_window_blocks blocks of
  // block_size tokens, addressed by each sequence's window table (ScheduledSequence); the other
  // layers use num_blocks. 0: every layer uses the one pool and the one table.
  int64_t num_window_blocks = 0;
  // > 0: speculation's self-draft (shard/self_draft.h) over the model's first draft_layers
  // layers, its head's fixed rows the ids below draft_vocab. 0: the shard builds no drafter.
  int32_t draft_layers = 0;
  int32_t draft_vocab = 0;
  std::vector<int32_t> draft_ids;  // the head's fixed rows (the tokenizer's frequent_ids); empty: ids below draft_vocab
};

// A draft token the shard's own drafter proposes (ScheduledSequence::draft_tokens).
inline constexpr int32_t kShardDraftToken = -1;

struct NewSequence {
  uint64_t seq_id = 0;
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
};

struct ScheduledSequence {
  uint64_t seq_id = 0;
  int64_t start_pos = 0;
  int32_t num_tokens = 0;
  bool sample = false;
  std::vector<int32_t> append_blocks;
  bool reset_blocks = false;
  bool prompt_logprobs = false;
  std::vector<int32_t> banned_tokens;  // given probability 0 when this step samples
  // Structured outputs: the tokens the grammar allows at each sampled row, a bitmask over the
  // model's vocabulary per row ((vocab + 31) / 32 words; word w bit b is token 32w + b; set =
  // allowed), rows one after another: 1 row, or k + 1 with k proposed draft_tokens (1 row with
  // forced_drafts: the row after them). Empty: no constraint.
  std::vector<uint32_t> token_mask;
  // With a window pool (ConfigureMsg::num_window_blocks > 0): the window table's entries for the
  // same table slots as append_blocks (same length; reset_blocks clears both tables). -1 marks a
  // slot whose window block was released: every position in it is behind every window the
  // sequence's queries will see, and it is never read. Empty without a window pool.
  std::vector<int32_t> append_window_blocks;
  // Speculation (sample is then set): k proposed tokens that follow the last known token. The
  // piece is the last known token and the k drafts (num_tokens = k + 1, start_pos + 1 = the
  // token list's length). The shard samples row i as an ordinary decode would, accepts draft i
  // while the sample equals it, and reports every token it drew (1 .. k + 1, in order); then it
  // cuts its tables to the blocks that hold the computed positions (start_pos + tokens drawn),
  // as the coordinator's block pool does. Drafts that are all kShardDraftToken are proposed by
  // the shard's drafter (ConfigureMsg::draft_layers) in the same step, before the verification.
  std::vector<int32_t> draft_tokens;
  // The draft_tokens are certain (structured outputs' jump-forward: the grammar allows nothing
  // else): the shard takes them without computing their rows' logits or verifying them, reports
  // them with logprob 0 (probability 1 under the grammar), and samples only the row after them.
  bool forced_drafts = false;
  // Structured outputs: token_mask is empty here and comes in the StepMasks message that follows
  // this plan; the shard starts the forward pass and waits for it only before sampling (the
  // coordinator computes the masks while the ranks compute the logits).
  bool mask_follows = false;
};

struct BlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
};

struct StepPlan {
  uint64_t step_id = 0;
  std::vector<NewSequence> new_sequences;
  std::vector<ScheduledSequence> scheduled;
  std::vector<uint64_t> finished;
  std::vector<BlockCopy> block_copies;
  std::vector<BlockCopy> window_block_copies;  // copy-on-write in the window pool, before the step
};

// The token masks of a plan's pieces marked mask_follows, sent right after the plan to every rank.
struct SequenceMask {
  uint64_t seq_id = 0;
  std::vector<uint32_t> token_mask;  // as ScheduledSequence::token_mask (empty: no constraint)
};

struct StepMasks {
  uint64_t step_id = 0;
  std::vector<SequenceMask> masks;  // one per piece marked mask_follows, in the plan's order
};

struct StepToken {
  uint64_t seq_id = 0;
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

struct PromptLogprob {
  uint64_t seq_id = 0;
  int64_t position = 0;
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

struct StepResult {
  uint64_t step_id = 0;
  int32_t rank = 0;
  std::vector<StepToken> tokens;
  std::string error;
  uint64_t compute_micros = 0;
  uint64_t comm_micros = 0;
  std::vector<PromptLogprob> prompt_logprobs;
  uint64_t draft_micros = 0;  // of compute_micros, the shard drafter's time
  // Sparse decode attention: the threshold in effect (0: off) and this step's decode pieces x
  // global layers that attended sparsely / densely (ShardBackend::sparse_stats).
  int64_t sparse_threshold_tokens = 0;
  uint64_t sparse_decodes = 0;
  uint64_t dense_global_decodes = 0;
};

struct Heartbeat {
  int32_t rank = -1;
  uint64_t last_step_id = 0;
};

struct ShutdownMsg {
  std::string reason;
};

struct AbortMsg {
  std::vector<uint64_t> seq_ids;
};

struct RefusedMsg {
  std::string reason;
};

using ControlMessage = std::variant<ShardHello, ConfigureMsg, StepPlan, StepResult, Heartbeat, ShutdownMsg,
                                    AbortMsg, RefusedMsg, StepMasks>;

}  // namespace tessera
