// tessera-gpu-ops-bench: per-op timings of the CUDA backend's kernels at Llama-3-8B shapes
// (hidden 4096, 32 heads, 8 KV heads, head_dim 128, FFN 14336, vocab 128256) for batch 1, 8,
// 32 and 128, plus the device-to-device copy bandwidth that bounds them; W8A16 / W4A16 GEMMs
// (batch 1, 8, 32) and prefill attention (a 512-token chunk). Reaches the GPU only
// through the dlopen-ed libtessera_cuda.so (kernels/cuda/cuda_loader.h), like the shard.
//
// Each figure: CUDA-event time of --iters back-to-back calls on one stream after 3 warm-ups,
// divided by the count. "GB/s" is the op's compulsory traffic (stated per op below) over that
// time; "of copy" compares it with the measured device-to-device copy bandwidth (the first
// row), the practical ceiling of a memory-bound op. Buffers hold constant bit patterns (memset): the
// kernels' speed does not depend on the values. Run by bench/gpu_check.sh.
//
// Last, the sparse / dense crossover of decode attention on the device (kernels/sparse_attention.h
// on CUDA: sparse_attention.cu): one global layer's decode attention at 1k-32k tokens of context,
// batch 1 and 8, dense (paged decode attention over the whole context, split over the keys as the
// forward pass splits it) against sparse (block scores + selection of 1 sink + 2 recent + 128
// top blocks + attention over the compacted tables), and the first context where sparse is at
// least 2x as fast (what `--sparse-threshold` should be on this device; `--sparse-attention auto`
// keeps CUDA dense until it is measured).
//
// Usage: tessera-gpu-ops-bench [--iters N] [--device D] [--sparse-only]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_loader.h"

namespace tessera {
namespace {

const CudaApi* g_api = nullptr;

void check(int rc, const char* what) {
  if (rc == 0) return;
  std::fprintf(stderr, "tessera-gpu-ops-bench: %s failed: %s (code %d)\n", what, g_api->last_error(), rc);
  std::exit(1);
}

// Device buffers that live until the end of the program (the process exits right after).
void* device_bytes(int64_t bytes, int fill = 0x3c) {
  void* p = nullptr;
  check(g_api->device_malloc(&p, bytes), "cudaMalloc");
  check(g_api->device_memset(p, fill, bytes), "cudaMemset");
  return p;
}
template <typename T>
T* device_copy(const std::vector<T>& host) {
  auto* d = static_cast<T*>(device_bytes(static_cast<int64_t>(host.size() * sizeof(T))));
  check(g_api->device_memcpy(d, host.data(), static_cast<int64_t>(host.size() * sizeof(T))), "cudaMemcpy");
  return d;
}

struct Timer {
  void* stream = nullptr;
  void* start = nullptr;
  void* stop = nullptr;
  int iters = 20;

