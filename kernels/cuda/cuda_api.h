// C entry points of the CUDA backend library (libtessera_cuda.so), resolved with dlsym by the
// shard and the GPU tests (kernels/cuda/cuda_loader.h). Nothing that includes this header links
// CUDA: it only declares plain C functions.
//
// Conventions for every function below:
//  * Returns 0 on success, non-zero on failure (a CUDA, cuBLAS or NCCL error code, or -1 for
//    bad arguments / a feature this build lacks); the message of the last error *of the calling
//    thread* is tessera_cuda_last_error().
//  * Pointers named d_* (and all tensor arguments of the ops) are device pointers; h_* are host.
//  * `stream` is a cudaStream_t passed as void*; 0 means the legacy default stream.
//  * Kernel launches are asynchronous: a 0 return means the launch was accepted; errors during
//    execution appear at the next synchronising call.
//  * Activations are fp32 in this first version (embedding can also write f16, and the GEMM
//    takes f16 inputs, see tessera_cuda_convert_f32_to_f16). Sizes are counts of elements
//    unless the name says bytes.
//  * An op's argument struct (`const struct TesseraCuda...Args* args`) is host memory read
//    during the call, like its scalar arguments (a graph capture keeps the values); the device
//    arrays it points to are read when the op runs.
//
// The entry points are one list, TESSERA_CUDA_ENTRY_POINTS below (an X-macro): the signature of
// each is written there once, next to its doc comment, and the rest is generated from it: the
// extern "C" declarations at the end of this header, the CudaApi table and its dlsym
// (cuda_loader.{h,cpp}), the fake backend's exported ops (tests/gpu/fake_cuda_backend.cpp).
// Adding an entry point = its list entry + its definition in the library (a .cu; host-only code
// in a .cpp) + its definition in the fake backend; the compiler checks every definition against
// the declaration the list makes, and open_cuda_api() fails on a library that lacks one.
#pragma once

#include <stdint.h>

#include "common/block_geometry.h"  // the GGUF block formats (no standard library)

