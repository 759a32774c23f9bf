#include "tune/trace.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tessera {
namespace {

using Json = nlohmann::json;

LengthDistribution lognormal(double mean, double sigma, int64_t lo, int64_t hi) {
  LengthDistribution d;
  d.kind = LengthDistribution::Kind::kLogNormal;
  d.a = mean;
  d.b = sigma;
  d.min_tokens = lo;
  d.max_tokens = hi;
  return d;
}

Result<LengthMix> parse_one_mix(std::string_view spec) {
  if (spec == "chat") return LengthMix{"chat", lognormal(160, 0.8, 8, 2048), lognormal(96, 0.7, 4, 512)};
  if (spec == "docs") return LengthMix{"docs", lognormal(16000, 0.35, 4096, 32000), lognormal(256, 0.5, 16, 1024)};
  if (spec == "docs-2k") return LengthMix{"docs-2k", lognormal(2000, 0.35, 512, 4096), lognormal(64, 0.5, 8, 256)};
  const size_t slash = spec.find('/');
  if (slash == std::string_view::npos)
    return Status::invalid_argument(fmt::format(
        "--lengths '{}': expected chat, docs, docs-2k, PROMPT/OUTPUT (e.g. lognormal:512,0.5/64) or a mixture "
        "MIX*W+MIX*W (e.g. chat*0.9+docs-2k*0.1)",
        spec));
  auto prompt = LengthDistribution::parse(spec.substr(0, slash));
  if (!prompt.is_ok()) return Status::invalid_argument(fmt::format("--lengths '{}': prompt: {}", spec, prompt.status().message()));
  auto output = LengthDistribution::parse(spec.substr(slash + 1));
  if (!output.is_ok()) return Status::invalid_argument(fmt::format("--lengths '{}': output: {}", spec, output.status().message()));
  return LengthMix{std::string(spec), *prompt, *output, {}};
}

}  // namespace

Result<LengthMix> parse_length_mix(std::string_view spec) {
  if (spec.find('+') == std::string_view::npos && spec.find('*') == std::string_view::npos) return parse_one_mix(spec);
  LengthMix mix;
  mix.name = std::string(spec);
  size_t begin = 0;
  while (begin <= spec.size()) {
    const size_t plus = std::min(spec.find('+', begin), spec.size());
    const std::string_view part = spec.substr(begin, plus - begin);
    const size_t star = part.rfind('*');
    double weight = 1.0;
    std::string_view lengths = part;
    if (star != std::string_view::npos) {
      const std::string w(part.substr(star + 1));
      char* end = nullptr;
      weight = std::strtod(w.c_str(), &end);
      if (w.empty() || end != w.c_str() + w.size() || !std::isfinite(weight) || weight <= 0)
        return Status::invalid_argument(
            fmt::format("--lengths '{}': part '{}': the weight after '*' must be a number > 0", spec, part));
      lengths = part.substr(0, star);
    }
    auto one = parse_one_mix(lengths);
    if (!one.is_ok()) return Status::invalid_argument(fmt::format("--lengths '{}': part '{}': {}", spec, part, one.status().message()));
    mix.parts.push_back(LengthMixPart{weight, one->prompt, one->output});
    begin = plus + 1;
  }
  mix.prompt = mix.parts.front().prompt;
  mix.output = mix.parts.front().output;
  return mix;
}

Result<ArrivalSpec> ArrivalSpec::parse(std::string_view spec) {
  ArrivalSpec a;
  if (spec == "poisson") return a;
  if (spec == "fixed") {
    a.kind = Kind::kFixed;
    a.cv = 0;
    return a;
  }
  if (spec == "bursty" || spec.starts_with("bursty:")) {
    a.kind = Kind::kBursty;
    a.cv = 2.0;
    if (spec.size() > 7) {
      const std::string v(spec.substr(7));
      char* end = nullptr;
      a.cv = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !std::isfinite(a.cv) || a.cv <= 1.0)
        return Status::invalid_argument(fmt::format("--arrivals '{}': the CV of bursty gaps must be a number > 1", spec));
    }
    return a;
  }
  return Status::invalid_argument(fmt::format("--arrivals '{}': expected poisson, bursty, bursty:CV or fixed", spec));
}

std::string ArrivalSpec::to_string() const {
  switch (kind) {
    case Kind::kPoisson:
      return "poisson";
    case Kind::kFixed:
      return "fixed";
    case Kind::kBursty:
      return fmt::format("bursty:{:g}", cv);
  }
  return "?";
}