  // Microseconds per call of fn (which enqueues one call on `stream` and returns its rc).
  double us(const std::function<int()>& fn, const char* what) {
    for (int i = 0; i < 3; ++i) check(fn(), what);
    check(g_api->event_record(start, stream), "cudaEventRecord");
    for (int i = 0; i < iters; ++i) check(fn(), what);
    check(g_api->event_record(stop, stream), "cudaEventRecord");
    float ms = 0.0f;
    check(g_api->event_elapsed_ms(start, stop, &ms), "cudaEventElapsedTime");
    return 1000.0 * static_cast<double>(ms) / iters;
  }
};

double g_copy_gbps = 0.0;  // measured first; every later row is compared with it

void row(const char* op, const std::string& shape, int64_t batch, double us, double bytes) {
  const double gbps = bytes / (us * 1e-6) / 1e9;
  if (g_copy_gbps == 0.0) g_copy_gbps = gbps;
  std::printf("| %-18s | %-26s | %5lld | %10.1f | %8.1f | %6.0f%% |\n", op, shape.c_str(),
              static_cast<long long>(batch), us, gbps, 100.0 * gbps / g_copy_gbps);
  std::fflush(stdout);
}

constexpr int64_t kHidden = 4096, kHeads = 32, kKvHeads = 8, kHeadDim = 128, kFfn = 14336, kVocab = 128256;
constexpr int64_t kBlockSize = 16;

// The sparse / dense crossover (see the top of the file). The split of the dense keys follows
// CudaForward's (pieces of >= 512 keys, at most 32, for a model of 32,768 positions); the sparse
// attention reads the same split arguments, over its compacted tables.
int sparse_crossover(Timer& timer) {
  void* s = timer.stream;
  constexpr int64_t kMaxContext = 32768, kSink = 1, kRecent = 2, kTop = 128;
  constexpr double kMinSpeedup = 2.0;
  const int64_t splits = std::min<int64_t>(32, (kMaxContext + 511) / 512);
  const int64_t split_keys = (kMaxContext + splits - 1) / splits;
  const int64_t row_floats = kKvHeads * kHeadDim;
  std::printf("\nsparse decode attention (1 sink + 2 recent + %lld top blocks of %lld) against dense, one layer:\n",
              static_cast<long long>(kTop), static_cast<long long>(kBlockSize));
  for (const int64_t b : {int64_t{1}, int64_t{8}}) {
    const int64_t blocks_per_seq = kMaxContext / kBlockSize, num_blocks = b * blocks_per_seq;
    const int64_t cache_bytes = num_blocks * kBlockSize * row_floats * 4;
    void* k_cache = device_bytes(cache_bytes);
    void* v_cache = device_bytes(cache_bytes);
    auto* kmin = static_cast<float*>(device_bytes(num_blocks * row_floats * 4, 0xbc));  // -0.0117...
    auto* kmax = static_cast<float*>(device_bytes(num_blocks * row_floats * 4));        // +0.0117...
    std::vector<int32_t> tables(static_cast<size_t>(num_blocks)), begin(static_cast<size_t>(b)),
        qlen(static_cast<size_t>(b), 1);
    for (int64_t i = 0; i < num_blocks; ++i) tables[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    for (int64_t i = 0; i < b; ++i) begin[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    const int32_t* d_tables = device_copy(tables);
    const int32_t* d_begin = device_copy(begin);
    const int32_t* d_qlen = device_copy(qlen);
    auto* scores = static_cast<float*>(device_bytes(num_blocks * 4, 0));
    auto* compact = static_cast<int32_t*>(device_bytes((num_blocks + 2 * b) * 4, 0));
    auto* q = static_cast<float*>(device_bytes(b * kHeads * kHeadDim * 4));
    auto* out = static_cast<float*>(device_bytes(b * kHeads * kHeadDim * 4, 0));
    auto* partial = static_cast<float*>(device_bytes(b * kHeads * splits * (kHeadDim + 2) * 4, 0));
    int64_t threshold = 0;
    for (int64_t ctx = 1024; ctx <= kMaxContext; ctx *= 2) {
      const int32_t* d_lens = device_copy(std::vector<int32_t>(static_cast<size_t>(b), static_cast<int32_t>(ctx)));
      TesseraCudaDecodeAttentionArgs dense{q,       out,       k_cache,    v_cache,   d_tables, d_lens,
                                           b,       kHeads,    kKvHeads,   kHeadDim,  kBlockSize, blocks_per_seq,
                                           0.0883883f, 0,      splits,     split_keys, partial,  TESSERA_CUDA_F32};
      const double dense_us = timer.us([&] { return g_api->paged_decode_attention_f32(&dense, s); }, "dense decode");
      TesseraCudaSparseArgs sel{};
      sel.q = q;
      sel.kmin = kmin;
      sel.kmax = kmax;
      sel.block_tables = d_tables;
      sel.query_begin = d_begin;
      sel.query_len = d_qlen;
      sel.seq_lens = d_lens;
      sel.scores = scores;
      sel.compact_tables = compact;
      sel.compact_seq_lens = compact + num_blocks;
      sel.compact_start_pos = compact + num_blocks + b;
      sel.n_seqs = b;
      sel.n_heads = kHeads;
      sel.n_kv_heads = kKvHeads;
      sel.head_dim = kHeadDim;
      sel.block_size = kBlockSize;
      sel.max_blocks_per_seq = blocks_per_seq;
      sel.num_blocks = num_blocks;
      sel.n_ranks = 1;
      sel.threshold_tokens = 1;
      sel.sink_blocks = kSink;
      sel.recent_blocks = kRecent;
      sel.top_blocks = kTop;
      TesseraCudaDecodeAttentionArgs sparse = dense;
      sparse.block_tables = sel.compact_tables;
      sparse.seq_lens = sel.compact_seq_lens;
      const double sparse_us = timer.us(
          [&] {
            int rc = g_api->sparse_block_scores_f32(&sel, s);
            if (rc == 0) rc = g_api->sparse_select_blocks(&sel, s);
            return rc != 0 ? rc : g_api->paged_decode_attention_f32(&sparse, s);
          },
          "sparse decode");
      const int64_t n_blocks = ctx / kBlockSize, kept = std::min(n_blocks, kSink + kRecent + kTop);
      const double kv_row_bytes = static_cast<double>(row_floats * 4 * 2);  // K and V of one position
      row("decode dense", "ctx " + std::to_string(ctx) + ", 32/8 heads", b, dense_us,
          static_cast<double>(b * ctx) * kv_row_bytes);
      // Sparse traffic: every block's summaries (min and max) + the K and V of the blocks kept.
      const double summary_bytes = static_cast<double>(b * n_blocks * row_floats * 4 * 2);
      row("decode sparse", "ctx " + std::to_string(ctx) + ", top " + std::to_string(kTop), b, sparse_us,
          summary_bytes + static_cast<double>(b * kept * kBlockSize) * kv_row_bytes);
      if (threshold == 0 && sparse_us * kMinSpeedup <= dense_us) threshold = ctx;
      check(g_api->device_free(const_cast<int32_t*>(d_lens)), "cudaFree");
    }
    std::printf("batch %lld: sparse is %s\n", static_cast<long long>(b),
                threshold > 0 ? ("at least 2x as fast from " + std::to_string(threshold) + " tokens").c_str()
                              : "never 2x as fast up to 32768 tokens");
    check(g_api->stream_synchronize(s), "cudaStreamSynchronize");
    for (const void* p : {static_cast<const void*>(k_cache), static_cast<const void*>(v_cache),
                          static_cast<const void*>(kmin), static_cast<const void*>(kmax),
                          static_cast<const void*>(d_tables), static_cast<const void*>(d_begin),
                          static_cast<const void*>(d_qlen), static_cast<const void*>(scores),
                          static_cast<const void*>(compact), static_cast<const void*>(q), static_cast<const void*>(out),
                          static_cast<const void*>(partial)})
      check(g_api->device_free(const_cast<void*>(p)), "cudaFree");
  }
  return 0;
}

int run(int argc, char** argv) {
  Timer timer;
  int device = 0;
  bool sparse_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) timer.iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--device") && i + 1 < argc) device = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--sparse-only")) sparse_only = true;
    else {
      std::fprintf(stderr, "usage: tessera-gpu-ops-bench [--iters N] [--device D] [--sparse-only]\n");
      return 2;
    }
  }
  if (timer.iters < 1) timer.iters = 1;
  Result<const CudaApi*> api = load_cuda_api_with_device();
  if (!api.is_ok()) {
    std::fprintf(stderr, "tessera-gpu-ops-bench: %s\n", api.status().message().c_str());
    return 1;
  }
  g_api = *api;
  check(g_api->set_device(device), "cudaSetDevice");
  char name[256] = {};
  int major = 0, minor = 0;
  check(g_api->device_info(device, name, sizeof(name), &major, &minor), "cudaGetDeviceProperties");
  check(g_api->stream_create(&timer.stream), "cudaStreamCreate");
  check(g_api->event_create(&timer.start), "cudaEventCreate");
  check(g_api->event_create(&timer.stop), "cudaEventCreate");
  void* blas = nullptr;
  check(g_api->blas_create(&blas), "cublasCreate");
  void* s = timer.stream;

