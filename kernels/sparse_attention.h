// Query-aware sparse decode attention over the paged KV cache (Quest: Tang et al., "Quest:
// Query-Aware Sparsity for Efficient Long-Context LLM Inference", ICML 2024), CPU.
//
// Method. For every physical block and KV head the cache keeps a summary: the element-wise
// minimum and maximum of the block's keys. For a decode query q (one head, KV head g),
//   bound(q, block) = sum_d max(q_d * kmin[g][d], q_d * kmax[g][d])  >=  max over the block's keys k of q . k,
// since each term is at least q_d * k_d for every key of the block. A logical block's score is
// the largest bound over the query heads; the block's keys can only win attention mass if
// that score is high. A decode step attends to the first `sink_blocks` blocks (attention sinks),
// the last `recent_blocks` (the current, partially filled block among them) and the
// `top_blocks` highest-scoring blocks in between, instead of the whole sequence.
//
// Execution reuses paged_attention unchanged: keys are stored after RoPE, so attention uses
// positions only for the causal mask. The physical ids of the selected blocks, in logical
// order, form a *compacted* block table, and the query's position becomes
// (selected blocks - 1) * block_size + pos % block_size: every selected block before the last
// is full and wholly visible, the last is the current block, visible up to the query's slot.
//
// Contract:
//  * Summaries: KvBlockSummaries holds [num_blocks][n_kv_heads][head_dim] fp32 minima and maxima
//    for one cache layer, indexed by physical block id like the cache; owned by the caller.
//    Call kv_summary_update after every kv_write of the layer (same table, same positions);
//    the summaries of the blocks a sequence attends to must be current before selection.
//  * Selection and sparse_decode_attention are for one decode token (n_tokens == 1) of a
//    global-attention layer: sliding-window args are refused (the window already bounds the
//    work, and its mask would not survive compaction).
//  * Determinism: scores use a fixed arithmetic (8 lanes, lane d % 8 summed in increasing d,
//    lanes combined as ((0+4)+(2+6))+((1+5)+(3+7)), no FMA), so the selection depends neither on
//    the ISA nor on the thread count; ties go to the lower logical block index. When every
//    block is selected (the sequence has at most sink + recent + top blocks), the result is
//    bit-identical to paged_attention.
//  * Cost per decode step and layer: reading the summaries of the sequence's blocks
//    (2 * n_kv_heads * head_dim floats per block, 1/8 of an fp32 K cache at block_size 16)
//    and n_heads * head_dim multiply-max-adds per block, spread over the pool; then attention
//    over at most (sink + recent + top) * block_size keys.
//  * No heap allocation per call once a SparseScratch has seen a sequence this long.
//
// Thread-safety: the functions may run concurrently on different scratches and different
// outputs; summaries must not be updated while a selection reads them (the same rule as the
// cache itself).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/kv_config.h"
#include "common/shard_options.h"
#include "kernels/paged_attention.h"

