#include "server/server.h"

#include <fstream>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "common/logging.h"
#include "common/mapped_file.h"
#include "common/process.h"
#include "server/api_server.h"
#include "server/reasoning.h"
#include "engine/block_pool.h"
#include "engine/engine.h"
#include "engine/metrics.h"
#include "server/shard_group.h"
#include "server/shard_launcher.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "server/tool_calls.h"
#include "template/builtin_chat_template.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tessera {
namespace {

std::string default_model_name(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

ShardLaunchSpec launch_spec(const ServerOptions& o, const std::string& endpoint) {
  ShardLaunchSpec spec;
  spec.shard_binary = sibling_executable("tessera-shard");
  spec.model_path = o.model_path;
  spec.coordinator_endpoint = endpoint;
  spec.tp = o.tp;
  spec.runtime = o.shard;
  spec.hosts = o.hosts;
  spec.hostfile = o.hostfile;
  spec.bind = o.bind;
  spec.force_mpirun = o.force_mpirun;
  spec.extra_shard_args = o.extra_shard_args;
  spec.launch_agent = o.launch_agent;
  spec.extra_mpirun_args = o.extra_mpirun_args;
  // A GPU shard sizes its workspace for the scheduler's largest step.
  spec.runtime.max_step_tokens = o.scheduler.max_step_tokens;
  spec.runtime.max_step_seqs = o.scheduler.max_batch;
  // Shards on this host can look at the coordinator's process before they give up on it.
  if (o.hosts.empty() && o.hostfile.empty()) spec.coordinator_pid = static_cast<int>(::getpid());
  return spec;
}

int fail(const std::string& message) {
  TESSERA_LOG_ERROR("{}", message);
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

// The model's own chat template: GGUF metadata (read without mapping the weights) or the
// tokenizer_config.json beside an HF model. NotFound when the model has none.
Result<ChatTemplate> model_chat_template(const std::string& model_path) {
  TESSERA_ASSIGN_OR_RETURN(const ModelPath where, resolve_model_path(model_path));
  if (where.format == ModelFormat::kGguf) {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::open_metadata(where.file));
    return ChatTemplate::from_gguf(*gguf);
  }
  return ChatTemplate::from_tokenizer_config((std::filesystem::path(model_path) / "tokenizer_config.json").string());
}

// The chat template the server renders conversations with, and where it came from.
struct ServedChatTemplate {
  std::unique_ptr<ChatTemplate> chat;  // null: /v1/chat/completions is off
  std::string source;                  // "--chat-template <path>", "model", "builtin:<arch>"; "" when none
};

// --chat-template, else the model's own template, else (when the model has none) the one Tessera
// ships for its architecture (template/builtin_chat_template.h). A template that fails to parse
// is an error for --chat-template and a warning (chat off) for the model's.
Result<ServedChatTemplate> served_chat_template(const ServerOptions& o, const ModelConfig& config) {
  ServedChatTemplate served;
  if (!o.chat_template_path.empty()) {
    TESSERA_ASSIGN_OR_RETURN(const std::string source, read_text_file(o.chat_template_path));
    auto t = ChatTemplate::parse(source);
    if (!t.is_ok()) return t.status().with_context(o.chat_template_path);
    served.chat = std::make_unique<ChatTemplate>(std::move(t).value());
    served.source = "--chat-template " + o.chat_template_path;
    return served;
  }
  Result<ChatTemplate> own = model_chat_template(o.model_path);
  if (own.is_ok()) {
    served.chat = std::make_unique<ChatTemplate>(std::move(own).value());
    served.source = "model";
    return served;
  }
  if (own.status().code() == StatusCode::kNotFound) {
    Result<ChatTemplate> builtin = builtin_chat_template(config.arch);
    if (builtin.is_ok()) {
      served.chat = std::make_unique<ChatTemplate>(std::move(builtin).value());
      served.source = "builtin:" + std::string(architecture_name(config.arch));
      return served;
    }
  }
  TESSERA_LOG_WARN("no chat template ({}): /v1/chat/completions is off", own.status().message());
  return served;
}

// One generation of shards: the control group, the processes the server started (none when
// they were started elsewhere), and the KV block pools planned from their memory. Held by
// pointer: the engine keeps references to the group and the pools.
struct ShardSet {
  std::unique_ptr<ShardGroup> group;
  std::unique_ptr<ChildProcess> processes;
  std::optional<BlockPool> pool;
  std::optional<BlockPool> window_pool;
  bool processes_exited = false;

  WindowPool window() { return window_pool ? WindowPool{&*window_pool, group->plan().window} : WindowPool{}; }
  // Reaps the shard process (or mpirun) once it exits: no zombie under a server that lives on.
  void reap() {
    if (processes && !processes_exited && !processes->running()) {
      processes_exited = true;
      TESSERA_LOG_ERROR("the shard processes exited with code {}", processes->exit_code());
    }
  }
  void stop(const std::string& reason) {
    if (group) group->shutdown(reason);
    if (processes && !processes->wait_for(std::chrono::milliseconds(3000))) processes->terminate();
  }
};

// Starts the shards (when the server starts them), waits for their hellos and plans the KV pools.
Result<std::unique_ptr<ShardSet>> start_shards(const ServerOptions& o, const ShardGroupOptions& go) {
  auto set = std::make_unique<ShardSet>();
  TESSERA_ASSIGN_OR_RETURN(set->group, ShardGroup::create(go));
  std::string endpoint = set->group->endpoint();
  if (endpoint.rfind("tcp://0.0.0.0:", 0) == 0)  // tell remote shards a reachable address
    endpoint = "tcp://" + this_hostname() + endpoint.substr(13);
  if (o.spawn_shards) {
    const std::vector<std::string> cmd = build_shard_command(launch_spec(o, endpoint));
    TESSERA_LOG_INFO("starting shards: {}", format_command(cmd));
    TESSERA_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::spawn(cmd));
    set->processes = std::make_unique<ChildProcess>(std::move(child));
  } else {
    TESSERA_LOG_INFO("waiting for {} shard(s) at {}", o.tp, endpoint);
  }
  ChildProcess* processes = set->processes.get();
  Status started = set->group->start([processes]() -> Status {
    if (!processes || processes->running()) return Status::ok();
    return Status::unavailable(
        fmt::format("the shard processes exited with code {} during start-up", processes->exit_code()));
  });
  if (!started.is_ok()) {
    if (set->processes) set->processes->terminate();
    return started;
  }
  const MemoryPlan& plan = set->group->plan();
  BlockPoolOptions po;
  po.num_blocks = plan.num_blocks;
  po.block_size = static_cast<int32_t>(plan.block_size);
  Result<BlockPool> pool = BlockPool::create(po);
  Result<BlockPool> window_pool = plan.num_window_blocks > 0 && pool.is_ok()
                                      ? BlockPool::create({plan.num_window_blocks, po.block_size, po.enable_prefix_cache})
                                      : Result<BlockPool>(Status::not_found("no window pool"));
  for (const Status& s : {pool.status(), plan.num_window_blocks > 0 ? window_pool.status() : Status::ok()}) {
    if (s.is_ok()) continue;
    set->stop("bad configuration");
    return s;
  }
  set->pool.emplace(std::move(pool).value());
  if (plan.num_window_blocks > 0) set->window_pool.emplace(std::move(window_pool).value());
  return set;
}

// Recovery from a failed shard group: the engine has already ended the requests in flight
// with an error; the group is torn down (its processes stopped and reaped), restarted after a
// backoff (1, 2, 4 ... 30 s), its KV pools planned anew, and the engine serves again. After
// max_restarts failed generations in a row (a generation that served a minute resets the count)
// the server stays up, /health "failed" with the reason, until it is stopped. Shards started
// elsewhere (spawn_shards off) cannot be restarted here: their failure is final.
class Recovery {
 public:
  Recovery(const ServerOptions& o, const ShardGroupOptions& go, Engine& engine, std::unique_ptr<ShardSet>& set)
      : o_(o), go_(go), engine_(engine), set_(set) {}

