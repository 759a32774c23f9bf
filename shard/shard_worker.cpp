#include "shard/shard_worker.h"

#include <unistd.h>

#include <atomic>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "comm/control_channel.h"
#include "comm/control_codec.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/thread_pool.h"
#include "kernels/weight_codec.h"
#include "shard/cpu_backend.h"
#include "shard/cuda_backend.h"
#include "shard/shard_executor.h"
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

// Sends heartbeats on its own socket so the coordinator hears from a live process even while
// a long step computes. It is also the watchdog of a step stuck in a collective: when the
// coordinator's process (on this host) is gone, it aborts the communicator, so a rank whose
// peer is stopped or lost does not wait on it for ever after the job is over.
class HeartbeatThread {
 public:
  HeartbeatThread(const ShardOptions& o, int rank, const ShardExecutor& executor, DeviceComm& comm)
      : thread_([this, o, rank, &executor, &comm] {
          auto client = ControlClient::connect(o.coordinator, shard_identity(rank) + "-hb");
          if (!client.is_ok()) return;
          while (!stop_.load()) {
            (void)(*client)->send(Heartbeat{rank, executor.last_step()});
            if (o.coordinator_pid > 0 && !process_alive(o.coordinator_pid))
              comm.abort(fmt::format("the coordinator (pid {}) is gone", o.coordinator_pid));
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
    HeartbeatThread heartbeat(o_, rank, *executor_, comm_);
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
    wo.codec = &cpu_weight_codec();
    wo.quant = o_.runtime.quant;
    wo.quantize_lm_head = o_.runtime.quant_lm_head;
    wo.threads = o_.runtime.threads > 0 ? o_.runtime.threads : static_cast<int>(bound_cpus_.size());
    std::optional<ImportanceMatrix> importance;
    if (!o_.runtime.imatrix.empty()) {
      TESSERA_ASSIGN_OR_RETURN(importance, load_importance(o_.runtime.imatrix));
      wo.importance = &*importance;
    }
    TESSERA_ASSIGN_OR_RETURN(ModelWeights full, bind_model_weights(*store_, wo));
    TESSERA_ASSIGN_OR_RETURN(layout_, plan_shard_layout(c, TpConfig{comm_.rank(), comm_.size()}));
    TESSERA_ASSIGN_OR_RETURN(ShardWeights weights, slice_model_weights(std::move(full), c, layout_));
    int threads = o_.runtime.threads;
    if (threads <= 0) threads = bound_cpus_.empty() ? 0 : static_cast<int>(bound_cpus_.size());
    pool_ = std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = threads, .pin_cpus = bound_cpus_});
    if (o_.device == DeviceKind::kCuda) {
      TESSERA_RETURN_IF_ERROR(load_cuda(std::move(weights)));
    } else {
      CpuBackendOptions co;
      co.runtime = o_.runtime;
      co.local_ranks = o_.local_ranks;
      co.bound_cpus = bound_cpus_;
      backend_ = std::make_unique<CpuBackend>(c, layout_, std::move(weights), pool_.get(), &comm_, co);
    }
    executor_ = std::make_unique<ShardExecutor>(
        *backend_, c, ShardExecutorOptions{.rank = comm_.rank(), .device_sampling = o_.runtime.device_sampling});
    return Status::ok();
  }

