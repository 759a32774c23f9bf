// The decoder forward pass on one CUDA device for one shard: the CUDA backend of the decoder
// (decoder/decoder.h walks the layers; this class holds the device buffers, the uploaded
// weights, the KV pool and the CUDA graphs, and runs each op as a kernel or GEMM). Same math as
// ForwardPass (shard/forward.h) and the same SequenceInput batches; the vocabulary-parallel LM
// head + all-gather and the device-side greedy / sampling outputs are its own.
//
// No CUDA is linked here: every device call goes through the dlopen-ed backend table
// (kernels/cuda/cuda_loader.h), so this file builds on machines without CUDA and create()
// returns Unavailable there.
//
// Memory, all allocated by create(), nothing per step:
//  1. the weights, in the form the kernels of each weight type read (shard/cuda_weights.cpp);
//  2. the workspace for the largest step (options.max_tokens_per_step tokens,
//     max_seqs_per_step sequences, max_logit_rows logit rows);
//  3. the KV pool as one allocation of options.kv_dtype. Its size comes from the free device
//     memory (kv_headroom, max_kv_blocks), or, with options.defer_kv_pool, from
//     configure_kv(), which with num_window_blocks > 0 also allocates the window pool of the
//     windowed layers;
//  4. with options.sparse.enabled, the key summaries and the sparse selection's buffers.
// shard/cuda_pools.cpp lays out 2 to 4.
//
// Sparse decode attention (options.sparse): a decode token at position p with p + 1 >=
// sparse.threshold_tokens attends to a selection of its sequence's blocks (sink + top +
// recent) in the layers with no sliding window. The selection runs on the device, with no host
// sync. The result equals the CPU's ForwardPass with the same config (set_sparse_attention) up
// to the forward passes' own rounding differences, and the dense result exactly when the
// selection covers every block. shard/cuda_ops.cpp describes it (enqueue_sparse).
//
// CUDA graphs (options.cuda_graphs): a step in which every sequence wants the logits of each of
// its tokens runs as one graph launch: plain decode steps and speculative verification steps
// (k + 1 <= max_graph_tokens). The batch is padded to a power-of-two bucket of sequences, and
// each sequence to a power-of-two number of token rows. A graph is captured on its key's first
// step and replayed for every later one. Other steps (prefill chunks, steps over the graph
// limits) run eagerly.
// shard/cuda_graphs.cpp describes the padding and the fixed buffers.
//
// Streams: every kernel runs on one stream. With TP > 1 `comm` must be an NcclComm (device
// pointers) and its stream is used, so kernels and collectives are ordered without events.
// Thread-safety: create() and run() on one thread (the cuBLAS handle is per thread).
//
// The implementation, by job: cuda_forward.cpp (create, validation, the step driver),
// cuda_weights.cpp (weight upload), cuda_pools.cpp (workspace, KV and window pools),
// cuda_ops.cpp (the decoder's ops, sparse selection), cuda_head.cpp (LM head, greedy and sampled
// outputs), cuda_graphs.cpp (CUDA graphs); cuda_forward_internal.h holds what they share.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "decoder/decoder.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/sampling.h"
#include "model/model_config.h"
#include "model/weight_store.h"
#include "shard/forward.h"
#include "shard/tp_slice.h"

