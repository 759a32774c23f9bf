#include "eval/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "common/sha256.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
constexpr const char* kFormat = "tessera-eval-1";

Json to_json(const PrecisionResult& p) {
  Json j = {{"precision", p.precision},     {"reference", p.reference},       {"calibrated", p.calibrated},
            {"bits_per_weight", p.bits_per_weight}, {"weight_bytes", p.weight_bytes}, {"formats", p.formats},
            {"classes", Json::object()},    {"canaries", Json::object()}};
  for (const auto& [name, c] : p.classes)
    j["classes"][name] = {{"tokens", c.tokens}, {"ppl", c.ppl}, {"kl_mean", c.kl_mean}, {"kl_p99", c.kl_p99},
                          {"top1", c.top1}};
  if (p.code)
    j["canaries"]["code"] = {{"problems", p.code->problems}, {"parse_rate", p.code->parse_rate},
                             {"pass_at_1", p.code->pass_at_1}};
  if (p.math) j["canaries"]["math"] = {{"problems", p.math->problems}, {"accuracy", p.math->accuracy}};
  return j;
}

PrecisionResult precision_from_json(const Json& j) {
  PrecisionResult p;
  p.precision = j.at("precision").get<std::string>();
  p.reference = j.value("reference", false);
  p.calibrated = j.value("calibrated", false);
  p.bits_per_weight = j.value("bits_per_weight", 0.0);
  p.weight_bytes = j.value("weight_bytes", int64_t{0});
  if (j.contains("formats")) p.formats = j.at("formats").get<std::map<std::string, int64_t>>();
  for (const auto& [name, c] : j.at("classes").items())
    p.classes[name] = ClassQuality{c.at("tokens").get<int64_t>(), c.at("ppl").get<double>(),
                                   c.at("kl_mean").get<double>(), c.at("kl_p99").get<double>(),
                                   c.at("top1").get<double>()};
  if (j.contains("canaries")) {
    const Json& c = j.at("canaries");
    if (c.contains("code"))
      p.code = CodeCanary{c["code"].at("problems").get<int64_t>(), c["code"].at("parse_rate").get<double>(),
                          c["code"].at("pass_at_1").get<double>()};
    if (c.contains("math"))
      p.math = MathCanary{c["math"].at("problems").get<int64_t>(), c["math"].at("accuracy").get<double>()};
  }
  return p;
}

}  // namespace

const PrecisionResult* ModelReport::find(const std::string& precision) const {
  for (const PrecisionResult& p : precisions)
    if (p.precision == precision) return &p;
  return nullptr;
}

Result<EvalReport> load_eval_report(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::not_found(fmt::format("{}: no quality report there", path));
  std::stringstream ss;
  ss << in.rdbuf();
  EvalReport r;
  try {
    const Json j = Json::parse(ss.str());
    if (!j.is_object() || j.value("format", std::string()) != kFormat)
      return Status::invalid_argument(fmt::format("{}: field 'format' is not \"{}\"", path, kFormat));
    for (const auto& [sha, m] : j.at("models").items()) {
      ModelReport mr;
      mr.sha256 = sha;
      mr.model = m.value("model", std::string());
      mr.file_bytes = m.value("file_bytes", int64_t{0});
      mr.reference = m.value("reference", std::string());
      mr.corpus_sha256 = m.value("corpus_sha256", std::string());
      mr.cpu = m.value("cpu", std::string());
      mr.date = m.value("date", std::string());
      mr.settings_json = m.contains("settings") ? m.at("settings").dump() : "{}";
      if (m.contains("classes")) mr.classes = m.at("classes").get<std::vector<std::string>>();
      if (m.contains("skipped_classes"))
        mr.skipped_classes = m.at("skipped_classes").get<std::map<std::string, std::string>>();
      for (const Json& p : m.at("precisions")) mr.precisions.push_back(precision_from_json(p));
      r.models.emplace(sha, std::move(mr));
    }
  } catch (const Json::exception& e) {
    return Status::invalid_argument(fmt::format("{}: not a quality report: {}", path, e.what()));
  }
  return r;
}