  // Called every 200 ms by the main thread. False when a signal came during a backoff (the
  // caller then shuts down).
  bool tick(const sigset_t& signals) {
    if (set_) set_->reap();
    const auto now = std::chrono::steady_clock::now();
    if (engine_.healthy()) {
      if (failures_ > 0 && now - serving_since_ > std::chrono::seconds(60)) failures_ = 0;
      return true;
    }
    if (given_up_ || engine_.draining() || !o_.spawn_shards) return true;
    const std::string why = engine_.failure();
    if (failures_ >= o_.max_restarts) {
      given_up_ = true;
      engine_.set_recovery(RecoveryState::kFailed);
      TESSERA_LOG_ERROR("the shards failed {} time(s) in a row; not restarting them again (--max-restarts {}): {}",
                        failures_ + 1, o_.max_restarts, why);
      return true;
    }
    ++failures_;
    engine_.set_recovery(RecoveryState::kRestarting);
    const double backoff = std::min(30.0, static_cast<double>(1 << std::min(failures_ - 1, 5)));
    TESSERA_LOG_WARN("the shards failed ({}): restarting them in {:.0f} s (try {} of {})", why, backoff, failures_,
                     o_.max_restarts);
    engine_.stop();
    if (set_) set_->stop("restarting after a failure");
    set_.reset();  // the group's socket and every process of the failed generation are gone
    timespec wait{static_cast<time_t>(backoff), 0};
    const int sig = sigtimedwait(&signals, nullptr, &wait);
    if (sig == SIGINT || sig == SIGTERM) {
      TESSERA_LOG_INFO("signal {} during a restart: shutting down", sig);
      return false;
    }
    // A new socket name per generation: the failed group's may still be closing.
    ShardGroupOptions go = go_;
    if (go.endpoint.rfind("ipc://@", 0) == 0) go.endpoint = local_control_endpoint() + "." + std::to_string(failures_);
    auto next = start_shards(o_, go);
    if (!next.is_ok()) {
      TESSERA_LOG_ERROR("restarting the shards failed: {}", next.status().to_string());
      engine_.fail_restart(next.status().message());  // still unhealthy: the next tick tries again
      return true;
    }
    set_ = std::move(next).value();
    Status s = engine_.restart(*set_->group, *set_->pool, set_->window());
    if (!s.is_ok()) {
      TESSERA_LOG_ERROR("restarting the engine failed: {}", s.to_string());
      return true;
    }
    engine_.start();
    engine_.set_recovery(RecoveryState::kNone);
    serving_since_ = std::chrono::steady_clock::now();  // after the backoff: only serving counts
    TESSERA_LOG_INFO("shards restarted: serving again ({} KV blocks)", set_->group->plan().num_blocks);
    return true;
  }

