#include "comm/nccl_comm.h"

#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_loader.h"

namespace tessera {

Status NcclComm::error(int rc, const std::string& what) const {
  return api_->check(rc, "nccl rank " + std::to_string(rank_) + "/" + std::to_string(size_) + ": " + what);
}

Result<std::unique_ptr<NcclComm>> NcclComm::create(DeviceComm& bootstrap, const NcclCommOptions& options) {
  const int rank = bootstrap.rank(), size = bootstrap.size();
  const std::string who = "nccl rank " + std::to_string(rank) + "/" + std::to_string(size);

  // 1. Every rank checks that it can use NCCL, and they agree before anyone blocks in NCCL.
  Result<const CudaApi*> loaded = load_cuda_api_with_device();
  std::string local_problem;
  if (!loaded.is_ok()) local_problem = loaded.status().message();
  else if (!(*loaded)->nccl_available()) local_problem = "libtessera_cuda was built without NCCL";
  float ready = local_problem.empty() ? 1.0f : 0.0f;
  TESSERA_RETURN_IF_ERROR(bootstrap.all_reduce_sum(&ready, 1).with_context(who + ": bootstrap readiness vote"));
  if (!local_problem.empty()) return Status::unavailable(who + ": " + local_problem);
  if (ready != static_cast<float>(size))
    return Status::unavailable(who + ": " + std::to_string(size - static_cast<int>(ready)) +
                               " other rank(s) cannot use CUDA/NCCL (see their logs)");
  const CudaApi* api = *loaded;

  // 2. Rank 0 creates the unique id; byte 0 of the message says whether that worked, so a
  // failure there is reported on every rank instead of leaving them waiting in NCCL init.
  const int64_t id_bytes = api->nccl_unique_id_bytes();
  std::vector<uint8_t> message(static_cast<size_t>(id_bytes) + 1, 0);
  std::string id_error;
  if (rank == 0) {
    const Status s = api->check(api->nccl_get_unique_id(message.data() + 1, id_bytes), who + ": ncclGetUniqueId");
    if (s.is_ok()) message[0] = 1;
    else id_error = s.message();
  }
  TESSERA_RETURN_IF_ERROR(bootstrap.broadcast(message.data(), static_cast<int64_t>(message.size()), 0)
                              .with_context(who + ": broadcast of the NCCL unique id"));
  if (message[0] != 1)
    return Status::unavailable(rank == 0 ? id_error : who + ": rank 0 could not create the NCCL unique id");

  // 3. The communicator, its stream and the barrier's scratch float.
  std::unique_ptr<NcclComm> comm(new NcclComm(api, rank, size, options.device));
  TESSERA_RETURN_IF_ERROR(comm->error(
      api->nccl_comm_init(&comm->comm_, message.data() + 1, id_bytes, rank, size, options.device),
      "ncclCommInitRank on device " + std::to_string(options.device)));
  if (options.stream) {
    comm->stream_ = options.stream;
  } else {
    TESSERA_RETURN_IF_ERROR(comm->error(api->stream_create(&comm->stream_), "cudaStreamCreate"));
    comm->owns_stream_ = true;
  }
  void* scratch = nullptr;
  TESSERA_RETURN_IF_ERROR(comm->error(api->device_malloc(&scratch, sizeof(float)), "cudaMalloc of 4 bytes"));
  comm->scratch_ = static_cast<float*>(scratch);
  // Zero once: a sum of zeros stays zero for every later barrier. (device_memset returns when
  // the fill is complete, so the first collective on stream_ sees it.)
  TESSERA_RETURN_IF_ERROR(comm->error(api->device_memset(scratch, 0, sizeof(float)), "cudaMemset"));
  return comm;
}

NcclComm::~NcclComm() {
  // Errors here cannot be reported to anyone; the process is usually ending.
  if (comm_) api_->nccl_comm_destroy(comm_);
  if (scratch_) api_->device_free(scratch_);
  if (owns_stream_ && stream_) api_->stream_destroy(stream_);
}

Status NcclComm::all_reduce_sum(float* data, int64_t count) {
  return error(api_->nccl_all_reduce_sum_f32(comm_, data, data, count, stream_),
               "all_reduce_sum(count=" + std::to_string(count) + ")");
}

Status NcclComm::all_gather(const void* send, void* recv, int64_t bytes) {
  return error(api_->nccl_all_gather(comm_, send, recv, bytes, stream_),
               "all_gather(bytes=" + std::to_string(bytes) + ")");
}

Status NcclComm::broadcast(void* data, int64_t bytes, int root) {
  if (root < 0 || root >= size_)
    return Status::invalid_argument("nccl rank " + std::to_string(rank_) + ": broadcast root " + std::to_string(root) +
                                    " outside [0, " + std::to_string(size_) + ")");
  return error(api_->nccl_broadcast(comm_, data, bytes, root, stream_),
               "broadcast(bytes=" + std::to_string(bytes) + ", root=" + std::to_string(root) + ")");
}

Status NcclComm::barrier() {
  // NCCL has no barrier: a one-float all-reduce completes on a rank only after every rank
  // joined it, and synchronizing the stream waits for that completion.
  TESSERA_RETURN_IF_ERROR(all_reduce_sum(scratch_, 1));
  return synchronize();
}

Status NcclComm::synchronize() {
  return error(api_->stream_synchronize(stream_), "cudaStreamSynchronize");
}

}  // namespace tessera
