#include "server/shard_group.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "common/kv_config.h"
#include "common/logging.h"
#include "common/process.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

ShardGroup::~ShardGroup() {
  server_.reset();
  // ZeroMQ leaves ipc:// socket files behind (an abstract one, "ipc://@name", has no file).
  if (o_.endpoint.rfind("ipc://", 0) == 0 && o_.endpoint.rfind("ipc://@", 0) != 0)
    ::unlink(o_.endpoint.substr(6).c_str());
}

std::string local_control_endpoint() { return "ipc://@tessera-" + std::to_string(::getpid()) + ".ctl"; }

Result<std::unique_ptr<ShardGroup>> ShardGroup::create(const ShardGroupOptions& options) {
  if (options.world_size < 1) return Status::invalid_argument("world size must be >= 1");
  std::unique_ptr<ShardGroup> g(new ShardGroup(options));
  TESSERA_ASSIGN_OR_RETURN(g->server_, ControlServer::bind(options.endpoint));
  g->hellos_.resize(static_cast<size_t>(options.world_size));
  g->said_hello_.assign(static_cast<size_t>(options.world_size), false);
  g->silence_.assign(static_cast<size_t>(options.world_size),
                     SilenceBudget(options.heartbeat_timeout, std::max(options.heartbeat_timeout, options.dead_timeout)));
  g->slow_.assign(static_cast<size_t>(options.world_size), false);
  g->hostname_ = this_hostname();
  return g;
}

const std::string& ShardGroup::endpoint() const { return server_->endpoint(); }

int ShardGroup::rank_of(const std::string& peer) const {
  // "shard-<rank>" or "shard-<rank>-hb"
  if (peer.rfind("shard-", 0) != 0) return -1;
  int rank = 0;
  size_t i = 6;
  if (i >= peer.size() || !std::isdigit(static_cast<unsigned char>(peer[i]))) return -1;
  while (i < peer.size() && std::isdigit(static_cast<unsigned char>(peer[i]))) {
    rank = rank * 10 + (peer[i] - '0');
    if (rank > 1 << 20) return -1;
    ++i;
  }
  if (i != peer.size() && peer.substr(i) != "-hb") return -1;
  return rank < o_.world_size ? rank : -1;
}

Status ShardGroup::fail(Status s) {
  if (healthy_ || failure_.empty()) failure_ = s.message();
  healthy_ = false;
  TESSERA_LOG_ERROR("{}", s.message());
  return s;
}