  std::printf("device %d: %s (sm_%d%d), %d iterations per figure\n\n", device, name, major, minor, timer.iters);
  std::printf("| %-18s | %-26s | %5s | %10s | %8s | %7s |\n", "op", "shape", "batch", "us/call", "GB/s", "of copy");
  std::printf("|%s|%s|%s|%s|%s|%s|\n", std::string(20, '-').c_str(), std::string(28, '-').c_str(),
              std::string(7, '-').c_str(), std::string(12, '-').c_str(), std::string(10, '-').c_str(),
              std::string(9, '-').c_str());

  // Device-to-device copy: 1 GiB; traffic counts the read and the write.
  const int64_t copy_bytes = int64_t{1} << (sparse_only ? 26 : 30);
  void* copy_src = device_bytes(copy_bytes);
  void* copy_dst = device_bytes(copy_bytes);
  const double copy_us = timer.us([&] { return g_api->device_memcpy_async(copy_dst, copy_src, copy_bytes, s); },
                                  "memcpy d2d");
  row("memcpy d2d", sparse_only ? "64 MiB" : "1 GiB", 1, copy_us, 2.0 * static_cast<double>(copy_bytes));
  check(g_api->device_free(copy_src), "cudaFree");
  check(g_api->device_free(copy_dst), "cudaFree");
  if (sparse_only) return sparse_crossover(timer);

