#include "shard/backend_probe.h"

#include <cstdlib>
#include <filesystem>

#include "kernels/cuda/cuda_loader.h"

namespace tessera {

BackendChoice choose_backend(const std::string& requested, bool* ok) {
  *ok = true;
  BackendChoice c;
  if (requested == "cpu") {
    c.reason = "CPU backend requested";
    return c;
  }
  // "auto" on a machine without the NVIDIA driver: do not load the backend at all (dlopen-ing
  // the CUDA runtime and cuBLAS costs a shard ~0.4 s and ~220 MB). TESSERA_CUDA_LIBRARY (a
  // chosen backend library, e.g. the tests' CPU stand-in) is always loaded.
  std::error_code ec;
  if (requested == "auto" && std::getenv("TESSERA_CUDA_LIBRARY") == nullptr &&
      !std::filesystem::exists("/proc/driver/nvidia/version", ec) && !std::filesystem::exists("/dev/nvidiactl", ec)) {
    c.reason = "no NVIDIA driver (/proc/driver/nvidia/version and /dev/nvidiactl absent); using the CPU backend";
    return c;
  }
  // The loader keeps the library loaded: the CUDA runtime does not support being unloaded.
  Result<const CudaApi*> api = load_cuda_api();
  if (!api.is_ok()) {
    c.reason = "CUDA backend not available (" + api.status().message() + ")";
  } else {
    c.cuda_devices = (*api)->device_count();
    if (c.cuda_devices == 0)
      c.reason = std::string("no CUDA device: ") + (*api)->last_error();
    else
      c.reason = std::to_string(c.cuda_devices) + " CUDA device(s)";
  }
  if (c.cuda_devices > 0) {
    c.kind = DeviceKind::kCuda;
  } else if (requested == "cuda") {
    *ok = false;
  } else {
    c.reason += "; using the CPU backend";
  }
  return c;
}

}  // namespace tessera
