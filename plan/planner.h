// `tessera plan`: the cost accounts of a deployment (plan/README.md). For a model config, a weight
// precision, a KV dtype, a TP degree and a card, the memory bill of one rank and the predicted
// decode-step time. Pure arithmetic: no I/O except reading model configs in load_plan_model().
//
// What is assumed (the bill prints each of these):
// * TP split as shard/tp_slice.h does it (ARCHITECTURE.md "Tensor parallelism"): Q/K/V and gate/up by output rows, O and
//   down by input columns, the LM head by vocabulary rows (ceil(vocab / tp) on the largest
//   rank), the embedding replicated on every rank (the lookup needs no collective). KV heads
//   are split when n_kv % tp == 0, else replicated (one per rank) when tp % n_kv == 0.
// * A matrix of [rows, cols] in a precision takes rows * (ceil(cols / group) * group_bytes +
//   row_extra_bytes); groups run along the input dimension (cols).
// * Memory: KV room = memory * (1 - headroom) - runtime reserve - weights - workspace. The
//   headroom is a fraction of the card's memory never planned for (ARCHITECTURE.md "KV accounting").
// * Workspace (per rank): max_step_tokens * (3 * hidden + 2 * q_cols + 2 * kv_cols + 2 * ffn/tp)
//   * activation bytes (the buffers of the forward pass: x, h, proj; q, attn; k, v; gate, up)
//   + logits: max_batch * (vocab_per_rank + (tp > 1 ? tp * vocab_per_rank : 0)) * 4 (fp32; with TP
//   the padded slices of every rank are gathered for sampling).
// * KV pools, as the coordinator plans them (ARCHITECTURE.md "KV accounting"): a model with windowed layers
//   (windowed_kv_layers non-empty: Gemma 3's local layers) keeps their KV in a window pool of
//   W = window_pool_blocks(window, max_step_tokens, block, max_batch) blocks of Wb = windowed
//   bytes per token * block, and the global layers' KV in the normal pool of F = global bytes
//   per token * block: with KV room R and A = F + Wb, when W < R / A the normal pool gets
//   (R - W * Wb) / F blocks; otherwise (and for every other model) one pool of R / A blocks
//   holds every layer's KV for the whole context. Capacity (tokens, sequences) is the normal
//   pool's: the window pool never runs out for max_batch running sequences.
// * Time of one decode step at batch B, context C (per rank):
//   memory floor = (weights read + B * (C * global KV per token + min(C, window) * windowed KV
//   per token)) / bandwidth (the windowed layers' attention reads only the window), where
//   weights read = layer matrices + the LM-head slice + B embedding rows + norm vectors;
//   compute = (2 * B * matrix params + B * 4 * q_heads * head_dim * (global layers * C +
//   windowed layers * min(C, window))) / peak;
//   floor = max(memory, compute); plus launches * launch cost; plus all-reduce time.
//   Ring all-reduce of n bytes over p ranks: 2 (p-1)/p * n / link bandwidth + 2 (p-1) hop latencies.
//
// Units: bytes, seconds, FLOP. Thread-safety: values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/kv_config.h"
#include "common/status.h"
#include "model/model_config.h"
#include "plan/hardware.h"

namespace tessera {

// How a weight matrix is stored: groups of `group_elems` consecutive elements of a row take
// `group_bytes` bytes (scales and zeros included); each row adds `row_extra_bytes` (a
// per-channel scale).
struct PrecisionSpec {
  std::string name;                 // "INT4"
  std::string layout;               // "4-bit, group 128, fp16 scale + fp16 zero"
  int64_t group_elems = 1;
  int64_t group_bytes = 2;
  int64_t row_extra_bytes = 0;
  int64_t align_elems = 0;          // a row-parallel slice must start on a multiple; 0: group_elems

