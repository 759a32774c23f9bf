// CudaForward's CUDA graphs: which steps replay a graph (set_cuda_graphs, graph_bucket,
// graph_tokens), and run_graphed(), which pads such a step to its bucket, captures its graph on
// the key's first step and replays it.
//
// CUDA graphs (options.cuda_graphs): a step in which every sequence wants the logits of each of
// its tokens runs as one graph launch: plain decode steps (one token a sequence) and speculative
// verification steps (the last known token and k drafts, all_logits, k + 1 <= max_graph_tokens),
// plain decodes beside them. The batch is padded to a bucket of sequences (1, 2, 4, ... up to
// max_graph_batch) and every sequence to a bucket of token rows q (1, 2, 4, ... up to
// max_graph_tokens; sequence s owns rows [s * q, s * q + q)): padding sequences decode token 0
// at position 0, a sequence's rows past its tokens are dead rows, and neither writes KV (slot
// -1) nor returns logits (the real logit rows are gathered first, the rest repeat row 0). Rows
// never mix in any op, so dead rows cannot reach real ones. The step's metadata goes to the
// same device buffers every time (block tables at a fixed stride, the prefill attention's grid
// sized for q queries a sequence, each reading its own count from the device), so the graph
// captured on the (bucket, q, output) key's first step (embedding .. LM head, NCCL collectives
// included) is replayed for every later one. Other steps (prefill chunks, which want one row of
// several tokens; steps over the graph limits) run eagerly.

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "shard/cuda_forward_internal.h"

