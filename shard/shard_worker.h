// The shard's worker loop (ARCHITECTURE.md): says hello to the coordinator, takes its KV
// configuration, then executes StepPlans strictly in step order and answers each with a
// StepResult. A heartbeat thread tells the coordinator the process is alive; the loop exits by
// itself when the coordinator is silent for longer than `coordinator_timeout`.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "comm/device_comm.h"
#include "common/shard_options.h"
#include "topology/topology.h"

namespace tessera {

struct ShardOptions {
  std::string model_path;
  std::string coordinator;                 // control endpoint, e.g. ipc:///tmp/x or tcp://host:port
  // How it runs the model: threads (0: the cores this rank is bound to), --quant, --kv-dtype,
  // sparse attention, the CUDA workspace limits and graphs, ... (common/shard_options.h).
  ShardRuntimeOptions runtime;
  DeviceKind device = DeviceKind::kCpu;    // runtime.device resolved (shard/backend_probe.h)
  bool bind = true;                        // bind threads and memory per topology/
  int local_ranks = 1;                     // ranks sharing this host's memory
  std::chrono::milliseconds heartbeat_interval{250};
  std::chrono::milliseconds coordinator_timeout{3000};
  // > 0: the coordinator's pid on this host. Silent past coordinator_timeout, the loop exits at
  // once when that process is gone, and waits up to coordinator_dead_timeout while it is alive
  // (a loaded or stopped host); 0: it exits after coordinator_timeout.
  int coordinator_pid = 0;
  std::chrono::milliseconds coordinator_dead_timeout{30000};
  uint32_t protocol_version = 0;           // tests only: speak another version (0: the real one)
  std::chrono::milliseconds debug_step_delay{0};  // tests only: sleep before each step (failure tests)
};

// Runs until shutdown or failure; returns the process exit code (0: orderly shutdown).
int run_shard(const ShardOptions& options, DeviceComm& comm);

// Identity of a model for the start-up check: architecture, dimensions, file name and size.
std::string model_fingerprint(const std::string& model_path, const class ModelConfig& config);

}  // namespace tessera