Status ShardGroup::start(const std::function<Status()>& still_starting) {
  const auto deadline = Clock::now() + o_.start_timeout;
  int said = 0;
  while (said < o_.world_size) {
    if (Clock::now() > deadline) {
      std::string missing;
      for (int r = 0; r < o_.world_size; ++r)
        if (!said_hello_[static_cast<size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      return fail(Status::deadline_exceeded(
          fmt::format("shard rank(s) {} did not connect within {:.0f} s", missing, seconds(o_.start_timeout))));
    }
    if (still_starting) {
      Status s = still_starting();
      if (!s.is_ok()) return fail(s);
    }
    TESSERA_ASSIGN_OR_RETURN(auto got, server_->receive(std::chrono::milliseconds(100)));
    if (!got) continue;
    const int rank = rank_of(got->peer);
    if (!got->message.is_ok()) {
      const std::string why = fmt::format("{} sent a message the coordinator refuses: {}", got->peer,
                                          got->message.status().message());
      (void)server_->send(got->peer, RefusedMsg{why});
      return fail(Status::invalid_argument(why));
    }
    if (rank < 0) continue;  // not a shard of this group
    silence_[static_cast<size_t>(rank)].heard(Clock::now());
    if (auto* refused = std::get_if<RefusedMsg>(&*got->message))
      return fail(Status::unavailable(fmt::format("shard rank {} cannot start: {}", rank, refused->reason)));
    auto* hello = std::get_if<ShardHello>(&*got->message);
    if (!hello) continue;  // early heartbeats
    if (hello->rank != rank)
      return fail(Status::invalid_argument(fmt::format("{} says it is rank {}", got->peer, hello->rank)));
    if (hello->world_size != o_.world_size)
      return fail(Status::invalid_argument(fmt::format(
          "shard rank {} runs in a world of {} ranks, but the coordinator expects {}", rank, hello->world_size,
          o_.world_size)));
    if (hello->tp_size != o_.world_size)
      return fail(Status::invalid_argument(
          fmt::format("shard rank {} uses TP {}, but the coordinator expects TP {}", rank, hello->tp_size, o_.world_size)));
    if (!said_hello_[static_cast<size_t>(rank)]) ++said;
    said_hello_[static_cast<size_t>(rank)] = true;
    hellos_[static_cast<size_t>(rank)] = *hello;
    TESSERA_LOG_INFO("shard rank {} ready: {} on {} (pid {}), {:.1f} MiB of weights", rank, hello->device,
                     hello->hostname, hello->pid, static_cast<double>(hello->weight_bytes) / (1 << 20));
  }
  // Every rank must serve the same model.
  const std::string& expected =
      o_.expected_fingerprint.empty() ? hellos_[0].model_fingerprint : o_.expected_fingerprint;
  for (const ShardHello& h : hellos_) {
    if (h.model_fingerprint != expected)
      return fail(Status::invalid_argument(fmt::format("shard rank {} serves model '{}', expected '{}'", h.rank,
                                                       h.model_fingerprint, expected)));
  }
  for (const ShardHello& h : hellos_) {
    // The plan is in the coordinator's KV dtype: every shard must store exactly that.
    if (h.kv_dtype != o_.kv_dtype)
      return fail(Status::invalid_argument(fmt::format(
          "shard rank {} ({}) stores its KV cache as {}, but the coordinator plans {}: start both with the same "
          "--kv-dtype",
          h.rank, h.device, kv_dtype_name(h.kv_dtype), kv_dtype_name(o_.kv_dtype))));
    if (h.max_step_tokens > 0 && o_.step_tokens > h.max_step_tokens)
      return fail(Status::invalid_argument(fmt::format(
          "shard rank {} ({}) holds steps of at most {} tokens, but the scheduler's max_step_tokens is {}: start the "
          "shards with --max-step-tokens {} or lower max_step_tokens",
          h.rank, h.device, h.max_step_tokens, o_.step_tokens, o_.step_tokens)));
    if (h.max_step_seqs > 0 && o_.step_seqs > h.max_step_seqs)
      return fail(Status::invalid_argument(fmt::format(
          "shard rank {} ({}) holds steps of at most {} sequences, but the scheduler's max_batch is {}: start the "
          "shards with --max-step-seqs {} or lower max_batch",
          h.rank, h.device, h.max_step_seqs, o_.step_seqs, o_.step_seqs)));
  }
  TESSERA_ASSIGN_OR_RETURN(plan_, plan_kv_memory(hellos_, o_));
  TESSERA_LOG_INFO("KV cache plan: {} blocks of {} tokens of {} ({:.1f} MiB per shard, limited by {}, {:.0f}% headroom)",
                   plan_.num_blocks, plan_.block_size, kv_dtype_name(o_.kv_dtype),
                   static_cast<double>(plan_.planned_kv_bytes) / (1 << 20),
                   plan_.limited_by, o_.headroom * 100);
  if (plan_.num_window_blocks > 0)
    TESSERA_LOG_INFO("KV window pool: {} blocks for the layers with a {}-token window ({:.1f} MiB per shard; the "
                     "other layers' blocks are {} bytes)",
                     plan_.num_window_blocks, plan_.window,
                     static_cast<double>(plan_.num_window_blocks * plan_.window_bytes_per_block) / (1 << 20),
                     plan_.kv_bytes_per_block);
  for (int r = 0; r < o_.world_size; ++r) {
    ConfigureMsg cfg{plan_.num_blocks, static_cast<int32_t>(plan_.block_size), o_.kv_dtype, plan_.num_window_blocks};
    cfg.draft_layers = o_.draft_layers;
    cfg.draft_vocab = o_.draft_vocab;
    cfg.draft_ids = o_.draft_ids;
    Status s = server_->send(shard_identity(r), cfg);
    if (!s.is_ok()) return fail(s);
  }
  last_sent_ = Clock::now();
  // Gaps are measured from here: loading the weights before the hello is not a silence.
  for (SilenceBudget& b : silence_)
    b = SilenceBudget(o_.heartbeat_timeout, std::max(o_.heartbeat_timeout, o_.dead_timeout));
  healthy_ = true;
  return Status::ok();
}

SilenceBudget::SilenceBudget(std::chrono::milliseconds floor, std::chrono::milliseconds cap,
                             std::chrono::milliseconds half_life, Clock::time_point now)
    : floor_(floor), cap_(std::max(cap, floor)), half_life_(half_life), last_(now), longest_at_(now) {}

void SilenceBudget::heard(Clock::time_point now) {
  const double gap = std::chrono::duration<double, std::milli>(now - last_).count();
  last_ = std::max(last_, now);
  longest_ms_ = std::max(decayed_ms(now), gap);
  longest_at_ = now;
}

double SilenceBudget::decayed_ms(Clock::time_point now) const {
  const double age = std::chrono::duration<double, std::milli>(now - longest_at_).count();
  const double halvings = half_life_.count() > 0 ? std::max(0.0, age) / static_cast<double>(half_life_.count()) : 0;
  return longest_ms_ * std::exp2(-halvings);
}

std::chrono::milliseconds SilenceBudget::longest_gap(Clock::time_point now) const {
  return std::chrono::milliseconds(static_cast<int64_t>(decayed_ms(now)));
}

std::chrono::milliseconds SilenceBudget::timeout(Clock::time_point now) const {
  return std::clamp(4 * longest_gap(now), floor_, cap_);
}

Status ShardGroup::check_liveness() {
  const auto now = Clock::now();
  for (int r = 0; r < o_.world_size; ++r) {
    const auto i = static_cast<size_t>(r);
    const auto silent = now - silence_[i].last_heard();
    // Quiet for a few heartbeats: a local rank's process is looked at (a killed shard fails its
    // requests at once, before the timeout).
    if (silent <= 4 * o_.heartbeat_interval) {
      if (slow_[i]) TESSERA_LOG_INFO("shard rank {} is answering again", r);
      slow_[i] = false;
      continue;
    }
    const ShardHello& h = hellos_[i];
    const bool local = said_hello_[i] && h.pid > 0 && h.hostname == hostname_;
    if (local && !process_alive(h.pid))
      return fail(Status::unavailable(fmt::format("shard rank {} (pid {}) has exited (silent for {:.1f} s)", r, h.pid,
                                                  seconds(silent))));
    if (silent <= silence_[i].timeout(now)) continue;
    if (local && silent <= o_.dead_timeout) {
      if (!slow_[i])
        TESSERA_LOG_WARN("shard rank {} (pid {}) has been silent for {:.1f} s, but its process is alive (a loaded or "
                         "stopped host?): waiting up to {:.0f} s",
                         r, h.pid, seconds(silent), seconds(o_.dead_timeout));
      slow_[i] = true;
      continue;
    }
    return fail(Status::unavailable(fmt::format("shard rank {} stopped responding (silent for {:.1f} s{})", r,
                                                seconds(silent), local ? ", its process alive" : "")));
  }
  return Status::ok();
}

Status ShardGroup::handle(const ReceivedMessage& m, uint64_t wait_step, std::vector<StepResult>* results) {
  const int rank = rank_of(m.peer);
  if (rank < 0) return Status::ok();
  SilenceBudget& budget = silence_[static_cast<size_t>(rank)];
  const auto now = Clock::now();
  const auto before = budget.timeout(now);
  budget.heard(now);
  const auto after = budget.timeout(now);
  if (after >= before + before / 2)  // grew by half: a slower host or network than planned for
    TESSERA_LOG_WARN("shard rank {}: {:.1f} s between its messages: it is now declared dead after {:.1f} s of silence",
                     rank, seconds(budget.longest_gap(now)), seconds(after));
  if (!m.message.is_ok()) {
    (void)server_->send(m.peer, RefusedMsg{m.message.status().message()});
    return fail(Status::invalid_argument(
        fmt::format("shard rank {} sent a malformed message: {}", rank, m.message.status().message())));
  }
  if (auto* r = std::get_if<StepResult>(&*m.message)) {
    if (results && r->step_id == wait_step) (*results)[static_cast<size_t>(rank)] = *r;
  } else if (auto* refused = std::get_if<RefusedMsg>(&*m.message)) {
    return fail(Status::unavailable(fmt::format("shard rank {} refused a message: {}", rank, refused->reason)));
  }
  return Status::ok();
}

Result<StepResult> ShardGroup::run_step(StepPlan plan, const LateMasks& late) {
  if (!healthy_) return Status::unavailable("shards are unhealthy: " + failure_);
  plan.step_id = ++next_step_;
  for (int r = 0; r < o_.world_size; ++r) {
    Status s = server_->send(shard_identity(r), plan);
    if (!s.is_ok()) return fail(s.with_context(fmt::format("shard rank {}", r)));
  }
  if (late) {
    const StepMasks masks{plan.step_id, late()};
    for (int r = 0; r < o_.world_size; ++r) {
      Status s = server_->send(shard_identity(r), masks);
      if (!s.is_ok()) return fail(s.with_context(fmt::format("shard rank {}: the step's token masks", r)));
    }
  }
  last_sent_ = Clock::now();
  std::vector<StepResult> results(static_cast<size_t>(o_.world_size));
  for (auto& r : results) r.rank = -1;
  const auto deadline = Clock::now() + o_.step_timeout;
  for (;;) {
    bool all = true;
    for (const StepResult& r : results) all = all && r.rank >= 0;
    if (all) break;
    TESSERA_ASSIGN_OR_RETURN(auto got, server_->receive(std::chrono::milliseconds(50)));
    if (got) TESSERA_RETURN_IF_ERROR(handle(*got, plan.step_id, &results));
    TESSERA_RETURN_IF_ERROR(check_liveness());
    if (Clock::now() > deadline) {
      for (int r = 0; r < o_.world_size; ++r)
        if (results[static_cast<size_t>(r)].rank < 0)
          return fail(Status::deadline_exceeded(fmt::format("shard rank {} did not finish step {} within {:.0f} s", r,
                                                            plan.step_id, seconds(o_.step_timeout))));
    }
    // Keep the shards' view of the coordinator alive during long steps.
    if (Clock::now() - last_sent_ > o_.heartbeat_interval) {
      for (int r = 0; r < o_.world_size; ++r) (void)server_->send(shard_identity(r), Heartbeat{-1, plan.step_id});
      last_sent_ = Clock::now();
    }
  }
  for (const StepResult& r : results)
    if (!r.error.empty()) return Status::internal(r.error);  // a step error, not a dead shard
  return std::move(results[0]);
}

Status ShardGroup::keep_alive() {
  if (!healthy_) return Status::unavailable("shards are unhealthy: " + failure_);
  for (;;) {
    TESSERA_ASSIGN_OR_RETURN(auto got, server_->receive(std::chrono::milliseconds(0)));
    if (!got) break;
    TESSERA_RETURN_IF_ERROR(handle(*got, 0, nullptr));
  }
  TESSERA_RETURN_IF_ERROR(check_liveness());
  if (Clock::now() - last_sent_ > o_.heartbeat_interval) {
    for (int r = 0; r < o_.world_size; ++r) (void)server_->send(shard_identity(r), Heartbeat{-1, 0});
    last_sent_ = Clock::now();
  }
  return Status::ok();
}

void ShardGroup::shutdown(const std::string& reason) {
  for (int r = 0; r < o_.world_size; ++r) (void)server_->send(shard_identity(r), ShutdownMsg{reason});
  healthy_ = false;
}

}  // namespace tessera