namespace tessera {

using cuda_forward_detail::micros_since;

void CudaForward::set_cuda_graphs(bool on) {
  options_.cuda_graphs = on;
  max_graph_batch_ = on ? std::min({options_.max_graph_batch, options_.max_seqs_per_step, options_.max_logit_rows,
                                    options_.max_tokens_per_step})
                        : 0;
}

int64_t CudaForward::graph_bucket(int64_t n_seqs) const {
  int64_t b = 1;
  while (b < n_seqs) b *= 2;
  return std::min(b, max_graph_batch_);
}

int64_t CudaForward::graph_tokens(std::span<const SequenceInput> batch) const {
  const auto n_seqs = static_cast<int64_t>(batch.size());
  if (max_graph_batch_ == 0 || n_seqs == 0 || n_seqs > max_graph_batch_) return 0;
  int64_t longest = 1;
  for (const SequenceInput& in : batch) {
    const auto len = static_cast<int64_t>(in.tokens.size());
    // Every row's logits: one decode token, or a verification piece (all_logits).
    if (!in.want_logits || (len > 1 && !in.all_logits) || len > options_.max_graph_tokens) return 0;
    longest = std::max(longest, len);
  }
  int64_t q = 1;
  while (q < longest) q *= 2;
  // The padded step's rows are all token rows and all logit rows of the graph.
  const int64_t rows = graph_bucket(n_seqs) * q;
  if (q > 1 && (rows > options_.max_logit_rows || rows > options_.max_tokens_per_step)) return 0;
  return q;
}

Status CudaForward::run_graphed(std::span<const SequenceInput> batch, const StepOut& out, int64_t q) {
  const int64_t bs = options_.block_size;
  const auto n_real = static_cast<int64_t>(batch.size());
  const int64_t bucket = graph_bucket(n_real);
  const int64_t T = bucket * q;  // token rows, and logit rows of the LM head
  // Fixed shapes for the graph: `bucket` sequences of q token rows, block tables at the full
  // stride, the regions packed for the bucket (the same offsets at every replay of its graph).
  // Padding sequences decode token 0 at position 0 of a one-key sequence in block 0; dead rows
  // (past a sequence's tokens) hold token 0 at position 0. Neither writes KV (slot -1), and their
  // outputs are never read: the real logit rows come first in out_rows, the rest repeat row 0.
  n_seqs_ = bucket;
  table_stride_ = max_table_blocks_;
  graph_query_len_ = q;
  meta_at_ = MetaLayout(T, bucket, table_stride_, num_window_blocks_ > 0);
  const MetaLayout& meta = meta_at_;
  int64_t n_out = 0;
  for (int64_t s = 0; s < bucket; ++s) {
    const bool real = s < n_real;
    const SequenceInput* in = real ? &batch[static_cast<size_t>(s)] : nullptr;
    const int64_t pos = real ? in->start_pos : 0;
    const int64_t len = real ? static_cast<int64_t>(in->tokens.size()) : 1;
    h_meta_[static_cast<size_t>(meta.query_begin + s)] = static_cast<int32_t>(s * q);
    h_meta_[static_cast<size_t>(meta.query_len + s)] = static_cast<int32_t>(len);
    h_meta_[static_cast<size_t>(meta.start_pos + s)] = static_cast<int32_t>(pos);
    h_meta_[static_cast<size_t>(meta.seq_lens + s)] = static_cast<int32_t>(pos + len);
    fill_tables(in, s, real ? (pos + len + bs - 1) / bs : 0);
    for (int64_t i = 0; i < q; ++i) {
      const int64_t row = s * q + i;
      const bool live = real && i < len;
      h_meta_[static_cast<size_t>(meta.tokens + row)] = live ? in->tokens[static_cast<size_t>(i)] : 0;
      h_meta_[static_cast<size_t>(meta.positions + row)] = live ? static_cast<int32_t>(pos + i) : 0;
      set_slots(live ? in : nullptr, row, pos + i);
    }
    if (real)  // graph_tokens() admitted only pieces that want every row (one row: its last)
      for (int64_t i = in->all_logits ? 0 : len - 1; i < len; ++i)
        h_meta_[static_cast<size_t>(meta.out_rows + n_out++)] = static_cast<int32_t>(s * q + i);
  }
  for (int64_t r = n_out; r < T; ++r) h_meta_[static_cast<size_t>(meta.out_rows + r)] = 0;
  TESSERA_CUDA_TRY(api_->set_device(options_.device), "select the CUDA device");
  // Every region the graph reads, at the bucket's offsets.
  TESSERA_CUDA_LAUNCH(api_->device_memcpy_async(meta_, h_meta_.data(), meta.total * 4, stream_),
                      "upload step metadata");
  TESSERA_CUDA_LAUNCH(api_->device_memcpy_async(slots_, h_slots_.data(), T * 8, stream_), "upload KV slots");
  if (window_slots_)
    TESSERA_CUDA_LAUNCH(api_->device_memcpy_async(window_slots_, h_window_slots_.data(), T * 8, stream_),
                        "upload window-pool KV slots");
  if (out.kind == Output::kSampled) {
    // Padding rows: greedy, no logprobs, no penalties (their tokens are dropped).
    for (int64_t r = n_out; r < T; ++r) h_sample_rows_[static_cast<size_t>(r)] = TesseraCudaSampleRow{};
    TESSERA_RETURN_IF_ERROR(upload_sampling(T, out.penalties));
  }
  // One graph per bucket, rows per sequence, output kind (logits, greedy ids or tokens sampled
  // on the device) and whether it selects sparse blocks.
  const int64_t key =
      ((bucket * (options_.max_graph_tokens + 1) + q) * 3 + static_cast<int64_t>(out.kind)) * 2 + (sparse_step_ ? 1 : 0);
  void* graph = nullptr;
  for (const auto& [k, g] : graphs_)
    if (k == key) graph = g;
  if (!graph) {
    TESSERA_CUDA_TRY(api_->graph_begin_capture(stream_),
                     fmt::format("begin capturing the step graph of {} x {} rows", bucket, q));
    const int64_t before = last_step_.launches;
    Status s = enqueue_forward(T, /*all_decode=*/q == 1);
    if (s.is_ok()) s = enqueue_lm_head(0, T, out.kind);
    last_step_.launches = before;  // captured, not launched
    void* captured = nullptr;
    const int rc = api_->graph_end_capture(stream_, &captured);
    if (!s.is_ok()) {
      if (rc == 0) api_->graph_destroy(captured);
      return s.with_context(fmt::format("capturing the step graph of {} x {} rows", bucket, q));
    }
    TESSERA_CUDA_TRY(rc, fmt::format("instantiate the step graph of {} x {} rows", bucket, q));
    graphs_.emplace_back(key, captured);
    graph = captured;
    last_step_.captured = true;
  }
  TESSERA_CUDA_LAUNCH(api_->graph_launch(graph, stream_), "launch the step graph");
  count_sparse();
  last_step_.graphed = true;
  last_step_.bucket = bucket;
  last_step_.graph_tokens = q;
  switch (out.kind) {
    case Output::kGreedy:
      out.ids->resize(static_cast<size_t>(n_out));
      TESSERA_RETURN_IF_ERROR(download_greedy(T, n_out, out.ids->data()));
      break;
    case Output::kSampled:
      out.sampled->resize(static_cast<size_t>(n_out));
      TESSERA_RETURN_IF_ERROR(download_sampled(n_out, out.rows, out.sampled->data()));
      break;
    case Output::kLogits:
      out.logits->resize(static_cast<size_t>(n_out * config_.vocab));
      TESSERA_RETURN_IF_ERROR(download_logits(T, n_out, out.logits->data()));
      break;
  }
  last_step_.total_micros = micros_since(step_start_);
  return Status::ok();
}

}  // namespace tessera