extern "C" {

// ---- types of the ops' arguments (the ops themselves are documented in the list) ----

// Table dtypes / activation dtypes for the embedding.
enum { TESSERA_CUDA_F32 = 0, TESSERA_CUDA_F16 = 1 };

// The arguments of rope_kv_write_f32 (RoPE + paged KV write).
struct TesseraCudaRopeKvArgs {
  float* q;                 // [n_tokens, n_heads, head_dim], rotated in place
  const float* k;           // [n_tokens, n_kv_heads, head_dim], not modified
  const float* v;           // [n_tokens, n_kv_heads, head_dim]
  const int32_t* positions; // [n_tokens]
  const int64_t* slots;     // [n_tokens]
  const float* inv_freq;    // [head_dim / 2]
  void* k_cache;            // elements of kv_dtype
  void* v_cache;
  int64_t n_tokens;
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;         // even
  int64_t block_size;
  int64_t num_blocks;       // slots >= num_blocks * block_size are skipped like negative ones
  int32_t kv_dtype;         // the cache's elements: TESSERA_CUDA_F32 or TESSERA_CUDA_F16
};

// The arguments of paged_decode_attention_f32.
struct TesseraCudaDecodeAttentionArgs {
  const float* q;               // [n_seqs, n_heads, head_dim], RoPE applied
  float* out;                   // [n_seqs, n_heads, head_dim]
  const void* k_cache;          // the paged layout of rope_kv_write_f32, elements of kv_dtype
  const void* v_cache;
  const int32_t* block_tables;  // [n_seqs, max_blocks_per_seq] block ids
  const int32_t* seq_lens;      // [n_seqs] keys in the cache including this token, >= 1
  int64_t n_seqs;
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t block_size;
  int64_t max_blocks_per_seq;
  float scale;                  // usually 1/sqrt(head_dim)
  int64_t sliding_window;       // > 0: only the last sliding_window keys
  int64_t n_splits;             // <= 1: one block per (sequence, head); else split (the op's doc)
  int64_t split_keys;           // keys per piece when n_splits > 1 (> 0)
  float* partial;               // [n_seqs, n_heads, n_splits, head_dim + 2] when n_splits > 1
  int32_t kv_dtype;             // the cache's elements: TESSERA_CUDA_F32 or TESSERA_CUDA_F16
};

// The arguments of kv_summary_update_f32 (Quest key summaries, kernels/sparse_attention.h).
struct TesseraCudaKvSummaryArgs {
  const void* k_cache;      // one layer's K, the paged layout of rope_kv_write_f32, elements of kv_dtype
  float* kmin;              // [num_blocks][n_kv_heads][head_dim]: element-wise min of a block's keys
  float* kmax;              // [num_blocks][n_kv_heads][head_dim]: element-wise max
  const int64_t* slots;     // [n_tokens] the step's KV slots (rope_kv_write_f32's; < 0: no write)
  int64_t n_tokens;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t block_size;
  int64_t num_blocks;       // slots >= num_blocks * block_size are skipped like negative ones
  int32_t kv_dtype;         // TESSERA_CUDA_F32 or TESSERA_CUDA_F16
};

// The arguments of sparse_block_scores_f32 and sparse_select_blocks (Quest block selection for
// decode attention, kernels/sparse_attention.h). Sequence s is *sparse* when
//   query_len[s] == 1 && seq_lens[s] >= threshold_tokens &&
//   n_blocks(s) > sink_blocks + recent_blocks + top_blocks,  n_blocks(s) = (seq_lens[s] - 1) / block_size + 1;
// its competing blocks are the logical blocks [sink_blocks, n_blocks(s) - recent_blocks).
struct TesseraCudaSparseArgs {
  const float* q;                // [rows, n_heads, head_dim], RoPE applied; sequence s's query is row query_begin[s]
  const float* kmin;             // the layer's summaries, as TesseraCudaKvSummaryArgs
  const float* kmax;
  const int32_t* block_tables;   // [n_seqs, max_blocks_per_seq] block ids (the step's dense tables)
  const int32_t* query_begin;    // [n_seqs]
  const int32_t* query_len;      // [n_seqs]
  const int32_t* seq_lens;       // [n_seqs] keys in the cache including the step's tokens
  float* scores;                 // [n_seqs, max_blocks_per_seq] block scores (this rank's heads)
  const float* gathered_scores;  // n_ranks > 1: [n_ranks][n_seqs, max_blocks_per_seq], every rank's scores
  int32_t* compact_tables;       // [n_seqs, max_blocks_per_seq] out: the tables attention reads
  int32_t* compact_seq_lens;     // [n_seqs] out
  int32_t* compact_start_pos;    // [n_seqs] out (the prefill kernel's start_pos)
  int64_t n_seqs;
  int64_t n_heads;               // query heads of this rank; n_heads % n_kv_heads == 0
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t block_size;
  int64_t max_blocks_per_seq;
  int64_t num_blocks;            // blocks of the summaries (a table entry outside [0, num_blocks) scores -inf)
  int64_t n_ranks;               // >= 1; > 1: selection reads the element-wise max of gathered_scores
  int64_t threshold_tokens;      // >= 1
  int64_t sink_blocks;           // >= 0
  int64_t recent_blocks;         // >= 1
  int64_t top_blocks;            // >= 0
};

// The arguments of sample_f32 (device sampling).
enum { TESSERA_CUDA_MAX_TOP_LOGPROBS = 20 };
struct TesseraCudaSampleRow {
  double u;                  // the draw's uniform in [0, 1): sampling_uniform(seed, output position)
  float temperature;         // 0: greedy
  float top_p;               // (0, 1]; 1: off
  float min_p;               // [0, 1]; 0: off
  int32_t top_k;             // <= 0 or >= vocab: off
  float repetition_penalty;  // 1: off
  float presence_penalty;
  float frequency_penalty;
  int32_t n_logprobs;     // 0 .. TESSERA_CUDA_MAX_TOP_LOGPROBS
  int32_t want_logprob;   // != 0: the chosen token's logprob (also when n_logprobs > 0)
  int32_t penalty_begin;  // this row's penalty entries: penalties[penalty_begin, penalty_end)
  int32_t penalty_end;
  int32_t pad_;
};
// One token id of one row (ids unique within a row).
struct TesseraCudaPenalty {
  int32_t id;         // ids outside [0, vocab) are ignored
  int32_t in_prompt;  // != 0: in the prompt (repetition penalty)
  int32_t out_count;  // times in the output so far
  int32_t banned;     // != 0: -inf before the penalties
};
struct TesseraCudaSampleArgs {
  float* logits;                               // [n_rows, vocab], modified
  float* scratch;                              // [n_rows, vocab]
  const struct TesseraCudaSampleRow* rows;     // [n_rows] (device)
  const struct TesseraCudaPenalty* penalties;  // (device; may be null when no row has entries)
  int64_t n_rows;
  int64_t vocab;
  int32_t* ids;         // [n_rows] the chosen token
  float* logprobs;      // [n_rows] its logprob (0 when not asked)
  int32_t* top_ids;     // [n_rows, TESSERA_CUDA_MAX_TOP_LOGPROBS]: the first
  float* top_logprobs;  //   n_logprobs of row r at r * MAX (the rest untouched)
};

// The arguments of paged_prefill_attention_f32.
struct TesseraCudaPrefillAttentionArgs {
  const float* q;               // [rows, n_heads, head_dim], RoPE applied
  float* out;                   // [rows, n_heads, head_dim]
  const void* k_cache;          // elements of kv_dtype
  const void* v_cache;
  const int32_t* block_tables;  // [n_seqs, max_blocks_per_seq] block ids
  const int32_t* query_begin;   // [n_seqs]
  const int32_t* query_len;     // [n_seqs], each in [0, max_query_len]
  const int32_t* start_pos;     // [n_seqs]
  int64_t n_seqs;
  int64_t max_query_len;
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t block_size;
  int64_t max_blocks_per_seq;
  float scale;                  // usually 1/sqrt(head_dim)
  int64_t sliding_window;       // > 0: a query at p sees keys (p - sliding_window, p]
  int32_t kv_dtype;             // the cache's elements: TESSERA_CUDA_F32 or TESSERA_CUDA_F16
};

// The weight types of gemm_gguf / dequantize_gguf: the numeric values of tessera::QuantType
// (common/dtype.h), one per format of common/block_geometry.h's list (TESSERA_CUDA_GGUF_Q8_0 = 3,
// TESSERA_CUDA_GGUF_Q4_0 = 4, ..., TESSERA_CUDA_GGUF_TQ2_0 = 12).
enum {
#define TESSERA_CUDA_GGUF_TYPE(name, elems, bytes) \
  TESSERA_CUDA_GGUF_##name = tessera::blocks::kFirstQuantType + tessera::blocks::kIndex##name,
  TESSERA_GGUF_BLOCK_FORMATS(TESSERA_CUDA_GGUF_TYPE)
#undef TESSERA_CUDA_GGUF_TYPE
};

}  // extern "C"

