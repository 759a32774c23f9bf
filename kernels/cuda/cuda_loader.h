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

  // device, memory, streams, events
  decltype(&tessera_cuda_device_count) device_count = nullptr;
  decltype(&tessera_cuda_last_error) last_error = nullptr;
  decltype(&tessera_cuda_set_device) set_device = nullptr;
  decltype(&tessera_cuda_device_info) device_info = nullptr;
  decltype(&tessera_cuda_malloc) device_malloc = nullptr;
  decltype(&tessera_cuda_free) device_free = nullptr;
  decltype(&tessera_cuda_memcpy) device_memcpy = nullptr;
  decltype(&tessera_cuda_memcpy_async) device_memcpy_async = nullptr;
  decltype(&tessera_cuda_memset) device_memset = nullptr;
  decltype(&tessera_cuda_device_synchronize) device_synchronize = nullptr;
  decltype(&tessera_cuda_stream_create) stream_create = nullptr;
  decltype(&tessera_cuda_stream_destroy) stream_destroy = nullptr;
  decltype(&tessera_cuda_stream_synchronize) stream_synchronize = nullptr;
  decltype(&tessera_cuda_event_create) event_create = nullptr;
  decltype(&tessera_cuda_event_destroy) event_destroy = nullptr;
  decltype(&tessera_cuda_event_record) event_record = nullptr;
  decltype(&tessera_cuda_event_elapsed_ms) event_elapsed_ms = nullptr;
  decltype(&tessera_cuda_graph_begin_capture) graph_begin_capture = nullptr;
  decltype(&tessera_cuda_graph_end_capture) graph_end_capture = nullptr;
  decltype(&tessera_cuda_graph_launch) graph_launch = nullptr;
  decltype(&tessera_cuda_graph_destroy) graph_destroy = nullptr;

  // NCCL
  decltype(&tessera_nccl_available) nccl_available = nullptr;
  decltype(&tessera_nccl_unique_id_bytes) nccl_unique_id_bytes = nullptr;
  decltype(&tessera_nccl_get_unique_id) nccl_get_unique_id = nullptr;
  decltype(&tessera_nccl_comm_init) nccl_comm_init = nullptr;
  decltype(&tessera_nccl_comm_destroy) nccl_comm_destroy = nullptr;
  decltype(&tessera_nccl_all_reduce_sum_f32) nccl_all_reduce_sum_f32 = nullptr;
  decltype(&tessera_nccl_all_gather) nccl_all_gather = nullptr;
  decltype(&tessera_nccl_broadcast) nccl_broadcast = nullptr;

  // ops
  decltype(&tessera_cuda_rms_norm_f32) rms_norm_f32 = nullptr;
  decltype(&tessera_cuda_add_rms_norm_f32) add_rms_norm_f32 = nullptr;
  decltype(&tessera_cuda_embedding) embedding = nullptr;
  decltype(&tessera_cuda_convert_f32_to_f16) convert_f32_to_f16 = nullptr;
  decltype(&tessera_cuda_convert_f16_to_f32) convert_f16_to_f32 = nullptr;
  decltype(&tessera_cuda_rope_kv_write_f32) rope_kv_write_f32 = nullptr;
  decltype(&tessera_cuda_paged_decode_attention_f32) paged_decode_attention_f32 = nullptr;
  decltype(&tessera_cuda_silu_mul_f32) silu_mul_f32 = nullptr;
  decltype(&tessera_cuda_argmax_f32) argmax_f32 = nullptr;
  decltype(&tessera_cuda_argmax_value_f32) argmax_value_f32 = nullptr;
  decltype(&tessera_cuda_blas_create) blas_create = nullptr;
  decltype(&tessera_cuda_blas_destroy) blas_destroy = nullptr;
  decltype(&tessera_cuda_gemm_f16) gemm_f16 = nullptr;

  // ops for the GPU forward pass
  decltype(&tessera_cuda_mem_get_info) mem_get_info = nullptr;
  decltype(&tessera_cuda_paged_prefill_attention_f32) paged_prefill_attention_f32 = nullptr;
  decltype(&tessera_cuda_gemm_w8a16) gemm_w8a16 = nullptr;
  decltype(&tessera_cuda_gemm_w4a16) gemm_w4a16 = nullptr;
  decltype(&tessera_cuda_gemm_w8a16_tc) gemm_w8a16_tc = nullptr;
  decltype(&tessera_cuda_gemm_w4a16_tc) gemm_w4a16_tc = nullptr;
  decltype(&tessera_cuda_dequantize_w8a16) dequantize_w8a16 = nullptr;
  decltype(&tessera_cuda_dequantize_w4a16) dequantize_w4a16 = nullptr;
  decltype(&tessera_cuda_gemm_gguf) gemm_gguf = nullptr;
  decltype(&tessera_cuda_dequantize_gguf) dequantize_gguf = nullptr;
  decltype(&tessera_cuda_add_f32) add_f32 = nullptr;
  decltype(&tessera_cuda_add_bias_f32) add_bias_f32 = nullptr;
  decltype(&tessera_cuda_gather_rows_f32) gather_rows_f32 = nullptr;
  decltype(&tessera_cuda_sample_f32) sample_f32 = nullptr;
  decltype(&tessera_cuda_unshard_logits_f32) unshard_logits_f32 = nullptr;

  // OK when rc == 0; else Unavailable "<what>: <last_error()>" (call on the failing thread).
  Status check(int rc, std::string_view what) const;
};

// Where load_cuda_api() looks: $TESSERA_CUDA_LIBRARY when set, else
// <directory of the executable>/../lib/libtessera_cuda.so (build/bin -> build/lib).
std::string default_cuda_library_path();

// dlopens `path` and resolves every entry point. Unavailable naming the path and the dlerror
// text (missing file, missing CUDA runtime, a symbol this library lacks).
Result<CudaApi> open_cuda_api(const std::string& path);

// The process-wide table from default_cuda_library_path(), loaded on first call; later calls
// return the same table or the same error. Does not look at devices.
Result<const CudaApi*> load_cuda_api();

// load_cuda_api() plus at least one device: Unavailable "no CUDA device: <reason>" otherwise.
// What tests and benchmarks call before touching the GPU.
Result<const CudaApi*> load_cuda_api_with_device();

}  // namespace tessera
