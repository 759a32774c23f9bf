// tessera-shard: one tensor-parallel rank. Under mpirun the ranks form an MPI group for their
// collectives; started alone it is rank 0 of 1.
#include <CLI/CLI.hpp>

#include <algorithm>

#include "cli/flags.h"
#include "comm/mpi_comm.h"
#include "common/env.h"
#include "common/logging.h"
#include "kernels/gemm.h"
#include "shard/backend_probe.h"
#include "shard/shard_worker.h"

int main(int argc, char** argv) {
  using namespace tessera;
  ShardOptions o;
  int64_t heartbeat_ms = 250, coordinator_timeout_ms = 3000;
  bool no_bind = false;
  CLI::App app{"tessera-shard: one tensor-parallel rank of a Tessera model"};
  app.add_option("--model", o.model_path, "HF model directory or .gguf file")->required();
  app.add_option("--coordinator", o.coordinator, "coordinator control endpoint (tcp://host:port or ipc://path)")
      ->required();
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
  cli::add_shard_runtime_flags(app, o.runtime, cli::ShardFlagsFor::kShard);
  int64_t debug_step_delay_ms = 0;
  app.add_option("--debug-step-delay-ms", debug_step_delay_ms, "testing only: sleep before each step")->group("");
  CLI11_PARSE(app, argc, argv);
  o.debug_step_delay = std::chrono::milliseconds(debug_step_delay_ms);
  if (Status st = set_matmul_precision(o.runtime.matmul_precision); !st.is_ok()) {
    std::fprintf(stderr, "error: --matmul-precision: %s\n", st.to_string().c_str());
    return 2;
  }
  o.bind = !no_bind;
  o.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  o.coordinator_timeout = std::chrono::milliseconds(coordinator_timeout_ms);
  o.coordinator_dead_timeout = std::chrono::milliseconds(std::max(coordinator_dead_timeout_ms, coordinator_timeout_ms));
  if (!app.count("--local-ranks")) o.local_ranks = static_cast<int>(env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1));

  std::unique_ptr<DeviceComm> comm;
  if (launched_by_mpi()) {
    MpiCommOptions mo;
    mo.collective_timeout = std::chrono::milliseconds(o.runtime.collective_timeout_ms);
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
  const BackendChoice backend = choose_backend(o.runtime.device, &ok);
  if (!ok) {
    TESSERA_LOG_ERROR("--device cuda: {}", backend.reason);
    return 2;
  }
  o.device = backend.kind;
  TESSERA_LOG_INFO("backend: {}", backend.reason);
  return run_shard(o, *comm);
}