Result<std::vector<SimRequest>> generate_trace(const TraceSpec& spec) {
  if (!(spec.rate > 0) || !std::isfinite(spec.rate))
    return Status::invalid_argument(fmt::format("--rate {}: must be > 0 requests per second", spec.rate));
  if (spec.num_requests < 1) return Status::invalid_argument(fmt::format("--num-requests {}: must be >= 1", spec.num_requests));
  if (spec.priority_classes < 1 || spec.priority_classes > 16)
    return Status::invalid_argument(fmt::format("priority classes {}: must be 1..16", spec.priority_classes));
  std::mt19937_64 arrival_rng(spec.seed * 0x9E3779B97F4A7C15ull + 1);
  std::mt19937_64 length_rng(spec.seed * 0xBF58476D1CE4E5B9ull + 2);
  std::mt19937_64 class_rng(spec.seed * 0x94D049BB133111EBull + 3);
  const double mean_gap = 1.0 / spec.rate;
  // Gamma gaps: shape k = 1 / CV^2, scale = mean / k.
  const double shape = spec.arrivals.kind == ArrivalSpec::Kind::kBursty ? 1.0 / (spec.arrivals.cv * spec.arrivals.cv) : 1.0;
  std::gamma_distribution<double> gamma(shape, mean_gap / shape);
  std::exponential_distribution<double> expo(spec.rate);
  std::uniform_int_distribution<int32_t> cls(0, spec.priority_classes - 1);
  double total_weight = 0;
  for (const LengthMixPart& p : spec.lengths.parts) total_weight += p.weight;
  std::vector<SimRequest> out;
  out.reserve(static_cast<size_t>(spec.num_requests));
  double t = 0;
  for (int64_t i = 0; i < spec.num_requests; ++i) {
    SimRequest r;
    r.arrival_s = t;
    const LengthDistribution* prompt = &spec.lengths.prompt;
    const LengthDistribution* output = &spec.lengths.output;
    if (!spec.lengths.parts.empty()) {
      double u = std::uniform_real_distribution<double>(0.0, total_weight)(length_rng);
      const LengthMixPart* pick = &spec.lengths.parts.back();
      for (const LengthMixPart& p : spec.lengths.parts) {
        if (u < p.weight) {
          pick = &p;
          break;
        }
        u -= p.weight;
      }
      prompt = &pick->prompt;
      output = &pick->output;
    }
    r.prompt_tokens = prompt->sample(length_rng);
    r.output_tokens = output->sample(length_rng);
    r.priority = cls(class_rng);
    out.push_back(r);
    switch (spec.arrivals.kind) {
      case ArrivalSpec::Kind::kPoisson:
        t += expo(arrival_rng);
        break;
      case ArrivalSpec::Kind::kBursty:
        t += gamma(arrival_rng);
        break;
      case ArrivalSpec::Kind::kFixed:
        t += mean_gap;
        break;
    }
  }
  return out;
}

Result<std::vector<SimRequest>> parse_sim_trace(std::string_view jsonl, std::string_view source) {
  std::vector<SimRequest> out;
  std::istringstream in{std::string(jsonl)};
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json j;
    try {
      j = Json::parse(line);
    } catch (const Json::exception& e) {
      return Status::invalid_argument(fmt::format("{}:{}: not JSON: {}", source, n, e.what()));
    }
    if (!j.is_object()) return Status::invalid_argument(fmt::format("{}:{}: expected a JSON object", source, n));
    SimRequest r;
    for (const char* field : {"prompt_tokens", "output_tokens"})
      if (!j.contains(field) || !j[field].is_number_integer() || j[field].get<int64_t>() < 1)
        return Status::invalid_argument(fmt::format("{}:{}: '{}' must be an integer >= 1", source, n, field));
    r.prompt_tokens = j["prompt_tokens"].get<int64_t>();
    r.output_tokens = j["output_tokens"].get<int64_t>();
    if (!j.contains("arrival_s") || !j["arrival_s"].is_number() || !(j["arrival_s"].get<double>() >= 0))
      return Status::invalid_argument(fmt::format("{}:{}: 'arrival_s' must be a number >= 0 (seconds from the start)", source, n));
    r.arrival_s = j["arrival_s"].get<double>();
    if (j.contains("priority")) {
      if (!j["priority"].is_number_integer() || j["priority"].get<int64_t>() < 0 || j["priority"].get<int64_t>() > 15)
        return Status::invalid_argument(fmt::format("{}:{}: 'priority' must be an integer in 0..15", source, n));
      r.priority = j["priority"].get<int32_t>();
    }
    out.push_back(r);
  }
  if (out.empty()) return Status::invalid_argument(fmt::format("{}: the trace has no requests", source));
  std::stable_sort(out.begin(), out.end(), [](const SimRequest& a, const SimRequest& b) { return a.arrival_s < b.arrival_s; });
  return out;
}

Result<std::vector<SimRequest>> load_sim_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::io_error(fmt::format("{}: cannot read the trace", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_sim_trace(ss.str(), path);
}

std::string sim_trace_jsonl(const std::vector<SimRequest>& trace) {
  std::string out;
  for (const SimRequest& r : trace)
    out += fmt::format("{{\"arrival_s\":{:.6f},\"prompt_tokens\":{},\"output_tokens\":{},\"priority\":{}}}\n", r.arrival_s,
                       r.prompt_tokens, r.output_tokens, r.priority);
  return out;
}

Status save_sim_trace(const std::string& path, const std::vector<SimRequest>& trace) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return Status::io_error(fmt::format("{}: cannot write the trace", path));
  out << sim_trace_jsonl(trace);
  if (!out) return Status::io_error(fmt::format("{}: write failed", path));
  return Status::ok();
}

TraceLengthStats trace_length_stats(const std::vector<SimRequest>& trace) {
  TraceLengthStats s;
  if (trace.empty()) return s;
  for (const SimRequest& r : trace) {
    s.mean_prompt += static_cast<double>(r.prompt_tokens);
    s.mean_output += static_cast<double>(r.output_tokens);
    s.max_total = std::max(s.max_total, r.prompt_tokens + r.output_tokens);
  }
  const auto n = static_cast<double>(trace.size());
  s.mean_prompt /= n;
  s.mean_output /= n;
  s.mean_total = s.mean_prompt + s.mean_output;
  const double span = trace.back().arrival_s - trace.front().arrival_s;
  s.offered_rate = span > 0 ? (n - 1) / span : 0;
  return s;
}

}  // namespace tessera
