#include "shard/shard_worker.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <thread>

#include "comm/control_channel.h"
#include "comm/control_codec.h"
#include "comm/nccl_comm.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/thread_pool.h"
#include "kernels/cuda/cuda_loader.h"
#include "kernels/sampling.h"
#include "shard/cuda_forward.h"
#include "shard/forward.h"
#include "shard/kv_cache.h"
#include "shard/tp_slice.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

// Logs a failed Status and returns exit code 2 from the enclosing function.
#define TESSERA_RETURN_IF_ERROR_EXIT(expr)      \
  do {                                          \
    Status st_ = (expr);                        \
    if (!st_.is_ok()) {                         \
      TESSERA_LOG_ERROR("{}", st_.to_string()); \
      return 2;                                 \
    }                                           \
  } while (0)

uint64_t micros_since(Clock::time_point t0) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
}

uint64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// Per-sequence state a shard keeps between steps.
struct SequenceState {
  std::vector<int32_t> tokens;       // prompt, then every sampled token
  size_t n_prompt = 0;
  std::vector<int32_t> block_table;
  std::unique_ptr<Sampler> sampler;
};

// Sends heartbeats on its own socket so the coordinator hears from a live process even while
// a long step computes.
class HeartbeatThread {
 public:
  HeartbeatThread(const ShardOptions& o, int rank, std::atomic<uint64_t>& last_step)
      : thread_([this, o, rank, &last_step] {
          auto client = ControlClient::connect(o.coordinator, shard_identity(rank) + "-hb");
          if (!client.is_ok()) return;
          while (!stop_.load()) {
            (void)(*client)->send(Heartbeat{rank, last_step.load()});
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait_for(lock, o.heartbeat_interval, [this] { return stop_.load(); });
          }
        }) {}
  ~HeartbeatThread() {
    stop_ = true;
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

class ShardWorker {
 public:
  ShardWorker(const ShardOptions& o, DeviceComm& comm) : o_(o), comm_(comm) {}

  int run() {
    const int rank = comm_.rank();
    set_log_role("shard", rank);
    if (o_.bind) bind_threads();
    Status s = load();
    auto client = ControlClient::connect(o_.coordinator, shard_identity(rank));
    if (!client.is_ok()) {
      TESSERA_LOG_ERROR("{}", client.status().to_string());
      return 2;
    }
    client_ = std::move(client).value();
    if (!s.is_ok()) {
      // Tell the coordinator why this rank cannot serve, then stop.
      TESSERA_LOG_ERROR("{}", s.to_string());
      (void)send(RefusedMsg{"rank " + std::to_string(rank) + ": " + s.to_string()});
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return 2;
    }
    HeartbeatThread heartbeat(o_, rank, last_step_);
    Result<ShardHello> h = hello();
    if (!h.is_ok()) {
      TESSERA_LOG_ERROR("{}", h.status().to_string());
      (void)send(RefusedMsg{"rank " + std::to_string(rank) + ": " + h.status().to_string()});
      return 2;
    }
    TESSERA_RETURN_IF_ERROR_EXIT(send(*h));
    return loop();
  }

 private:
  void bind_threads() {
    auto topo = discover_topology();
    if (!topo.is_ok()) {
      TESSERA_LOG_WARN("no binding: {}", topo.status().to_string());
      return;
    }
    const auto bindings = plan_bindings(*topo, o_.local_ranks, o_.device);
    const RankBinding& b = bindings[static_cast<size_t>(comm_.rank() % o_.local_ranks)];
    Status s = bind_current_process(b);
    if (!s.is_ok()) TESSERA_LOG_WARN("binding failed: {}", s.to_string());
    bound_cpus_ = b.cpus;
    TESSERA_LOG_DEBUG("bound to cpus {} ({})", format_cpu_list(b.cpus), b.reason);
  }

  Status load() {
    TESSERA_ASSIGN_OR_RETURN(store_, WeightStore::open(o_.model_path));
    const ModelConfig& c = store_->config();
    WeightLoadOptions wo;
    wo.quant = o_.weight_quant;
    wo.quantize_lm_head = o_.quantize_lm_head;
    wo.threads = o_.threads > 0 ? o_.threads : static_cast<int>(bound_cpus_.size());
    TESSERA_ASSIGN_OR_RETURN(ModelWeights full, bind_model_weights(*store_, wo));
    TESSERA_ASSIGN_OR_RETURN(layout_, plan_shard_layout(c, TpConfig{comm_.rank(), comm_.size()}));
    TESSERA_ASSIGN_OR_RETURN(weights_, slice_model_weights(std::move(full), c, layout_));
    int threads = o_.threads;
    if (threads <= 0) threads = bound_cpus_.empty() ? 0 : static_cast<int>(bound_cpus_.size());
    pool_ = std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = threads, .pin_cpus = bound_cpus_});
    if (o_.device == DeviceKind::kCuda) TESSERA_RETURN_IF_ERROR(load_cuda());
    return Status::ok();
  }

