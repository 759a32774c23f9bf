// A whole serving process: the coordinator (API server + engine thread + shard group), and,
// when asked, the shard processes it starts itself (one tessera-shard, or mpirun for TP > 1).
// Used by `tessera serve`, `tessera launch` and `tessera-coordinator`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/shard_options.h"
#include "engine/scheduler_config.h"

namespace tessera {

struct ServerOptions {
  std::string model_path;
  std::string model_name;            // default: the model's directory or file name
  std::string chat_template_path;    // a Jinja file overriding the model's chat template
  int tp = 1;
  // How the shards run the model (common/shard_options.h): device, threads, --quant,
  // --kv-dtype (the coordinator plans it; the shards must store it), ... The workspace limits
  // (max_step_tokens / max_step_seqs) are the scheduler's, set when the shards start.
  ShardRuntimeOptions shard;
  std::string host = "127.0.0.1";
  int port = 8000;                   // 0: ephemeral
  SchedulerConfig scheduler;
  int64_t block_size = 16;
  // --block-size auto: the launcher (launch/, `tessera serve` and `tessera launch`) replaces it
  // with tune/block_size.h's choice for expected_lengths / expected_trace before run_server;
  // run_server refuses it unresolved.
  bool block_size_auto = false;
  std::string expected_lengths = "chat";  // a tune/trace.h length mix
  std::string expected_trace;             // a JSONL trace whose lengths are expected (wins over the mix)
  std::string block_size_source = "default";  // default | flag | scheduler-config | auto: shown in /metrics
  std::string block_size_reason;              // why (auto): printed at start-up and in /metrics
  double headroom = 0.10;
  uint64_t max_kv_bytes = 0;         // per shard; 0: 2 GiB for CPU shards, none for CUDA
  bool kv_window_pool = true;        // the sliding-window layers' KV in a pool of its own (common/kv_config.h)
  int64_t max_queued_sequences = 4096;
  size_t max_body_bytes = 8 << 20;
  // Shards.
  bool spawn_shards = true;          // false: wait for shards started elsewhere (mpirun MPMD, by hand)
  std::string shard_endpoint;        // control endpoint; default ipc:// (local) or tcp://0.0.0.0:0
  std::vector<std::string> hosts;
  std::string hostfile;
  std::string bind = "auto";
  bool force_mpirun = false;         // mpirun even for TP = 1 (tessera launch)
  std::vector<std::string> extra_shard_args;
  std::string launch_agent;          // how mpirun reaches other hosts (Open MPI plm_rsh_agent); "": ssh
  std::vector<std::string> extra_mpirun_args;
  int64_t heartbeat_timeout_ms = 2000;
  // A silent shard whose process is alive on this host (a loaded or stopped host) is waited for
  // this long before it is declared dead.
  int64_t dead_timeout_ms = 30000;
  int64_t start_timeout_ms = 300000;
  // SIGTERM / SIGINT: new requests get 503 and /health says "draining" while the requests
  // already taken get this long to finish; what is left then ends with an error event (a
  // second signal cuts the wait short).
  double shutdown_grace_s = 30.0;
  // Structured outputs: a schema, regex or grammar that takes longer to compile is refused (400).
  int64_t grammar_compile_timeout_ms = 5000;
  // Reasoning models: "auto" (when the chat template writes <think>), "think" or "none".
  std::string reasoning_parser = "auto";
  // A failed shard group (a shard killed, crashed or silent past the timeouts) is torn down and
  // restarted with backoff, at most this many times in a row (0: never; the server then stays
  // up, unhealthy). Only shards the server starts itself are restarted.
  int max_restarts = 5;
  // A JSONL file the engine appends one line per step to (engine/step_features.h: what the
  // step computed and how long it took): the data `tessera tune calibrate` fits the step-time
  // model on. "": none.
  std::string step_log_path;
};

// Runs until SIGINT or SIGTERM (then drains: see shutdown_grace_s; and stops every process it
// started) and returns the exit code.
// Prints "listening on http://HOST:PORT" on stdout once it serves.
int run_server(const ServerOptions& options);

// The shard launch spec a server with these options would use, for --dry-run.
std::string describe_shard_command(const ServerOptions& options, const std::string& endpoint);

}  // namespace tessera
