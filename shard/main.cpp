// tessera-shard: one tensor-parallel rank. Under mpirun the ranks form an MPI group for their
// collectives; started alone it is rank 0 of 1.
#include <CLI/CLI.hpp>

#include <algorithm>

#include "cli/flags.h"
#include "comm/mpi_comm.h"
#include "common/env.h"
#include "common/logging.h"
#include "shard/backend_probe.h"
#include "shard/shard_worker.h"

int main(int argc, char** argv) {
  using namespace tessera;
  ShardOptions o;
  std::string device = "auto";
  int64_t heartbeat_ms = 250, coordinator_timeout_ms = 3000;
  bool no_bind = false;
  CLI::App app{"tessera-shard: one tensor-parallel rank of a Tessera model"};
  app.add_option("--model", o.model_path, "HF model directory or .gguf file")->required();
  app.add_option("--coordinator", o.coordinator, "coordinator control endpoint (tcp://host:port or ipc://path)")
      ->required();
  app.add_option("--device", device, "cpu, cuda or auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--threads", o.threads, "CPU threads (0: the cores this rank is bound to)");
  app.add_flag("--no-bind", no_bind, "do not bind threads and memory");
  app.add_option("--local-ranks", o.local_ranks, "ranks on this host (default: from mpirun, else 1)");
  app.add_option("--heartbeat-ms", heartbeat_ms);
  app.add_option("--coordinator-timeout-ms", coordinator_timeout_ms,
                 "exit when the coordinator is silent this long (with --coordinator-pid: and its process is gone)");
  int64_t coordinator_dead_timeout_ms = 30000;
  app.add_option("--coordinator-pid", o.coordinator_pid,
                 "the coordinator's pid on this host: exit at once when it is gone, wait while it lives");
  app.add_option("--coordinator-dead-timeout-ms", coordinator_dead_timeout_ms,
                 "with --coordinator-pid: exit when the coordinator is silent this long although its process lives");
  app.add_option("--protocol-version", o.protocol_version, "testing only: speak another protocol version")
      ->group("");
  cli::QuantFlags quant;
  cli::add_quant_flags(app, quant);
  cli::KvDtypeFlag kv_dtype;
  cli::add_kv_dtype_flag(app, kv_dtype, cli::KvDtypeUse::kRuntime);
  MatmulPrecision precision = MatmulPrecision::kAuto;
  cli::add_matmul_precision_flag(app, precision);
  app.add_option("--max-step-tokens", o.max_step_tokens,
                 "CUDA: tokens of the largest step the workspace holds (the coordinator's max_step_tokens)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // the last one wins (--shard-arg overrides)
  app.add_option("--max-step-seqs", o.max_step_seqs,
                 "CUDA: sequences of the largest step (the coordinator's max_batch)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  bool no_graphs = false;
  app.add_flag("--no-cuda-graphs", no_graphs, "CUDA: run decode and verification steps eagerly instead of as CUDA graph replays");
  bool no_device_sampling = false;
  app.add_flag("--no-device-sampling", no_device_sampling,
               "CUDA: sample on the host from downloaded logits instead of on the device");
  int64_t collective_timeout_ms = 120000;
  app.add_option("--collective-timeout-ms", collective_timeout_ms,
                 "TP over MPI: fail a collective (and exit) when a peer has not joined it for this long (0: wait for ever)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cli::add_sparse_attention_flags(app, o.sparse);
  int64_t debug_step_delay_ms = 0;
  app.add_option("--debug-step-delay-ms", debug_step_delay_ms, "testing only: sleep before each step")->group("");
  CLI11_PARSE(app, argc, argv);
  o.debug_step_delay = std::chrono::milliseconds(debug_step_delay_ms);
  o.weight_quant = quant.quant;
  o.quantize_lm_head = quant.lm_head;
  o.imatrix_path = quant.imatrix;
  o.kv_dtype = kv_dtype.runtime();
  if (Status st = set_matmul_precision(precision); !st.is_ok()) {
    std::fprintf(stderr, "error: --matmul-precision: %s\n", st.to_string().c_str());
    return 2;
  }
  o.bind = !no_bind;
  o.cuda_graphs = !no_graphs;
  o.device_sampling = !no_device_sampling;
  o.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  o.coordinator_timeout = std::chrono::milliseconds(coordinator_timeout_ms);
  o.coordinator_dead_timeout = std::chrono::milliseconds(std::max(coordinator_dead_timeout_ms, coordinator_timeout_ms));
  if (!app.count("--local-ranks")) o.local_ranks = static_cast<int>(env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1));

  std::unique_ptr<DeviceComm> comm;
  if (launched_by_mpi()) {
    MpiCommOptions mo;
    mo.collective_timeout = std::chrono::milliseconds(collective_timeout_ms);
    auto mpi = make_mpi_comm(mo);
    if (!mpi.is_ok()) {
      std::fprintf(stderr, "error: %s\n", mpi.status().to_string().c_str());
      return 2;
    }
    comm = std::move(mpi).value();
  } else {
    comm = make_single_rank_comm();
  }
  set_log_role("shard", comm->rank());
  bool ok = true;
  const BackendChoice backend = choose_backend(device, &ok);
  if (!ok) {
    TESSERA_LOG_ERROR("--device cuda: {}", backend.reason);
    return 2;
  }
  o.device = backend.kind;
  TESSERA_LOG_INFO("backend: {}", backend.reason);
  return run_shard(o, *comm);
}
