// Helpers for the GPU tests: the CUDA backend is reached only through the dlopen-ed library
// (kernels/cuda/cuda_loader.h), so these binaries link no CUDA and skip without a device.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/cuda/cuda_loader.h"
#include "tests/kernels/kernel_test_util.h"

namespace tessera::gpu_test {

using test::gaussian;  // seeded normal data, as in the CPU kernel tests

// fp32 <-> fp16 element by element (round to nearest even; widening is exact).
inline std::vector<uint16_t> to_f16(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_fp16(x[i]);
  return h;
}
inline std::vector<float> from_f16(const std::vector<uint16_t>& h) {
  std::vector<float> x(h.size());
  for (size_t i = 0; i < h.size(); ++i) x[i] = fp16_to_f32(h[i]);
  return x;
}

// Skips the test ("no CUDA device: ...") unless the library loads and a device is present;
// allocations made through it are freed at TearDown.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<const CudaApi*> api = load_cuda_api_with_device();
    if (!api.is_ok()) GTEST_SKIP() << api.status().message();
    api_ = *api;
    ASSERT_EQ(api_->set_device(0), 0) << api_->last_error();
  }
  void TearDown() override {
    if (!api_) return;
    for (void* p : allocations_) api_->device_free(p);
  }

  template <typename T>
  T* alloc(int64_t n) {
    void* p = nullptr;
    const int rc = api_->device_malloc(&p, n * static_cast<int64_t>(sizeof(T)));
    EXPECT_EQ(rc, 0) << api_->last_error();
    if (p) allocations_.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  T* to_device(const std::vector<T>& host) {
    T* d = alloc<T>(static_cast<int64_t>(host.size()));
    const int rc = api_->device_memcpy(d, host.data(), static_cast<int64_t>(host.size() * sizeof(T)));
    EXPECT_EQ(rc, 0) << api_->last_error();
    return d;
  }
  // Waits for all queued work (so kernel errors surface here), then copies back.
  template <typename T>
  std::vector<T> to_host(const T* d, int64_t n) {
    std::vector<T> host(static_cast<size_t>(n));
    EXPECT_EQ(api_->device_synchronize(), 0) << api_->last_error();
    EXPECT_EQ(api_->device_memcpy(host.data(), d, n * static_cast<int64_t>(sizeof(T))), 0) << api_->last_error();
    return host;
  }

  const CudaApi* api_ = nullptr;

 private:
  std::vector<void*> allocations_;
};

}  // namespace tessera::gpu_test
