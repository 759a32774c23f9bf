// DeviceComm over NCCL for GPU shards: collectives on *device* memory.
//
// NCCL lives in the CUDA backend library (libtessera_cuda.so); this class reaches it through
// the function table of kernels/cuda/cuda_loader.h, so the shard (and this file) never link
// CUDA. The NCCL unique id is created by rank 0 and sent to the other ranks over a host
// communicator (`bootstrap`: the MpiComm of the shard's MPI world, or an InProcessComm in
// tests), which also gives this communicator its rank and size.
//
// Differences from the DeviceComm contract of device_comm.h:
//  * Every pointer passed to all_reduce_sum, all_gather and broadcast is a device pointer on
//    this rank's device (options.device).
//  * The collectives are enqueued on stream() and return once enqueued: results are ready for
//    later work on that stream; call synchronize() before reading them from the host.
//    barrier() synchronizes the stream, so it returns after every rank reached it.
//  * Sums follow NCCL's reduction order (deterministic for a fixed topology, rank count and
//    size, and identical on every rank), not strictly rank order.
// Errors: Unavailable naming the rank, the collective, its size and the NCCL message.
// Thread-safety: one thread per rank; the CUDA device of the calling thread is set at creation
// (call set_device on other threads yourself).
#pragma once

#include <cstdint>
#include <memory>

#include "comm/device_comm.h"

namespace tessera {

struct CudaApi;

struct NcclCommOptions {
  int device = 0;          // CUDA device of this rank
  void* stream = nullptr;  // cudaStream_t to run on; null: the communicator creates its own
};

class NcclComm final : public DeviceComm {
 public:
  // Collective over `bootstrap`: every rank of it calls this at the same time. If any rank
  // cannot load the CUDA library or NCCL, every rank returns an error (none hangs).
  static Result<std::unique_ptr<NcclComm>> create(DeviceComm& bootstrap, const NcclCommOptions& options);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view name() const override { return "nccl"; }

  Status all_reduce_sum(float* data, int64_t count) override;                    // device pointer
  Status all_gather(const void* send, void* recv, int64_t bytes) override;       // device pointers
  Status broadcast(void* data, int64_t bytes, int root) override;                // device pointer
  Status barrier() override;

  void* stream() const { return stream_; }
  int device() const { return device_; }
  Status synchronize();

 private:
  NcclComm(const CudaApi* api, int rank, int size, int device) : api_(api), rank_(rank), size_(size), device_(device) {}
  Status error(int rc, const std::string& what) const;

  const CudaApi* api_;
  int rank_, size_, device_;
  void* comm_ = nullptr;     // ncclComm_t
  void* stream_ = nullptr;   // cudaStream_t
  bool owns_stream_ = false;
  float* scratch_ = nullptr;  // one device float for barrier()
};

}  // namespace tessera