Status save_eval_report(const EvalReport& report, const std::string& path) {
  Json models = Json::object();
  for (const auto& [sha, m] : report.models) {
    Json settings = Json::object();
    try {
      settings = Json::parse(m.settings_json.empty() ? "{}" : m.settings_json);
    } catch (const Json::exception&) {
    }
    Json pj = Json::array();
    for (const PrecisionResult& p : m.precisions) pj.push_back(to_json(p));
    models[sha] = {{"model", m.model},       {"file_bytes", m.file_bytes}, {"reference", m.reference},
                   {"corpus_sha256", m.corpus_sha256}, {"cpu", m.cpu},     {"date", m.date},
                   {"settings", settings},   {"classes", m.classes},       {"skipped_classes", m.skipped_classes},
                   {"precisions", pj}};
  }
  const Json j = {{"format", kFormat}, {"models", models}};
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Status::internal(fmt::format("{}: cannot write", tmp));
    out << j.dump(1) << "\n";
    if (!out) return Status::internal(fmt::format("{}: write failed", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::internal(fmt::format("{}: rename to {} failed: {}", tmp, path, ec.message()));
  return Status::ok();
}

std::string format_quality_bill(const ModelReport& m, const std::string& report_path) {
  std::string s = fmt::format("\nQuality by precision ({}; measured {} against {}; mean KL in nats/token)\n",
                              report_path, m.date, m.reference);
  s += fmt::format("  {:<14} {:>7} {:>12}", "precision", "bits/w", "weights MiB");
  for (const std::string& c : m.classes) s += fmt::format(" {:>10}", c + " KL");
  s += fmt::format(" {:>10} {:>8}\n", "HumanEval", "arith");
  for (const PrecisionResult& p : m.precisions) {
    s += fmt::format("  {:<14} {:>7.2f} {:>12.1f}", p.precision + (p.reference ? "*" : ""), p.bits_per_weight,
                     p.weight_bytes / 1048576.0);
    for (const std::string& c : m.classes) {
      auto it = p.classes.find(c);
      s += it == p.classes.end() ? fmt::format(" {:>10}", "-") : fmt::format(" {:>10.4f}", it->second.kl_mean);
    }
    s += p.code ? fmt::format(" {:>9.0f}%", 100 * p.code->pass_at_1) : fmt::format(" {:>10}", "-");
    s += p.math ? fmt::format(" {:>7.0f}%", 100 * p.math->accuracy) : fmt::format(" {:>8}", "-");
    s += "\n";
  }
  for (const auto& [cls, why] : m.skipped_classes) s += fmt::format("  (class {} not measured: {})\n", cls, why);
  s += "  (* the reference; serve a precision under a budget with --quant NAME --quality-budget class=max_kl)\n";
  return s;
}

std::string default_eval_report_path(const std::string& model_path) {
  std::string p = model_path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p + ".eval.json";
}

std::string quality_class_for(const std::string& budget_class) {
  return budget_class == "chat" ? "prose" : budget_class;
}

Result<QualityBudget> parse_quality_budget(const std::string& spec) {
  QualityBudget b;
  std::stringstream ss(spec);
  std::string piece;
  while (std::getline(ss, piece, ',')) {
    if (piece.empty()) continue;
    const size_t eq = piece.find('=');
    const std::string cls = piece.substr(0, eq);
    if (eq == std::string::npos || (cls != "code" && cls != "math" && cls != "chat" && cls != "prose"))
      return Status::invalid_argument(fmt::format(
          "--quality-budget '{}': expected class=max_kl pieces with class code, math, chat or prose", piece));
    double v = 0;
    size_t used = 0;
    try {
      v = std::stod(piece.substr(eq + 1), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != piece.size() - eq - 1 || !(v >= 0) || !std::isfinite(v))
      return Status::invalid_argument(
          fmt::format("--quality-budget '{}': '{}' is not a non-negative number (nats per token)", piece,
                      piece.substr(eq + 1)));
    b.max_kl[cls] = v;
  }
  if (b.max_kl.empty()) return Status::invalid_argument("--quality-budget: no class=max_kl given");
  return b;
}

Result<std::string> model_sha256(const std::string& path) {
  if (!fs::is_directory(path)) return sha256_file(path);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string all;
  for (const fs::path& f : files) {
    TESSERA_ASSIGN_OR_RETURN(std::string h, sha256_file(f.string()));
    all += f.filename().string() + " " + h + "\n";
  }
  return sha256_hex(all);
}

std::string served_precision_name(const std::string& quant_name, bool calibrated) {
  const std::string base = quant_name.empty() || quant_name == "none" ? "file" : quant_name;
  return calibrated && base != "file" ? base + "+imatrix" : base;
}

Result<std::string> apply_quality_gate(const std::string& model_path, const std::string& precision,
                                       const QualityBudget& budget, const std::string& report_path) {
  auto report = load_eval_report(report_path);
  if (!report.is_ok()) {
    if (report.status().code() == StatusCode::kNotFound)
      return Status::not_found(fmt::format(
          "--quality-budget: no quality report at {}; measure one with `tessera eval --model {} --precisions {} "
          "--json {}` (or give --quality-report)",
          report_path, model_path, precision, report_path));
    return report.status();
  }
  TESSERA_ASSIGN_OR_RETURN(std::string sha, model_sha256(model_path));
  TESSERA_RETURN_IF_ERROR(check_quality_budget(*report, report_path, sha, precision, budget));
  const PrecisionResult* p = report->models.at(sha).find(precision);
  std::string line = fmt::format("quality gate: precision '{}' within budget ({}):", precision, report_path);
  for (const auto& [cls, max_kl] : budget.max_kl)
    line += fmt::format(" {} KL {:.4f} <= {}", cls, p->classes.at(quality_class_for(cls)).kl_mean, max_kl);
  return line;
}

Status check_quality_budget(const EvalReport& report, const std::string& report_path, const std::string& sha256,
                            const std::string& precision, const QualityBudget& budget) {
  auto it = report.models.find(sha256);
  if (it == report.models.end())
    return Status::invalid_argument(fmt::format(
        "--quality-budget: {} has no measurement of this model file (sha256 {}); run `tessera eval --model "
        "<file> --precisions {} --json {}`",
        report_path, sha256.substr(0, 12), precision, report_path));
  const ModelReport& m = it->second;
  const PrecisionResult* p = m.find(precision);
  if (p == nullptr)
    return Status::invalid_argument(fmt::format(
        "--quality-budget: {} measured {} but not precision '{}'; run `tessera eval --model {} --precisions {} "
        "--json {}`",
        report_path, m.model, precision, m.model, precision, report_path));
  std::vector<std::string> over;  // every class over budget, named in one message
  for (const auto& [budget_class, max_kl] : budget.max_kl) {
    const std::string cls = quality_class_for(budget_class);
    auto c = p->classes.find(cls);
    if (c == p->classes.end()) {
      auto skipped = m.skipped_classes.find(cls);
      return Status::invalid_argument(fmt::format(
          "--quality-budget: class '{}' was not measured for precision '{}' in {}{}", budget_class, precision,
          report_path, skipped == m.skipped_classes.end() ? "" : " (skipped: " + skipped->second + ")"));
    }
    if (c->second.kl_mean > max_kl)
      over.push_back(fmt::format(
          "--quality-budget: precision '{}' loses {:.4f} nats/token of KL on {} (p99 {:.3f}, top-1 agreement "
          "{:.1f}%, {} tokens; {}), over the budget {}={} (report {}, reference {})",
          precision, c->second.kl_mean, cls, c->second.kl_p99, 100 * c->second.top1, c->second.tokens,
          p->code && cls == "code" ? fmt::format("HumanEval pass@1 {:.1f}%", 100 * p->code->pass_at_1)
          : p->math && cls == "math" ? fmt::format("arithmetic accuracy {:.1f}%", 100 * p->math->accuracy)
                                     : std::string("no canary"),
          budget_class, max_kl, report_path, m.reference));
  }
  if (!over.empty()) return Status::invalid_argument(fmt::format("{}", fmt::join(over, "; ")));
  return Status::ok();
}

}  // namespace tessera
