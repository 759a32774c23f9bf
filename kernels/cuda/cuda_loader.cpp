#include "kernels/cuda/cuda_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <mutex>
#include <optional>

#include "common/env.h"

namespace tessera {
namespace {

template <typename Fn>
bool resolve(void* lib, const char* name, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(::dlsym(lib, name));
  if (!*out) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
  }
  return *out != nullptr;
}

}  // namespace

Status CudaApi::check(int rc, std::string_view what) const {
  if (rc == 0) return Status::ok();
  return Status::unavailable(std::string(what) + ": " + (last_error ? last_error() : "unknown CUDA error") +
                             " (code " + std::to_string(rc) + ")");
}

std::string default_cuda_library_path() {
  std::string over = env_string("TESSERA_CUDA_LIBRARY", "");
  if (!over.empty()) return over;
  char exe[PATH_MAX] = {};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "libtessera_cuda.so";
  return (std::filesystem::path(std::string(exe, static_cast<size_t>(n))).parent_path().parent_path() / "lib" /
          "libtessera_cuda.so")
      .string();
}

Result<CudaApi> open_cuda_api(const std::string& path) {
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = ::dlerror();
    return Status::unavailable("CUDA backend library " + path + " not loadable: " + (err ? err : "unknown"));
  }
  CudaApi api;
  api.path = path;
  std::string missing;
  resolve(lib, "tessera_cuda_device_count", &api.device_count, &missing);
  resolve(lib, "tessera_cuda_last_error", &api.last_error, &missing);
  resolve(lib, "tessera_cuda_set_device", &api.set_device, &missing);
  resolve(lib, "tessera_cuda_device_info", &api.device_info, &missing);
  resolve(lib, "tessera_cuda_malloc", &api.device_malloc, &missing);
  resolve(lib, "tessera_cuda_free", &api.device_free, &missing);
  resolve(lib, "tessera_cuda_memcpy", &api.device_memcpy, &missing);
  resolve(lib, "tessera_cuda_memcpy_async", &api.device_memcpy_async, &missing);
  resolve(lib, "tessera_cuda_memset", &api.device_memset, &missing);
  resolve(lib, "tessera_cuda_device_synchronize", &api.device_synchronize, &missing);
  resolve(lib, "tessera_cuda_stream_create", &api.stream_create, &missing);
  resolve(lib, "tessera_cuda_stream_destroy", &api.stream_destroy, &missing);
  resolve(lib, "tessera_cuda_stream_synchronize", &api.stream_synchronize, &missing);
  resolve(lib, "tessera_cuda_event_create", &api.event_create, &missing);
  resolve(lib, "tessera_cuda_event_destroy", &api.event_destroy, &missing);
  resolve(lib, "tessera_cuda_event_record", &api.event_record, &missing);
  resolve(lib, "tessera_cuda_event_elapsed_ms", &api.event_elapsed_ms, &missing);
  resolve(lib, "tessera_cuda_graph_begin_capture", &api.graph_begin_capture, &missing);
  resolve(lib, "tessera_cuda_graph_end_capture", &api.graph_end_capture, &missing);
  resolve(lib, "tessera_cuda_graph_launch", &api.graph_launch, &missing);
  resolve(lib, "tessera_cuda_graph_destroy", &api.graph_destroy, &missing);
  resolve(lib, "tessera_nccl_available", &api.nccl_available, &missing);
  resolve(lib, "tessera_nccl_unique_id_bytes", &api.nccl_unique_id_bytes, &missing);
  resolve(lib, "tessera_nccl_get_unique_id", &api.nccl_get_unique_id, &missing);
  resolve(lib, "tessera_nccl_comm_init", &api.nccl_comm_init, &missing);
  resolve(lib, "tessera_nccl_comm_destroy", &api.nccl_comm_destroy, &missing);
  resolve(lib, "tessera_nccl_all_reduce_sum_f32", &api.nccl_all_reduce_sum_f32, &missing);
  resolve(lib, "tessera_nccl_all_gather", &api.nccl_all_gather, &missing);
  resolve(lib, "tessera_nccl_broadcast", &api.nccl_broadcast, &missing);
  resolve(lib, "tessera_cuda_rms_norm_f32", &api.rms_norm_f32, &missing);
  resolve(lib, "tessera_cuda_add_rms_norm_f32", &api.add_rms_norm_f32, &missing);
  resolve(lib, "tessera_cuda_embedding", &api.embedding, &missing);
  resolve(lib, "tessera_cuda_convert_f32_to_f16", &api.convert_f32_to_f16, &missing);
  resolve(lib, "tessera_cuda_convert_f16_to_f32", &api.convert_f16_to_f32, &missing);
  resolve(lib, "tessera_cuda_rope_kv_write_f32", &api.rope_kv_write_f32, &missing);
  resolve(lib, "tessera_cuda_paged_decode_attention_f32", &api.paged_decode_attention_f32, &missing);
  resolve(lib, "tessera_cuda_silu_mul_f32", &api.silu_mul_f32, &missing);
  resolve(lib, "tessera_cuda_argmax_f32", &api.argmax_f32, &missing);
  resolve(lib, "tessera_cuda_argmax_value_f32", &api.argmax_value_f32, &missing);
  resolve(lib, "tessera_cuda_blas_create", &api.blas_create, &missing);
  resolve(lib, "tessera_cuda_blas_destroy", &api.blas_destroy, &missing);
  resolve(lib, "tessera_cuda_gemm_f16", &api.gemm_f16, &missing);
  resolve(lib, "tessera_cuda_mem_get_info", &api.mem_get_info, &missing);
  resolve(lib, "tessera_cuda_paged_prefill_attention_f32", &api.paged_prefill_attention_f32, &missing);
  resolve(lib, "tessera_cuda_gemm_w8a16", &api.gemm_w8a16, &missing);
  resolve(lib, "tessera_cuda_gemm_w4a16", &api.gemm_w4a16, &missing);
  resolve(lib, "tessera_cuda_gemm_w8a16_tc", &api.gemm_w8a16_tc, &missing);
  resolve(lib, "tessera_cuda_gemm_w4a16_tc", &api.gemm_w4a16_tc, &missing);
  resolve(lib, "tessera_cuda_dequantize_w8a16", &api.dequantize_w8a16, &missing);
  resolve(lib, "tessera_cuda_dequantize_w4a16", &api.dequantize_w4a16, &missing);
  resolve(lib, "tessera_cuda_gemm_gguf", &api.gemm_gguf, &missing);
  resolve(lib, "tessera_cuda_dequantize_gguf", &api.dequantize_gguf, &missing);
  resolve(lib, "tessera_cuda_add_f32", &api.add_f32, &missing);
  resolve(lib, "tessera_cuda_add_bias_f32", &api.add_bias_f32, &missing);
  resolve(lib, "tessera_cuda_gather_rows_f32", &api.gather_rows_f32, &missing);
  resolve(lib, "tessera_cuda_sample_f32", &api.sample_f32, &missing);
  resolve(lib, "tessera_cuda_unshard_logits_f32", &api.unshard_logits_f32, &missing);
  if (!missing.empty())
    return Status::unavailable("CUDA backend library " + path + " lacks entry points: " + missing +
                               " (stale build?)");
  // The handle is deliberately kept open for the life of the process.
  return api;
}

Result<const CudaApi*> load_cuda_api() {
  static std::once_flag once;
  static std::optional<CudaApi> api;
  static Status error;
  std::call_once(once, [] {
    Result<CudaApi> r = open_cuda_api(default_cuda_library_path());
    if (r.is_ok()) api = std::move(r).value();
    else error = r.status();
  });
  if (!api) return error;
  return &*api;
}

Result<const CudaApi*> load_cuda_api_with_device() {
  Result<const CudaApi*> api = load_cuda_api();
  if (!api.is_ok()) return Status::unavailable("no CUDA device: " + api.status().message());
  const int n = (*api)->device_count();
  if (n <= 0) return Status::unavailable(std::string("no CUDA device: ") + (*api)->last_error());
  return api;
}

}  // namespace tessera
