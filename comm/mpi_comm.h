// DeviceComm over MPI for CPU shards (host memory). Open MPI here is not CUDA-aware: GPU shards
// use NCCL for device tensors and MPI only for bootstrap.
#pragma once

#include <chrono>
#include <memory>

#include "comm/device_comm.h"

namespace tessera {

struct MpiCommOptions {
  // A collective with no answer from every peer for this long fails (DeadlineExceeded, naming
  // the call and the wait) instead of waiting for ever; 0: no limit. A stopped peer is waited
  // for up to this; the coordinator tears the group down long before on a host it can see.
  std::chrono::milliseconds collective_timeout{120000};
  // Waits spin (lowest latency; the ranks of a step arrive within microseconds) for this long,
  // then sleep between polls, backing off up to max_poll_sleep: a rank whose peer is stopped or
  // gone costs no core.
  std::chrono::microseconds spin{2000};
  std::chrono::microseconds max_poll_sleep{1000};
};

// Initialises MPI (MPI_THREAD_FUNNELED) on first use and finalises it when the last MpiComm of
// the process is destroyed. Errors name the failing MPI call. Collectives are non-blocking MPI
// calls waited for as MpiCommOptions says; DeviceComm::abort() ends a wait from any thread
// (Aborted, with its reason).
Result<std::unique_ptr<DeviceComm>> make_mpi_comm(const MpiCommOptions& options = {});

// True when this process was started by mpirun (Open MPI / PMIx environment present).
bool launched_by_mpi();

}  // namespace tessera
