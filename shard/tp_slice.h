// Tensor-parallel slicing of a model for one shard (ARCHITECTURE.md "Tensor parallelism", Megatron style):
// Q/K/V and gate/up by output rows (column-parallel; views into the file, no copy), O and down by
// input columns (row-parallel; the rank's columns are copied), LM head by vocabulary rows, the
// embedding replicated. KV heads are split when n_kv_heads % tp == 0; when tp % n_kv_heads == 0
// each KV head is replicated on the tp / n_kv_heads ranks whose query heads use it. A slice of a
// block-quantized matrix must start and end on block boundaries (for I4_G128, on groups of 128
// inputs; I8_CH rows keep their scale).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "model/model_config.h"
#include "model/weight_store.h"

namespace tessera {

struct TpConfig {
  int rank = 0;
  int size = 1;
};

// This rank's share of the model's dimensions.
struct ShardLayout {
  int tp_rank = 0;
  int tp_size = 1;
  int64_t n_heads = 0;        // query heads on this rank
  int64_t head_begin = 0;     // first query head
  int64_t n_kv_heads = 0;     // KV heads stored on this rank
  int64_t kv_head_begin = 0;
  int64_t ffn = 0;            // intermediate columns on this rank
  int64_t ffn_begin = 0;
  int64_t vocab_begin = 0;    // LM head rows [vocab_begin, vocab_end)
  int64_t vocab_end = 0;
  int64_t vocab_per_rank = 0; // padded slice size used for the all-gather (vocab_end - vocab_begin <= it)
};

// Errors name the dimension that cannot be split: "32 query heads cannot be split over TP 3".
Result<ShardLayout> plan_shard_layout(const ModelConfig& config, const TpConfig& tp);

// This rank's weights. Views point into the file or into `owned`.
struct ShardWeights {
  ModelWeights full;                        // the whole model's views (owns converted vectors)
  ModelWeights weights;                     // this rank's slice
  std::vector<WeightBytes> owned;           // copied row-parallel slices, re-laid matrices (huge pages)
  uint64_t bytes = 0;                       // bytes of weights this rank uses
};

Result<ShardWeights> slice_model_weights(ModelWeights full, const ModelConfig& config,
                                         const ShardLayout& layout);

}  // namespace tessera
