// Starting shard processes: one `tessera-shard` for TP = 1 on this host (no MPI), or the
// `mpirun` line that starts N shards (on this host or on --hosts / --hostfile) for TP = N.
// Children run in their own process group so the whole group can be stopped at once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/shard_options.h"
#include "common/status.h"

namespace tessera {

struct ShardLaunchSpec {
  std::string shard_binary;               // path of tessera-shard
  std::string model_path;
  std::string coordinator_endpoint;
  int tp = 1;
  // How the shards run the model (device, threads, --quant, --kv-dtype, the workspace limits
  // the scheduler sets, ...): passed as the flags common/shard_options.h's table gives.
  ShardRuntimeOptions runtime;
  std::vector<std::string> hosts;         // empty: this host
  std::string hostfile;
  std::string bind = "auto";              // auto: shards bind themselves (hwloc); none; core (mpirun binds)
  bool force_mpirun = false;              // use mpirun even for TP = 1
  int coordinator_pid = 0;                // > 0: --coordinator-pid (shards on the coordinator's host)
  std::vector<std::string> extra_shard_args;
  // How mpirun starts its daemons on the other hosts: a command called as `AGENT HOST WORD...`
  // like ssh (Open MPI's plm_rsh_agent; words split at spaces). Empty: Open MPI's default (ssh).
  std::string launch_agent;
  std::vector<std::string> extra_mpirun_args;  // after mpirun's own, before the shard's argv
};

// argv of the command that starts the shards ("mpirun", ... or "tessera-shard", ...).
std::vector<std::string> build_shard_command(const ShardLaunchSpec& spec);
// The argv as one shell-quoted line, for --dry-run and logs.
std::string format_command(const std::vector<std::string>& argv);
// The path of a sibling executable of the running one ("tessera-shard" next to "tessera").
std::string sibling_executable(const std::string& name);

class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(ChildProcess&& o) noexcept;
  ChildProcess& operator=(ChildProcess&& o) noexcept;
  ~ChildProcess();  // terminates the group if still running

  // Starts argv in a new process group. Errors name the program.
  static Result<ChildProcess> spawn(const std::vector<std::string>& argv);
  pid_t pid() const { return pid_; }
  // Non-blocking: false once the child has exited (exit_code() then holds its status).
  bool running();
  int exit_code() const { return exit_code_; }
  // SIGTERM to the group, SIGKILL after `grace`, then reaps. Idempotent.
  void terminate(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));
  // Waits up to `timeout` for exit; true if it exited.
  bool wait_for(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int exit_code_ = -1;
};

}  // namespace tessera
