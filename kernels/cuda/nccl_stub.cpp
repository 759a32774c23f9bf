// The NCCL entry points of a library built without NCCL (CMake found no nccl.h / libnccl):
// same symbols as nccl_api.cpp, each failing with "built without NCCL".
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace {
int without_nccl() {
  return tessera::cuda::record_message("libtessera_cuda was built without NCCL (nccl.h / libnccl not found at configure time)");
}
}  // namespace

extern "C" int tessera_nccl_available() { return 0; }
extern "C" int64_t tessera_nccl_unique_id_bytes() { return 0; }
extern "C" int tessera_nccl_get_unique_id(void*, int64_t) { return without_nccl(); }
extern "C" int tessera_nccl_comm_init(void** comm, const void*, int64_t, int, int, int) {
  if (comm) *comm = nullptr;
  return without_nccl();
}
extern "C" int tessera_nccl_comm_destroy(void* comm) { return comm ? without_nccl() : 0; }
extern "C" int tessera_nccl_all_reduce_sum_f32(void*, const float*, float*, int64_t, void*) { return without_nccl(); }
extern "C" int tessera_nccl_all_gather(void*, const void*, void*, int64_t, void*) { return without_nccl(); }
extern "C" int tessera_nccl_broadcast(void*, void*, int64_t, int, void*) { return without_nccl(); }
