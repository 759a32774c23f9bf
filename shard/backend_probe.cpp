#include "shard/backend_probe.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <filesystem>

namespace tessera {
namespace {

std::string library_path() {
  char exe[PATH_MAX] = {};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "libtessera_cuda.so";
  return (std::filesystem::path(std::string(exe, static_cast<size_t>(n))).parent_path().parent_path() / "lib" /
          "libtessera_cuda.so")
      .string();
}

}  // namespace

BackendChoice choose_backend(const std::string& requested, bool* ok) {
  *ok = true;
  BackendChoice c;
  if (requested == "cpu") {
    c.reason = "CPU backend requested";
    return c;
  }
  const std::string path = library_path();
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    c.reason = "CUDA backend not available (" + std::string(::dlerror()) + ")";
  } else {
    using CountFn = int (*)();
    using ErrFn = const char* (*)();
    auto count = reinterpret_cast<CountFn>(::dlsym(lib, "tessera_cuda_device_count"));
    auto err = reinterpret_cast<ErrFn>(::dlsym(lib, "tessera_cuda_last_error"));
    c.cuda_devices = count ? count() : 0;
    if (c.cuda_devices == 0)
      c.reason = std::string("no CUDA device: ") + (err ? err() : "unknown");
    else
      c.reason = std::to_string(c.cuda_devices) + " CUDA device(s)";
    // The library stays loaded: the CUDA runtime does not support being unloaded cleanly.
  }
  if (requested == "cuda") {
    if (c.cuda_devices == 0) *ok = false;
    else c.kind = DeviceKind::kCuda;
  }
  // "auto": the CUDA forward pass arrives with the CUDA backend issue; until then CPU.
  if (requested == "auto" && c.cuda_devices > 0) c.reason += "; the CUDA forward pass is not built yet, using CPU";
  return c;
}

}  // namespace tessera