// ---- the list ----
// TESSERA_CUDA_ENTRY_POINTS(CALL, OP) expands CALL or OP once per entry point:
//   CALL(return type, C symbol, CudaApi field, (parameters))
//     a host call that takes effect when it is made (device, memory, copies, streams, events,
//     graphs, cuBLAS handles, NCCL set-up); a graph capture never records it.
//   OP(return type, C symbol, CudaApi field, (parameters), (argument names))
//     work enqueued on `stream` (kernels, cuBLAS GEMMs, NCCL collectives), which a graph capture
//     records; the argument names are the parameters' names in order, for definitions that
//     forward a call (the fake backend's capture hook).
// A C++20 consumer that treats both alike passes one macro `(ret, symbol, field, params, ...)` twice.
// The doc comments are block comments because the list is one macro.
#define TESSERA_CUDA_ENTRY_POINTS(CALL, OP)                                                                          \
  /* ---- device, memory, streams, events (runtime_api.cpp) ---- */                                                  \
                                                                                                                     \
  /* Number of usable CUDA devices (0 when there is no driver or no device; never fails). */                         \
  CALL(int, tessera_cuda_device_count, device_count, ())                                                             \
  CALL(const char*, tessera_cuda_last_error, last_error, ())                                                         \
  CALL(int, tessera_cuda_set_device, set_device, (int device))                                                       \
  /* Writes the device name (NUL-terminated, truncated to `cap` bytes) and compute capability. */                    \
  CALL(int, tessera_cuda_device_info, device_info, (int device, char* h_name, int cap, int* major, int* minor))      \
  CALL(int, tessera_cuda_malloc, device_malloc, (void** d_ptr, int64_t bytes))                                       \
  /* null is fine */                                                                                                 \
  CALL(int, tessera_cuda_free, device_free, (void* d_ptr))                                                           \
  /* cudaMemcpy with cudaMemcpyDefault (unified addressing decides the direction). Returns when                      \
     the copy is complete (it synchronizes the legacy default stream), so work on any stream                         \
     enqueued afterwards sees the data; it also waits for earlier work on the legacy stream. */                      \
  CALL(int, tessera_cuda_memcpy, device_memcpy, (void* dst, const void* src, int64_t bytes))                         \
  /* Stream-ordered copy; host memory must stay valid until the stream reaches it. */                                \
  CALL(int, tessera_cuda_memcpy_async, device_memcpy_async,                                                          \
       (void* dst, const void* src, int64_t bytes, void* stream))                                                    \
  /* Byte fill of device memory; returns when complete (like tessera_cuda_memcpy). */                                \
  CALL(int, tessera_cuda_memset, device_memset, (void* d_ptr, int value, int64_t bytes))                             \
  CALL(int, tessera_cuda_device_synchronize, device_synchronize, ())                                                 \
  /* non-blocking stream */                                                                                          \
  CALL(int, tessera_cuda_stream_create, stream_create, (void** stream))                                              \
  CALL(int, tessera_cuda_stream_destroy, stream_destroy, (void* stream))                                             \
  CALL(int, tessera_cuda_stream_synchronize, stream_synchronize, (void* stream))                                     \
  CALL(int, tessera_cuda_event_create, event_create, (void** event))                                                 \
  CALL(int, tessera_cuda_event_destroy, event_destroy, (void* event))                                                \
  CALL(int, tessera_cuda_event_record, event_record, (void* event, void* stream))                                    \
  /* Milliseconds between two recorded events (waits for `end`). */                                                  \
  CALL(int, tessera_cuda_event_elapsed_ms, event_elapsed_ms, (void* start, void* end, float* ms))                    \
                                                                                                                     \
  /* CUDA graphs (runtime_api.cpp). Capture of the work enqueued on `stream` by the calling                          \
     thread (cudaStreamCaptureModeThreadLocal): between begin and end nothing runs; kernels,                         \
     cuBLAS calls and NCCL collectives enqueued on `stream` (the OP entries) are recorded with                       \
     their arguments as they are at capture time (device pointers and scalars), so a replay                          \
     reads whatever those device buffers hold then. Host<->device copies must stay outside a                         \
     capture. end_capture instantiates the graph into *graph_exec (the captured template is                          \
     released); a failed or invalidated capture returns non-zero and leaves the stream out of                        \
     capture mode. */                                                                                                \
  CALL(int, tessera_cuda_graph_begin_capture, graph_begin_capture, (void* stream))                                   \
  CALL(int, tessera_cuda_graph_end_capture, graph_end_capture, (void* stream, void** graph_exec))                    \
  /* Enqueues one replay of an instantiated graph on `stream` (one launch). */                                       \
  CALL(int, tessera_cuda_graph_launch, graph_launch, (void* graph_exec, void* stream))                               \
  /* null is fine */                                                                                                 \
  CALL(int, tessera_cuda_graph_destroy, graph_destroy, (void* graph_exec))                                           \
                                                                                                                     \
  /* ---- NCCL (nccl_api.cpp; nccl_stub.cpp when the library was built without NCCL) ---- */                         \
                                                                                                                     \
  /* 1 when built with NCCL, else 0 (then every tessera_nccl_* call fails with "built without                        \
     NCCL"). */                                                                                                      \
  CALL(int, tessera_nccl_available, nccl_available, ())                                                              \
  /* Size of an ncclUniqueId in bytes (128 with NCCL 2.x; 0 without NCCL). */                                        \
  CALL(int64_t, tessera_nccl_unique_id_bytes, nccl_unique_id_bytes, ())                                              \
  /* Writes a fresh unique id (rank 0 does this once, then sends the bytes to every rank). */                        \
  CALL(int, tessera_nccl_get_unique_id, nccl_get_unique_id, (void* h_id, int64_t id_bytes))                          \
  /* Selects `device` on the calling thread and creates this rank's communicator (blocks until                       \
     all nranks ranks have called it with the same id). *comm receives an opaque ncclComm_t. */                      \
  CALL(int, tessera_nccl_comm_init, nccl_comm_init,                                                                  \
       (void** comm, const void* h_id, int64_t id_bytes, int rank, int nranks, int device))                          \
  /* null is fine */                                                                                                 \
  CALL(int, tessera_nccl_comm_destroy, nccl_comm_destroy, (void* comm))                                              \
  /* recv[i] = sum over ranks of send[i], i < count; fp32; send == recv allowed (in place). */                       \
  OP(int, tessera_nccl_all_reduce_sum_f32, nccl_all_reduce_sum_f32,                                                  \
     (void* comm, const float* d_send, float* d_recv, int64_t count, void* stream),                                  \
     (comm, d_send, d_recv, count, stream))                                                                          \
  /* d_recv[r * bytes, (r + 1) * bytes) = rank r's d_send[0, bytes). */                                              \
  OP(int, tessera_nccl_all_gather, nccl_all_gather,                                                                  \
     (void* comm, const void* d_send, void* d_recv, int64_t bytes, void* stream),                                    \
     (comm, d_send, d_recv, bytes, stream))                                                                          \
  /* d_data[0, bytes) of rank `root` copied to every rank, in place. */                                              \
  OP(int, tessera_nccl_broadcast, nccl_broadcast,                                                                    \
     (void* comm, void* d_data, int64_t bytes, int root, void* stream), (comm, d_data, bytes, root, stream))         \
                                                                                                                     \
  /* ---- ops (one .cu file per op family) ---- */                                                                   \
                                                                                                                     \
  /* norm.cu. y = x / sqrt(mean(x^2) + eps) * w for n rows of dim fp32 values. y may alias x. */                     \
  OP(int, tessera_cuda_rms_norm_f32, rms_norm_f32,                                                                   \
     (const float* x, const float* w, float* y, int64_t n, int64_t dim, float eps, void* stream),                    \
     (x, w, y, n, dim, eps, stream))                                                                                 \
  /* norm.cu. residual += delta; y = rms_norm(residual) * w. fp32 [n, dim]; y may alias delta. */                    \
  OP(int, tessera_cuda_add_rms_norm_f32, add_rms_norm_f32,                                                           \
     (float* residual, const float* delta, const float* w, float* y, int64_t n, int64_t dim, float eps,              \
      void* stream),                                                                                                 \
     (residual, delta, w, y, n, dim, eps, stream))                                                                   \
                                                                                                                     \
  /* embedding.cu. out[t, :] = table[ids[t], :] for t < n_tokens. table [vocab, dim] of                              \
     table_dtype, out [n_tokens, dim] of out_dtype (TESSERA_CUDA_F32 / TESSERA_CUDA_F16); ids                        \
     int32 on the device. An id outside [0, vocab) gives a row of zeros (the host validates ids                      \
     before they get here). */                                                                                       \
  OP(int, tessera_cuda_embedding, embedding,                                                                         \
     (const void* table, int table_dtype, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n_tokens,          \
      void* out, int out_dtype, void* stream),                                                                       \
     (table, table_dtype, vocab, dim, ids, n_tokens, out, out_dtype, stream))                                        \
  /* embedding.cu. Element-wise conversions (round to nearest even), n elements. */                                  \
  OP(int, tessera_cuda_convert_f32_to_f16, convert_f32_to_f16,                                                       \
     (const float* src, uint16_t* dst, int64_t n, void* stream), (src, dst, n, stream))                              \
  OP(int, tessera_cuda_convert_f16_to_f32, convert_f16_to_f32,                                                       \
     (const uint16_t* src, float* dst, int64_t n, void* stream), (src, dst, n, stream))                              \
                                                                                                                     \
  /* rope_kv.cu. RoPE (Hugging Face rotate-half layout, as kernels/rope.h: element i and                             \
     i + head_dim/2 of a head rotate by angle (float)position * inv_freq[i], cosf/sinf in fp32)                      \
     applied in place to q, and to k on its way into the paged cache; v is copied unchanged.                         \
     Cache layout as kernels/paged_attention.h (one layer): [num_blocks][block_size][n_kv_heads]                     \
     [head_dim] for K and for V, of kv_dtype: fp32, or fp16 (written rounded to nearest even,                        \
     as the CPU's fp16 cache; the attention ops widen it exactly and compute in fp32). Token t                       \
     goes to global slot slots[t] = block_id * block_size + offset, i.e. block slots[t] /                            \
     block_size, offset slots[t] % block_size; the host builds slots from each sequence's block                      \
     table. A negative slot skips the cache write (padding tokens); q is still rotated.                              \
     Arguments: TesseraCudaRopeKvArgs. */                                                                            \
  OP(int, tessera_cuda_rope_kv_write_f32, rope_kv_write_f32,                                                         \
     (const struct TesseraCudaRopeKvArgs* args, void* stream), (args, stream))                                       \
                                                                                                                     \
  /* paged_attention.cu. Decode attention: one query token per sequence, at position                                 \
     seq_lens[s] - 1, attending to cached keys max(0, seq_lens[s] - sliding_window) ..                               \
     seq_lens[s] - 1 (the whole sequence when sliding_window <= 0). Query head h reads KV head                       \
     h / (n_heads / n_kv_heads) (GQA). Online softmax, fp32 throughout. head_dim <= 256.                             \
     Launch: one block of 128 threads (4 warps) per (sequence, query head); warp w handles keys                      \
     w, w + 4, ...; lane l holds dims l, l + 32, ...; the warps' partial softmax states are                          \
     merged at the end.                                                                                              \
     Split over the sequence (flash-decoding) when n_splits > 1: the visible keys of a sequence                      \
     are cut into pieces of split_keys keys (the first piece starts at the window's first key);                      \
     block (h, s, p) of a grid (n_heads, n_seqs, n_splits) handles piece p and writes its state                      \
     (max m, sum l, unnormalized weighted value sum acc) to partial[((s * n_heads + h) *                             \
     n_splits + p) * (head_dim + 2)] as [acc[0..head_dim), m, l]; pieces past the end write                          \
     m = -inf, l = 0. A second kernel (grid (n_heads, n_seqs)) merges the pieces:                                    \
     M = max m_p, L = sum l_p e^(m_p - M), out = sum acc_p e^(m_p - M) / L. So a long context                        \
     uses n_splits blocks per head; the grid does not depend on the lengths (a CUDA graph can                        \
     hold it). n_splits * split_keys should cover the longest visible span (keys beyond it are                       \
     not attended). Arguments: TesseraCudaDecodeAttentionArgs. */                                                    \
  OP(int, tessera_cuda_paged_decode_attention_f32, paged_decode_attention_f32,                                       \
     (const struct TesseraCudaDecodeAttentionArgs* args, void* stream), (args, stream))                              \
                                                                                                                     \
  /* sparse_attention.cu. Quest key summaries after rope_kv_write_f32 (same slots, same cache):                      \
     for each physical block the step wrote, kmin / kmax [block][n_kv_heads][head_dim] become the                    \
     element-wise min / max of its keys over slots 0 .. the last slot written, recomputed from the                   \
     cache (fp16 widened exactly), as kernels/sparse_attention.h's kv_summary_update (bit-identical:                 \
     min / max are exact). Token t recomputes its block unless token t + 1 writes the same block (the                \
     tokens writing one block are consecutive rows in increasing slot order, as the forward pass lays                \
     them out; no two sequences write one block). Launch: one block of 128 threads per token, thread                 \
     e handles elements e, e + 128, ... of the block's [n_kv_heads * head_dim] row. Arguments:                       \
     TesseraCudaKvSummaryArgs. */                                                                                    \
  OP(int, tessera_cuda_kv_summary_update_f32, kv_summary_update_f32,                                                 \
     (const struct TesseraCudaKvSummaryArgs* args, void* stream), (args, stream))                                    \
  /* sparse_attention.cu. Block scores of the sparse sequences (TesseraCudaSparseArgs): for each                     \
     competing logical block b of sparse sequence s, scores[s, b] = max over query heads h of the                    \
     Quest bound sum_d max(q_d * kmin_d, q_d * kmax_d) against physical block block_tables[s, b]                     \
     (KV head h / (n_heads / n_kv_heads)), in kernels/sparse_attention.h's canonical arithmetic                      \
     (8 lanes of d % 8, lanes combined ((0+4)+(2+6))+((1+5)+(3+7)), no FMA: bit-identical to                         \
     sparse_block_scores); a NaN bound counts as -inf. Other entries are not written.                                \
     Launch: grid (min(max_blocks_per_seq, 512), n_seqs), 128 threads = 16 groups of 8 lanes,                        \
     group g computing heads g, g + 16, ...; block x strides over the competing blocks from                          \
     sink_blocks + x. The grid does not depend on the lengths (a CUDA graph can hold it). */                         \
  OP(int, tessera_cuda_sparse_block_scores_f32, sparse_block_scores_f32,                                             \
     (const struct TesseraCudaSparseArgs* args, void* stream), (args, stream))                                       \
  /* sparse_attention.cu. The compacted block tables: for a sparse sequence s the selected logical                   \
     blocks (the first sink_blocks, the top_blocks best competing blocks by score, ties to the                       \
     lower index, and the last recent_blocks; with n_ranks > 1 the score is the max over                             \
     gathered_scores, written back to scores first) in increasing order; compact_tables[s, i] =                      \
     block_tables[s, selected[i]] (zeros after them), compact_seq_lens[s] = (selected - 1) *                         \
     block_size + (seq_lens[s] - 1) % block_size + 1, compact_start_pos[s] = compact_seq_lens[s] - 1:                \
     kernels/sparse_attention.h's sparse_select_scored + sparse_compact_block_table. Every other                     \
     sequence is copied unchanged (its table row, seq_lens, start_pos = seq_lens - query_len), so                    \
     both attention ops read the compact arrays for the whole step. Selection: a radix select                        \
     (4 passes of 8 bits) of the top_blocks-th largest score key, then the blocks with a larger key                  \
     and the lowest-index ones with an equal key, compacted with block-wide prefix sums in index                     \
     order (deterministic). Launch: one block of 256 threads per sequence. */                                        \
  OP(int, tessera_cuda_sparse_select_blocks, sparse_select_blocks,                                                   \
     (const struct TesseraCudaSparseArgs* args, void* stream), (args, stream))                                       \
                                                                                                                     \
  /* activation.cu. out = silu(gate) * up, fp32 [n_tokens, dim]; out may alias gate or up. */                        \
  OP(int, tessera_cuda_silu_mul_f32, silu_mul_f32,                                                                   \
     (const float* gate, const float* up, float* out, int64_t n_tokens, int64_t dim, void* stream),                  \
     (gate, up, out, n_tokens, dim, stream))                                                                         \
  /* activation.cu. out = gelu_tanh(gate) * up (GeGLU, Gemma's MLP), fp32 [n_tokens, dim]; out                       \
     may alias gate or up. gelu_tanh(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))),                   \
     as kernels/activation.h's gelu_tanh_mul (within fp32 rounding: tanhf on the device). */                         \
  OP(int, tessera_cuda_gelu_tanh_mul_f32, gelu_tanh_mul_f32,                                                         \
     (const float* gate, const float* up, float* out, int64_t n_tokens, int64_t dim, void* stream),                  \
     (gate, up, out, n_tokens, dim, stream))                                                                         \
                                                                                                                     \
  /* sampling.cu. ids[r] = argmax of logits[r, 0 .. vocab), ties to the lowest id, NaN counts as                     \
     -inf (all -inf or NaN: 0), as kernels/sampling.h's greedy path. fp32 [n_rows, vocab]. */                        \
  OP(int, tessera_cuda_argmax_f32, argmax_f32,                                                                       \
     (const float* logits, int64_t n_rows, int64_t vocab, int32_t* ids, void* stream),                               \
     (logits, n_rows, vocab, ids, stream))                                                                           \
  /* sampling.cu. The same per row, plus values[r] = the maximum (NaN as -inf; -inf when every                       \
     value is), and ids offset by id_offset: a TP rank's candidate over its vocabulary slice                         \
     [id_offset, id_offset + vocab), merged across ranks by the larger value, then the lower id. */                  \
  OP(int, tessera_cuda_argmax_value_f32, argmax_value_f32,                                                           \
     (const float* logits, int64_t n_rows, int64_t vocab, int32_t id_offset, int32_t* ids, float* values,            \
      void* stream),                                                                                                 \
     (logits, n_rows, vocab, id_offset, ids, values, stream))                                                        \
                                                                                                                     \
  /* sampling.cu. Sampling on the device: for each row, what Sampler::sample (kernels/sampling.h)                    \
     does with that row of logits, with the same order of operations and the same semantics, so                      \
     that only ids and logprobs cross to the host:                                                                   \
       1. this row's penalty entries (TesseraCudaPenalty): banned ids become -inf; then the                          \
          repetition penalty (x > 0 ? x / r : x * r, for ids with in_prompt or out_count > 0)                        \
          and presence / frequency (x -= presence + frequency * out_count, the penalty computed                      \
          in fp32, for out_count > 0), each an IEEE operation as written (no fused multiply-add);                    \
       2. NaN -> -inf, +inf -> FLT_MAX; a row that is all -inf becomes all 0 (uniform);                              \
       3. logprobs when asked (want_logprob or n_logprobs > 0): lse = max + log(sum e^(x - max)),                    \
          the chosen token's x - lse, and the n_logprobs best (x desc, id asc) with x - lse;                         \
       4. temperature 0: the argmax (first maximum); else weights w = (float) e^((x - max) / T)                      \
          with sampling.cpp's deterministic exp (bit-identical: the same +, -, *, / in IEEE                          \
          double without contraction), top-k by (x desc, id asc), min-p (w >= min_p), top-p over                     \
          (w desc, id asc) (the smallest prefix whose mass >= top_p * the top-k mass, at least                       \
          one token), and the draw with `u`: the first kept token whose running mass exceeds                         \
          u * (kept mass), walking (w desc, id asc) when top-k or top-p is on, id order                              \
          otherwise.                                                                                                 \
     Masses are sums of w in 2^-43 fixed point (integers: exact and independent of the order and                     \
     of the thread count, so every TP rank given the same logits draws the same token); the CPU                      \
     sums in double. The two can differ only where u falls within ~1e-8 (relative) of a                              \
     boundary between two tokens.                                                                                    \
     Launch: one block per row. logits [n_rows, vocab] fp32 are modified (steps 1-2); scratch                        \
     [n_rows, vocab] fp32 is workspace. vocab in [1, 2^20]. Arguments: TesseraCudaSampleArgs                         \
     (rows: TesseraCudaSampleRow). */                                                                                \
  OP(int, tessera_cuda_sample_f32, sample_f32,                                                                       \
     (const struct TesseraCudaSampleArgs* args, void* stream), (args, stream))                                       \
                                                                                                                     \
  /* elementwise.cu. A vocabulary-parallel LM head's all-gathered logits back in vocabulary                          \
     order: gathered holds tp chunks of n_rows * per_rank floats; chunk r holds rank r's logits                      \
     [n_rows, count_r] packed at its front, count_r = min(vocab, (r + 1) * per_rank) -                               \
     min(vocab, r * per_rank). out [n_rows, vocab]: out[t, r * per_rank + i] = chunk r [t, i]. */                    \
  OP(int, tessera_cuda_unshard_logits_f32, unshard_logits_f32,                                                       \
     (const float* gathered, int64_t n_rows, int64_t vocab, int64_t per_rank, int64_t tp, float* out,                \
      void* stream),                                                                                                 \
     (gathered, n_rows, vocab, per_rank, tp, out, stream))                                                           \
                                                                                                                     \
  /* gemm_blas.cpp (cuBLASLt; cuBLAS for shapes the cuBLASLt heuristic does not cover). A handle                     \
     per thread and device: create it after selecting the device. The handle owns a fixed device                     \
     workspace (set again after every stream change) and one cuBLASLt plan per GEMM shape,                           \
     chosen on the shape's first call, so GEMMs can be captured into CUDA graphs without cuBLAS                      \
     allocating during the capture. */                                                                               \
  CALL(int, tessera_cuda_blas_create, blas_create, (void** handle))                                                  \
  CALL(int, tessera_cuda_blas_destroy, blas_destroy, (void* handle))                                                 \
  /* y[t, r] = sum_c x[t, c] * w[r, c]: w f16 [rows, cols] row-major (the weight layout of                           \
     kernels/gemm.h), x f16 [n_tokens, cols], y fp32 [n_tokens, rows], overwritten; fp32                             \
     accumulation (CUBLAS_COMPUTE_32F). */                                                                           \
  OP(int, tessera_cuda_gemm_f16, gemm_f16,                                                                           \
     (void* handle, const uint16_t* w, const uint16_t* x, float* y, int64_t rows, int64_t cols, int64_t n_tokens,    \
      void* stream),                                                                                                 \
     (handle, w, x, y, rows, cols, n_tokens, stream))                                                                \
                                                                                                                     \
  /* ---- added for the GPU forward pass (shard/cuda_forward.h) ---- */                                              \
                                                                                                                     \
  /* memory_info.cpp. cudaMemGetInfo of the current device, in bytes. */                                             \
  CALL(int, tessera_cuda_mem_get_info, mem_get_info, (int64_t* free_bytes, int64_t* total_bytes))                    \
                                                                                                                     \
  /* prefill_attention.cu. Causal attention of a chunk of query tokens per sequence over the                         \
     paged cache (layout as rope_kv_write_f32's), GQA, online softmax, fp32. Sequence s has                          \
     query_len[s] query rows starting at row query_begin[s] of q / out, at positions                                 \
     start_pos[s] .. start_pos[s] + query_len[s] - 1; the cache must already hold the keys of                        \
     positions [0, start_pos[s] + query_len[s]) (earlier chunks, a cached prefix and this chunk,                     \
     written by tessera_cuda_rope_kv_write_f32). A query at position p sees the keys                                 \
     max(0, p - sliding_window + 1) .. p (0 .. p when sliding_window <= 0). head_dim <= 256.                         \
     Rows of q / out that belong to no sequence are neither read nor written.                                        \
     Launch: grid (n_heads, ceil(max_query_len / 16), n_seqs), 128 threads, 16 queries and                           \
     16-key K/V tiles in shared memory per block (see prefill_attention.cu).                                         \
     Arguments: TesseraCudaPrefillAttentionArgs. */                                                                  \
  OP(int, tessera_cuda_paged_prefill_attention_f32, paged_prefill_attention_f32,                                     \
     (const struct TesseraCudaPrefillAttentionArgs* args, void* stream), (args, stream))                             \
                                                                                                                     \
  /* quant_gemm.cu. Small-batch GEMMs with weights dequantized in registers, f16 activations                         \
     x [n_tokens, cols], fp32 output y [n_tokens, rows] (overwritten), fp32 accumulation;                            \
     n_tokens <= 65535 (fast for 1..8, correct for any; large batches should use cuBLAS).                            \
     W8A16 (the I8_CH format of common/dtype.h): w int8 [rows, cols] row-major levels,                               \
     scales fp32 [rows]; y[t, r] = scales[r] * sum_c w[r, c] * x[t, c]. */                                           \
  OP(int, tessera_cuda_gemm_w8a16, gemm_w8a16,                                                                       \
     (const int8_t* w, const float* scales, const uint16_t* x, float* y, int64_t rows, int64_t cols,                 \
      int64_t n_tokens, void* stream),                                                                               \
     (w, scales, x, y, rows, cols, n_tokens, stream))                                                                \
  /* W4A16, group-wise along the input (group 128, cols % 128 == 0), device layout:                                  \
       w      uint8 [rows, cols / 2]: byte b of row r holds element 2b in its low nibble and                         \
              element 2b + 1 in its high nibble (levels 0..15);                                                      \
       scales f16   [rows, cols / 128] (d), zeros uint8 [rows, cols / 128] (z, 0..15);                               \
       weight (r, c) = (level - z[r, c / 128]) * d[r, c / 128]   (I4_G128's grid, repacked). */                      \
  OP(int, tessera_cuda_gemm_w4a16, gemm_w4a16,                                                                       \
     (const uint8_t* w, const uint16_t* scales, const uint8_t* zeros, const uint16_t* x, float* y, int64_t rows,     \
      int64_t cols, int64_t n_tokens, void* stream),                                                                 \
     (w, scales, zeros, x, y, rows, cols, n_tokens, stream))                                                         \
  /* quant_gemm_tc.cu. The same two GEMMs (same arguments, layouts and result) on tensor cores                       \
     (mma.sync m16n8k16, fp32 accumulation), for batches of tokens (prefill): the weights are                        \
     read once per 64 tokens. Needs compute capability >= 8.0, w and x 16-byte aligned, cols a                       \
     multiple of 16 (W8) or 128 (W4), n_tokens <= 64 * 65535. W4: each weight is rounded to f16                      \
     before the multiply (the value tessera_cuda_dequantize_w4a16 writes); W8: the int8 levels                       \
     are exact in f16 and the row scale multiplies the fp32 sum. */                                                  \
  OP(int, tessera_cuda_gemm_w8a16_tc, gemm_w8a16_tc,                                                                 \
     (const int8_t* w, const float* scales, const uint16_t* x, float* y, int64_t rows, int64_t cols,                 \
      int64_t n_tokens, void* stream),                                                                               \
     (w, scales, x, y, rows, cols, n_tokens, stream))                                                                \
  OP(int, tessera_cuda_gemm_w4a16_tc, gemm_w4a16_tc,                                                                 \
     (const uint8_t* w, const uint16_t* scales, const uint8_t* zeros, const uint16_t* x, float* y, int64_t rows,     \
      int64_t cols, int64_t n_tokens, void* stream),                                                                 \
     (w, scales, zeros, x, y, rows, cols, n_tokens, stream))                                                         \
  /* quant_gemm.cu. The same weights expanded to f16 [rows, cols] (round to nearest even), for                       \
     batches where cuBLAS on a dequantized copy beats re-reading the packed weights per 8                            \
     tokens. */                                                                                                      \
  OP(int, tessera_cuda_dequantize_w8a16, dequantize_w8a16,                                                           \
     (const int8_t* w, const float* scales, uint16_t* out, int64_t rows, int64_t cols, void* stream),                \
     (w, scales, out, rows, cols, stream))                                                                           \
  OP(int, tessera_cuda_dequantize_w4a16, dequantize_w4a16,                                                           \
     (const uint8_t* w, const uint16_t* scales, const uint8_t* zeros, uint16_t* out, int64_t rows, int64_t cols,     \
      void* stream),                                                                                                 \
     (w, scales, zeros, out, rows, cols, stream))                                                                    \
                                                                                                                     \
  /* gguf_gemm.cu. GGUF block-quantized weights used as stored in the file (ggml's byte layouts,                     \
     specified in kernels/cpu/quant.cpp): row r of W [rows, cols] is cols / block_elems blocks                       \
     at w + r * row_bytes (row_bytes >= those blocks' bytes, even; w 2-byte aligned). `type` is                      \
     one of the TESSERA_CUDA_GGUF_* values (tessera::QuantType's); cols a multiple of the type's                     \
     elements per block (common/block_geometry.h's list: 32 or 256). Any                                             \
     other type returns -1 with a message naming it.                                                                 \
     y[t, r] = sum_c W[r, c] * x[t, c]: x f16 [n_tokens, cols], y fp32 [n_tokens, rows]                              \
     (overwritten), fp32 accumulation, weights dequantized in registers (each weight computed in                     \
     fp32 as kernels/cpu/quant.cpp's dequantize_row does). Fast for 1..8 tokens (decode),                            \
     correct for any n_tokens >= 0 (larger batches: tessera_cuda_dequantize_gguf +                                   \
     tessera_cuda_gemm_f16). */                                                                                      \
  OP(int, tessera_cuda_gemm_gguf, gemm_gguf,                                                                         \
     (int type, const void* w, int64_t row_bytes, const uint16_t* x, float* y, int64_t rows, int64_t cols,           \
      int64_t n_tokens, void* stream),                                                                               \
     (type, w, row_bytes, x, y, rows, cols, n_tokens, stream))                                                       \
  /* gguf_gemm.cu. out f16 [rows, cols] row-major = W rounded to nearest even (bit-identical to                      \
     f32_to_fp16 of dequantize_row's values). */                                                                     \
  OP(int, tessera_cuda_dequantize_gguf, dequantize_gguf,                                                             \
     (int type, const void* w, int64_t row_bytes, uint16_t* out, int64_t rows, int64_t cols, void* stream),          \
     (type, w, row_bytes, out, rows, cols, stream))                                                                  \
                                                                                                                     \
  /* elementwise.cu. y[i] += x[i], i < n (fp32). */                                                                  \
  OP(int, tessera_cuda_add_f32, add_f32, (float* y, const float* x, int64_t n, void* stream), (y, x, n, stream))     \
  /* elementwise.cu. y[t, i] += bias[i] for y fp32 [n_tokens, dim]. */                                               \
  OP(int, tessera_cuda_add_bias_f32, add_bias_f32,                                                                   \
     (float* y, const float* bias, int64_t n_tokens, int64_t dim, void* stream), (y, bias, n_tokens, dim, stream))   \
  /* elementwise.cu. dst[i, :] = src[rows[i], :] for i < n_rows; fp32 rows of dim; rows int32 on                     \
     the device. dst must not overlap src. */                                                                        \
  OP(int, tessera_cuda_gather_rows_f32, gather_rows_f32,                                                             \
     (const float* src, const int32_t* rows, float* dst, int64_t n_rows, int64_t dim, void* stream),                 \
     (src, rows, dst, n_rows, dim, stream))                                                                          \
  /* elementwise.cu. x[i] *= s, i < n (fp32, in place), as kernels/elementwise.h's scale_f32                         \
     (one IEEE multiply: the same bits). */                                                                          \
  OP(int, tessera_cuda_scale_f32, scale_f32, (float* x, float s, int64_t n, void* stream), (x, s, n, stream))

// The declarations of every entry point. (Two macros, no `...`: .cu files are C++17, where a
// variadic macro needs at least one variadic argument.)
#define TESSERA_CUDA_DECLARE_CALL(ret, symbol, field, params) ret symbol params;
#define TESSERA_CUDA_DECLARE_OP(ret, symbol, field, params, args) ret symbol params;
extern "C" {
TESSERA_CUDA_ENTRY_POINTS(TESSERA_CUDA_DECLARE_CALL, TESSERA_CUDA_DECLARE_OP)
}  // extern "C"
#undef TESSERA_CUDA_DECLARE_CALL
#undef TESSERA_CUDA_DECLARE_OP