  // Uploads this rank's weights to its GPU (local rank modulo the devices of this host), with
  // an NCCL communicator over the MPI world at TP > 1. The KV pool waits for configure().
  Status load_cuda() {
    if (o_.kv_f16)
      return Status::unimplemented(
          "--kv-dtype fp16: the CUDA backend's KV cache is fp32 only (fp16 runs on the CPU "
          "backend)");
    TESSERA_ASSIGN_OR_RETURN(const CudaApi* api, load_cuda_api_with_device());
    const int devices = api->device_count();
    const int local_rank =
        static_cast<int>(env_int("OMPI_COMM_WORLD_LOCAL_RANK", comm_.rank() % std::max(1, o_.local_ranks)));
    const int device = local_rank % devices;
    if (comm_.size() > 1) {
      NcclCommOptions no;
      no.device = device;
      TESSERA_ASSIGN_OR_RETURN(nccl_, NcclComm::create(comm_, no));
    }
    CudaForwardOptions co;
    co.device = device;
    co.max_tokens_per_step = o_.max_step_tokens;
    co.max_seqs_per_step = o_.max_step_seqs;
    co.max_logit_rows = std::min<int64_t>(o_.max_step_tokens, std::max<int64_t>(o_.max_step_seqs, 256));
    co.defer_kv_pool = true;
    co.cuda_graphs = o_.cuda_graphs;
    co.max_graph_batch = o_.max_step_seqs;
    TESSERA_ASSIGN_OR_RETURN(cuda_, CudaForward::create(store_->config(), layout_, weights_.weights, nccl_.get(), co));
    // The device holds the weights now: drop the host copies (quantized or converted ones are
    // owned here; a mapped file's pages are released by the OS when not touched again).
    weights_ = ShardWeights{};
    TESSERA_LOG_INFO("{}: {:.1f} MiB of weights, {:.1f} MiB of workspace, steps up to {} tokens / {} sequences{}{}",
                     cuda_->device_name(), static_cast<double>(cuda_->weight_bytes()) / (1 << 20),
                     static_cast<double>(cuda_->workspace_bytes()) / (1 << 20), o_.max_step_tokens, o_.max_step_seqs,
                     o_.cuda_graphs ? ", decode as CUDA graphs" : "",
                     o_.device_sampling ? ", sampling on the device" : ", sampling on the host");
    return Status::ok();
  }

  Result<ShardHello> hello() const {
    const ModelConfig& c = store_->config();
    ShardHello h;
    h.rank = comm_.rank();
    h.world_size = comm_.size();
    h.tp_size = layout_.tp_size;
    h.kv_bytes_per_token = 2ull * static_cast<uint64_t>(c.n_layers * layout_.n_kv_heads * c.head_dim) *
                           (o_.kv_f16 ? sizeof(uint16_t) : sizeof(float));
    h.weight_bytes = weights_.bytes;
    if (cuda_) {
      h.device = cuda_->device_name();
      TESSERA_ASSIGN_OR_RETURN(const int64_t free_bytes, cuda_->free_device_bytes());
      h.memory_available_bytes = static_cast<uint64_t>(free_bytes);
      h.kv_bytes_per_token = static_cast<uint64_t>(cuda_->kv_bytes_per_token());
      h.weight_bytes = static_cast<uint64_t>(cuda_->weight_bytes());
      h.max_step_tokens = o_.max_step_tokens;
      h.max_step_seqs = o_.max_step_seqs;
    } else {
      h.device = fmt::format("cpu ({} threads{})", pool_->size(),
                             bound_cpus_.empty() ? "" : ", cpus " + format_cpu_list(bound_cpus_));
      h.memory_available_bytes = mem_available_bytes() / static_cast<uint64_t>(std::max(1, o_.local_ranks));
    }
    h.model_fingerprint = model_fingerprint(o_.model_path, c) + " quant=" + std::string(weight_quant_name(o_.weight_quant)) +
                          (o_.quantize_lm_head ? "+lm_head" : "");
    h.hostname = hostname();
    h.pid = static_cast<int32_t>(::getpid());
    return h;
  }

