// NCCL entry points of the C API (built when CMake found nccl.h and libnccl; otherwise
// nccl_stub.cpp provides the same symbols). Every NCCL call is checked; a failure records
// "<call>: <ncclGetErrorString> (<code>)[: <ncclGetLastError>]".
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>

#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace {

int record_nccl(const char* what, ncclResult_t r, ncclComm_t comm) {
  char text[512];
  const char* detail = ncclGetLastError(comm);
  if (detail && detail[0])
    std::snprintf(text, sizeof(text), "%s: %s (%d): %s", what, ncclGetErrorString(r), static_cast<int>(r), detail);
  else
    std::snprintf(text, sizeof(text), "%s: %s (%d)", what, ncclGetErrorString(r), static_cast<int>(r));
  tessera::cuda::record_message(text);
  return static_cast<int>(r);
}

}  // namespace

#define TESSERA_NCCL_RETURN_IF_ERROR(call, comm)                       \
  do {                                                                 \
    const ncclResult_t tessera_nccl_r_ = (call);                       \
    if (tessera_nccl_r_ != ncclSuccess) return record_nccl(#call, tessera_nccl_r_, (comm)); \
  } while (0)

extern "C" int tessera_nccl_available() { return 1; }

extern "C" int64_t tessera_nccl_unique_id_bytes() { return static_cast<int64_t>(sizeof(ncclUniqueId)); }

extern "C" int tessera_nccl_get_unique_id(void* h_id, int64_t id_bytes) {
  if (!h_id || id_bytes != static_cast<int64_t>(sizeof(ncclUniqueId)))
    return tessera::cuda::record_message("tessera_nccl_get_unique_id: id buffer must be sizeof(ncclUniqueId) bytes");
  ncclUniqueId id;
  TESSERA_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id), nullptr);
  std::memcpy(h_id, &id, sizeof(id));
  return 0;
}

extern "C" int tessera_nccl_comm_init(void** comm, const void* h_id, int64_t id_bytes, int rank, int nranks,
                                      int device) {
  if (!comm || !h_id || id_bytes != static_cast<int64_t>(sizeof(ncclUniqueId)))
    return tessera::cuda::record_message("tessera_nccl_comm_init: null pointer or id of the wrong size");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return tessera::cuda::record_message("tessera_nccl_comm_init: rank outside [0, nranks)");
  *comm = nullptr;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  ncclUniqueId id;
  std::memcpy(&id, h_id, sizeof(id));
  ncclComm_t c = nullptr;
  TESSERA_NCCL_RETURN_IF_ERROR(ncclCommInitRank(&c, nranks, id, rank), nullptr);
  *comm = c;
  return 0;
}

extern "C" int tessera_nccl_comm_destroy(void* comm) {
  if (!comm) return 0;
  TESSERA_NCCL_RETURN_IF_ERROR(ncclCommDestroy(static_cast<ncclComm_t>(comm)), nullptr);
  return 0;
}

extern "C" int tessera_nccl_all_reduce_sum_f32(void* comm, const float* d_send, float* d_recv, int64_t count,
                                               void* stream) {
  if (count < 0) return tessera::cuda::record_message("tessera_nccl_all_reduce_sum_f32: negative count");
  auto c = static_cast<ncclComm_t>(comm);
  TESSERA_NCCL_RETURN_IF_ERROR(ncclAllReduce(d_send, d_recv, static_cast<size_t>(count), ncclFloat32, ncclSum, c,
                                             static_cast<cudaStream_t>(stream)),
                               c);
  return 0;
}

extern "C" int tessera_nccl_all_gather(void* comm, const void* d_send, void* d_recv, int64_t bytes, void* stream) {
  if (bytes < 0) return tessera::cuda::record_message("tessera_nccl_all_gather: negative size");
  auto c = static_cast<ncclComm_t>(comm);
  TESSERA_NCCL_RETURN_IF_ERROR(
      ncclAllGather(d_send, d_recv, static_cast<size_t>(bytes), ncclUint8, c, static_cast<cudaStream_t>(stream)), c);
  return 0;
}

extern "C" int tessera_nccl_broadcast(void* comm, void* d_data, int64_t bytes, int root, void* stream) {
  if (bytes < 0) return tessera::cuda::record_message("tessera_nccl_broadcast: negative size");
  auto c = static_cast<ncclComm_t>(comm);
  TESSERA_NCCL_RETURN_IF_ERROR(ncclBroadcast(d_data, d_data, static_cast<size_t>(bytes), ncclUint8, root, c,
                                             static_cast<cudaStream_t>(stream)),
                               c);
  return 0;
}
