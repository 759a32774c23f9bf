#include "launch/measure_step.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "comm/device_comm.h"
#include "common/dtype.h"
#include "common/thread_pool.h"
#include "kernels/weight_codec.h"
#include "model/weight_store.h"
#include "shard/forward.h"
#include "shard/kv_cache.h"
#include "shard/tp_slice.h"

namespace tessera::cli {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

uint64_t weight_bytes_of(const ModelWeights& w) {
  uint64_t bytes = w.embed.nbytes() + (w.lm_head.data == w.embed.data ? 0 : w.lm_head.nbytes());
  for (const LayerWeights& l : w.layers)
    for (const TensorView* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) bytes += m->nbytes();
  return bytes;
}

// One TP rank of the measured engine.
struct Rank {
  ShardLayout layout;
  ShardWeights weights;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<ForwardPass> forward;
};

}  // namespace

Result<Measured> measure_decode_steps(const MeasureArgs& a, int64_t context) {
  Measured out;
  out.tp = a.tp;
  out.batch = a.batch;
  out.context = context;
  out.steps = std::max(1, a.steps);
  const int warmup = 2;
  TESSERA_ASSIGN_OR_RETURN(auto store, WeightStore::open(a.model));
  const ModelConfig& c = store->config();
  // A context at (or near) the model's length, the plan's default, is measured as far as the timed
  // steps leave room: a few positions less (Measured::context says which).
  if (context + warmup + out.steps + 1 > c.max_positions) {
    if (context > c.max_positions || c.max_positions - warmup - out.steps - 1 < 1)
      return Status::invalid_argument(fmt::format("--measure: context {} plus {} steps exceeds the model's {} positions",
                                                  context, warmup + out.steps, c.max_positions));
    context = c.max_positions - warmup - out.steps - 1;
    out.context = context;
  }
  const int hw = a.threads > 0 ? a.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  out.threads_per_rank = std::max(1, hw / a.tp);
  const int64_t tokens_per_seq = context + warmup + out.steps + 1;
  const int64_t blocks_per_seq = (tokens_per_seq + a.block_size - 1) / a.block_size;

  std::vector<std::unique_ptr<DeviceComm>> comms;
  if (a.tp == 1) comms.push_back(make_single_rank_comm());
  else comms = make_in_process_comms(a.tp);
  std::vector<Rank> ranks(static_cast<size_t>(a.tp));
  for (int r = 0; r < a.tp; ++r) {
    Rank& rank = ranks[static_cast<size_t>(r)];
    TESSERA_ASSIGN_OR_RETURN(ModelWeights full, bind_model_weights(*store, {.codec = &cpu_weight_codec()}));
    TESSERA_ASSIGN_OR_RETURN(rank.layout, plan_shard_layout(c, TpConfig{r, a.tp}));
    TESSERA_ASSIGN_OR_RETURN(rank.weights, slice_model_weights(std::move(full), c, rank.layout));
    KvCacheShape shape;
    shape.n_layers = c.n_layers;
    shape.n_kv_heads = rank.layout.n_kv_heads;
    shape.head_dim = c.head_dim;
    shape.block_size = a.block_size;
    shape.num_blocks = blocks_per_seq * a.batch;
    shape.dtype = a.kv_dtype;
    TESSERA_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(shape));
    rank.cache = std::make_unique<KvCache>(std::move(cache));
    // Real pages with non-zero values: untouched anonymous pages would all read the one zero
    // page from cache and flatter the KV read.
    const std::vector<float> fill(static_cast<size_t>(a.block_size * shape.n_kv_heads * shape.head_dim), 0.01f);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const PagedKvLayer kv = rank.cache->layer(l);
      for (int32_t b = 0; b < kv.num_blocks; ++b) kv_write(kv, &b, 0, a.block_size, fill.data(), fill.data());
    }
    rank.pool = std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = out.threads_per_rank});
    relayout_for_cpu_kernels(rank.weights, rank.pool.get());
    rank.forward = std::make_unique<ForwardPass>(c, rank.layout, rank.weights.weights, rank.pool.get(),
                                                 rank.cache.get(), comms[static_cast<size_t>(r)].get());
    if (r == 0) {
      out.weight_bytes = weight_bytes_of(rank.weights.weights);
      for (const auto& v : rank.weights.full.owned_f32) out.weight_bytes += v.size() * sizeof(float);
      out.kv_bytes_per_token = KvCache::bytes_per_block(shape) / static_cast<size_t>(a.block_size);
    }
  }

  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(a.batch));
  for (int64_t i = 0; i < a.batch; ++i)
    for (int64_t b = 0; b < blocks_per_seq; ++b) tables[static_cast<size_t>(i)].push_back(static_cast<int32_t>(i * blocks_per_seq + b));
  std::vector<int32_t> tokens(static_cast<size_t>(a.batch));
  for (int64_t i = 0; i < a.batch; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 1) % c.vocab);

  std::vector<double> times;
  std::vector<Status> errors(static_cast<size_t>(a.tp));
  auto run_rank = [&](int r) {
    Rank& rank = ranks[static_cast<size_t>(r)];
    std::vector<float> logits;
    std::vector<SequenceInput> batch(static_cast<size_t>(a.batch));
    for (int step = 0; step < warmup + out.steps; ++step) {
      for (int64_t i = 0; i < a.batch; ++i) {
        SequenceInput& s = batch[static_cast<size_t>(i)];
        s.tokens = std::span<const int32_t>(&tokens[static_cast<size_t>(i)], 1);
        s.start_pos = context + step;
        s.block_table = tables[static_cast<size_t>(i)];
      }
      if (step == warmup) rank.forward->comm_micros = 0;
      const auto t0 = std::chrono::steady_clock::now();
      Status st = rank.forward->run(batch, logits);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!st.is_ok()) {
        errors[static_cast<size_t>(r)] = st;
        return;
      }
      if (r == 0 && step >= warmup) times.push_back(dt);
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < a.tp; ++r) threads.emplace_back(run_rank, r);
  run_rank(0);
  for (std::thread& t : threads) t.join();
  for (const Status& st : errors) TESSERA_RETURN_IF_ERROR(st);
  out.step_median_s = median(times);
  double sum = 0;
  for (double t : times) sum += t;
  out.step_mean_s = times.empty() ? 0 : sum / static_cast<double>(times.size());
  out.step_min_s = times.empty() ? 0 : *std::min_element(times.begin(), times.end());
  out.comm_s = static_cast<double>(ranks[0].forward->comm_micros) * 1e-6 / out.steps;
  return out;
}


}  // namespace tessera::cli
