// Collective communication between the shards of one tensor-parallel group (ARCHITECTURE.md "Tensor parallelism").
//
// Implementations: SingleRankComm (TP = 1), InProcessComm (ranks as threads, for tests), MpiComm
// (CPU shards, host memory), and NCCL (GPU shards, device memory; in the CUDA backend).
// Every rank calls the same collectives in the same order. Results are bitwise identical on
// every rank; sums are reduced in rank order so they are deterministic run to run.
// Thread-safety: one thread per rank calls a communicator.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tessera {

class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view name() const = 0;

  // data[0, count) = sum over ranks of every rank's data[0, count), in place.
  virtual Status all_reduce_sum(float* data, int64_t count) = 0;
  // recv[r * bytes, (r + 1) * bytes) = rank r's send[0, bytes).
  virtual Status all_gather(const void* send, void* recv, int64_t bytes) = 0;
  // data[0, bytes) of `root` copied to every rank.
  virtual Status broadcast(void* data, int64_t bytes, int root) = 0;
  virtual Status barrier() = 0;

  // Ends a collective waiting now, and fails every later one, with `reason`: for a watchdog
  // thread that finds the job over (its coordinator gone) while the step thread waits on a
  // peer that never comes. Thread-safe. Communicators whose waits cannot be interrupted ignore it.
  virtual void abort(const std::string& reason) {}
  // True once a collective failed part-way (a peer lost, a timeout, abort()): the ranks are out
  // of step, so the communicator must not be used again and the rank should exit.
  virtual bool failed() const { return false; }
};

std::unique_ptr<DeviceComm> make_single_rank_comm();

// n communicators sharing state, one per thread-rank. The group must outlive them.
std::vector<std::unique_ptr<DeviceComm>> make_in_process_comms(int n);

}  // namespace tessera
