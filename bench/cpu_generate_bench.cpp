// tessera-bench-cpu: CPU throughput of the forward pass on one model file.
//
// Reports, per thread count: prompt processing (one prompt of --prompt tokens, tok/s),
// generation at batch 1 (--gen tokens decoded one at a time from position --depth (0: an empty
// cache; D: after D tokens of context prefilled, untimed: decode attention at that depth), greedy,
// tok/s),
// aggregate generation with B concurrent sequences (B single-token pieces per step), the weight
// bytes read per generated token, the machine's read bandwidth (measured here with the same
// number of threads) and the fraction of it that batch-1 generation reaches. Every figure is
// the median of --reps runs after one warm-up. --json writes the same numbers for scripts
// (bench/llama_cpp_compare.py).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include "common/check.h"
#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/kernel_tune.h"
#include "kernels/cpu/vec.h"
#include "kernels/gemm.h"
#include "cli/flags.h"
#include "local/local_model.h"
#include "shard/kv_cache.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// ---------------------------------------------------------------- memory bandwidth

#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t read_sum_avx2(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 128 <= n; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  return out[0] + out[1] + out[2] + out[3];
}
#endif

uint64_t read_sum(const uint8_t* p, size_t n) {
#if defined(__x86_64__)
  if (cpu::has_avx2()) return read_sum_avx2(p, n);
#endif
  uint64_t s = 0;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    s += v;
  }
  return s;
}

// Read bandwidth (GB/s) of `threads` threads each streaming its part of a 1 GiB buffer:
// the best of several passes (the machine is shared; the best pass is the least disturbed).
double measure_bandwidth_gbs(int threads) {
  const size_t bytes = size_t{1} << 30;
  std::vector<uint8_t> storage(bytes + 64);
  uint8_t* buf = storage.data() + ((64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64);
  for (size_t i = 0; i < bytes; i += 4096) buf[i] = static_cast<uint8_t>(i >> 12);
  const size_t part = bytes / static_cast<size_t>(threads) / 128 * 128;
  double best = 0.0;
  std::atomic<uint64_t> sink{0};
  for (int pass = 0; pass < 6; ++pass) {
    const auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] { sink += read_sum(buf + static_cast<size_t>(t) * part, part); });
    for (auto& t : ts) t.join();
    const double s = seconds_since(t0);
    best = std::max(best, static_cast<double>(part) * threads / s / 1e9);
  }
  return best;
}

// ---------------------------------------------------------------- model runs

// The process's peak resident set (VmHWM), MB.
double peak_rss_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0.0;
}

int32_t argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

struct Runner {
  LocalModel& model;
  std::vector<float> logits;
  double depth_prefill_seconds = 0;  // the last context prefill of decode() (timed, not in its figure)

