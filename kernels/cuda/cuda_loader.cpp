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
#define TESSERA_CUDA_RESOLVE(ret, symbol, field, params, ...) resolve(lib, #symbol, &api.field, &missing);
  TESSERA_CUDA_ENTRY_POINTS(TESSERA_CUDA_RESOLVE, TESSERA_CUDA_RESOLVE)
#undef TESSERA_CUDA_RESOLVE
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