 private:
  const ServerOptions& o_;
  const ShardGroupOptions& go_;
  Engine& engine_;
  std::unique_ptr<ShardSet>& set_;
  int failures_ = 0;
  bool given_up_ = false;
  std::chrono::steady_clock::time_point serving_since_ = std::chrono::steady_clock::now();
};

}  // namespace

std::string describe_shard_command(const ServerOptions& o, const std::string& endpoint) {
  return format_command(build_shard_command(launch_spec(o, endpoint)));
}

namespace {

// The block size in use, where it came from and (auto) why: a gauge whose labels carry the text.
std::string kv_block_size_prometheus(int64_t block, const std::string& source, const std::string& reason) {
  std::string r;
  for (char c : reason) {
    if (c == '\\' || c == '"') r += '\\';
    if (c == '\n') continue;
    r += c;
  }
  return fmt::format(
      "# HELP tessera_kv_block_size_choice KV cache tokens per block and where the number came from; source: default, flag, scheduler-config or auto "
      "(reason: why auto chose it)\n# TYPE tessera_kv_block_size_choice gauge\ntessera_kv_block_size_choice{{source=\"{}\",reason=\"{}\"}} {}\n",
      source, r, block);
}

}  // namespace

int run_server(const ServerOptions& o) {
  set_log_role("coordinator");
  // Signals are taken by this thread with sigtimedwait; every thread started later inherits
  // the block, so Ctrl-C never lands in a worker.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (o.block_size_auto)
    return fail("--block-size auto is resolved by `tessera serve` / `tessera launch` (the step-time model lives "
                "there): give this process a number");
  auto loaded = load_model_config(o.model_path);  // the config only; the shards load the weights
  if (!loaded.is_ok()) return fail(loaded.status().to_string());
  const ModelConfig& config = *loaded;
  auto tokenizer = load_tokenizer_for_model(o.model_path);
  if (!tokenizer.is_ok()) return fail(tokenizer.status().to_string());
  auto served_chat = served_chat_template(o, config);
  if (!served_chat.is_ok()) return fail(served_chat.status().to_string());
  std::unique_ptr<ChatTemplate> chat = std::move(served_chat->chat);
  if (chat)
    TESSERA_LOG_INFO("chat template: {} (tool calls in the {} format)", served_chat->source,
                     tool_format_name(tool_format_for_template(chat->source())));
  Status sched_ok = validate_scheduler_config(o.scheduler);
  if (!sched_ok.is_ok()) return fail(sched_ok.to_string());

  ShardGroupOptions go;
  go.world_size = o.tp;
  go.endpoint = !o.shard_endpoint.empty() ? o.shard_endpoint
                : (o.hosts.empty() && o.hostfile.empty())
                    ? local_control_endpoint()
                    : "tcp://0.0.0.0:0";
  go.block_size = o.block_size;
  go.kv_dtype = o.shard.kv_dtype;
  go.headroom = o.headroom;
  go.max_kv_bytes = o.max_kv_bytes;
  go.cpu_max_kv_bytes = uint64_t{2} << 30;  // CPU shards: 2 GiB of KV unless --max-kv-bytes says otherwise
  go.heartbeat_timeout = std::chrono::milliseconds(o.heartbeat_timeout_ms);
  go.dead_timeout = std::chrono::milliseconds(std::max(o.dead_timeout_ms, o.heartbeat_timeout_ms));
  go.start_timeout = std::chrono::milliseconds(o.start_timeout_ms);
  go.step_tokens = o.scheduler.max_step_tokens;
  go.step_seqs = o.scheduler.max_batch;
  go.window_pool = o.kv_window_pool;
  if (const SpeculationConfig& sc = o.scheduler.speculation; sc.draft_layers > 0) {
    if (sc.draft_layers > config.n_layers)
      return fail(fmt::format("--spec-draft-layers {}: the self-draft runs 1..{} of the model's layers",
                              sc.draft_layers, config.n_layers));
    go.draft_layers = sc.draft_layers;
    go.draft_vocab = sc.draft_vocab;
    go.draft_ids = (*tokenizer)->frequent_ids(sc.draft_vocab);
  }
  auto first = start_shards(o, go);
  if (!first.is_ok()) return fail(first.status().to_string());
  std::unique_ptr<ShardSet> set = std::move(first).value();

  MetricsRegistry metrics;
  declare_engine_metrics(metrics);
  EngineOptions eo;
  eo.scheduler = o.scheduler;
  eo.eos_ids = config.eos_ids;
  if (eo.eos_ids.empty()) eo.eos_ids = (*tokenizer)->eos_ids();
  eo.max_positions = config.max_positions;
  eo.max_queued_sequences = o.max_queued_sequences;
  eo.window = set->window();
  std::ofstream step_log;
  if (!o.step_log_path.empty()) {
    step_log.open(o.step_log_path, std::ios::out | std::ios::trunc);
    if (!step_log) {
      set->stop("cannot serve");
      return fail(fmt::format("--step-log {}: cannot open for writing", o.step_log_path));
    }
    // Engine thread only; a line per step, flushed so that a reader sees whole lines while serving.
    eo.on_step = [&step_log](const StepRecord& r) { step_log << step_record_json(r) << '\n' << std::flush; };
    TESSERA_LOG_INFO("step log: {}", o.step_log_path);
  }
  Engine engine(eo, *set->group, *set->pool, tokenizer->get(), metrics);
  TESSERA_LOG_INFO("{}", format_scheduler_config(o.scheduler));
  TESSERA_LOG_INFO("kv block size {} ({}{}{})", o.block_size, o.block_size_source, o.block_size_reason.empty() ? "" : ": ",
                   o.block_size_reason);

  ApiServerOptions ao;
  ao.model_name = o.model_name.empty() ? default_model_name(o.model_path) : o.model_name;
  ao.host = o.host;
  ao.port = o.port;
  ao.max_body_bytes = o.max_body_bytes;
  ao.max_positions = config.max_positions;
  ao.chat_template_source = served_chat->source;
  ao.model_vocab = config.vocab;
  ao.eos_ids = eo.eos_ids;
  ao.grammar.compile_timeout = std::chrono::milliseconds(o.grammar_compile_timeout_ms);
  ao.reasoning = o.reasoning_parser == "think" || (o.reasoning_parser == "auto" && chat && template_has_reasoning(chat->source()));
  const SchedulerConfig sched = o.scheduler;
  auto api = ApiServer::start(ao, engine, **tokenizer, chat.get(), metrics,
                              [sched, block = o.block_size, source = o.block_size_source, reason = o.block_size_reason] {
                                return scheduler_config_prometheus(sched) + kv_block_size_prometheus(block, source, reason);
                              });
  if (!api.is_ok()) {
    set->stop("cannot serve");
    return fail(api.status().to_string());
  }
  engine.start();
  std::printf("listening on http://%s:%d (model '%s', TP %d)\n", o.host.c_str(), (*api)->port(), ao.model_name.c_str(),
              o.tp);
  std::fflush(stdout);

  int exit_code = 0;
  Recovery recovery(o, go, engine, set);
  for (;;) {
    timespec timeout{0, 200 * 1000 * 1000};
    const int sig = sigtimedwait(&signals, nullptr, &timeout);
    if (sig == SIGINT || sig == SIGTERM) {
      TESSERA_LOG_INFO("signal {}: shutting down; {} request(s) in flight get up to {} s (--shutdown-grace)", sig,
                       engine.open_jobs(), o.shutdown_grace_s);
      break;
    }
    if (!recovery.tick(signals)) break;  // a signal during a restart's backoff
  }
  // Drain: no new requests (503, /health "draining"); the ones taken run on until they finish,
  // the grace period ends or a second signal comes.
  engine.drain();
  const auto grace_end = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(std::max(0.0, o.shutdown_grace_s) * 1e3));
  while (engine.open_jobs() > 0 && std::chrono::steady_clock::now() < grace_end) {
    timespec timeout{0, 20 * 1000 * 1000};
    const int sig = sigtimedwait(&signals, nullptr, &timeout);
    if (sig == SIGINT || sig == SIGTERM) {
      TESSERA_LOG_INFO("signal {} again: ending the {} open request(s) now", sig, engine.open_jobs());
      break;
    }
  }
  if (engine.open_jobs() > 0)
    TESSERA_LOG_WARN("shutdown: {} request(s) still open; they end with an error", engine.open_jobs());
  // The engine ends what is left (every stream gets an error event and [DONE]), then the HTTP
  // server sends what is queued before it closes the connections.
  engine.stop();
  (*api)->stop(std::chrono::milliseconds(2000));
  if (set) set->stop("server stopping");
  return exit_code;
}

}  // namespace tessera