  // One prompt of n tokens from position 0; returns seconds.
  double prefill(int64_t n) {
    const int64_t vocab = model.config().vocab;
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % vocab);
    std::vector<int32_t> table;
    TESSERA_CHECK(model.ensure_blocks(table, n), "KV blocks for {} tokens", n);
    SequenceInput in;
    in.tokens = ids;
    in.block_table = table;
    const auto t0 = Clock::now();
    const Status s = model.forward().run(std::span<const SequenceInput>(&in, 1), logits);
    const double dt = seconds_since(t0);
    TESSERA_CHECK(s.is_ok(), "prefill: {}", s.to_string());
    model.release_blocks(table);
    return dt;
  }

  // `batch` sequences decoded together for n steps from position `depth` (greedy, or with
  // `sampling` drawn through the engine's Sampler over the whole vocabulary); returns seconds.
  // With depth > 0 each sequence first gets `depth` tokens of context (one prefill, untimed).
  double decode(int64_t batch, int64_t n, const SamplingParams* sampling = nullptr, int64_t depth = 0) {
    const int64_t vocab = model.config().vocab;
    std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch));
    std::vector<int32_t> cur(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<int32_t>& table = tables[static_cast<size_t>(b)];
      TESSERA_CHECK(model.ensure_blocks(table, depth + n), "KV blocks for {} sequences of {} tokens", batch,
                    depth + n);
      cur[static_cast<size_t>(b)] = static_cast<int32_t>((b * 104729 + 1) % vocab);
      if (depth > 0) {
        std::vector<int32_t> ids(static_cast<size_t>(depth));
        for (int64_t i = 0; i < depth; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13 + b) % vocab);
        SequenceInput in;
        in.tokens = ids;
        in.block_table = table;
        const auto p0 = Clock::now();
        const Status s = model.forward().run(std::span<const SequenceInput>(&in, 1), logits);
        depth_prefill_seconds = seconds_since(p0);
        TESSERA_CHECK(s.is_ok(), "context prefill: {}", s.to_string());
      }
    }
    std::vector<SequenceInput> ins(static_cast<size_t>(batch));
    std::vector<Sampler> samplers;
    ThreadPool* pool = &model.pool();  // as the shard executor samples: on the forward pass's threads
    if (sampling != nullptr)
      for (int64_t b = 0; b < batch; ++b) samplers.emplace_back(*sampling);
    const auto t0 = Clock::now();
    for (int64_t pos = depth; pos < depth + n; ++pos) {
      for (int64_t b = 0; b < batch; ++b) {
        SequenceInput& in = ins[static_cast<size_t>(b)];
        in.tokens = std::span<const int32_t>(&cur[static_cast<size_t>(b)], 1);
        in.start_pos = pos;
        in.block_table = tables[static_cast<size_t>(b)];
      }
      const Status s = model.forward().run(ins, logits);
      TESSERA_CHECK(s.is_ok(), "decode: {}", s.to_string());
      for (int64_t b = 0; b < batch; ++b) {
        float* row = &logits[static_cast<size_t>(b * vocab)];
        cur[static_cast<size_t>(b)] =
            sampling != nullptr ? samplers[static_cast<size_t>(b)].sample(row, vocab, pool).id : argmax(row, vocab);
      }
    }
    const double dt = seconds_since(t0);
    for (auto& t : tables) model.release_blocks(t);
    return dt;
  }
};

// Bytes of weights one decode step reads, from the weights the forward pass uses (so --quant
// counts its converted layout): every matrix and norm, one row of the embedding, the LM head.
size_t weight_bytes_per_token(const ModelWeights& w) {
  auto bytes = [](const TensorView& t) -> size_t { return t.data == nullptr ? 0 : t.nbytes(); };
  size_t total = w.embed.data == nullptr ? 0 : w.embed.row_stride_bytes();
  total += bytes(w.final_norm) + bytes(w.lm_head);
  for (const LayerWeights& l : w.layers) {
    for (const TensorView* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.q_norm,
                                &l.k_norm, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down})
      total += bytes(*t);
  }
  return total;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t j = s.find(',', i);
    out.push_back(std::stoi(s.substr(i, j == std::string::npos ? std::string::npos : j - i)));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return out;
}

