// The coordinator's view of its shards (ARCHITECTURE.md): the control server they connect to, the
// start-up handshake (every rank's hello is checked: protocol version, world size, TP, model),
// the memory plan that sizes the KV cache, and one StepPlan -> StepResult round trip at a time.
//
// Liveness: every message from a rank (results, heartbeats from its heartbeat socket) counts.
// A rank on this host (its hello's hostname and pid) is looked at when it goes quiet: gone
// (exited, a zombie) means dead at once; still there (busy, starved by a loaded host, stopped)
// means slow, and it is waited for up to `dead_timeout` of silence. A rank on another host is
// declared dead after a silence scaled to the gaps measured between its messages (SilenceBudget:
// at least `heartbeat_timeout`, at most `dead_timeout`). A step not answered within `step_timeout`
// fails. Either way the error names the rank and the group becomes unhealthy; nothing waits
// forever.
// Thread-safety: owned and used by one thread (the engine thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/control_channel.h"
#include "proto/control_messages.h"
#include "engine/step_executor.h"
#include "common/status.h"
#include "engine/memory_plan.h"

namespace tessera {

// The shard group's options; the memory plan's (engine/memory_plan.h) are its base, so a
// caller sets `block_size`, `headroom`, ... on the group's options directly.
struct ShardGroupOptions : MemoryPlanOptions {
  std::string endpoint = "tcp://127.0.0.1:0";  // where shards connect
  int world_size = 1;
  std::string expected_fingerprint;            // empty: take rank 0's
  std::chrono::milliseconds start_timeout{120000};
  std::chrono::milliseconds heartbeat_timeout{2000};
  // A silent rank whose process is alive on this host is declared dead only after this long.
  std::chrono::milliseconds dead_timeout{30000};
  std::chrono::milliseconds step_timeout{600000};
  std::chrono::milliseconds heartbeat_interval{250};
  KvDtype kv_dtype = KvDtype::kF32;  // every shard's hello must say it stores this
  // Speculation's self-draft in every shard (ConfigureMsg::draft_layers; 0: none).
  int32_t draft_layers = 0;
  int32_t draft_vocab = 0;
  std::vector<int32_t> draft_ids;  // its head's fixed rows (Tokenizer::frequent_ids)
};

// How long a rank may be silent before it is declared dead, scaled to what is measured: the
// timeout is max(floor, 4 x the longest gap between its messages seen lately), at most `cap`.
// The longest gap decays by half every `half_life`, so a stall widens the timeout for a while
// (a loaded host or network stalls again soon), not for ever. Pure arithmetic on the times given.
class SilenceBudget {
 public:
  using Clock = std::chrono::steady_clock;
  SilenceBudget(std::chrono::milliseconds floor, std::chrono::milliseconds cap,
                std::chrono::milliseconds half_life = std::chrono::seconds(60), Clock::time_point now = Clock::now());
  // A message arrived at `now`: records the gap since the one before.
  void heard(Clock::time_point now);
  Clock::time_point last_heard() const { return last_; }
  // The longest recent gap, decayed to `now`.
  std::chrono::milliseconds longest_gap(Clock::time_point now) const;
  std::chrono::milliseconds timeout(Clock::time_point now) const;

 private:
  double decayed_ms(Clock::time_point now) const;

  std::chrono::milliseconds floor_, cap_, half_life_;
  Clock::time_point last_;
  double longest_ms_ = 0;              // at longest_at_
  Clock::time_point longest_at_;
};

// The control endpoint for shards on this host: a Unix socket in the abstract namespace
// ("ipc://@tessera-<pid>.ctl"), so a coordinator killed with SIGKILL leaves no socket file behind.
std::string local_control_endpoint();

class ShardGroup : public StepExecutor {
 public:
  ~ShardGroup() override;
  static Result<std::unique_ptr<ShardGroup>> create(const ShardGroupOptions& options);

  const std::string& endpoint() const;
  // Waits for every rank's hello, validates them, plans memory and configures the shards.
  // `still_starting` is polled while waiting (e.g. "is mpirun still alive?"); returning an
  // error stops the wait with it.
  Status start(const std::function<Status()>& still_starting = {});
  const std::vector<ShardHello>& hellos() const { return hellos_; }
  const MemoryPlan& plan() const { return plan_; }

  // Numbers the plan (step ids are consecutive from 1), sends it to every rank and waits for
  // every rank's result. Returns rank 0's result (the sampled tokens); the first rank error
  // becomes the returned Status.
  Result<StepResult> run_step(StepPlan plan) override { return run_step(std::move(plan), LateMasks{}); }
  // With `late`: the plan goes out, then `late` computes the masks while the ranks run the
  // forward pass, and they follow as a StepMasks message to every rank.
  Result<StepResult> run_step(StepPlan plan, const LateMasks& late) override;
  uint64_t steps_run() const override { return next_step_; }
  // Call while idle: sends heartbeats when due and checks the shards' liveness.
  Status keep_alive() override;
  void shutdown(const std::string& reason);
  bool healthy() const override { return healthy_; }
  const std::string& failure() const { return failure_; }

 private:
  explicit ShardGroup(const ShardGroupOptions& o) : o_(o) {}
  Status handle(const ReceivedMessage& m, uint64_t wait_step, std::vector<StepResult>* results);
  Status check_liveness();
  Status fail(Status s);
  int rank_of(const std::string& peer) const;  // -1 if not a shard identity

  ShardGroupOptions o_;
  std::unique_ptr<ControlServer> server_;
  std::vector<ShardHello> hellos_;
  std::vector<bool> said_hello_;
  std::vector<SilenceBudget> silence_;  // per rank: when last heard, and the silence allowed
  std::vector<bool> slow_;   // per rank: silent past heartbeat_timeout, its process alive (warned once)
  std::string hostname_;     // this host's, to tell which ranks are local
  std::chrono::steady_clock::time_point last_sent_;
  MemoryPlan plan_;
  uint64_t next_step_ = 0;
  bool healthy_ = false;
  std::string failure_;
};

}  // namespace tessera
