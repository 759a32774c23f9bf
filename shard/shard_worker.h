// The shard's worker loop (DESIGN §1): says hello to the coordinator, takes its KV
// configuration, then executes StepPlans strictly in step order and answers each with a
// StepResult. A heartbeat thread tells the coordinator the process is alive; the loop exits by
// itself when the coordinator is silent for longer than `coordinator_timeout`.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "comm/device_comm.h"
#include "common/kv_config.h"
#include "kernels/sparse_attention.h"
#include "model/weight_store.h"
#include "topology/topology.h"

namespace tessera {

struct ShardOptions {
  std::string model_path;
  std::string coordinator;                 // control endpoint, e.g. ipc:///tmp/x or tcp://host:port
  int threads = 0;                         // 0: the cores this rank is bound to
  DeviceKind device = DeviceKind::kCpu;
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
  WeightQuant weight_quant = WeightQuant::kNone;  // --quant: RTN of float weights at load
  bool quantize_lm_head = false;                  // --quant-lm-head: the LM head too
  std::string imatrix_path;                       // --imatrix: calibrated --quant (model/importance.h)
  KvDtype kv_dtype = KvDtype::kF32;               // --kv-dtype: the KV cache elements (fp32 or fp16)
  SparseAttentionConfig sparse;                   // --sparse-attention ... (CPU backend)
  // The CUDA backend's workspace holds steps of at most this many tokens / sequences (the
  // coordinator passes its scheduler's max_step_tokens / max_batch); decode steps run as CUDA
  // graph replays unless cuda_graphs is off.
  int64_t max_step_tokens = 8192;
  int64_t max_step_seqs = 256;
  bool cuda_graphs = true;
  // CUDA: sample on the device (only ids and logprobs cross to the host) when a step allows it
  // (no prompt logprobs, <= 20 top logprobs); off: every non-greedy step reads the logits.
  bool device_sampling = true;
};

// Runs until shutdown or failure; returns the process exit code (0: orderly shutdown).
int run_shard(const ShardOptions& options, DeviceComm& comm);

// Identity of a model for the start-up check: architecture, dimensions, file name and size.
std::string model_fingerprint(const std::string& model_path, const class ModelConfig& config);

}  // namespace tessera
