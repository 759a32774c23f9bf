// The decoder forward pass on CPU (ARCHITECTURE.md "One step", step 3) for one shard: the CPU backend
// of the decoder (decoder/decoder.h walks the layers; this class holds the activations, runs
// the ops with the CPU kernels, writes the KV cache and computes the LM head).
//
// A step runs a batch of sequence pieces at once: all their tokens are stacked into one
// [T, hidden] activation matrix for the GEMMs, and attention runs per sequence over the paged
// KV cache (each piece's keys/values are written to the cache before its attention runs, so a
// piece may be a whole prompt, a prefill chunk, or one decode token).
//
// Thread-safety: one thread calls run(); kernels use the injected ThreadPool.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/status.h"
#include "decoder/decoder.h"
#include "kernels/paged_attention.h"
#include "kernels/sparse_attention.h"
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
  // With a window pool (KvCacheShape::num_window_blocks > 0): the table of the windowed layers,
  // block ids of the window pool for the same positions as block_table. -1 marks a released
  // slot; the slots from first_read_slot(start_pos, window) on must be live. Empty (and
  // unused) without a window pool.
  std::span<const int32_t> window_block_table;
};

// Re-lays this rank's block-quantized matrices (every format with a 16-row variant in
// common/dtype.h's table, its r16 column; rows a multiple of 16) into the 16-row interleaved layouts of
// the SIMD kernels (kernels/cpu/qgemm.h, repack_r16: same results, no per-block transposes),
// where AVX-512 or AVX2 is active; a no-op on the scalar path and with TESSERA_CPU_REPACK=0. Buffers the
// ShardWeights owns are re-laid in place (sw.full's views of them are stale after); a matrix
// mapped from the file is copied into sw.owned and its file pages are dropped from memory. A
// tied embedding is re-laid once and shared with the head (ForwardPass::embed unpacks its rows)
// where the head's rows start and end on 16-row groups; otherwise the head gets its own copy.
// The groups are spread over `pool` when given. For the CPU backend only: call before building
// the ForwardPass over sw.weights. Returns how many matrices were re-laid.
int64_t relayout_for_cpu_kernels(ShardWeights& sw, ThreadPool* pool = nullptr);

// This rank's widths for the decoder (both backends build their Decoder with it).
DecoderDims decoder_dims(const ModelConfig& config, const ShardLayout& layout);

class ForwardPass : private DecoderBackend {
 public:
  // Everything passed in must outlive the ForwardPass. `weights` is this rank's slice as laid
  // out by `layout`; `comm` joins the ranks of the TP group (all-reduce after the O and down
  // projections, all-gather of the vocabulary-parallel logits). `arch` describes the layers
  // (default: describe_architecture(config, weights)); it must validate against the weights.
  // A cache with a window pool must hold exactly kv_window_layers(config, arch)'s layers there.
  ForwardPass(const ModelConfig& config, const ShardLayout& layout, const ModelWeights& weights,
              ThreadPool* pool, KvCache* cache, DeviceComm* comm);
  ForwardPass(const ModelConfig& config, const ShardLayout& layout, const ModelWeights& weights,
              ThreadPool* pool, KvCache* cache, DeviceComm* comm, ArchSpec arch);

  // Runs every piece; writes fp32 logits (the full vocabulary, identical on every rank) to
  // `logits` (resized): in batch order, one row per token of a piece with all_logits, else one
  // row for a piece with want_logits. Errors: token id out of range,
  // block table too short, a window table that validate_window_table() refuses (or one given
  // without a window pool); the cache is not modified when the input is rejected. Every rank
  // of the group validates the same plan the same way, so all reject it together.
  Status run(std::span<const SequenceInput> batch, std::vector<float>& logits);

  // The trunk of the self-draft (shard/self_draft.h): the first n_layers layers of every piece
  // (0: all), the final norm, and into `hidden` ([pieces, hidden], resized) the final-normed
  // state of each piece's last token; no LM head. The KV of those layers is written at the
  // pieces' positions (a full run() over the same positions overwrites it). Validated as run().
  Status run_hidden(std::span<const SequenceInput> batch, int64_t n_layers, std::vector<float>& hidden);
  // The LM head alone: fp32 logits of the full vocabulary (identical on every rank) for `n`
  // final-normed hidden states ([n, hidden]), into `logits` (resized).
  Status head(const float* hidden, int64_t n, std::vector<float>& logits);