namespace tessera {

class DeviceComm;
struct CudaApi;

struct CudaForwardOptions {
  int device = 0;
  int64_t block_size = 16;              // tokens per KV block
  int64_t max_tokens_per_step = 2048;   // new tokens of all sequences in one run()
  int64_t max_seqs_per_step = 256;      // sequences in one run()
  int64_t max_logit_rows = 256;         // logit rows per LM-head pass (more run in several passes)
  double kv_headroom = 0.10;            // fraction of total device memory left free after the KV pool
  int64_t max_kv_blocks = 0;            // > 0: at most this many KV blocks
  bool defer_kv_pool = false;           // true: no KV pool until configure_kv()
  KvDtype kv_dtype = KvDtype::kF32;     // the KV pools' elements: fp32 or fp16 (others are refused)
  bool cuda_graphs = true;              // decode steps as CUDA graph replays
  int64_t max_graph_batch = 256;        // the largest graphed bucket (also <= max_seqs_per_step)
  // The most tokens of one sequence in a graphed step (a speculative piece's k + 1), a power of
  // two; a graphed step's bucket * q rows also stay <= max_logit_rows and max_tokens_per_step.
  int64_t max_graph_tokens = 16;
  // Decode attention split over the sequence in pieces of this many keys (at most 32 pieces)
  // while a step has fewer than 1024 (sequence, head) pairs. 0: pieces of 512 keys when the
  // context is longer than 1024; < 0: never split.
  int64_t decode_split_keys = 0;
  // run_sampled(): penalty entries (token ids with a repetition / presence / frequency penalty
  // or a ban) one step may carry for all its rows; a step with more samples on the host.
  int64_t max_penalty_entries = 65536;
  // Sparse decode attention (see above and shard/cuda_ops.cpp). enabled: threshold_tokens >= 1
  // and select's sink >= 0, recent >= 1, top >= 0. `measure` (--sparse-attention auto) is
  // refused: the backend resolves it first (shard/cuda_backend.h).
  SparseAttentionConfig sparse;
};

// What one run() enqueued (host side): the numbers the GPU benchmark reports.
struct CudaStepStats {
  int64_t launches = 0;     // kernel, GEMM, collective, copy and graph launches enqueued
  bool graphed = false;     // replayed a CUDA graph
  bool captured = false;    // captured that graph first (this step)
  int64_t bucket = 0;       // the padded batch of a graphed step
  int64_t graph_tokens = 0; // its token rows per sequence (1: a plain decode step)
  double host_micros = 0;   // run() entry until every launch was enqueued (before the wait)
  double total_micros = 0;  // run() entry until the logits were on the host
};

// The device-sampling row of a sequence whose host state is `sampler` (its parameters, the
// uniform of its next draw) with `banned` ids; appends the row's penalty entries (one per id the
// repetition / presence / frequency penalties or the bans touch) to `penalties`.
TesseraCudaSampleRow device_sample_row(const Sampler& sampler, std::span<const int32_t> banned,
                                       std::vector<TesseraCudaPenalty>& penalties);

class CudaForward : private DecoderBackend {
 public:
  // Uploads `weights` (this rank's slice as laid out by `layout`), allocates the workspace and
  // the KV pool. `comm` may be null at TP 1; at TP > 1 it must be an NcclComm of layout.tp_size
  // ranks. config, layout and comm must outlive the object; `weights` may be released after.
  // Errors: Unavailable (no CUDA library / device, a CUDA call failed), ResourceExhausted (the
  // weights and workspace leave no room for one KV block), InvalidArgument (bad options, a
  // communicator that does not match).
  static Result<std::unique_ptr<CudaForward>> create(const ModelConfig& config, const ShardLayout& layout,
                                                     const ModelWeights& weights, DeviceComm* comm,
                                                     const CudaForwardOptions& options);
  // The same with the layers described by `arch` (the other overload describes them with
  // describe_architecture(config, weights)). Unimplemented when the decoder needs an op this
  // backend lacks (Decoder::check_backend).
  static Result<std::unique_ptr<CudaForward>> create(const ModelConfig& config, const ShardLayout& layout,
                                                     const ModelWeights& weights, DeviceComm* comm,
                                                     const CudaForwardOptions& options, ArchSpec arch);
  ~CudaForward();
  CudaForward(const CudaForward&) = delete;
  CudaForward& operator=(const CudaForward&) = delete;

  // As ForwardPass::run: fp32 logits (the full vocabulary, identical on every rank) in batch
  // order, one row per token of an all_logits piece, one for a want_logits piece. Returns after
  // the logits are on the host. Errors: token id / position / block id out of range, a block
  // table too short, or a step larger than the options allow (nothing is run then); a failed
  // CUDA call (Unavailable).
  Status run(std::span<const SequenceInput> batch, std::vector<float>& logits);
  // As run(), but only each logit row's greedy token comes back: the argmax (ties to the lowest
  // id, NaN as -inf: kernels/sampling.h's greedy choice) is taken on the device (per rank over
  // its vocabulary slice at TP > 1, merged on the host), so 4 bytes a row cross to the host
  // instead of the vocabulary's logits. Rows in run()'s order.
  Status run_greedy(std::span<const SequenceInput> batch, std::vector<int32_t>& ids);
  // As run(), but each logit row is sampled on the device (tessera_cuda_sample_f32: penalties,
  // temperature, top-k / top-p / min-p, the seeded draw with rows[i].u, the chosen token's
  // logprob and top-n logprobs, Sampler::sample's semantics), so only ids and logprobs cross
  // to the host. At TP > 1 every rank samples the same all-gathered logits with the same
  // deterministic kernel, so every rank gets the same tokens. One row per sequence that wants
  // logits (no all_logits piece), rows[i] for the i-th; penalty ranges index `penalties`.
  // InvalidArgument when can_sample() says no (nothing is run then). out[i].top_logprobs holds
  // rows[i].n_logprobs entries; out[i].logprob is 0 unless asked for.
  Status run_sampled(std::span<const SequenceInput> batch, std::span<const TesseraCudaSampleRow> rows,
                     std::span<const TesseraCudaPenalty> penalties, std::vector<SampledToken>& out);
  // OK when run_sampled() can take a step with these rows and penalties: at most
  // max_seqs_per_step rows, at most options.max_penalty_entries entries with valid ranges,
  // n_logprobs in [0, TESSERA_CUDA_MAX_TOP_LOGPROBS], a vocabulary of at most 2^20 ids.
  Status can_sample(std::span<const TesseraCudaSampleRow> rows, std::span<const TesseraCudaPenalty> penalties) const;