namespace tessera {

class ThreadPool;

// Per physical block and KV head, the element-wise min and max of the block's keys, over slots
// 0 .. last written slot. Layout of each array: [num_blocks][n_kv_heads][head_dim] fp32.
struct KvBlockSummaries {
  float* kmin = nullptr;
  float* kmax = nullptr;
  int64_t num_blocks = 0;  // as the cache layer's num_blocks
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
};

// After kv_write(kv, block_table, start_pos, n_tokens, ...): recomputes, from the cache
// contents (fp32 or fp16), the summaries of every block that positions start_pos ..
// start_pos + n_tokens - 1 touch, over slots 0 .. the block's last written slot (the block's
// earlier slots must hold the sequence's earlier positions). Costs one read of those slots.
void kv_summary_update(const PagedKvLayer& kv, const KvBlockSummaries& s, const int32_t* block_table,
                       int64_t start_pos, int64_t n_tokens);

// SparseSelectOptions and SparseAttentionConfig: common/shard_options.h.

// The start-up measurement behind `--sparse-attention auto`: one decode query's attention in one
// global layer of this shape, dense (paged_attention over the whole context) against sparse
// (selection + attention over the selected blocks), over synthetic keys and values in the
// cache's element type, at contexts of 1024, 2048, ... tokens up to max_context (the last one
// max_context itself), the fastest of `reps` timings each after one warm-up. The measurement
// stops at the first context where sparse attention is at least min_speedup times as fast as
// dense: that context is threshold_tokens (0 when no measured context reaches it; then sparse
// attention does not pay for this shape on this machine). Allocates the K, V and summaries of
// the largest context measured (freed on return).
struct SparseCrossoverPoint {
  int64_t context = 0;
  double dense_us = 0;
  double sparse_us = 0;
};
struct SparseCrossover {
  std::vector<SparseCrossoverPoint> points;
  int64_t threshold_tokens = 0;
  double min_speedup = 0;
  double seconds = 0;  // the measurement's own time
};
struct SparseCrossoverShape {
  int64_t n_heads = 0;  // query heads of the shard
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;
  KvDtype dtype = KvDtype::kF32;  // the cache's elements: fp32, fp16 or int8
};
SparseCrossover measure_sparse_crossover(const SparseCrossoverShape& shape, const SparseSelectOptions& opt,
                                         int64_t max_context, double min_speedup, int reps, ThreadPool* pool);
// "1024: 210/190 us, 2048: ... -> sparse from 4096 tokens (>= 2x)" for start-up logs.
std::string describe_sparse_crossover(const SparseCrossover& c);

// Working memory of sparse selection and attention for one caller thread: grown on first use,
// then reused. After sparse_select_blocks or sparse_decode_attention, `selected` holds the
// selection (logical block indices, increasing).
struct SparseScratch {
  std::vector<float> scores;        // per logical block
  std::vector<int32_t> candidates;  // logical blocks ranked for the top_blocks
  std::vector<int32_t> selected;
  std::vector<int32_t> table;       // compacted block table
};

// The Quest bound of one query head over one block: sum_d max(q[d] * kmin[d], q[d] * kmax[d])
// in the canonical arithmetic above. q, kmin, kmax: head_dim floats.
float quest_bound(const float* q, const float* kmin, const float* kmax, int64_t head_dim);

// Scores of logical blocks 0 .. scores.size() - 1 of the sequence of `args` (its q, n_heads and
// block_table; n_heads % n_kv_heads == 0, query head h reads KV head h / (n_heads / n_kv_heads)):
// scores[i] = max over query heads of quest_bound against block block_table[i]. A NaN bound
// counts as -inf. Unscaled (args.scale does not change the ranking).
void sparse_block_scores(const KvBlockSummaries& s, const AttentionArgs& args, std::span<float> scores,
                         ThreadPool* pool);

// The blocks the decode query of `args` (n_tokens == 1 at position start_pos, so the sequence
// has start_pos + 1 positions and n_blocks = start_pos / block_size + 1 blocks) attends to,
// as logical block indices in increasing order: all blocks when n_blocks <= sink + recent + top,
// else the first sink_blocks, the last recent_blocks and the top_blocks highest-scoring blocks
// between them (ties: lower index). The span points into scratch.selected.
std::span<const int32_t> sparse_select_blocks(const PagedKvLayer& kv, const KvBlockSummaries& s,
                                              const AttentionArgs& args, const SparseSelectOptions& opt,
                                              ThreadPool* pool, SparseScratch& scratch);

// Writes block_table[selected[i]] to compact_table[i] for every i and returns the position of a
// decode query at `pos` in the compacted sequence: (selected.size() - 1) * block_size +
// pos % block_size. Precondition: selected is strictly increasing and ends with pos / block_size.
int64_t sparse_compact_block_table(std::span<const int32_t> selected, const int32_t* block_table, int64_t pos,
                                   int64_t block_size, int32_t* compact_table);

// The arguments of dense attention over the selection: args with the compacted block table (in
// scratch.table, valid until the scratch's next use) and the remapped start_pos. For a caller
// that runs many sequences' attention in one paged_attention_batch.
AttentionArgs sparse_decode_args(const PagedKvLayer& kv, const KvBlockSummaries& s, const AttentionArgs& args,
                                 const SparseSelectOptions& opt, ThreadPool* pool, SparseScratch& scratch);

// The same in two phases, for tensor parallelism, where each rank holds some of the query heads
// and the ranks must attend to the same blocks (the selection of one process over every head):
// sparse_score_blocks writes the scores of the competing blocks (logical sink_blocks ..
// n_blocks - recent_blocks - 1) into scratch.scores and returns them as a span (empty when the
// selection covers every block: nothing to score); the caller may combine them across ranks
// (the element-wise max is the score over every rank's heads, bit-exact); then
// sparse_args_from_scores selects from scratch.scores and returns the compacted arguments, as
// sparse_decode_args. sparse_select_scored: the selection alone (as sparse_select_blocks).
std::span<float> sparse_score_blocks(const PagedKvLayer& kv, const KvBlockSummaries& s, const AttentionArgs& args,
                                     const SparseSelectOptions& opt, ThreadPool* pool, SparseScratch& scratch);
std::span<const int32_t> sparse_select_scored(int64_t pos, int64_t block_size, const SparseSelectOptions& opt,
                                              SparseScratch& scratch);
AttentionArgs sparse_args_from_scores(const PagedKvLayer& kv, const AttentionArgs& args,
                                      const SparseSelectOptions& opt, SparseScratch& scratch);

// Sparse attention of one decode token: sparse_decode_args, then paged_attention over the
// compacted table into args.out. Preconditions: args.n_tokens == 1,
// args.sliding_window == 0, the cache and the summaries hold positions 0 .. args.start_pos.
void sparse_decode_attention(const PagedKvLayer& kv, const KvBlockSummaries& s, const AttentionArgs& args,
                             const SparseSelectOptions& opt, ThreadPool* pool, SparseScratch& scratch);

}  // namespace tessera