  // InvalidArgument when enabling it on a cache without key summaries.
  Status set_sparse_attention(const SparseAttentionConfig& config);
  const SparseAttentionConfig& sparse_attention() const { return sparse_; }

  const ModelConfig& config() const { return config_; }
  const Decoder& decoder() const { return decoder_; }

  // Called with the input of every projection before it runs (x: n_tokens rows of k values;
  // calibration, model/importance.h). Empty by default; set between runs.
  using ProjectionObserver = std::function<void(WeightRef w, const float* x, int64_t n_tokens, int64_t k)>;
  void set_projection_observer(ProjectionObserver observer) { observer_ = std::move(observer); }

 private:
  Status validate(std::span<const SequenceInput> batch) const;
  // Validates, then the decoder's first n_layers layers (0: all) over every piece's tokens.
  Status run_trunk(std::span<const SequenceInput> batch, int64_t n_layers, int64_t& n_tokens);
  void ensure_workspace(int64_t n_tokens);
  Status gather_logits(int64_t n_out, std::vector<float>& logits);
  Status sum_over_ranks(float* data, int64_t count);
  float* act(Act a);
  const TensorView& weight(WeightRef w) const;

  // DecoderBackend: the ops of the layer graph on this step's batch_.
  std::string_view backend_name() const override { return "CPU"; }
  bool supports(DecoderOp op, QuantType weight_type) const override;
  Status embed(int64_t n_tokens) override;
  Status scale(Act a, int64_t count, float s) override;
  Status rms_norm(Act in, WeightRef w, Act out, int64_t rows, int64_t dim) override;
  Status add_rms_norm(Act delta, WeightRef w, int64_t n_tokens) override;
  Status project(Act in, std::span<const Projection> outs, int64_t n_tokens) override;
  Status add_bias(Act a, WeightRef bias, int64_t n_tokens, int64_t dim) override;
  Status attention(int64_t layer, const LayerSpec& spec, float scale, int64_t n_tokens) override;
  Status gated_activation(GluActivation act, int64_t n_tokens) override;
  Status all_reduce(Act a, int64_t count) override;

  const ModelConfig& config_;
  const ShardLayout layout_;
  const ModelWeights& weights_;
  DeviceComm* comm_;
  ThreadPool* pool_;
  KvCache* cache_;
  Decoder decoder_;
  ProjectionObserver observer_;
  std::span<const SequenceInput> batch_;  // the step run() is computing
  // Workspace, grown to the largest step seen and reused (no allocation per decode step).
  int64_t capacity_tokens_ = 0;
  std::vector<float> x_, h_, q_, k_, v_, attn_, proj_, gate_, up_;
  std::vector<int32_t> positions_;
  std::vector<uint8_t> embed_row_;  // one embedding row back in its file layout (16-row layouts)
  std::vector<float> local_logits_, gathered_logits_;
  std::vector<AttentionArgs> attention_args_;  // one per sequence of the step
  SparseAttentionConfig sparse_;
  std::vector<SparseScratch> sparse_scratch_;  // one per sequence of the step (compacted tables)
  // This layer's sparse decodes: the index into the step and its scores (in its scratch; empty
  // when the selection takes every block).
  struct ScoredSeq {
    size_t index;
    std::span<float> scores;
  };
  std::vector<ScoredSeq> sparse_seqs_;
  // At TP > 1: every score of sparse_seqs_ becomes the max over the ranks' scores (one
  // all_gather; local_logits_ / gathered_logits_ as staging).
  Status combine_sparse_scores();
  int64_t kv_window_ = 0;  // with a window pool: the largest window of its layers

 public:
  // Time spent in collectives, accumulated over run() calls (for the per-step breakdown).
  uint64_t comm_micros = 0;
  // Decode pieces x layers that attended sparsely, and densely in a layer sparse could serve.
  uint64_t sparse_attentions = 0;
  uint64_t dense_global_decodes = 0;
};

}  // namespace tessera
