#include "cli/default_model.h"

#include <limits.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/env.h"

namespace tessera::cli {

namespace fs = std::filesystem;

DefaultModelSearch default_model_search() {
  DefaultModelSearch s;
  s.env_model = env_string("TESSERA_MODEL", "");
  std::error_code ec;
  s.working_dir = fs::current_path(ec).string();
  char exe[PATH_MAX] = {};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) s.executable_dir = fs::path(std::string(exe, static_cast<size_t>(n))).parent_path().string();
  return s;
}

Result<std::string> resolve_default_model(const DefaultModelSearch& search) {
  std::error_code ec;
  if (!search.env_model.empty()) {
    if (fs::exists(search.env_model, ec)) return search.env_model;
    return Status::not_found(fmt::format("TESSERA_MODEL names {}, which does not exist", search.env_model));
  }
  std::vector<std::string> looked;
  auto candidate = [&](const std::string& base, const fs::path& rel) -> std::optional<std::string> {
    if (base.empty()) return std::nullopt;
    const fs::path p = (fs::path(base) / rel).lexically_normal();
    looked.push_back(p.string());
    if (fs::is_regular_file(p, ec)) return p.string();
    return std::nullopt;
  };
  const fs::path file(kDefaultModelFile);
  if (auto p = candidate(search.working_dir, fs::path("models") / file)) return *p;
  if (auto p = candidate(search.executable_dir, fs::path("..") / ".." / "models" / file)) return *p;
  return Status::not_found(fmt::format(
      "no --model given and no default model ({} not at {}); run scripts/quickstart.sh (or "
      "scripts/default_model.sh) to install Gemma 3 270M, set TESSERA_MODEL, or pass --model",
      kDefaultModelFile, fmt::join(looked, " or ")));
}

CLI::Option* add_model_flag(CLI::App& app, std::string& model_path, const std::string& help) {
  return app.add_option("--model", model_path,
                        help + fmt::format(" (default: $TESSERA_MODEL, else models/{} here or in the "
                                           "source tree of this build)",
                                           kDefaultModelFile));
}

Status resolve_model_flag(std::string& model_path) {
  if (!model_path.empty()) return Status::ok();
  TESSERA_ASSIGN_OR_RETURN(model_path, resolve_default_model(default_model_search()));
  return Status::ok();
}

}  // namespace tessera::cli