  // With options.defer_kv_pool: the device bytes free now (after weights and workspace), what
  // a KV pool may take before any headroom.
  Result<int64_t> free_device_bytes() const;
  // With options.defer_kv_pool: allocates the KV pool of exactly num_blocks blocks of
  // block_size tokens, and with num_window_blocks > 0 the window pool of that many for the
  // windowed layers. ResourceExhausted when they do not fit; InvalidArgument when called
  // twice, with bad sizes, or with a window pool and kv_window() 0.
  Status configure_kv(int64_t block_size, int64_t num_blocks, int64_t num_window_blocks = 0);
  // Copy-on-write of a shared block of `pool`: the K and V of every layer stored there, of
  // block src into block dst, ordered before the next run() on the forward stream. OutOfRange
  // for bad ids, InvalidArgument for the window pool when there is none.
  Status copy_block(int32_t src, int32_t dst, KvPool pool = KvPool::kMain);
  // KV bytes of one token (every layer, K and V, this rank's KV heads, in options.kv_dtype).
  int64_t kv_bytes_per_token() const;
  // The window pool's figures (kv_window_layers of the config and the description): the
  // largest window of the windowed layers, and their share of kv_bytes_per_token(). 0 and 0
  // when the model has none.
  int64_t kv_window() const { return window_.window; }
  int64_t kv_window_bytes_per_token() const;
  // Key-summary bytes per block of the KV pool (0 unless options.sparse.enabled).
  int64_t kv_summary_bytes_per_block() const;
  const SparseAttentionConfig& sparse_attention() const { return options_.sparse; }
  // Accumulated over run()s, as ForwardPass's counters: decode pieces x summarized global layers
  // that attended sparsely (p + 1 >= threshold) and densely (below it), with sparse enabled.
  uint64_t sparse_attentions() const { return sparse_attentions_; }
  uint64_t dense_global_decodes() const { return dense_global_decodes_; }

  const CudaStepStats& last_step() const { return last_step_; }
  // Turns graph replays of decode steps on or off from the next run() (captured graphs stay).
  void set_cuda_graphs(bool on);
  int64_t graphs_captured() const { return static_cast<int64_t>(graphs_.size()); }
  std::string device_name() const { return device_name_; }

  int64_t num_kv_blocks() const { return num_blocks_; }
  int64_t num_window_blocks() const { return num_window_blocks_; }  // 0: no window pool
  int64_t block_size() const { return options_.block_size; }
  int64_t weight_bytes() const { return weight_bytes_; }       // device bytes of weights
  int64_t workspace_bytes() const { return workspace_bytes_; }
  int64_t kv_bytes() const { return kv_bytes_; }
  int64_t kv_summary_bytes() const { return summary_bytes_; }  // the key summaries (sparse attention)
  // The dense bytes one decode step streams from the weights (every layer matrix and the LM
  // head, not the embedding): the numerator of the bandwidth floor.
  int64_t weight_bytes_per_step() const { return step_weight_bytes_; }

  struct Matrix;   // a device weight matrix (cuda_forward_internal.h)
  struct Layer;

 private:
  CudaForward(const ModelConfig& config, const ShardLayout& layout, DeviceComm* comm,
              const CudaForwardOptions& options);
  // Offsets (int32 elements) of the step metadata regions for T tokens (and as many logit rows
  // at most), S sequences and block tables of table_cap columns; with window_tables a second
  // table region of the same shape (the window pool's), otherwise window_tables == total.
  struct MetaLayout {
    int64_t tokens = 0, positions = 0, out_rows = 0, query_begin = 0, query_len = 0, start_pos = 0, seq_lens = 0,
            tables = 0, window_tables = 0, total = 0;
    MetaLayout() = default;
    MetaLayout(int64_t T, int64_t S, int64_t table_cap, bool window_tables);
  };