  double bits_per_weight() const { return 8.0 * static_cast<double>(group_bytes) / static_cast<double>(group_elems); }
  uint64_t row_bytes(int64_t cols) const;
  uint64_t matrix_bytes(int64_t rows, int64_t cols) const { return static_cast<uint64_t>(rows) * row_bytes(cols); }
  int64_t alignment() const { return align_elems > 0 ? align_elems : group_elems; }
};

// Every format Tessera reads, from the format table (common/dtype.h): F32, F16, BF16, INT8
// (per-channel), INT4 (g128), then the GGUF formats (Q8_0, Q4_0, ..., TQ2_0); and the planned
// 2BIT (g64), TERNARY (2 bits packed), TERNARY-B5 (5 trits per byte). Case-insensitive;
// "int4-g128" etc. NotFound naming the choices.
Result<PrecisionSpec> precision_preset(std::string_view name);
std::vector<std::string> precision_names();
// Makes a precision whose bits per weight equal bytes * 8 / elements (the stored model's mix).
// A mix whose exact fraction needs a group above max_group_elems is rounded to a group of
// max_group_elems; give a divisor of every row length billed (a row rounds up to whole groups).
PrecisionSpec precision_from_totals(std::string name, uint64_t bytes, uint64_t elements, int64_t max_group_elems = 256);


// Well-known configs: llama-2-7b, llama-2-13b, llama-2-70b, llama-3-8b, llama-3-70b, mistral-7b.
Result<ModelConfig> model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

// A model for planning: a preset name, a config.json, an HF directory or a .gguf file.
// `weights_*` are set when the file holds the weights themselves (the stored precision).
struct PlanModel {
  ModelConfig config;
  std::string name;                 // the preset name or path
  bool has_weights = false;
  PrecisionSpec stored_layers;      // average over the layers' matrices as stored
  PrecisionSpec stored_embeddings;  // embedding and LM head as stored
};
Result<PlanModel> load_plan_model(const std::string& name_or_path);

// A distribution of sequence lengths (tokens at the end of a request: prompt + output), as
// points with probabilities summing to 1.
struct SequenceLengths {
  std::string description;
  std::vector<std::pair<int64_t, double>> points;

