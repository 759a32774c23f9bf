// Free and total device memory (cudaMemGetInfo), for sizing the KV pool after the weights and
// the workspace are allocated.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

extern "C" int tessera_cuda_mem_get_info(int64_t* free_bytes, int64_t* total_bytes) {
  if (!free_bytes || !total_bytes) return tessera::cuda::record_message("tessera_cuda_mem_get_info: null out pointer");
  size_t f = 0, t = 0;
  TESSERA_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&f, &t));
  *free_bytes = static_cast<int64_t>(f);
  *total_bytes = static_cast<int64_t>(t);
  return 0;
}