  const int64_t batches[] = {1, 8, 32, 128};
  const int64_t max_batch = 128;
  // Shared buffers sized for the largest batch.
  auto* table16 = static_cast<uint16_t*>(device_bytes(kVocab * kHidden * 2));
  std::vector<int32_t> ids(max_batch);
  for (int64_t i = 0; i < max_batch; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % kVocab);
  const int32_t* d_ids = device_copy(ids);
  auto* act = static_cast<float*>(device_bytes(max_batch * kFfn * 4));
  auto* act2 = static_cast<float*>(device_bytes(max_batch * kFfn * 4));
  auto* residual = static_cast<float*>(device_bytes(max_batch * kHidden * 4));
  auto* norm_w = static_cast<float*>(device_bytes(kHidden * 4));
  auto* logits = static_cast<float*>(device_bytes(max_batch * kVocab * 4));
  auto* out_ids = static_cast<int32_t*>(device_bytes(max_batch * 4));

  for (int64_t b : batches) {
    const double emb_bytes = static_cast<double>(b * kHidden * (2 + 4));
    row("embedding f16->f32", "dim 4096", b,
        timer.us([&] { return g_api->embedding(table16, TESSERA_CUDA_F16, kVocab, kHidden, d_ids, b, act, TESSERA_CUDA_F32, s); },
                 "embedding"),
        emb_bytes);
  }
  for (int64_t b : batches)
    row("add_rms_norm", "dim 4096", b,
        timer.us([&] { return g_api->add_rms_norm_f32(residual, act, norm_w, act2, b, kHidden, 1e-5f, s); },
                 "add_rms_norm"),
        static_cast<double>(b * kHidden * 4 * 4 + kHidden * 4));
  for (int64_t b : batches)
    row("silu_mul", "dim 14336", b,
        timer.us([&] { return g_api->silu_mul_f32(act, act2, act, b, kFfn, s); }, "silu_mul"),
        static_cast<double>(b * kFfn * 4 * 3));
  for (int64_t b : batches)
    row("argmax", "vocab 128256", b,
        timer.us([&] { return g_api->argmax_f32(logits, b, kVocab, out_ids, s); }, "argmax"),
        static_cast<double>(b * kVocab * 4));

