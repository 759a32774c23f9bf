#include "model/importance.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tessera {

namespace {
using Json = nlohmann::json;
constexpr const char* kFormat = "tessera-importance-1";
}  // namespace

Result<ImportanceMatrix> load_importance(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::not_found(fmt::format("{}: cannot open the importance file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  Json j;
  try {
    j = Json::parse(ss.str());
  } catch (const Json::exception& e) {
    return Status::invalid_argument(fmt::format("{}: not JSON: {}", path, e.what()));
  }
  if (!j.is_object() || j.value("format", std::string()) != kFormat)
    return Status::invalid_argument(fmt::format("{}: field 'format' is not \"{}\"", path, kFormat));
  ImportanceMatrix m;
  try {
    m.model = j.value("model", std::string());
    m.model_sha256 = j.value("model_sha256", std::string());
    m.source = j.value("source", std::string());
    m.tokens = j.value("tokens", int64_t{0});
    const Json& t = j.at("tensors");
    if (!t.is_object()) return Status::invalid_argument(fmt::format("{}: field 'tensors' is not an object", path));
    for (const auto& [name, values] : t.items()) {
      if (!values.is_array() || values.empty())
        return Status::invalid_argument(fmt::format("{}: tensor '{}': expected a non-empty array", path, name));
      std::vector<float> v;
      v.reserve(values.size());
      for (const Json& x : values) {
        if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() < 0)
          return Status::invalid_argument(
              fmt::format("{}: tensor '{}': value {} is not a finite non-negative number", path, name, x.dump()));
        v.push_back(x.get<float>());
      }
      m.columns.emplace(name, std::move(v));
    }
  } catch (const Json::exception& e) {
    return Status::invalid_argument(fmt::format("{}: {}", path, e.what()));
  }
  return m;
}

Status save_importance(const ImportanceMatrix& m, const std::string& path) {
  Json j = {{"format", kFormat}, {"model", m.model},   {"model_sha256", m.model_sha256},
            {"source", m.source}, {"tokens", m.tokens}, {"tensors", Json::object()}};
  for (const auto& [name, v] : m.columns) j["tensors"][name] = v;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Status::internal(fmt::format("{}: cannot write", tmp));
    out << j.dump();
    if (!out) return Status::internal(fmt::format("{}: write failed", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::internal(fmt::format("{}: rename to {} failed: {}", tmp, path, ec.message()));
  return Status::ok();
}

void ImportanceAccumulator::add(const std::string& name, const float* x, int64_t n_tokens, int64_t k) {
  Sums& s = sums_[name];
  if (s.sq.empty()) s.sq.assign(static_cast<size_t>(k), 0.0);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* row = x + t * k;
    for (int64_t j = 0; j < k; ++j) s.sq[static_cast<size_t>(j)] += static_cast<double>(row[j]) * row[j];
  }
  s.tokens += n_tokens;
}

int64_t ImportanceAccumulator::tokens(const std::string& name) const {
  auto it = sums_.find(name);
  return it == sums_.end() ? 0 : it->second.tokens;
}

ImportanceMatrix ImportanceAccumulator::matrix() const {
  ImportanceMatrix m;
  for (const auto& [name, s] : sums_) {
    std::vector<float> v(s.sq.size());
    for (size_t j = 0; j < v.size(); ++j) v[j] = s.tokens > 0 ? static_cast<float>(s.sq[j] / s.tokens) : 0.0f;
    m.columns.emplace(name, std::move(v));
    m.tokens = std::max(m.tokens, s.tokens);
  }
  return m;
}

}  // namespace tessera
