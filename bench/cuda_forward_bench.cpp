// tessera-gpu-forward-bench: decode-step time of the CUDA forward pass (shard/cuda_forward.h)
// on a synthetic Llama-3-8B-shaped model (hidden 4096, 32 layers, 32 heads, 8 KV heads, FFN
// 14336, vocab 128256; --layers to shrink it) built in memory — no model file: every layer's
// matrices of one shape are views of one host buffer of random values (the kernels' speed does
// not depend on the values), uploaded per layer, so the device holds the full model's bytes.
// The embedding and the LM head are f16 (one shared buffer, so the head is "tied"; the bytes a
// step reads are the same).
//
// For each weight type (f16: cuBLAS; int8: W8A16 kernel; int4: W4A16 kernel) and batch size:
// B sequences are prefilled with --context tokens each, then --steps decode steps (one token
// per sequence) are timed with a host clock around CudaForward::run_greedy (the argmax on the
// device, the ids copied to the host: the serving path of a greedy request), first replayed
// from CUDA graphs, then run eagerly; then graphed steps that sample on the device
// (run_sampled: temperature 0.8, top-p 0.95, the seeded draw); then speculative verification
// steps (every sequence's last token and 4 drafts, the argmax of each of the 5 rows on the
// device), graphed and eager. Printed beside it: the
// bytes of weights one step streams, the measured device-to-device copy bandwidth, the floor =
// bytes / bandwidth, floor / step time, the launches one step enqueues in each mode and the
// share of the step the host spends enqueueing.
//
// Usage: tessera-gpu-forward-bench [--types f16,int8,int4] [--batches 1,8] [--steps N]
//        [--context N] [--layers N] [--kv-dtype fp32|fp16] [--budget-s S]
//        (types after the budget are skipped)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/cuda/cuda_loader.h"
#include "kernels/quant.h"
#include "kernels/sampling.h"
#include "shard/cuda_forward.h"
#include "tools/testmodel/synthetic_model.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "tessera-gpu-forward-bench: %s\n", msg.c_str());
  std::exit(1);
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoll(item));
  return v;
}

// Deterministic uniform values in [-a, a) (xorshift; speed matters, quality does not).
struct Rng {
  uint64_t s = 0x9e3779b97f4a7c15ull;
  float next(float a) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return (static_cast<float>(s >> 40) / 16777216.0f * 2.0f - 1.0f) * a;
  }
};

// A host matrix [rows, cols] of `type` filled with small random weights.
std::vector<uint8_t> random_matrix(QuantType type, int64_t rows, int64_t cols, Rng& rng) {
  const size_t rb = row_bytes(type, cols);
  std::vector<uint8_t> bytes(rb * static_cast<size_t>(rows));
  std::vector<float> row(static_cast<size_t>(cols));
  const float a = 1.0f / std::sqrt(static_cast<float>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* dst = bytes.data() + rb * static_cast<size_t>(r);
    if (type == QuantType::kI8_CH) {
      for (int64_t c = 0; c < cols; ++c) dst[c] = static_cast<uint8_t>(static_cast<int8_t>(rng.next(127.0f)));
      const float scale = a / 127.0f;
      std::memcpy(dst + cols, &scale, 4);
      continue;
    }
    for (auto& x : row) x = rng.next(a);
    if (type == QuantType::kI4_G128) quantize_row_int4(row.data(), dst, cols, Int4Grid::kAsymmetric);
    else quantize_row(type, row.data(), dst, cols);
  }
  return bytes;
}

struct Result1 {
  int64_t batch;
  double step_ms;
};