  // Uploads this rank's weights to its GPU (local rank modulo the devices of this host), with
  // an NCCL communicator over the MPI world at TP > 1. The KV pool waits for configure().
  Status load_cuda(ShardWeights weights) {
    CudaBackendOptions co;
    co.local_rank =
        static_cast<int>(env_int("OMPI_COMM_WORLD_LOCAL_RANK", comm_.rank() % std::max(1, o_.local_ranks)));
    co.runtime = o_.runtime;
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> cuda,
                             CudaBackend::create(store_->config(), layout_, std::move(weights), comm_, co));
    const CudaForward& f = cuda->forward();
    TESSERA_LOG_INFO("{}: {:.1f} MiB of weights, {:.1f} MiB of workspace, steps up to {} tokens / {} sequences{}{}",
                     f.device_name(), static_cast<double>(f.weight_bytes()) / (1 << 20),
                     static_cast<double>(f.workspace_bytes()) / (1 << 20), o_.runtime.max_step_tokens, o_.runtime.max_step_seqs,
                     o_.runtime.cuda_graphs ? ", decode as CUDA graphs" : "",
                     o_.runtime.device_sampling ? ", sampling on the device" : ", sampling on the host");
    backend_ = std::move(cuda);
    return Status::ok();
  }

  Result<ShardHello> hello() const {
    const ModelConfig& c = store_->config();
    TESSERA_ASSIGN_OR_RETURN(const BackendMemory m, backend_->memory());
    ShardHello h;
    h.rank = comm_.rank();
    h.world_size = comm_.size();
    h.tp_size = layout_.tp_size;
    h.device = m.device;
    h.memory_available_bytes = m.memory_available_bytes;
    h.kv_dtype = m.kv_dtype;
    h.kv_bytes_per_token = m.kv_bytes_per_token;
    h.kv_window = m.kv_window;
    h.kv_window_bytes_per_token = m.kv_window_bytes_per_token;
    h.kv_summary_bytes_per_block = m.kv_summary_bytes_per_block;
    h.weight_bytes = m.weight_bytes;
    if (m.max_step_tokens > 0) h.max_step_tokens = m.max_step_tokens;
    if (m.max_step_seqs > 0) h.max_step_seqs = m.max_step_seqs;
    h.model_fingerprint = model_fingerprint(o_.model_path, c) + " quant=" + std::string(weight_quant_name(o_.runtime.quant)) +
                          (o_.runtime.quant_lm_head ? "+lm_head" : "") + (o_.runtime.imatrix.empty() ? "" : "+imatrix");
    h.hostname = this_hostname();
    h.pid = static_cast<int32_t>(::getpid());
    return h;
  }

  Status send(const ControlMessage& m) {
    if (o_.protocol_version != 0) return client_->send_bytes(encode_message(m, o_.protocol_version));
    return client_->send(m);
  }

  // Whether to give up on a coordinator silent for `silent`: with its pid, at once when its
  // process is gone (after a second of silence) and after coordinator_dead_timeout while it lives;
  // without, after coordinator_timeout.
  bool coordinator_lost(Clock::duration silent, bool& warned) const {
    const auto ms = [](Clock::duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
    if (o_.coordinator_pid > 0) {
      if (silent > std::chrono::seconds(1) && !process_alive(o_.coordinator_pid)) {
        TESSERA_LOG_ERROR("the coordinator (pid {}) is gone: exiting", o_.coordinator_pid);
        return true;
      }
      if (silent <= o_.coordinator_timeout) return false;
      if (silent <= o_.coordinator_dead_timeout) {
        if (!warned)
          TESSERA_LOG_WARN("no message from the coordinator for {} ms, but its process (pid {}) is alive: waiting up to "
                           "{} ms",
                           ms(silent), o_.coordinator_pid, o_.coordinator_dead_timeout.count());
        warned = true;
        return false;
      }
    } else if (silent <= o_.coordinator_timeout) {
      return false;
    }
    TESSERA_LOG_ERROR("no message from the coordinator for {} ms: exiting", ms(silent));
    return true;
  }

  // A step's token masks (StepMasks), which the coordinator sends after the plan while this rank
  // runs the forward pass. Heartbeats are skipped, masks of an earlier step (one that failed
  // before its sampling) dropped; any other message waits in pending_ for the loop.
  Result<StepMasks> wait_masks(uint64_t step_id) {
    Clock::time_point last_heard = Clock::now();
    bool warned = false;
    for (;;) {
      auto got = client_->receive(std::chrono::milliseconds(100));
      if (!got.is_ok()) return got.status();
      if (!got->has_value()) {
        if (coordinator_lost(Clock::now() - last_heard, warned))
          return Status::deadline_exceeded(fmt::format("the token masks of step {} never arrived", step_id));
        continue;
      }
      last_heard = Clock::now();
      ReceivedMessage& rm = **got;
      if (!rm.message.is_ok()) {
        TESSERA_LOG_ERROR("refusing a message from the coordinator: {}", rm.message.status().to_string());
        (void)send(RefusedMsg{rm.message.status().message()});
        continue;
      }
      if (auto* m = std::get_if<StepMasks>(&*rm.message)) {
        if (m->step_id < step_id) continue;
        return std::move(*m);
      }
      if (std::holds_alternative<Heartbeat>(*rm.message)) continue;
      pending_.push_back(std::move(*rm.message));
      if (std::holds_alternative<ShutdownMsg>(pending_.back()))
        return Status::aborted(fmt::format("the coordinator shut down while step {} waited for its token masks", step_id));
    }
  }

  int loop() {
    Clock::time_point last_heard = Clock::now();
    bool warned = false;
    for (;;) {
      if (!pending_.empty()) {
        ControlMessage msg = std::move(pending_.front());
        pending_.pop_front();
        const int rc = handle(msg);
        if (rc >= 0) return rc;
        continue;
      }
      auto got = client_->receive(std::chrono::milliseconds(100));
      if (!got.is_ok()) {
        TESSERA_LOG_ERROR("{}", got.status().to_string());
        return 2;
      }
      if (!got->has_value()) {
        if (coordinator_lost(Clock::now() - last_heard, warned)) return 3;
        continue;
      }
      last_heard = Clock::now();
      warned = false;
      ReceivedMessage& rm = **got;
      if (!rm.message.is_ok()) {
        TESSERA_LOG_ERROR("refusing a message from the coordinator: {}", rm.message.status().to_string());
        (void)send(RefusedMsg{rm.message.status().message()});
        continue;
      }
      const int rc = handle(*rm.message);
      if (rc >= 0) return rc;
    }
  }

  // One message from the coordinator; an exit code to stop the loop with, or -1 to go on.
  int handle(ControlMessage& msg) {
    if (auto* cfg = std::get_if<ConfigureMsg>(&msg)) {
      Status s = executor_->configure(cfg->block_size, cfg->num_blocks, cfg->kv_dtype, cfg->num_window_blocks,
                                      SelfDraftConfig{cfg->draft_layers, cfg->draft_vocab, cfg->draft_ids});
      if (!s.is_ok()) {
        TESSERA_LOG_ERROR("{}", s.to_string());
        (void)send(RefusedMsg{s.message()});
        return 2;
      }
    } else if (auto* plan = std::get_if<StepPlan>(&msg)) {
      if (o_.debug_step_delay.count() > 0) std::this_thread::sleep_for(o_.debug_step_delay);
      StepResult r = executor_->execute(*plan, [&] { return wait_masks(plan->step_id); });
      TESSERA_RETURN_IF_ERROR_EXIT(send(r));
      if (comm_.failed()) {  // the ranks are out of step: this group cannot compute again
        TESSERA_LOG_ERROR("a collective failed ({}): exiting", r.error);
        return 3;
      }
    } else if (auto* abort = std::get_if<AbortMsg>(&msg)) {
      for (uint64_t id : abort->seq_ids) executor_->drop(id);
    } else if (auto* sd = std::get_if<ShutdownMsg>(&msg)) {
      TESSERA_LOG_DEBUG("shutdown: {}", sd->reason);
      return 0;
    } else if (auto* refused = std::get_if<RefusedMsg>(&msg)) {
      TESSERA_LOG_ERROR("the coordinator refused this shard: {}", refused->reason);
      return 2;
    }
    // Heartbeats only refresh last_heard; the masks of a step that failed before its sampling
    // are dropped.
    return -1;
  }

  const ShardOptions& o_;
  DeviceComm& comm_;
  std::unique_ptr<ControlClient> client_;
  std::unique_ptr<WeightStore> store_;
  ShardLayout layout_;
  std::vector<int> bound_cpus_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<ShardBackend> backend_;
  std::unique_ptr<ShardExecutor> executor_;
  std::deque<ControlMessage> pending_;  // messages that arrived while a step waited for its masks
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
