// Chooses the shard's compute backend. The CUDA backend is a shared library
// (libtessera_cuda.so, next to the executables in ../lib) loaded with dlopen through
// kernels/cuda/cuda_loader.h only when asked for, so a CPU-only machine never pays the CUDA
// start-up cost.
#pragma once

#include <string>

#include "topology/topology.h"

namespace tessera {

struct BackendChoice {
  DeviceKind kind = DeviceKind::kCpu;
  int cuda_devices = 0;
  std::string reason;  // why this backend: "no CUDA driver (cudaGetDeviceCount: ...)"
};

// requested: "cpu", "cuda" or "auto". "auto" takes CUDA when the backend library loads and
// sees a device, else the CPU (reason says why). "cuda" without a usable device is an error
// (reason set, kind kCpu, ok false).
BackendChoice choose_backend(const std::string& requested, bool* ok);

}  // namespace tessera
