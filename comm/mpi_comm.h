// DeviceComm over MPI for CPU shards (host memory). Open MPI here is not CUDA-aware: GPU shards
// use NCCL for device tensors and MPI only for bootstrap.
#pragma once

#include <memory>

#include "comm/device_comm.h"

namespace tessera {

// Initialises MPI (MPI_THREAD_FUNNELED) on first use and finalises it when the last MpiComm of
// the process is destroyed. Errors name the failing MPI call.
Result<std::unique_ptr<DeviceComm>> make_mpi_comm();

// True when this process was started by mpirun (Open MPI / PMIx environment present).
bool launched_by_mpi();

}  // namespace tessera