int run(int argc, char** argv) {
  std::string types = "f16,int8,int4", batches_s = "1,8";
  int64_t steps = 20, context = 128, layers = -1;
  double budget_s = 1e9;
  KvDtype kv_dtype = KvDtype::kF32;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--types") types = v;
    else if (k == "--batches") batches_s = v;
    else if (k == "--steps") steps = std::stoll(v);
    else if (k == "--context") context = std::stoll(v);
    else if (k == "--layers") layers = std::stoll(v);
    else if (k == "--budget-s") budget_s = std::stod(v);
    else if (k == "--kv-dtype") {
      Result<KvDtype> d = parse_kv_dtype(v);
      if (!d.is_ok()) die(d.status().message());
      kv_dtype = *d;
    }
    else die("unknown option " + k);
  }
  const auto t_start = Clock::now();
  Result<const CudaApi*> api_r = load_cuda_api_with_device();
  if (!api_r.is_ok()) die(api_r.status().message());
  const CudaApi* api = *api_r;
  if (api->set_device(0) != 0) die(api->last_error());

  auto spec_r = synthetic_preset("llama3-8b");
  if (!spec_r.is_ok()) die(spec_r.status().to_string());
  const SyntheticModelSpec& spec = *spec_r;
  ModelConfig config;
  config.hidden = spec.hidden;
  config.n_layers = layers > 0 ? layers : spec.n_layers;
  config.n_heads = spec.n_heads;
  config.n_kv_heads = spec.n_kv_heads;
  config.head_dim = spec.hidden / spec.n_heads;
  config.ffn = spec.ffn;
  config.vocab = spec.vocab;
  config.max_positions = std::max<int64_t>(spec.max_positions, context + steps + 16);
  config.rms_eps = spec.rms_eps;
  config.rope_theta = spec.rope_theta;
  auto layout_r = plan_shard_layout(config, {0, 1});
  if (!layout_r.is_ok()) die(layout_r.status().to_string());
  const ShardLayout layout = *layout_r;
  const std::vector<int64_t> batches = parse_list(batches_s);

  // Device copy bandwidth: 1 GiB device-to-device, best of 5, read + write bytes.
  double copy_gbs = 0.0;
  {
    const int64_t bytes = int64_t{1} << 30;
    void *a = nullptr, *b = nullptr, *stream = nullptr, *e0 = nullptr, *e1 = nullptr;
    if (api->device_malloc(&a, bytes) || api->device_malloc(&b, bytes) || api->stream_create(&stream) ||
        api->event_create(&e0) || api->event_create(&e1) || api->device_memset(a, 1, bytes))
      die(std::string("copy bandwidth setup: ") + api->last_error());
    for (int i = 0; i < 6; ++i) {
      float ms = 0.0f;
      if (api->event_record(e0, stream) || api->device_memcpy_async(b, a, bytes, stream) ||
          api->event_record(e1, stream) || api->event_elapsed_ms(e0, e1, &ms))
        die(std::string("copy bandwidth: ") + api->last_error());
      if (i > 0 && ms > 0) copy_gbs = std::max(copy_gbs, 2.0 * static_cast<double>(bytes) / (ms * 1e6));
    }
    api->device_free(a);
    api->device_free(b);
    api->event_destroy(e0);
    api->event_destroy(e1);
    api->stream_destroy(stream);
  }
  std::printf("device copy bandwidth (read + write): %.0f GB/s; context %lld tokens, KV cache %s\n\n", copy_gbs,
              static_cast<long long>(context), std::string(kv_dtype_name(kv_dtype)).c_str());
  std::printf(
      "| weights | layers | batch | decode step ms | tokens/s | weight GB/step | floor ms | floor/step "
      "| eager step ms | launches/step eager -> graph | host share eager -> graph | sampled step ms "
      "| verify 5 rows ms graph / eager |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");

  std::stringstream ts(types);
  std::string type_name;
  while (std::getline(ts, type_name, ',')) {
    if (seconds_since(t_start) > budget_s) {
      std::printf("| %s | skipped: time budget of %.0f s spent |\n", type_name.c_str(), budget_s);
      continue;
    }
    QuantType wt;
    if (type_name == "f16") wt = QuantType::kF16;
    else if (type_name == "int8") wt = QuantType::kI8_CH;
    else if (type_name == "int4") wt = QuantType::kI4_G128;
    else die("unknown type " + type_name + " (f16, int8, int4)");

    Rng rng;
    const int64_t hd = config.head_dim, q_dim = config.n_heads * hd, kv_dim = config.n_kv_heads * hd;
    // One buffer per input width: [ffn, hidden] covers q / k / v / o / gate / up, [hidden, ffn] down.
    const std::vector<uint8_t> wide = random_matrix(wt, config.ffn, config.hidden, rng);
    const std::vector<uint8_t> down = random_matrix(wt, config.hidden, config.ffn, rng);
    const std::vector<uint8_t> embed = random_matrix(QuantType::kF16, config.vocab, config.hidden, rng);
    const std::vector<float> ones(static_cast<size_t>(config.ffn), 1.0f);
    ModelWeights w;
    w.embed = make_view(embed.data(), QuantType::kF16, {config.vocab, config.hidden});
    w.lm_head = w.embed;
    w.final_norm = make_view(ones.data(), QuantType::kF32, {config.hidden});
    for (int64_t l = 0; l < config.n_layers; ++l) {
      LayerWeights lw;
      lw.attn_norm = lw.ffn_norm = w.final_norm;
      lw.wq = make_view(wide.data(), wt, {q_dim, config.hidden});
      lw.wk = make_view(wide.data(), wt, {kv_dim, config.hidden});
      lw.wv = make_view(wide.data(), wt, {kv_dim, config.hidden});
      lw.wo = make_view(wide.data(), wt, {config.hidden, q_dim});  // q_dim == hidden for this shape
      lw.w_gate = make_view(wide.data(), wt, {config.ffn, config.hidden});
      lw.w_up = lw.w_gate;
      lw.w_down = make_view(down.data(), wt, {config.hidden, config.ffn});
      w.layers.push_back(lw);
    }
    CudaForwardOptions o;
    o.block_size = 16;
    o.max_tokens_per_step = std::max<int64_t>(512, *std::max_element(batches.begin(), batches.end()) * context);
    o.max_seqs_per_step = 256;
    o.max_logit_rows = 256;
    o.kv_dtype = kv_dtype;
    const int64_t max_b = *std::max_element(batches.begin(), batches.end());
    o.max_kv_blocks = max_b * ((context + 5 * (steps + 3) + 8 + 15) / 16 + 1);
    const auto t_up = Clock::now();
    auto fwd_r = CudaForward::create(config, layout, w, nullptr, o);
    if (!fwd_r.is_ok()) die(fwd_r.status().to_string());
    CudaForward& fwd = **fwd_r;
    std::fprintf(stderr, "%s: uploaded %.1f GB of weights in %.1f s\n", type_name.c_str(),
                 static_cast<double>(fwd.weight_bytes()) / 1e9, seconds_since(t_up));
    const double step_gb = static_cast<double>(fwd.weight_bytes_per_step()) / 1e9;
    const double floor_ms = copy_gbs > 0 ? step_gb / copy_gbs * 1e3 : 0.0;

    for (int64_t b : batches) {
      // Five timed phases; a verification step's 5 rows start one position after the last's.
      const int64_t blocks_per_seq = (context + 5 * (steps + 3) + 8 + 15) / 16;
      std::vector<std::vector<int32_t>> tables(static_cast<size_t>(b));
      for (int64_t s = 0; s < b; ++s)
        for (int64_t i = 0; i < blocks_per_seq; ++i) tables[static_cast<size_t>(s)].push_back(static_cast<int32_t>(s * blocks_per_seq + i));
      std::vector<int32_t> prompt(static_cast<size_t>(context));
      for (int64_t i = 0; i < context; ++i) prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % config.vocab);
      std::vector<SequenceInput> batch;
      for (int64_t s = 0; s < b; ++s) batch.push_back({prompt, 0, tables[static_cast<size_t>(s)], true});
      std::vector<float> logits;
      Status st = fwd.run(batch, logits);
      if (!st.is_ok()) die("prefill: " + st.to_string());
      std::vector<int32_t> tokens(static_cast<size_t>(b), 1), ids;
      std::vector<SampledToken> sampled;
      std::vector<TesseraCudaSampleRow> rows(static_cast<size_t>(b));
      for (int64_t s = 0; s < b; ++s) {
        TesseraCudaSampleRow& r = rows[static_cast<size_t>(s)];
        r.temperature = 0.8f;
        r.top_p = 0.95f;
        r.repetition_penalty = 1.0f;
      }
      bool sample = false;     // false: greedy on the device
      int64_t verify_rows = 0;  // > 0: verification pieces of this many tokens (all_logits)
      const std::vector<int32_t> drafts(8, 1);
      auto decode = [&](int64_t pos) {
        std::vector<SequenceInput> step;
        for (int64_t s = 0; s < b; ++s) {
          SequenceInput in{std::span<const int32_t>(&tokens[static_cast<size_t>(s)], 1), pos,
                           tables[static_cast<size_t>(s)], true};
          if (verify_rows > 0) {
            in.tokens = std::span<const int32_t>(drafts.data(), static_cast<size_t>(verify_rows));
            in.all_logits = true;
          }
          step.push_back(in);
        }
        for (int64_t s = 0; s < b; ++s)
          rows[static_cast<size_t>(s)].u = sampling_uniform(static_cast<uint64_t>(s), pos);
        Status s2 = sample ? fwd.run_sampled(step, rows, {}, sampled) : fwd.run_greedy(step, ids);
        if (!s2.is_ok()) die("decode: " + s2.to_string());
      };
      // Graphed decode (the default; the warm-up captures the bucket's graph), then the same
      // steps eagerly. Host share: enqueueing time / step time, averaged over the timed steps.
      struct Timing {
        double ms = 0, host_share = 0;
        int64_t launches = 0;
      };
      int64_t pos = context;
      auto timed = [&](bool graphs) {
        fwd.set_cuda_graphs(graphs);
        for (int64_t i = 0; i < 3; ++i) decode(pos++);  // warm-up
        Timing t;
        double host = 0, total = 0;
        const auto t0 = Clock::now();
        for (int64_t i = 0; i < steps; ++i) {
          decode(pos++);
          host += fwd.last_step().host_micros;
          total += fwd.last_step().total_micros;
        }
        t.ms = seconds_since(t0) * 1e3 / static_cast<double>(steps);
        t.host_share = total > 0 ? host / total : 0;
        t.launches = fwd.last_step().launches;
        return t;
      };
      const Timing g = timed(true);
      const Timing e = timed(false);
      sample = true;
      const Timing sg = timed(true);
      sample = false;
      verify_rows = 5;
      const Timing vg = timed(true);
      const Timing ve = timed(false);
      verify_rows = 0;
      std::printf(
          "| %s | %lld | %lld | %.2f | %.0f | %.2f | %.2f | %.0f%% | %.2f | %lld -> %lld | %.0f%% -> %.0f%% | %.2f "
          "| %.2f / %.2f |\n",
          type_name.c_str(), static_cast<long long>(config.n_layers), static_cast<long long>(b), g.ms,
          static_cast<double>(b) * 1e3 / g.ms, step_gb, floor_ms, g.ms > 0 ? 100.0 * floor_ms / g.ms : 0.0, e.ms,
          static_cast<long long>(e.launches), static_cast<long long>(g.launches), 100.0 * e.host_share,
          100.0 * g.host_share, sg.ms, vg.ms, ve.ms);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::run(argc, argv); }