  Status init(const ModelWeights& weights);
  Status upload_weights(const ModelWeights& weights);
  Status allocate_workspace();
  Status allocate_kv_pool();
  Result<void*> device_alloc(int64_t bytes, const char* what);
  Status allocate_kv(int64_t block_size, int64_t num_blocks, int64_t num_window_blocks);
  // Host metadata of the step: sequence s's block table (and window table) row, its first
  // `used` entries then zeros to table_stride_ (in null: a padding row, all zeros); the KV
  // slot(s) of token row `row` at position pos (in null: -1, no write).
  void fill_tables(const SequenceInput* in, int64_t s, int64_t used);
  void set_slots(const SequenceInput* in, int64_t row, int64_t pos);
  Status validate(std::span<const SequenceInput> batch) const;
  // Enqueues embedding .. LM head (and the TP all-gather) for the metadata already on the
  // device: n token rows, n_out logit rows.
  // (The layer sequence is the decoder's: Decoder::forward calls the DecoderBackend ops below.)
  Status enqueue_forward(int64_t n, bool all_decode);
  // What a step returns: logits, greedy ids, or tokens sampled on the device.
  enum class Output { kLogits = 0, kGreedy = 1, kSampled = 2 };
  struct StepOut {
    Output kind = Output::kLogits;
    std::vector<float>* logits = nullptr;
    std::vector<int32_t>* ids = nullptr;
    std::vector<SampledToken>* sampled = nullptr;
    std::span<const TesseraCudaSampleRow> rows;
    std::span<const TesseraCudaPenalty> penalties;
  };
  // Uploads rows [0, n_rows) of h_sample_rows_ and the penalty entries (stream order).
  Status upload_sampling(int64_t n_rows, std::span<const TesseraCudaPenalty> penalties);
  Status enqueue_lm_head(int64_t row0, int64_t count, Output kind);
  Status download_logits(int64_t n_rows, int64_t n_real, float* out);
  Status download_greedy(int64_t n_rows, int64_t n_real, int32_t* out);
  // The sampled tokens of a piece's first n_real logit rows (rows: their parameters).
  Status download_sampled(int64_t n_real, std::span<const TesseraCudaSampleRow> rows, SampledToken* out);
  Status run_step(std::span<const SequenceInput> batch, const StepOut& out);
  // Decides whether the step enqueues sparse selection (sparse_step_) and counts its pieces.
  void plan_sparse(std::span<const SequenceInput> batch);
  void count_sparse();
  // Enqueues the summary update of layer l (after its KV write) and, in a sparse step, the
  // selection; *tables / *seq_lens / *start_pos then point at the compacted arrays.
  Status enqueue_sparse(int64_t l, const LayerSpec& spec, const void* k_cache, int64_t n_tokens,
                        const int32_t** tables, const int32_t** seq_lens, const int32_t** start_pos);
  // The token rows per sequence of a graphed step for `batch` (a power of two), or 0 when the
  // step runs eagerly (see "CUDA graphs" in shard/cuda_graphs.cpp).
  int64_t graph_tokens(std::span<const SequenceInput> batch) const;
  Status run_graphed(std::span<const SequenceInput> batch, const StepOut& out, int64_t q);
  int64_t graph_bucket(int64_t n_seqs) const;
  Status gemm(const Matrix& m, const uint16_t* x16, float* y, int64_t n_tokens);
  float* act(Act a) const;
  int64_t act_width(Act a) const;
  const Matrix& matrix(WeightRef w) const;
  const float* vector(WeightRef w) const;

  // DecoderBackend: the ops of the layer graph, enqueued on the forward stream for the step
  // whose metadata is on the device (all_decode_: one token per sequence).
  std::string_view backend_name() const override { return "CUDA"; }
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
  DeviceComm* comm_;
  CudaForwardOptions options_;
  const CudaApi* api_ = nullptr;
  void* stream_ = nullptr;
  bool owns_stream_ = false;
  void* blas_ = nullptr;
  std::vector<void*> allocations_;

  // weights
  std::unique_ptr<Matrix> embed_;  // f16 [vocab, hidden]
  std::unique_ptr<Matrix> lm_head_own_;
  const Matrix* lm_head_ = nullptr;
  float* final_norm_ = nullptr;
  std::vector<Layer> layers_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<float*> inv_freq_;  // the ArchSpec's RoPE tables on the device
  bool all_decode_ = false;       // the step being enqueued decodes one token per sequence
  int64_t graph_query_len_ = 0;   // > 0: a graphed step's rows per sequence (the attention grid's queries)
  int64_t weight_bytes_ = 0, workspace_bytes_ = 0, kv_bytes_ = 0, step_weight_bytes_ = 0;