  // Device sampling over Gaussian logits (sd 3): the draw in id order, top-k + top-p (radix
  // selections), and top-p with 20 top logprobs. GB/s counts one read of the logits.
  {
    std::vector<float> host_logits(static_cast<size_t>(max_batch * kVocab));
    uint64_t state = 0x9e3779b97f4a7c15ULL;
    for (float& v : host_logits) {  // sum of 4 uniforms: roughly Gaussian, sd ~ 3
      float acc = 0.0f;
      for (int k = 0; k < 4; ++k) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        acc += static_cast<float>(state >> 40) / 16777216.0f - 0.5f;
      }
      v = acc * 5.2f;
    }
    float* sample_logits = device_copy(host_logits);
    auto* scratch = static_cast<float*>(device_bytes(max_batch * kVocab * 4));
    auto* out_lp = static_cast<float*>(device_bytes(max_batch * 4));
    auto* top_ids = static_cast<int32_t*>(device_bytes(max_batch * TESSERA_CUDA_MAX_TOP_LOGPROBS * 4));
    auto* top_lp = static_cast<float*>(device_bytes(max_batch * TESSERA_CUDA_MAX_TOP_LOGPROBS * 4));
    struct Mode {
      const char* name;
      int32_t top_k;
      float top_p;
      int32_t n_logprobs;
    };
    for (const Mode& mode : {Mode{"sample T=1", 0, 1.0f, 0}, Mode{"sample k50 p0.9", 50, 0.9f, 0},
                             Mode{"sample p0.9 +20 lp", 0, 0.9f, 20}}) {
      std::vector<TesseraCudaSampleRow> rows(max_batch);
      for (int64_t i = 0; i < max_batch; ++i) {
        TesseraCudaSampleRow& r = rows[static_cast<size_t>(i)];
        r.u = static_cast<double>(i * 37 % 100) / 100.0;
        r.temperature = mode.top_k ? 0.8f : 1.0f;
        r.top_p = mode.top_p;
        r.top_k = mode.top_k;
        r.repetition_penalty = 1.0f;
        r.n_logprobs = mode.n_logprobs;
      }
      const TesseraCudaSampleRow* d_rows = device_copy(rows);
      for (int64_t b : batches) {
        TesseraCudaSampleArgs a{};
        a.logits = sample_logits;
        a.scratch = scratch;
        a.rows = d_rows;
        a.n_rows = b;
        a.vocab = kVocab;
        a.ids = out_ids;
        a.logprobs = out_lp;
        a.top_ids = top_ids;
        a.top_logprobs = top_lp;
        row(mode.name, "vocab 128256", b, timer.us([&] { return g_api->sample_f32(&a, s); }, "sample"),
            static_cast<double>(b * kVocab * 4));
      }
    }
  }

  // RoPE + KV write and decode attention over a paged cache, contexts 1024 and 4096.
  std::vector<float> inv_freq(kHeadDim / 2);
  for (int64_t i = 0; i < kHeadDim / 2; ++i) inv_freq[static_cast<size_t>(i)] = 1.0f / (1.0f + static_cast<float>(i));
  const float* d_inv_freq = device_copy(inv_freq);
  for (int64_t ctx : {int64_t{1024}, int64_t{4096}}) {
    const int64_t blocks_per_seq = ctx / kBlockSize;
    const int64_t num_blocks = max_batch * blocks_per_seq;
    const int64_t cache_bytes = num_blocks * kBlockSize * kKvHeads * kHeadDim * 4;
    auto* k_cache = static_cast<float*>(device_bytes(cache_bytes, 0));
    auto* v_cache = static_cast<float*>(device_bytes(cache_bytes, 0));
    std::vector<int32_t> tables(static_cast<size_t>(num_blocks)), lens(max_batch, static_cast<int32_t>(ctx)),
        positions(max_batch, static_cast<int32_t>(ctx - 1));
    for (int64_t i = 0; i < num_blocks; ++i) tables[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::vector<int64_t> slots(max_batch);
    for (int64_t i = 0; i < max_batch; ++i) slots[static_cast<size_t>(i)] = (i * blocks_per_seq) * kBlockSize + ctx - 1;
    const int32_t* d_tables = device_copy(tables);
    const int32_t* d_lens = device_copy(lens);
    const int32_t* d_pos = device_copy(positions);
    const int64_t* d_slots = device_copy(slots);
    auto* q = static_cast<float*>(device_bytes(max_batch * kHeads * kHeadDim * 4, 0));
    auto* kv_in = static_cast<float*>(device_bytes(max_batch * kKvHeads * kHeadDim * 4, 0));
    auto* att_out = static_cast<float*>(device_bytes(max_batch * kHeads * kHeadDim * 4, 0));
    for (int64_t b : batches) {
      if (ctx == 1024) {
        TesseraCudaRopeKvArgs r{q, kv_in, kv_in, d_pos, d_slots, d_inv_freq, k_cache, v_cache, b, kHeads, kKvHeads,
                                kHeadDim, kBlockSize, num_blocks};
        row("rope_kv_write", "32/8 heads x 128", b,
            timer.us([&] { return g_api->rope_kv_write_f32(&r, s); }, "rope_kv_write"),
            static_cast<double>(b * (kHeads * kHeadDim * 8 + kKvHeads * kHeadDim * 16)));
      }
      TesseraCudaDecodeAttentionArgs a{q, att_out, k_cache, v_cache, d_tables, d_lens, b, kHeads, kKvHeads,
                                       kHeadDim, kBlockSize, blocks_per_seq, 0.0883883f, 0};
      row("decode_attention", "ctx " + std::to_string(ctx) + ", 32/8 heads", b,
          timer.us([&] { return g_api->paged_decode_attention_f32(&a, s); }, "paged_decode_attention"),
          static_cast<double>(b * ctx * kKvHeads * kHeadDim * 4 * 2));
    }
    check(g_api->stream_synchronize(s), "cudaStreamSynchronize");
    for (void* p : {static_cast<void*>(k_cache), static_cast<void*>(v_cache)}) check(g_api->device_free(p), "cudaFree");
  }

  // F16 GEMMs of one layer and the LM head: traffic = weights + f16 input + f32 output.
  struct GemmShape {
    const char* name;
    int64_t rows, cols;
  };
  const GemmShape gemms[] = {{"q_proj", kHidden, kHidden}, {"gate/up_proj", kFfn, kHidden},
                             {"down_proj", kHidden, kFfn}, {"lm_head", kVocab, kHidden}};
  auto* x16 = static_cast<uint16_t*>(device_bytes(max_batch * kFfn * 2));
  auto* y32 = static_cast<float*>(device_bytes(max_batch * kVocab * 4));
  for (const GemmShape& g : gemms) {
    auto* w = static_cast<uint16_t*>(device_bytes(g.rows * g.cols * 2));
    for (int64_t b : batches) {
      const std::string shape = std::string(g.name) + " " + std::to_string(g.rows) + "x" + std::to_string(g.cols);
      row("gemm_f16", shape, b,
          timer.us([&] { return g_api->gemm_f16(blas, w, x16, y32, g.rows, g.cols, b, s); }, "gemm_f16"),
          static_cast<double>(g.rows * g.cols * 2 + b * g.cols * 2 + b * g.rows * 4));
    }
    check(g_api->stream_synchronize(s), "cudaStreamSynchronize");
    check(g_api->device_free(w), "cudaFree");
  }

  // W8A16 / W4A16 GEMMs (quant_gemm.cu): traffic = weights + scales (+ zeros) + input + output.
  const int64_t small_batches[] = {1, 8, 32};
  for (const GemmShape& g : gemms) {
    auto* w8 = static_cast<int8_t*>(device_bytes(g.rows * g.cols));
    auto* s8 = static_cast<float*>(device_bytes(g.rows * 4));
    auto* w4 = static_cast<uint8_t*>(device_bytes(g.rows * g.cols / 2));
    auto* s4 = static_cast<uint16_t*>(device_bytes(g.rows * (g.cols / 128) * 2));
    auto* z4 = static_cast<uint8_t*>(device_bytes(g.rows * (g.cols / 128), 8));
    for (int64_t b : small_batches) {
      const std::string shape = std::string(g.name) + " " + std::to_string(g.rows) + "x" + std::to_string(g.cols);
      const double io = static_cast<double>(b * g.cols * 2 + b * g.rows * 4);
      row("gemm_w8a16", shape, b,
          timer.us([&] { return g_api->gemm_w8a16(w8, s8, x16, y32, g.rows, g.cols, b, s); }, "gemm_w8a16"),
          static_cast<double>(g.rows * g.cols + g.rows * 4) + io);
      row("gemm_w4a16", shape, b,
          timer.us([&] { return g_api->gemm_w4a16(w4, s4, z4, x16, y32, g.rows, g.cols, b, s); }, "gemm_w4a16"),
          static_cast<double>(g.rows * g.cols / 2 + g.rows * (g.cols / 128) * 3) + io);
    }
    check(g_api->stream_synchronize(s), "cudaStreamSynchronize");
    for (void* p : {static_cast<void*>(w8), static_cast<void*>(s8), static_cast<void*>(w4), static_cast<void*>(s4),
                    static_cast<void*>(z4)})
      check(g_api->device_free(p), "cudaFree");
  }

  // Prefill attention (prefill_attention.cu): one sequence, a chunk of `chunk` queries at the
  // end of a context of ctx tokens; traffic = the K/V the chunk reads once + q + out (a lower
  // bound: tiles re-read K/V from L2).
  for (int64_t ctx : {int64_t{512}, int64_t{2048}}) {
    const int64_t chunk = 512, blocks = ctx / kBlockSize;
    const int64_t cache_bytes = blocks * kBlockSize * kKvHeads * kHeadDim * 4;
    auto* k_cache = static_cast<float*>(device_bytes(cache_bytes, 0));
    auto* v_cache = static_cast<float*>(device_bytes(cache_bytes, 0));
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    for (int64_t i = 0; i < blocks; ++i) table[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    const int32_t* d_table = device_copy(table);
    const int32_t* d_begin = device_copy(std::vector<int32_t>{0});
    const int32_t* d_len = device_copy(std::vector<int32_t>{static_cast<int32_t>(chunk)});
    const int32_t* d_start = device_copy(std::vector<int32_t>{static_cast<int32_t>(ctx - chunk)});
    auto* q = static_cast<float*>(device_bytes(chunk * kHeads * kHeadDim * 4, 0));
    auto* out = static_cast<float*>(device_bytes(chunk * kHeads * kHeadDim * 4, 0));
    TesseraCudaPrefillAttentionArgs a{q,       out,      k_cache,  v_cache,    d_table,   d_begin, d_len,
                                      d_start, 1,        chunk,    kHeads,     kKvHeads,  kHeadDim, kBlockSize,
                                      blocks,  0.0883883f, 0};
    row("prefill_attention", "chunk 512, ctx " + std::to_string(ctx), chunk,
        timer.us([&] { return g_api->paged_prefill_attention_f32(&a, s); }, "paged_prefill_attention"),
        static_cast<double>(2 * cache_bytes + 2 * chunk * kHeads * kHeadDim * 4));
    check(g_api->stream_synchronize(s), "cudaStreamSynchronize");
    for (void* p : {static_cast<void*>(k_cache), static_cast<void*>(v_cache)}) check(g_api->device_free(p), "cudaFree");
  }
  check(g_api->device_synchronize(), "cudaDeviceSynchronize");
  return sparse_crossover(timer);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::run(argc, argv); }
