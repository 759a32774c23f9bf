// The GPU tests compare the CUDA backend against the CPU forward pass and kernels, whose float
// matmuls are the fp32 reference only in the fp32 matmul precision (kernels/gemm.h): on a CPU
// with AVX512_BF16 the default (auto) computes F16 / BF16 weights with bf16 dot products,
// which is a different rounding than cuBLAS's fp16 GEMM with fp32 accumulation.
#include <gtest/gtest.h>

#include "kernels/gemm.h"

namespace tessera {
namespace {

class Fp32MatmulReference : public ::testing::Environment {
 public:
  void SetUp() override { ASSERT_TRUE(set_matmul_precision(MatmulPrecision::kFp32).is_ok()); }
};

[[maybe_unused]] ::testing::Environment* const kFp32Reference =
    ::testing::AddGlobalTestEnvironment(new Fp32MatmulReference);

}  // namespace
}  // namespace tessera