  // workspace (device)
  float *x_ = nullptr, *h_ = nullptr, *proj_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr;
  float *attn_ = nullptr, *gate_ = nullptr, *up_ = nullptr, *logits_ = nullptr, *gathered_ = nullptr;
  uint16_t* act16_ = nullptr;
  // split decode attention (long contexts, small batches): pieces and their partial states
  int64_t decode_splits_ = 0, decode_split_keys_ = 0;
  float* decode_partial_ = nullptr;
  int32_t* greedy_ = nullptr;           // [ids | values] of max_logit_rows rows
  int32_t* greedy_gathered_ = nullptr;  // tp_size of those
  std::vector<int32_t> h_greedy_;
  // device sampling: per-row parameters (max_seqs_per_step), penalty entries, the weights'
  // scratch [max_logit_rows, vocab], the full logits at TP > 1 (unsharded from gathered_),
  // and the results [ids | logprobs | top ids | top logprobs] of max_logit_rows rows.
  TesseraCudaSampleRow* sample_rows_ = nullptr;
  TesseraCudaPenalty* penalties_ = nullptr;
  float* sample_scratch_ = nullptr;
  float* full_logits_ = nullptr;
  int32_t* sampled_ = nullptr;
  std::vector<TesseraCudaSampleRow> h_sample_rows_;
  std::vector<int32_t> h_sampled_;
  // f16 copy of one INT8 / INT4 / GGUF-block matrix for large steps (then cuBLAS), sized for
  // the largest such matrix; null when every matrix is f16.
  uint16_t* dequant_ = nullptr;
  int64_t dequant_elems_ = 0;
  int32_t* meta_ = nullptr;  // tokens | positions | out_rows | query_begin | query_len | start_pos | seq_lens | tables
  MetaLayout meta_at_;       // where the current step's regions are in meta_ (and h_meta_)
  int64_t* slots_ = nullptr;
  int64_t* window_slots_ = nullptr;  // with a window pool: the slots in it (window tables)
  int64_t max_table_blocks_ = 0;  // blocks a sequence of max_positions tokens needs
  // host mirror of the metadata, reused every step
  std::vector<int32_t> h_meta_;
  std::vector<int64_t> h_slots_, h_window_slots_;
  std::vector<float> h_gathered_;

  // KV pool
  // The pools' elements (options_.kv_dtype) are kv_elem_bytes_ bytes each.
  int64_t kv_elem_bytes_ = 4;
  uint8_t* kv_pool_ = nullptr;
  int64_t num_blocks_ = 0;
  int64_t layer_kv_bytes_ = 0;  // bytes of one layer's K (or V)
  // window pool (num_window_blocks_ > 0): the layers window_.layers marks live there
  KvWindowLayers window_;       // from the description, at create()
  uint8_t* window_pool_ = nullptr;
  int64_t num_window_blocks_ = 0;
  int64_t window_layer_kv_bytes_ = 0;
  std::vector<int64_t> pool_index_;  // per layer: its index among its pool's layers
  int64_t table_stride_ = 0;     // block-table columns of the current step
  // sparse decode attention (options_.sparse.enabled)
  std::vector<int64_t> summary_index_;  // per layer: its index among the summarized layers, -1: none
  int64_t n_summarized_ = 0, n_sparse_layers_ = 0;  // summarized layers; those with no sliding window
  int64_t summary_bytes_ = 0;
  float* summaries_ = nullptr;          // [summarized layer][min|max][num_blocks][n_kv_heads][head_dim]
  float* sparse_scores_ = nullptr;      // [max_seqs_per_step * max_table_blocks_]
  float* sparse_gathered_ = nullptr;    // TP > 1: tp_size of those
  int32_t* sparse_meta_ = nullptr;      // compact tables [S * max_table_blocks_] | seq_lens [S] | start_pos [S]
  bool sparse_step_ = false;            // this step enqueues the selection
  uint64_t step_sparse_ = 0, step_dense_ = 0;  // this step's decode pieces past / below the threshold
  uint64_t sparse_attentions_ = 0, dense_global_decodes_ = 0;
  int64_t n_seqs_ = 0;
  bool kv_ready_ = false;

  // CUDA graphs, one per bucket (padded batch size), token rows per sequence and output kind,
  // captured on first use: (graph_key, graph exec)
  std::vector<std::pair<int64_t, void*>> graphs_;
  int64_t max_graph_batch_ = 0;
  CudaStepStats last_step_;
  std::chrono::steady_clock::time_point step_start_;
  std::string device_name_;
};

}  // namespace tessera
