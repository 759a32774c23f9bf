// F16 GEMM through cuBLASLt with fp32 accumulation (tensor cores on sm_80 / sm_90).
//
// Tessera's weights are row-major [rows, cols] and activations row-major [n_tokens, cols]
// (kernels/gemm.h). cuBLAS is column-major, so the same bytes read as W^T [cols, rows] and
// X^T [cols, n_tokens]. We ask for C = op(A) op(B) with A = W (op T: [rows, cols]) and
// B = X^T (op N: [cols, n_tokens]), giving C [rows, n_tokens] column-major with ldc = rows,
// which is exactly y [n_tokens, rows] row-major.
//
// cuBLASLt: one plan per (shape, pointer alignments) — the matmul descriptor, the three matrix
// layouts and the algorithm the heuristic chose for our fixed workspace — built on the shape's
// first call and reused, so a step (and a CUDA graph capture) only enqueues cublasLtMatmul.
// When the heuristic offers nothing for a shape (or k == 0), cublasGemmEx runs it instead.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

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
// The largest power of two (at most 256) that divides the address: what cuBLASLt's heuristic
// must assume of a pointer (its default assumes 256).
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// A cuBLASLt plan for one GEMM shape and the alignments of its three pointers.
struct LtPlan {
  int m = 0, n = 0, k = 0;
  uint32_t align_w = 0, align_x = 0, align_y = 0;
  bool usable = false;  // false: the heuristic had no algorithm; use cublasGemmEx
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// What a Tessera cuBLAS handle points at: the cuBLAS and cuBLASLt handles, their own workspace
// and the cuBLASLt plans. cuBLAS would otherwise draw workspace from its pool, which is not
// allowed while a stream is being captured into a CUDA graph (and grows per captured graph).
struct BlasHandle {
  cublasHandle_t handle = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::vector<LtPlan> plans;
};
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;  // cuBLAS asks for <= 32 MiB on sm_90

void destroy_plan(LtPlan& p) {
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c) cublasLtMatrixLayoutDestroy(p.c);
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  p = LtPlan{};
}

// Builds the plan of y [n, m] = x [n, k] * w [m, k]^T in `plan` (shape and alignments set).
// A failing call returns its status; a heuristic with no result leaves plan.usable false.
cublasStatus_t build_plan(BlasHandle& b, LtPlan& plan) {
  cublasStatus_t s = cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  s = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t));
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n));
  // Column-major: A = W^T stored [k, m] (ld k), B = X^T [k, n] (ld k), C = Y^T [m, n] (ld m).
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16F, plan.k, plan.m, plan.k);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16F, plan.k, plan.n, plan.k);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_32F, plan.m, plan.n, plan.m);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  cublasLtMatmulPreference_t pref = nullptr;
  s = cublasLtMatmulPreferenceCreate(&pref);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const uint64_t workspace = b.workspace_bytes;
  s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                           sizeof(workspace));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, plan.align_w},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, plan.align_x},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, plan.align_y},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, plan.align_y}};
  for (const auto& [attr, value] : aligns)
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulAlgoGetHeuristic(b.lt, plan.desc, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  // No algorithm for this shape / alignment is not an error: cublasGemmEx takes it.
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) return CUBLAS_STATUS_SUCCESS;
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  plan.usable = returned > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  plan.algo = result.algo;
  return CUBLAS_STATUS_SUCCESS;
}
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
  const cublasStatus_t lt = cublasLtCreate(&b->lt);
  if (lt != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(b->handle);
    delete b;
    return record_blas("cublasLtCreate", lt);
  }
  const cudaError_t e = cudaMalloc(&b->workspace, kBlasWorkspaceBytes);
  if (e != cudaSuccess) {
    cublasLtDestroy(b->lt);
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
  for (LtPlan& p : b->plans) destroy_plan(p);
  if (b->lt) cublasLtDestroy(b->lt);
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
  const int m = static_cast<int>(rows), n = static_cast<int>(n_tokens), k = static_cast<int>(cols);
  const float alpha = 1.0f, beta = 0.0f;
  if (k > 0) {
    const uint32_t aw = alignment(w), ax = alignment(x), ay = alignment(y);
    LtPlan* plan = nullptr;
    for (LtPlan& p : b->plans)
      if (p.m == m && p.n == n && p.k == k && p.align_w == aw && p.align_x == ax && p.align_y == ay) plan = &p;
    if (!plan) {
      LtPlan fresh;
      fresh.m = m;
      fresh.n = n;
      fresh.k = k;
      fresh.align_w = aw;
      fresh.align_x = ax;
      fresh.align_y = ay;
      const cublasStatus_t s = build_plan(*b, fresh);
      if (s != CUBLAS_STATUS_SUCCESS) {
        destroy_plan(fresh);
        return record_blas("cuBLASLt plan", s);
      }
      b->plans.push_back(fresh);
      plan = &b->plans.back();
    }
    if (plan->usable) {
      TESSERA_BLAS_RETURN_IF_ERROR(cublasLtMatmul(b->lt, plan->desc, &alpha, w, plan->a, x, plan->b, &beta, y, plan->c,
                                                  y, plan->c, &plan->algo, b->workspace, b->workspace_bytes,
                                                  static_cast<cudaStream_t>(stream)));
      return 0;
    }
  }
  cublasHandle_t h = b->handle;
  // cublasSetStream resets the workspace to cuBLAS's pool: set ours again after it.
  TESSERA_BLAS_RETURN_IF_ERROR(cublasSetStream(h, static_cast<cudaStream_t>(stream)));
  TESSERA_BLAS_RETURN_IF_ERROR(cublasSetWorkspace(h, b->workspace, b->workspace_bytes));
  // cols == 0: the product is empty, y must still be zeros; beta = 0 with k = 0 writes them.
  const int ld = k > 0 ? k : 1;
  TESSERA_BLAS_RETURN_IF_ERROR(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, CUDA_R_16F, ld, x,
                                            CUDA_R_16F, ld, &beta, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
  return 0;
}