  Status send(const ControlMessage& m) {
    if (o_.protocol_version != 0) return client_->send_bytes(encode_message(m, o_.protocol_version));
    return client_->send(m);
  }

  int loop() {
    Clock::time_point last_heard = Clock::now();
    for (;;) {
      auto got = client_->receive(std::chrono::milliseconds(100));
      if (!got.is_ok()) {
        TESSERA_LOG_ERROR("{}", got.status().to_string());
        return 2;
      }
      if (!got->has_value()) {
        if (Clock::now() - last_heard > o_.coordinator_timeout) {
          TESSERA_LOG_ERROR("no message from the coordinator for {} ms: exiting", o_.coordinator_timeout.count());
          return 3;
        }
        continue;
      }
      last_heard = Clock::now();
      ReceivedMessage& rm = **got;
      if (!rm.message.is_ok()) {
        TESSERA_LOG_ERROR("refusing a message from the coordinator: {}", rm.message.status().to_string());
        (void)send(RefusedMsg{rm.message.status().message()});
        continue;
      }
      ControlMessage& msg = *rm.message;
      if (auto* cfg = std::get_if<ConfigureMsg>(&msg)) {
        Status s = configure(*cfg);
        if (!s.is_ok()) {
          TESSERA_LOG_ERROR("{}", s.to_string());
          (void)send(RefusedMsg{s.message()});
          return 2;
        }
      } else if (auto* plan = std::get_if<StepPlan>(&msg)) {
        StepResult r = execute(*plan);
        TESSERA_RETURN_IF_ERROR_EXIT(send(r));
      } else if (auto* abort = std::get_if<AbortMsg>(&msg)) {
        for (uint64_t id : abort->seq_ids) drop(id);
      } else if (auto* sd = std::get_if<ShutdownMsg>(&msg)) {
        TESSERA_LOG_DEBUG("shutdown: {}", sd->reason);
        return 0;
      } else if (auto* refused = std::get_if<RefusedMsg>(&msg)) {
        TESSERA_LOG_ERROR("the coordinator refused this shard: {}", refused->reason);
        return 2;
      }
      // Heartbeats only refresh last_heard.
    }
  }