  static SequenceLengths fixed(int64_t length);
  // Every length in [lo, hi] equally likely.
  static Result<SequenceLengths> uniform(int64_t lo, int64_t hi);
  // Geometric (the discrete exponential) with the given mean, cut at max_length and renormalized.
  static Result<SequenceLengths> geometric(double mean, int64_t max_length);
  double mean() const;
  int64_t max() const;
};
// "fixed:N", "uniform:LO:HI", "geometric:MEAN" (alias "exp:MEAN"). Lengths cut at max_length.
Result<SequenceLengths> parse_length_distribution(std::string_view spec, int64_t max_length);

struct Fragmentation {
  int64_t block_size = 0;
  double unused_slots = 0;    // E[(block - L mod block) mod block]: empty slots of the last block
  double blocks = 0;          // E[ceil(L / block)]
  double fraction = 0;        // unused_slots / (blocks * block): the share of allocated KV wasted
};
Fragmentation expected_fragmentation(const SequenceLengths& lengths, int64_t block_size);

// Ring all-reduce of `bytes` over `ranks`: 2 (p-1)/p * bytes / bandwidth + 2 (p-1) * hop latency.
double ring_all_reduce_s(uint64_t bytes, int ranks, const LinkSpec& link);
// Ring all-gather where each rank contributes `bytes_per_rank`: (p-1) * bytes_per_rank / bandwidth
// + (p-1) * hop latency.
double ring_all_gather_s(uint64_t bytes_per_rank, int ranks, const LinkSpec& link);

struct PlanInput {
  ModelConfig model;
  std::string model_name;
  PrecisionSpec weights;            // the layers' matrices
  PrecisionSpec embeddings;         // embedding and LM head
  KvDtype kv_dtype = KvDtype::kF16;
  int tp = 1;
  CardSpec card;
  bool use_slow_link = false;       // PCIe instead of NVLink between the TP ranks
  double headroom = 0.10;           // fraction of memory never planned for
  int64_t block_size = 16;          // tokens per KV block
  int64_t context_length = 0;       // 0: the model's max_positions
  SequenceLengths lengths;       // empty: fixed(context_length)
  int64_t batch = 1;                // decode batch for the time bill
  int64_t decode_context = -1;      // context of each decoding sequence; -1: the lengths' mean
  int64_t max_batch = 32;           // logit rows in the workspace
  int64_t max_step_tokens = 2048;   // activation rows in the workspace; with max_batch, sizes the window pool
};

struct MemoryBill {
  // Per rank (the largest rank when ranks differ).
  int64_t q_heads_per_rank = 0;
  int64_t kv_heads_per_rank = 0;
  bool kv_heads_replicated = false;
  int64_t ffn_per_rank = 0;
  int64_t vocab_per_rank = 0;
  uint64_t layer_weight_bytes = 0;   // all layers' matrices of this rank
  uint64_t embedding_bytes = 0;      // replicated: the whole table
  uint64_t lm_head_bytes = 0;        // vocab_per_rank rows (0 when tied to the embedding)
  uint64_t vector_bytes = 0;         // norms, biases
  uint64_t weight_bytes = 0;         // sum of the above
  uint64_t model_weight_bytes = 0;   // the whole model once (no replication)
  uint64_t matrix_params_per_rank = 0;  // elements multiplied per token (layers + LM-head slice)
  uint64_t kv_bytes_per_token = 0;      // this rank: 2 * layers * kv_heads_per_rank * head_dim * dtype
  uint64_t kv_bytes_per_token_model = 0;  // all KV heads once
  // The split of kv_bytes_per_token: the windowed layers' (windowed_kv_layers; 0 for a model
  // without them) and the rest's (the global layers: all of them for such a model).
  int64_t windowed_layers = 0;
  int64_t window = 0;                           // tokens a windowed layer attends over; 0: none
  uint64_t kv_bytes_per_token_global = 0;
  uint64_t kv_bytes_per_token_windowed = 0;
  // The window pool (zeros for a model without windowed layers). window_pool_blocks is what the
  // pool needs; window_pool is whether the plan splits (else one pool holds every layer).
  int64_t window_blocks_per_sequence = 0;
  int64_t window_pool_blocks = 0;
  bool window_pool = false;
  uint64_t window_block_bytes = 0;      // block tokens * kv_bytes_per_token_windowed
  uint64_t window_pool_bytes = 0;       // window_pool_blocks * window_block_bytes when split, else 0
  uint64_t workspace_activation_bytes = 0;
  uint64_t workspace_logits_bytes = 0;
  uint64_t workspace_bytes = 0;
  uint64_t memory_bytes = 0;
  uint64_t reserve_bytes = 0;
  uint64_t headroom_bytes = 0;
  int64_t kv_room_bytes = 0;         // may be negative: the plan does not fit
  // The normal pool (the only one when !window_pool): its block holds the global layers' KV
  // when split, every layer's otherwise.
  uint64_t kv_block_bytes = 0;
  int64_t kv_blocks = 0;
  int64_t kv_tokens = 0;             // kv_blocks * block: tokens of context the plan holds
  int64_t context_length = 0;
  int64_t blocks_per_sequence = 0;   // ceil(context / block)
  int64_t sequences_at_context = 0;  // kv_blocks / blocks_per_sequence
  double sequences_at_lengths = 0;   // kv_blocks / E[ceil(L / block)]
  Fragmentation fragmentation;
  std::vector<Fragmentation> block_size_sweep;  // 16 ... 1024
};

struct TimeBill {
  int64_t batch = 0;
  int64_t context = 0;
  uint64_t weight_bytes_read = 0;
  uint64_t kv_bytes_read = 0;
  double weight_read_s = 0;
  double kv_read_s = 0;
  double memory_s = 0;
  double flops = 0;
  double compute_s = 0;
  double floor_s = 0;                // max(memory_s, compute_s)
  bool compute_bound = false;
  double crossover_batch = 0;        // compute dominates above this batch; infinity: never at this context
  double crossover_batch_no_kv = 0;  // the same for weights alone (context 0): about peak / (bandwidth / bytes per weight)
  int launches_per_layer = 0;
  int launches_per_step = 0;
  double launch_s = 0;               // without graphs
  double launch_graph_s = 0;         // with CUDA graphs (equal to launch_s on the CPU)
  int all_reduces_per_step = 0;
  uint64_t all_reduce_bytes = 0;     // one all-reduce
  double all_reduce_s = 0;           // all of the step's all-reduces
  double all_gather_s = 0;           // logits all-gather for sampling
  double step_s = 0;                 // floor + launches + collectives, no graphs
  double step_graph_s = 0;           // with graphs
  double tokens_per_s = 0;           // batch / step_graph_s (step_s on the CPU)
};

// Speculative decoding on this plan (common/speculation_math.h): a step where each of the batch's
// sequences verifies k drafts computes batch * (k + 1) tokens; the weights and the KV are read
// once as in a plain step, the matrix and attention FLOPs, the all-reduce bytes and the logits
// gathered grow k + 1 times. Break-even: the per-position acceptance at which the expected
// tokens (1 + a + ... + a^k) equal verify_s / plain step.
struct SpeculationRow {
  int64_t drafts = 0;
  double verify_s = 0;
  double cost_ratio = 0;
  double break_even = 0;
};

struct PlanWarning {
  bool fatal = false;                // the plan cannot run at all
  std::string message;
};

struct Plan {
  PlanInput input;
  LinkSpec link;
  MemoryBill memory;
  TimeBill time;
  std::vector<SpeculationRow> speculation;  // k = 1, 2, 4, 8
  std::vector<PlanWarning> warnings;
};

// InvalidArgument for inputs that make no plan (TP that splits no heads, block size < 1,
// headroom outside [0, 1), batch < 1, ...). A plan that does not fit is returned with fatal warnings.
Result<Plan> make_plan(const PlanInput& input);

// The human-readable bill.
std::string format_plan(const Plan& plan);
// The same as one JSON object (numbers in bytes and seconds).
std::string plan_to_json(const Plan& plan);

// Formats bytes as "37.41 GB (34.84 GiB)".
std::string format_bytes(double bytes);

}  // namespace tessera
