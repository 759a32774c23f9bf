// The decoder forward pass on CPU (DESIGN §1 "One step", step 3) for one shard.
//
// A step runs a batch of sequence pieces at once: all their tokens are stacked into one
// [T, hidden] activation matrix for the GEMMs, and attention runs per sequence over the paged
// KV cache (each piece's keys/values are written to the cache before its attention runs, so a
// piece may be a whole prompt, a prefill chunk, or one decode token).
//
// Weights: the layer matrices and the LM head are used as bound, except GGUF Q8_0 / Q4_0
// matrices of a multiple of 16 rows where the AVX-512 kernels are active: those are re-laid
// once at construction into the 16-row interleaved layout (kernels/cpu/qgemm.h, repack_r16;
// same bytes, same results, no per-block transposes in the kernels), held by the ForwardPass;
// the file pages of a mapped original are dropped from memory after the copy.
// TESSERA_CPU_REPACK=0 keeps the file's layout (A/B).
//
// Thread-safety: one thread calls run(); kernels use the injected ThreadPool.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "kernels/paged_attention.h"
#include "model/model_config.h"
#include "model/weight_store.h"
#include "shard/kv_cache.h"
#include "shard/tp_slice.h"

namespace tessera {

class DeviceComm;
class ThreadPool;

// One sequence's piece of a step.
struct SequenceInput {
  std::span<const int32_t> tokens;       // new tokens (prefill chunk or one decode token)
  int64_t start_pos = 0;                 // position of tokens[0]
  std::span<const int32_t> block_table;  // covers positions [0, start_pos + tokens.size())
  bool want_logits = true;               // logits of the last token of this piece
  bool all_logits = false;               // logits of every token of this piece (prompt logprobs)
};

class ForwardPass {
 public:
  // Everything passed in must outlive the ForwardPass. `weights` is this rank's slice as laid
  // out by `layout`; `comm` joins the ranks of the TP group (all-reduce after the O and down
  // projections, all-gather of the vocabulary-parallel logits).
  ForwardPass(const ModelConfig& config, const ShardLayout& layout, const ModelWeights& weights,
              ThreadPool* pool, KvCache* cache, DeviceComm* comm);

  // Runs every piece; writes fp32 logits (the full vocabulary, identical on every rank) to
  // `logits` (resized): in batch order, one row per token of a piece with all_logits, else one
  // row for a piece with want_logits. Errors: token id out of range,
  // block table too short; the cache is not modified when the input is rejected. Every rank
  // of the group validates the same plan the same way, so all reject it together.
  Status run(std::span<const SequenceInput> batch, std::vector<float>& logits);

  const ModelConfig& config() const { return config_; }

 private:
  Status validate(std::span<const SequenceInput> batch) const;
  void ensure_workspace(int64_t n_tokens);
  void embed(std::span<const SequenceInput> batch);
  void attention_block(int64_t layer, std::span<const SequenceInput> batch, int64_t n_tokens);
  void mlp_block(int64_t layer, int64_t n_tokens);

  Status gather_logits(int64_t n_out, std::vector<float>& logits);
  Status all_reduce(float* data, int64_t count);

  const ModelConfig& config_;
  const ShardLayout layout_;
  const ModelWeights& weights_;
  // The matrices run() multiplies: weights_'s, or their 16-row interleaved copies.
  std::vector<LayerWeights> layers_;
  TensorView lm_head_;
  std::vector<std::vector<uint8_t>> repacked_;
  DeviceComm* comm_;
  ThreadPool* pool_;
  KvCache* cache_;
  std::vector<float> inv_freq_;
  // Workspace, grown to the largest step seen and reused (no allocation per decode step).
  int64_t capacity_tokens_ = 0;
  std::vector<float> x_, h_, q_, k_, v_, attn_, proj_, gate_, up_;
  std::vector<int32_t> positions_;
  std::vector<float> local_logits_, gathered_logits_;
  std::vector<AttentionArgs> attention_args_;  // one per sequence of the step

 public:
  // Time spent in collectives, accumulated over run() calls (for the per-step breakdown).
  uint64_t comm_micros = 0;
};

}  // namespace tessera
