// F16 GEMM through cuBLAS with fp32 accumulation (tensor cores on sm_80 / sm_90).
//
// Tessera's weights are row-major [rows, cols] and activations row-major [n_tokens, cols]
// (kernels/gemm.h). cuBLAS is column-major, so the same bytes read as W^T [cols, rows] and
// X^T [cols, n_tokens]. We ask for C = op(A) op(B) with A = W (op T: [rows, cols]) and
// B = X^T (op N: [cols, n_tokens]), giving C [rows, n_tokens] column-major with ldc = rows,
// which is exactly y [n_tokens, rows] row-major.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.h"

namespace {
int record_blas(const char* what, cublasStatus_t s) {
  char text[256];
  std::snprintf(text, sizeof(text), "%s: %s (%d)", what, cublasGetStatusString(s), static_cast<int>(s));
  tessera::cuda::record_message(text);
  return static_cast<int>(s);
}
}  // namespace

#define TESSERA_BLAS_RETURN_IF_ERROR(call)                          \
  do {                                                              \
    const cublasStatus_t tessera_blas_s_ = (call);                  \
    if (tessera_blas_s_ != CUBLAS_STATUS_SUCCESS) return record_blas(#call, tessera_blas_s_); \
  } while (0)

namespace {
// What a Tessera cuBLAS handle points at: the cuBLAS handle and its own workspace. cuBLAS
// would otherwise draw workspace from its pool, which is not allowed while a stream is being
// captured into a CUDA graph (and grows per captured graph).
struct BlasHandle {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;  // cuBLAS asks for <= 32 MiB on sm_90
}  // namespace

extern "C" int tessera_cuda_blas_create(void** handle) {
  if (!handle) return tessera::cuda::record_message("tessera_cuda_blas_create: null out pointer");
  *handle = nullptr;
  auto* b = new BlasHandle;
  const cublasStatus_t s = cublasCreate(&b->handle);
  if (s != CUBLAS_STATUS_SUCCESS) {
    delete b;
    return record_blas("cublasCreate", s);
  }
  const cudaError_t e = cudaMalloc(&b->workspace, kBlasWorkspaceBytes);
  if (e != cudaSuccess) {
    cublasDestroy(b->handle);
    delete b;
    return tessera::cuda::record_error("cudaMalloc (cuBLAS workspace)", e);
  }
  b->workspace_bytes = kBlasWorkspaceBytes;
  *handle = b;
  return 0;
}

extern "C" int tessera_cuda_blas_destroy(void* handle) {
  if (!handle) return 0;
  auto* b = static_cast<BlasHandle*>(handle);
  const cublasStatus_t s = cublasDestroy(b->handle);
  cudaFree(b->workspace);
  delete b;
  if (s != CUBLAS_STATUS_SUCCESS) return record_blas("cublasDestroy", s);
  return 0;
}

extern "C" int tessera_cuda_gemm_f16(void* handle, const uint16_t* w, const uint16_t* x, float* y, int64_t rows,
                                     int64_t cols, int64_t n_tokens, void* stream) {
  if (!handle) return tessera::cuda::record_message("tessera_cuda_gemm_f16: null cuBLAS handle");
  if (rows < 0 || cols < 0 || n_tokens < 0 || rows > INT32_MAX || cols > INT32_MAX || n_tokens > INT32_MAX)
    return tessera::cuda::record_message("tessera_cuda_gemm_f16: sizes must be in [0, 2^31)");
  if (rows == 0 || n_tokens == 0) return 0;
  auto* b = static_cast<BlasHandle*>(handle);
  cublasHandle_t h = b->handle;
  // cublasSetStream resets the workspace to cuBLAS's pool: set ours again after it.
  TESSERA_BLAS_RETURN_IF_ERROR(cublasSetStream(h, static_cast<cudaStream_t>(stream)));
  TESSERA_BLAS_RETURN_IF_ERROR(cublasSetWorkspace(h, b->workspace, b->workspace_bytes));
  const float alpha = 1.0f;
  // cols == 0: the product is empty, y must still be zeros; beta = 0 with k = 0 writes them.
  const float beta = 0.0f;
  const int m = static_cast<int>(rows), n = static_cast<int>(n_tokens), k = static_cast<int>(cols);
  const int ld = k > 0 ? k : 1;
  TESSERA_BLAS_RETURN_IF_ERROR(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, CUDA_R_16F, ld, x,
                                            CUDA_R_16F, ld, &beta, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
  return 0;
}