  Status configure(const ConfigureMsg& cfg) {
    if (num_blocks_ > 0) return Status::invalid_argument("configured twice");
    if (cuda_) {
      TESSERA_RETURN_IF_ERROR(cuda_->configure_kv(cfg.block_size, cfg.num_blocks));
      num_blocks_ = cfg.num_blocks;
      TESSERA_LOG_DEBUG("KV pool on {}: {} blocks of {} tokens", cuda_->device_name(), cfg.num_blocks, cfg.block_size);
      return Status::ok();
    }
    const ModelConfig& c = store_->config();
    KvCacheShape shape{c.n_layers, layout_.n_kv_heads, c.head_dim, cfg.block_size, cfg.num_blocks, o_.kv_f16};
    TESSERA_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(shape));
    cache_ = std::make_unique<KvCache>(std::move(cache));
    const int64_t relaid = relayout_for_cpu_kernels(weights_, pool_.get());
    if (relaid > 0) TESSERA_LOG_DEBUG("{} matrices re-laid in 16-row groups for the AVX-512 kernels", relaid);
    forward_ = std::make_unique<ForwardPass>(c, layout_, weights_.weights, pool_.get(), cache_.get(), &comm_);
    num_blocks_ = cfg.num_blocks;
    TESSERA_LOG_DEBUG("KV cache: {} blocks of {} tokens", cfg.num_blocks, cfg.block_size);
    return Status::ok();
  }

  void drop(uint64_t id) {
    sequences_.erase(id);
  }

  // Applies the plan's bookkeeping; any error leaves the computation undone (every rank sees
  // the same plan, so every rank fails the same way before any collective).
  Status prepare(const StepPlan& plan) {
    if (num_blocks_ == 0) return Status::invalid_argument("step before configure");
    if (plan.step_id != last_step_ + 1)
      return Status::invalid_argument(fmt::format("step {} arrived after step {}", plan.step_id, last_step_.load()));
    for (uint64_t id : plan.finished) drop(id);
    for (const NewSequence& n : plan.new_sequences) {
      TESSERA_RETURN_IF_ERROR(validate_sampling_params(n.sampling).with_context(fmt::format("sequence {}", n.seq_id)));
      if (sequences_.count(n.seq_id)) return Status::invalid_argument(fmt::format("sequence {} already exists", n.seq_id));
      const int64_t vocab = store_->config().vocab;
      for (int32_t id : n.prompt_ids)
        if (id < 0 || id >= vocab)
          return Status::out_of_range(fmt::format("sequence {}: token id {} is outside the vocabulary (0..{})",
                                                  n.seq_id, id, vocab - 1));
      SequenceState st;
      st.tokens = n.prompt_ids;
      st.n_prompt = n.prompt_ids.size();
      st.sampler = std::make_unique<Sampler>(n.sampling);
      st.sampler->add_prompt_tokens(n.prompt_ids);
      sequences_.emplace(n.seq_id, std::move(st));
    }
    for (const BlockCopy& bc : plan.block_copies) {
      if (bc.src < 0 || bc.dst < 0 || bc.src >= num_blocks_ || bc.dst >= num_blocks_)
        return Status::out_of_range(fmt::format("block copy {} -> {} outside the cache", bc.src, bc.dst));
    }
    for (const ScheduledSequence& s : plan.scheduled) {
      auto it = sequences_.find(s.seq_id);
      if (it == sequences_.end()) return Status::not_found(fmt::format("unknown sequence {}", s.seq_id));
      const auto n_tokens = static_cast<int64_t>(it->second.tokens.size());
      if (s.num_tokens <= 0 || s.start_pos < 0 || s.start_pos + s.num_tokens > n_tokens)
        return Status::invalid_argument(fmt::format("sequence {}: positions [{}, {}) but it has {} tokens", s.seq_id,
                                                    s.start_pos, s.start_pos + s.num_tokens, n_tokens));
    }
    return Status::ok();
  }

  Status copy_block(int32_t src, int32_t dst) {
    if (cuda_) return cuda_->copy_block(src, dst);
    const auto& shape = cache_->shape();
    const size_t per_block = static_cast<size_t>(shape.block_size * shape.n_kv_heads * shape.head_dim);
    const auto from = per_block * static_cast<size_t>(src), to = per_block * static_cast<size_t>(dst);
    for (int64_t l = 0; l < shape.n_layers; ++l) {
      PagedKvLayer kv = cache_->layer(l);
      if (shape.f16) {
        std::copy_n(kv.k16 + from, per_block, kv.k16 + to);
        std::copy_n(kv.v16 + from, per_block, kv.v16 + to);
      } else {
        std::copy_n(kv.k + from, per_block, kv.k + to);
        std::copy_n(kv.v + from, per_block, kv.v + to);
      }
    }
    return Status::ok();
  }

  StepResult execute(const StepPlan& plan) {
    if (o_.debug_step_delay.count() > 0) std::this_thread::sleep_for(o_.debug_step_delay);
    const auto t0 = Clock::now();
    StepResult r;
    r.step_id = plan.step_id;
    r.rank = comm_.rank();
    Status s = prepare(plan);
    if (s.is_ok()) {
      for (const BlockCopy& bc : plan.block_copies) {
        if (s.is_ok()) s = copy_block(bc.src, bc.dst);
      }
      batch_.clear();
      for (const ScheduledSequence& q : plan.scheduled) {
        SequenceState& st = sequences_.at(q.seq_id);
        if (q.reset_blocks) st.block_table.clear();
        st.block_table.insert(st.block_table.end(), q.append_blocks.begin(), q.append_blocks.end());
        SequenceInput in;
        in.tokens = std::span<const int32_t>(st.tokens.data() + q.start_pos, static_cast<size_t>(q.num_tokens));
        in.start_pos = q.start_pos;
        in.block_table = st.block_table;
        in.want_logits = q.sample;
        in.all_logits = q.prompt_logprobs;
        batch_.push_back(in);
      }
      bool greedy = false, on_device = false;
      if (cuda_) {
        // Collectives run on the device stream, inside the step (not timed apart). Steps whose
        // every sampled row is plain greedy take the argmax on the device; other steps sample
        // on the device when they can: either way no logits cross to the host.
        greedy = plain_greedy(plan);
        on_device = !greedy && o_.device_sampling && device_sampling_rows(plan);
        if (s.is_ok() && !batch_.empty()) {
          if (greedy)
            s = cuda_->run_greedy(batch_, greedy_ids_);
          else if (on_device)
            s = cuda_->run_sampled(batch_, sample_rows_, penalties_, sampled_);
          else
            s = cuda_->run(batch_, logits_);
        }
      } else {
        const uint64_t comm_before = forward_->comm_micros;
        if (s.is_ok() && !batch_.empty()) s = forward_->run(batch_, logits_);
        r.comm_micros = forward_->comm_micros - comm_before;
      }
      if (s.is_ok()) {
        if (greedy)
          take_greedy(plan, r);
        else if (on_device)
          take_sampled(plan, r);
        else
          sample(plan, r);
      }
    }
    if (!s.is_ok()) r.error = fmt::format("rank {}: step {}: {}", comm_.rank(), plan.step_id, s.to_string());
    last_step_ = plan.step_id;
    r.compute_micros = micros_since(t0);
    return r;
  }

  // True when every sequence that samples this step wants the plain argmax: temperature 0, no
  // logprobs, no penalties or logit bias, no banned tokens, no prompt logprobs (what Sampler would do with
  // the logits is then exactly the device's greedy choice).
  bool plain_greedy(const StepPlan& plan) const {
    for (const ScheduledSequence& q : plan.scheduled) {
      if (q.prompt_logprobs || !q.banned_tokens.empty()) return false;
      if (!q.sample) continue;
      auto it = sequences_.find(q.seq_id);
      if (it == sequences_.end()) return false;
      const SamplingParams& p = it->second.sampler->params();
      if (p.temperature != 0.0f || p.n_logprobs != 0 || p.return_logprob || p.repetition_penalty != 1.0f ||
          p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f || !p.logit_bias.empty())
        return false;
    }
    return true;
  }

  // Fills sample_rows_ / penalties_ with every sampling row of the step (batch order) for
  // CudaForward::run_sampled; false when the device cannot take the step (prompt logprobs need
  // the logits, more top logprobs than the device returns, a logit_bias (the host adds it), too
  // many penalty entries).
  bool device_sampling_rows(const StepPlan& plan) {
    sample_rows_.clear();
    penalties_.clear();
    for (const ScheduledSequence& q : plan.scheduled) {
      if (q.prompt_logprobs) return false;
      if (!q.sample) continue;
      auto it = sequences_.find(q.seq_id);
      if (it == sequences_.end()) return false;
      const Sampler& sampler = *it->second.sampler;
      const SamplingParams& p = sampler.params();
      if (p.n_logprobs > TESSERA_CUDA_MAX_TOP_LOGPROBS || !p.logit_bias.empty()) return false;
      sample_rows_.push_back(device_sample_row(sampler, q.banned_tokens, penalties_));
    }
    return cuda_->can_sample(sample_rows_, penalties_).is_ok();
  }

  // The tokens of a device-sampled step, one per sampling sequence in batch order: what
  // sample() does with the host's Sampler, the draw made on the device.
  void take_sampled(const StepPlan& plan, StepResult& r) {
    size_t row = 0;
    for (const ScheduledSequence& q : plan.scheduled) {
      if (!q.sample) continue;
      SequenceState& st = sequences_.at(q.seq_id);
      SampledToken& tok = sampled_[row++];
      st.sampler->accept(tok.id);
      if (q.start_pos + q.num_tokens == static_cast<int64_t>(st.tokens.size())) st.tokens.push_back(tok.id);
      if (comm_.rank() == 0) r.tokens.push_back({q.seq_id, tok.id, tok.logprob, std::move(tok.top_logprobs)});
    }
  }

  // The tokens of a plain_greedy step: one id per sampling sequence, in batch order.
  void take_greedy(const StepPlan& plan, StepResult& r) {
    size_t row = 0;
    for (const ScheduledSequence& q : plan.scheduled) {
      if (!q.sample) continue;
      SequenceState& st = sequences_.at(q.seq_id);
      const int32_t id = greedy_ids_[row++];
      st.sampler->accept(id);  // as sample() does: the sampler's history stays complete
      if (q.start_pos + q.num_tokens == static_cast<int64_t>(st.tokens.size())) st.tokens.push_back(id);
      if (comm_.rank() == 0) r.tokens.push_back({q.seq_id, id, 0.0f, {}});
    }
  }

  // Every rank samples from the same gathered logits with the same seeded state, so every
  // rank appends the same token; rank 0 reports it.
  void sample(const StepPlan& plan, StepResult& r) {
    const int64_t vocab = store_->config().vocab;
    int64_t row = 0;
    for (const ScheduledSequence& q : plan.scheduled) {
      SequenceState& st = sequences_.at(q.seq_id);
      if (q.prompt_logprobs) {
        // Row i predicts the token at start_pos + i + 1; report those inside the prompt.
        const auto n_prompt = static_cast<int64_t>(st.n_prompt);
        for (int64_t i = 0; i < q.num_tokens; ++i) {
          const int64_t pos = q.start_pos + i + 1;
          if (comm_.rank() == 0 && pos < n_prompt) {
            const int32_t token = st.tokens[static_cast<size_t>(pos)];
            SampledToken lp = token_logprobs(&logits_[static_cast<size_t>((row + i) * vocab)], vocab, token,
                                             st.sampler->params().n_logprobs);
            r.prompt_logprobs.push_back({q.seq_id, pos, token, lp.logprob, std::move(lp.top_logprobs)});
          }
        }
        row += q.num_tokens - 1;  // the last row is the sampling row below
        if (!q.sample) {
          ++row;
          continue;
        }
      } else if (!q.sample) {
        continue;
      }
      float* logits = &logits_[static_cast<size_t>(row * vocab)];
      for (const int32_t id : q.banned_tokens) {
        if (id >= 0 && id < vocab) logits[id] = -std::numeric_limits<float>::infinity();
      }
      SampledToken tok = st.sampler->sample(logits, vocab);
      ++row;
      // Recompute after preemption re-samples only when the plan covers every known token.
      if (q.start_pos + q.num_tokens == static_cast<int64_t>(st.tokens.size())) st.tokens.push_back(tok.id);
      if (comm_.rank() == 0) r.tokens.push_back({q.seq_id, tok.id, tok.logprob, std::move(tok.top_logprobs)});
    }
  }

  const ShardOptions& o_;
  DeviceComm& comm_;
  std::unique_ptr<ControlClient> client_;
  std::unique_ptr<WeightStore> store_;
  ShardLayout layout_;
  ShardWeights weights_;
  std::vector<int> bound_cpus_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<ForwardPass> forward_;
  std::unique_ptr<NcclComm> nccl_;     // CUDA backend at TP > 1
  std::unique_ptr<CudaForward> cuda_;  // CUDA backend; null: the CPU ForwardPass
  int64_t num_blocks_ = 0;             // set by configure
  std::map<uint64_t, SequenceState> sequences_;
  std::atomic<uint64_t> last_step_{0};
  std::vector<SequenceInput> batch_;
  std::vector<float> logits_;
  std::vector<int32_t> greedy_ids_;
  // device sampling (CUDA backend): the step's rows and penalty entries, the tokens back
  std::vector<TesseraCudaSampleRow> sample_rows_;
  std::vector<TesseraCudaPenalty> penalties_;
  std::vector<SampledToken> sampled_;
};

}  // namespace

std::string model_fingerprint(const std::string& model_path, const ModelConfig& c) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p(model_path);
  uint64_t size = 0;
  if (fs::is_regular_file(p, ec)) size = fs::file_size(p, ec);
  return fmt::format("{} hidden={} layers={} heads={} kv_heads={} ffn={} vocab={} file={} bytes={}",
                     architecture_name(c.arch), c.hidden, c.n_layers, c.n_heads, c.n_kv_heads, c.ffn, c.vocab,
                     p.filename().string().empty() ? p.parent_path().filename().string() : p.filename().string(), size);
}

int run_shard(const ShardOptions& options, DeviceComm& comm) {
  ShardWorker worker(options, comm);
  return worker.run();
}

}  // namespace tessera