int run(int argc, char** argv) {
  CLI::App app{"tessera-bench-cpu: prompt / generation / batched throughput of one model file"};
  std::string model_path, threads_s = "1,2", batches_s = "1,4,16", json_path, isa_s;
  int64_t n_prompt = 512, n_gen = 128, n_batch_gen = 64, depth = 0;
  int reps = 3;
  bool no_bandwidth = false, no_prompt = false, sampled = false;
  app.add_option("--model", model_path, "GGUF file or HF directory")->required();
  app.add_option("--threads", threads_s, "comma-separated thread counts");
  app.add_option("--prompt", n_prompt, "prompt tokens for the prefill figure");
  app.add_option("--gen", n_gen, "tokens for the batch-1 generation figure");
  app.add_option("--depth", depth, "context tokens in the cache before the batch-1 generation figure (prefilled, untimed)");
  app.add_option("--batches", batches_s, "comma-separated concurrent sequence counts (empty: skip)");
  app.add_option("--batch-gen", n_batch_gen, "decode steps for the concurrent figures");
  app.add_option("--reps", reps, "repetitions (median reported)");
  app.add_option("--isa", isa_s, "cap the kernels' ISA: scalar, avx2, avx512");
  app.add_flag("--no-bandwidth", no_bandwidth, "skip the bandwidth measurement");
  app.add_flag("--no-prompt", no_prompt, "skip the prefill figure");
  app.add_flag("--sampled", sampled, "also time sampled decoding (temperature 0.8, top-p 0.95), paired with greedy");
  app.add_option("--json", json_path, "also write the results as JSON here");
  // --quant, --kv-dtype, --sparse-attention, --matmul-precision, ... as a shard takes them (the
  // --threads list above is this program's own; the CUDA and device flags do not apply).
  ShardRuntimeOptions runtime;
  cli::add_shard_runtime_flags(app, runtime, cli::ShardFlagsFor::kLauncher,
                               {"--threads", "--device", "--no-cuda-graphs", "--no-device-sampling",
                                "--collective-timeout-ms"});
  CLI11_PARSE(app, argc, argv);
  const MatmulPrecision precision = runtime.matmul_precision;
  const SparseAttentionConfig& sparse = runtime.sparse;
  if (Status st = set_matmul_precision(precision); !st.is_ok()) {
    std::fprintf(stderr, "error: --matmul-precision: %s\n", st.to_string().c_str());
    return 2;
  }
  if (isa_s == "scalar") cpu::set_max_isa(cpu::Isa::kScalar);
  if (isa_s == "avx2") cpu::set_max_isa(cpu::Isa::kAvx2);
  if (isa_s == "avx512") cpu::set_max_isa(cpu::Isa::kAvx512);
  cpu::tune_kernels();  // as the CPU backend does, so that the line printed below is the one in effect
  const std::vector<int> threads = parse_list(threads_s);
  const std::vector<int> batches = batches_s.empty() ? std::vector<int>{} : parse_list(batches_s);

  nlohmann::json out;
  out["model"] = model_path;
  out["isa"] = cpu::isa_name(cpu::active_isa());
  out["cpu"] = cpu::describe_cpu();
  out["matmul_precision"] = matmul_precision_name(precision);
  out["prompt_tokens"] = n_prompt;
  out["gen_tokens"] = n_gen;
  out["depth"] = depth;
  out["quant"] = std::string(weight_quant_name(runtime.quant));
  out["kv_dtype"] = std::string(kv_dtype_name(runtime.kv_dtype));
  out["sparse_attention"] = sparse.enabled;
  out["sparse_threshold"] = sparse.threshold_tokens;
  out["sparse_top_blocks"] = sparse.select.top_blocks;
  std::printf("model %s  isa %s  matmul %s\ncpu %s\n", model_path.c_str(), cpu::isa_name(cpu::active_isa()),
              matmul_precision_name(precision),
              cpu::describe_cpu().c_str());
  for (int nt : threads) {
    LocalModelOptions opts;
    opts.path = model_path;
    opts.runtime = runtime;
    opts.runtime.threads = nt;
    int64_t max_batch = 1;
    for (int b : batches) max_batch = std::max<int64_t>(max_batch, b);
    // Each sequence rounds up to whole KV blocks (16 tokens by default).
    opts.kv_tokens = std::max({n_prompt, depth + n_gen, max_batch * (n_batch_gen + 16)}) + 64;
    auto loaded = LocalModel::load(opts);
    if (!loaded.is_ok()) {
      std::fprintf(stderr, "%s\n", loaded.status().to_string().c_str());
      return 1;
    }
    LocalModel& model = **loaded;
    Runner runner{model, {}};
    const size_t wbytes = weight_bytes_per_token(model.weights());
    nlohmann::json r;
    r["threads"] = nt;
    r["weight_bytes_per_token"] = wbytes;
    const ModelConfig& mc = model.config();
    r["kv_bytes_per_token"] = kv_bytes_per_token(mc.n_layers, mc.n_kv_heads, mc.head_dim, runtime.kv_dtype);
    if (!no_prompt) {
      runner.prefill(std::min<int64_t>(n_prompt, 64));  // warm-up (pages, scratch)
      std::vector<double> t;
      for (int i = 0; i < reps; ++i) t.push_back(runner.prefill(n_prompt));
      r["prompt_tok_s"] = static_cast<double>(n_prompt) / median(t);
    }
    runner.decode(1, 8);
    std::vector<double> t;
    const double cpu0 = process_cpu_seconds();
    for (int i = 0; i < reps; ++i) t.push_back(runner.decode(1, n_gen, nullptr, depth));
    // CPU seconds per token over all threads: on a shared machine this shows the kernels' own
    // cost, which the wall clock mixes with time the threads spent descheduled.
    const double cpu_ms = (process_cpu_seconds() - cpu0) * 1e3 / static_cast<double>(reps * n_gen);
    const double gen_tok_s = static_cast<double>(n_gen) / median(t);
    r["gen_tok_s"] = gen_tok_s;
    if (depth == 0) r["gen_cpu_ms_per_token"] = cpu_ms;  // else it includes the context prefills
    if (depth > 0) r["depth_prefill_tok_s"] = static_cast<double>(depth) / runner.depth_prefill_seconds;
    if (sampled) {
      // Temperature 0.8, top-p 0.95 over the whole vocabulary, alternating with greedy runs.
      SamplingParams sp;
      sp.temperature = 0.8f;
      sp.top_p = 0.95f;
      sp.seed = 7;
      sp.has_seed = true;
      std::vector<double> ts, tg;
      for (int i = 0; i < reps; ++i) {
        ts.push_back(runner.decode(1, n_gen, &sp, depth));
        tg.push_back(runner.decode(1, n_gen, nullptr, depth));
      }
      r["sampled_gen_tok_s"] = static_cast<double>(n_gen) / median(ts);
      r["greedy_gen_tok_s_paired"] = static_cast<double>(n_gen) / median(tg);
    }
    nlohmann::json conc = nlohmann::json::object();
    for (int b : batches) {
      std::vector<double> tb;
      for (int i = 0; i < reps; ++i) tb.push_back(runner.decode(b, n_batch_gen));
      conc[std::to_string(b)] = static_cast<double>(b * n_batch_gen) / median(tb);
    }
    r["concurrent_tok_s"] = conc;
    r["peak_rss_mb"] = peak_rss_mb();  // before the bandwidth measurement's buffers
    if (!no_bandwidth) {
      const double bw = measure_bandwidth_gbs(nt);
      r["read_bandwidth_gb_s"] = bw;
      r["bandwidth_fraction"] = static_cast<double>(wbytes) * gen_tok_s / (bw * 1e9);
    }
    if (depth == 0)
      std::printf("threads %d: prompt %.1f tok/s  gen %.1f tok/s (%.2f cpu-ms/token)", nt,
                  r.value("prompt_tok_s", 0.0), gen_tok_s, cpu_ms);
    else
      std::printf("threads %d: prompt %.1f tok/s  gen %.1f tok/s at depth %lld", nt, r.value("prompt_tok_s", 0.0),
                  gen_tok_s, static_cast<long long>(depth));
    if (sampled)
      std::printf("  sampled (T 0.8, top-p 0.95) %.1f tok/s vs greedy %.1f", r["sampled_gen_tok_s"].get<double>(),
                  r["greedy_gen_tok_s_paired"].get<double>());
    std::printf("  peak RSS %.0f MB", r["peak_rss_mb"].get<double>());
    for (auto& [k, v] : conc.items()) std::printf("  x%s %.1f tok/s", k.c_str(), v.get<double>());
    if (!no_bandwidth)
      std::printf("  | %.1f MB/token, bw %.1f GB/s, %.0f%% of it", static_cast<double>(wbytes) / 1e6,
                  r["read_bandwidth_gb_s"].get<double>(), 100.0 * r["bandwidth_fraction"].get<double>());
    std::printf("\n");
    std::fflush(stdout);
    out["runs"].push_back(r);
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::run(argc, argv); }
