// Loads the CUDA backend library (libtessera_cuda.so) with dlopen and resolves its C entry
// points (cuda_api.h) into a table of function pointers. This file does not depend on CUDA:
// the shard, the NCCL communicator (comm/nccl_comm.h), the GPU tests and the GPU benchmark
// use it on machines with or without a driver.
//
// Thread-safety: load_cuda_api() may be called from any thread; the table is immutable after
// loading. The library is never unloaded (the CUDA runtime does not support it cleanly).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "kernels/cuda/cuda_api.h"

namespace tessera {

struct CudaApi {
  std::string path;  // the library these pointers come from

  // One function pointer per entry point of cuda_api.h's list, named by the entry's CudaApi
  // field (device_malloc, rms_norm_f32, nccl_all_gather, ...), in the list's order. Every one is
  // non-null in a table returned by open_cuda_api().
#define TESSERA_CUDA_API_FIELD(ret, symbol, field, params, ...) decltype(&::symbol) field = nullptr;
  TESSERA_CUDA_ENTRY_POINTS(TESSERA_CUDA_API_FIELD, TESSERA_CUDA_API_FIELD)
#undef TESSERA_CUDA_API_FIELD

  // OK when rc == 0; else Unavailable "<what>: <last_error()>" (call on the failing thread).
  Status check(int rc, std::string_view what) const;
};

// Where load_cuda_api() looks: $TESSERA_CUDA_LIBRARY when set, else
// <directory of the executable>/../lib/libtessera_cuda.so (build/bin -> build/lib).
std::string default_cuda_library_path();

// dlopens `path` and resolves every entry point of the list. Unavailable naming the path and the
// dlerror text (missing file, missing CUDA runtime), or every symbol of the list the library
// lacks (a stale build).
Result<CudaApi> open_cuda_api(const std::string& path);

// The process-wide table from default_cuda_library_path(), loaded on first call; later calls
// return the same table or the same error. Does not look at devices.
Result<const CudaApi*> load_cuda_api();

// load_cuda_api() plus at least one device: Unavailable "no CUDA device: <reason>" otherwise.
// What tests and benchmarks call before touching the GPU.
Result<const CudaApi*> load_cuda_api_with_device();

}  // namespace tessera
