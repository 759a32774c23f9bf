#include "loadgen/load_generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loadgen/http_client.h"

namespace tessera {
namespace {

using SteadyClock = std::chrono::steady_clock;
using Json = nlohmann::json;

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  for (;;) {
    const size_t e = s.find(sep, pos);
    out.push_back(s.substr(pos, e == std::string_view::npos ? std::string_view::npos : e - pos));
    if (e == std::string_view::npos) break;
    pos = e + 1;
  }
  return out;
}

std::optional<double> parse_double(std::string_view s) {
  const std::string t(s);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end == t.c_str() || *end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

// A per-(seed, index, stream) generator, so request i's lengths and ids do not depend on how
// many requests ran before it or on which thread.
std::mt19937_64 rng_for(uint64_t seed, int64_t index, uint64_t stream) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(index),
                    static_cast<uint32_t>(static_cast<uint64_t>(index) >> 32), static_cast<uint32_t>(stream)};
  return std::mt19937_64(seq);
}

double seconds_since(SteadyClock::time_point t0, SteadyClock::time_point t) {
  return std::chrono::duration<double>(t - t0).count();
}

}  // namespace

// ---- Length distributions, traces, SLOs -------------------------------------------------------

Result<LengthDistribution> LengthDistribution::parse(std::string_view spec) {
  LengthDistribution d;
  std::string_view kind = "fixed";
  std::string_view args = spec;
  if (const size_t colon = spec.find(':'); colon != std::string_view::npos) {
    kind = spec.substr(0, colon);
    args = spec.substr(colon + 1);
  }
  const std::vector<std::string_view> parts = split(args, ',');
  std::vector<double> v;
  for (std::string_view p : parts) {
    auto x = parse_double(p);
    if (!x) return Status::invalid_argument(fmt::format("length distribution '{}': '{}' is not a number", spec, p));
    v.push_back(*x);
  }
  if (kind == "fixed") {
    if (v.size() != 1 || v[0] < 1)
      return Status::invalid_argument(fmt::format("length distribution '{}': fixed takes one count >= 1", spec));
    d.kind = Kind::kFixed;
    d.a = v[0];
  } else if (kind == "uniform") {
    if (v.size() != 2 || v[0] < 1 || v[1] < v[0])
      return Status::invalid_argument(
          fmt::format("length distribution '{}': uniform takes LOW,HIGH with 1 <= LOW <= HIGH", spec));
    d.kind = Kind::kUniform;
    d.a = v[0];
    d.b = v[1];
  } else if (kind == "lognormal") {
    if (v.size() != 2 || v[0] < 1 || v[1] < 0 || v[1] > 4)
      return Status::invalid_argument(
          fmt::format("length distribution '{}': lognormal takes MEAN,SIGMA with MEAN >= 1, 0 <= SIGMA <= 4", spec));
    d.kind = Kind::kLogNormal;
    d.a = v[0];
    d.b = v[1];
  } else {
    return Status::invalid_argument(
        fmt::format("length distribution '{}': unknown kind '{}' (fixed, uniform, lognormal)", spec, kind));
  }
  return d;
}

int64_t LengthDistribution::sample(std::mt19937_64& rng) const {
  double x = a;
  switch (kind) {
    case Kind::kFixed:
      break;
    case Kind::kUniform:
      x = static_cast<double>(std::uniform_int_distribution<int64_t>(std::llround(a), std::llround(b))(rng));
      break;
    case Kind::kLogNormal: {
      // Parameterized by its mean: mu = ln(mean) - sigma^2 / 2.
      const double mu = std::log(a) - b * b / 2;
      x = std::lognormal_distribution<double>(mu, b)(rng);
      break;
    }
  }
  return std::clamp<int64_t>(std::llround(x), min_tokens, max_tokens);
}

double LengthDistribution::mean() const {
  switch (kind) {
    case Kind::kFixed:
      return a;
    case Kind::kUniform:
      return (std::round(a) + std::round(b)) / 2;
    case Kind::kLogNormal:
      return a;
  }
  return a;
}

std::string LengthDistribution::to_string() const {
  switch (kind) {
    case Kind::kFixed:
      return fmt::format("fixed:{}", a);
    case Kind::kUniform:
      return fmt::format("uniform:{},{}", a, b);
    case Kind::kLogNormal:
      return fmt::format("lognormal:{},{}", a, b);
  }
  return "?";
}

Result<std::vector<TraceEntry>> parse_trace(std::string_view jsonl, std::string_view source) {
  std::vector<TraceEntry> out;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos <= jsonl.size()) {
    size_t e = jsonl.find('\n', pos);
    if (e == std::string_view::npos) e = jsonl.size();
    std::string_view line = jsonl.substr(pos, e - pos);
    pos = e + 1;
    ++line_no;
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.remove_suffix(1);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front()))) line.remove_prefix(1);
    if (line.empty()) continue;
    Json j;
    try {
      j = Json::parse(line);
    } catch (const Json::exception& ex) {
      return Status::invalid_argument(fmt::format("{}:{}: not JSON: {}", source, line_no, ex.what()));
    }
    if (!j.is_object()) return Status::invalid_argument(fmt::format("{}:{}: expected a JSON object", source, line_no));
    TraceEntry t;
    for (const char* field : {"prompt_tokens", "output_tokens"}) {
      if (!j.contains(field) || !j[field].is_number_integer() || j[field].get<int64_t>() < 1)
        return Status::invalid_argument(
            fmt::format("{}:{}: '{}' must be an integer >= 1", source, line_no, field));
    }
    t.prompt_tokens = j["prompt_tokens"].get<int64_t>();
    t.output_tokens = j["output_tokens"].get<int64_t>();
    if (j.contains("arrival_s") && !j["arrival_s"].is_null()) {
      if (!j["arrival_s"].is_number() || j["arrival_s"].get<double>() < 0)
        return Status::invalid_argument(fmt::format("{}:{}: 'arrival_s' must be a number >= 0", source, line_no));
      t.arrival_s = j["arrival_s"].get<double>();
    }
    out.push_back(t);
    if (e == jsonl.size()) break;
  }
  if (out.empty()) return Status::invalid_argument(fmt::format("{}: the trace has no requests", source));
  return out;
}

Result<std::vector<TraceEntry>> load_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::not_found(fmt::format("trace file '{}' cannot be opened", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_trace(ss.str(), path);
}

Result<SloSpec> SloSpec::parse(std::string_view spec) {
  SloSpec s;
  if (spec.empty()) return s;
  for (std::string_view item : split(spec, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      return Status::invalid_argument(fmt::format("--slo '{}': '{}' is not NAME=VALUE", spec, item));
    const std::string_view name = item.substr(0, eq);
    std::string_view value = item.substr(eq + 1);
    double scale = 1e-3;  // milliseconds by default
    if (value.size() > 2 && value.substr(value.size() - 2) == "ms") {
      value.remove_suffix(2);
    } else if (value.size() > 2 && value.substr(value.size() - 2) == "us") {
      scale = 1e-6;
      value.remove_suffix(2);
    } else if (value.size() > 1 && value.back() == 's') {
      scale = 1.0;
      value.remove_suffix(1);
    }
    const auto v = parse_double(value);
    if (!v || *v <= 0) return Status::invalid_argument(fmt::format("--slo '{}': bad value in '{}'", spec, item));
    if (name == "ttft") {
      s.ttft_s = *v * scale;
    } else if (name == "itl" || name == "tpot") {
      s.itl_s = *v * scale;
      s.itl_per_gap = false;
    } else if (name == "itl_p99") {
      s.itl_s = *v * scale;
      s.itl_per_gap = true;
    } else if (name == "e2e") {
      s.e2e_s = *v * scale;
    } else {
      return Status::invalid_argument(fmt::format("--slo '{}': unknown SLO '{}' (ttft, itl, itl_p99, e2e)", spec, name));
    }
  }
  return s;
}

std::string SloSpec::to_string() const {
  std::string s;
  auto add = [&](const char* name, const std::optional<double>& v) {
    if (!v) return;
    if (!s.empty()) s += ',';
    s += fmt::format("{}={:g}ms", name, *v * 1e3);
  };
  add("ttft", ttft_s);
  add(itl_per_gap ? "itl_p99" : "itl", itl_s);
  add("e2e", e2e_s);
  return s;
}

std::string_view arrival_mode_name(ArrivalMode mode) {
  switch (mode) {
    case ArrivalMode::kConcurrency:
      return "concurrency";
    case ArrivalMode::kPoisson:
      return "poisson";
    case ArrivalMode::kFixedRate:
      return "fixed-rate";
    case ArrivalMode::kTrace:
      return "trace";
  }
  return "?";
}

// ---- Workload ---------------------------------------------------------------------------------

Workload::Workload(const LoadOptions& options) : o_(options), arrival_rng_(rng_for(options.seed, -1, 7)) {}

PlannedRequest Workload::request(int64_t index) const {
  PlannedRequest r;
  r.index = index;
  if (!o_.trace.empty()) {
    const TraceEntry& t = o_.trace[static_cast<size_t>(index) % o_.trace.size()];
    r.prompt_tokens = t.prompt_tokens;
    r.output_tokens = t.output_tokens;
    return r;
  }
  auto rng = rng_for(o_.seed, index, 1);
  r.prompt_tokens = o_.prompt_tokens.sample(rng);
  r.output_tokens = o_.output_tokens.sample(rng);
  return r;
}

double Workload::next_arrival_s(int64_t index, double previous_arrival_s) {
  switch (o_.mode) {
    case ArrivalMode::kPoisson:
      if (index == 0) return 0;
      return previous_arrival_s + std::exponential_distribution<double>(o_.rate)(arrival_rng_);
    case ArrivalMode::kFixedRate:
      return static_cast<double>(index) / o_.rate;
    case ArrivalMode::kTrace: {
      const TraceEntry& t = o_.trace[static_cast<size_t>(index) % o_.trace.size()];
      return t.arrival_s.value_or(previous_arrival_s);
    }
    case ArrivalMode::kConcurrency:
      return 0;
  }
  return 0;
}

std::vector<int32_t> Workload::prompt_ids(const PlannedRequest& r, int32_t id_min, int32_t id_max) const {
  auto rng = rng_for(o_.seed, r.index, 2);
  std::uniform_int_distribution<int32_t> id(id_min, std::max(id_min, id_max - 1));
  std::vector<int32_t> ids(static_cast<size_t>(r.prompt_tokens));
  for (int32_t& x : ids) x = id(rng);
  return ids;
}

int64_t Workload::limit() const {
  if (o_.mode == ArrivalMode::kTrace) return static_cast<int64_t>(o_.trace.size());
  return INT64_MAX;
}

// ---- Statistics -------------------------------------------------------------------------------

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(values.size() - 1, lo + 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

LatencyStats latency_stats(std::vector<double> values) {
  LatencyStats s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = static_cast<int64_t>(values.size());
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  s.min = values.front();
  s.max = values.back();
  s.p50 = percentile(values, 50);
  s.p90 = percentile(values, 90);
  s.p99 = percentile(values, 99);
  return s;
}

double RequestRecord::tpot_s() const {
  if (output_tokens <= 1) return 0;
  return (e2e_s - ttft_s) / static_cast<double>(output_tokens - 1);
}

bool meets_slo(const RequestRecord& r, const SloSpec& slo) {
  if (!r.ok) return false;
  if (slo.ttft_s && r.ttft_s > *slo.ttft_s) return false;
  if (slo.itl_s && !slo.itl_per_gap && r.tpot_s() > *slo.itl_s) return false;
  if (slo.itl_s && slo.itl_per_gap && !r.itl_s.empty()) {
    // Nearest rank: the gap that 99% of the request's gaps do not exceed.
    std::vector<double> gaps = r.itl_s;
    const auto k = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(gaps.size()))) - 1;
    std::nth_element(gaps.begin(), gaps.begin() + static_cast<ptrdiff_t>(k), gaps.end());
    if (gaps[k] > *slo.itl_s) return false;
  }
  if (slo.e2e_s && r.e2e_s > *slo.e2e_s) return false;
  return true;
}

RunSummary summarize_run(const std::vector<RequestRecord>& requests, double duration_s, const SloSpec& slo) {
  RunSummary s;
  s.duration_s = duration_s;
  std::vector<double> ttft, itl, tpot, e2e;
  std::set<std::string> seen;
  for (const RequestRecord& r : requests) {
    ++s.sent;
    if (!r.ok) {
      ++s.failed;
      if (s.errors.size() < 5 && seen.insert(r.error).second) s.errors.push_back(r.error);
      continue;
    }
    ++s.completed;
    if (meets_slo(r, slo)) ++s.good;
    s.prompt_tokens += r.prompt_tokens;
    s.output_tokens += r.output_tokens;
    ttft.push_back(r.ttft_s);
    e2e.push_back(r.e2e_s);
    if (r.output_tokens > 1) tpot.push_back(r.tpot_s());
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
  }
  s.ttft = latency_stats(std::move(ttft));
  s.itl = latency_stats(std::move(itl));
  s.tpot = latency_stats(std::move(tpot));
  s.e2e = latency_stats(std::move(e2e));
  if (duration_s > 0) {
    s.request_throughput = static_cast<double>(s.completed) / duration_s;
    s.output_token_throughput = static_cast<double>(s.output_tokens) / duration_s;
    s.total_token_throughput = static_cast<double>(s.prompt_tokens + s.output_tokens) / duration_s;
    s.goodput = static_cast<double>(s.good) / duration_s;
  }
  return s;
}

std::map<std::string, double> parse_server_gauges(std::string_view text) {
  static const std::map<std::string_view, std::string_view> kNames = {
      {"tessera_batch_size", "batch_size"},
      {"tessera_kv_usage", "kv_usage"},
      {"tessera_running", "running"},
      {"tessera_waiting", "waiting"},
      {"vllm:gpu_cache_usage_perc", "kv_usage"},
      {"vllm:kv_cache_usage_perc", "kv_usage"},
      {"vllm:num_requests_running", "running"},
      {"vllm:num_requests_waiting", "waiting"},
  };
  std::map<std::string, double> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t e = text.find('\n', pos);
    if (e == std::string_view::npos) e = text.size();
    std::string_view line = text.substr(pos, e - pos);
    pos = e + 1;
    if (line.empty() || line.front() == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    const auto it = kNames.find(line.substr(0, name_end));
    if (it == kNames.end()) continue;
    // The value follows the labels (which may contain spaces inside quotes).
    size_t value_start = name_end;
    if (line[name_end] == '{') {
      const size_t close = line.rfind('}');
      if (close == std::string_view::npos) continue;
      value_start = close + 1;
    }
    std::string_view rest = line.substr(value_start);
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    rest = rest.substr(0, rest.find(' '));  // drop a timestamp
    if (const auto v = parse_double(rest)) out[std::string(it->second)] += *v;
  }
  return out;
}

Status validate_load_options(const LoadOptions& o) {
  if (o.num_requests < 0) return Status::invalid_argument("--num-requests must be >= 0");
  if (o.duration_s < 0) return Status::invalid_argument("--duration must be >= 0");
  if (o.num_requests == 0 && o.duration_s == 0 && o.mode != ArrivalMode::kTrace)
    return Status::invalid_argument("set --num-requests or --duration (or both): the run needs a bound");
  if (o.mode == ArrivalMode::kConcurrency && (o.concurrency < 1 || o.concurrency > 100000))
    return Status::invalid_argument(fmt::format("--concurrency {} must be in 1..100000", o.concurrency));
  if ((o.mode == ArrivalMode::kPoisson || o.mode == ArrivalMode::kFixedRate) && !(o.rate > 0))
    return Status::invalid_argument(fmt::format("--rate {} must be > 0", o.rate));
  if (o.mode == ArrivalMode::kTrace) {
    if (o.trace.empty()) return Status::invalid_argument("trace arrivals need a --trace file");
    for (size_t i = 0; i < o.trace.size(); ++i)
      if (!o.trace[i].arrival_s)
        return Status::invalid_argument(
            fmt::format("trace line {} has no arrival_s; give --rate or --concurrency to replay it", i + 1));
  }
  if (o.max_inflight < 1) return Status::invalid_argument("--max-inflight must be >= 1");
  if (o.token_id_min < 0) return Status::invalid_argument("token ids must be >= 0");
  if (o.request_timeout_s <= 0) return Status::invalid_argument("--request-timeout must be > 0");
  return Status::ok();
}

// ---- Running a load level ---------------------------------------------------------------------

namespace {

// One request against /v1/completions, timed.
RequestRecord execute_request(HttpClient& client, const LoadOptions& o, const std::string& model,
                              const Workload& workload, const PlannedRequest& plan, int32_t id_max,
                              SteadyClock::time_point run_start, std::atomic<int64_t>* tokens_seen) {
  RequestRecord rec;
  rec.index = plan.index;
  rec.prompt_tokens = plan.prompt_tokens;
  rec.max_tokens = plan.output_tokens;
  Json body = {{"model", model},
               {"prompt", workload.prompt_ids(plan, o.token_id_min, id_max)},
               {"max_tokens", plan.output_tokens},
               {"temperature", o.temperature},
               {"ignore_eos", o.ignore_eos},
               {"stream", o.stream}};
  if (o.stream) body["stream_options"] = {{"include_usage", true}};
  const std::string payload = body.dump();

  const auto t0 = SteadyClock::now();
  rec.start_s = seconds_since(run_start, t0);
  const auto deadline = t0 + std::chrono::duration_cast<SteadyClock::duration>(
                                 std::chrono::duration<double>(o.request_timeout_s));
  std::optional<SteadyClock::time_point> first, last;
  int64_t usage_tokens = -1;
  bool done = false;
  std::string stream_error;
  SseParser sse;
  auto on_event = [&](std::string_view data) {
    if (data == "[DONE]") {
      done = true;  // keep reading to the end of the body so the connection can be reused
      return true;
    }
    const auto now = SteadyClock::now();
    Json j;
    try {
      j = Json::parse(data);
    } catch (const Json::exception&) {
      stream_error = fmt::format("unparsable stream event: {}", data.substr(0, 200));
      return false;
    }
    if (j.contains("error")) {
      const Json& e = j["error"];
      stream_error = e.is_object() && e.contains("message") ? e["message"].dump() : e.dump();
      return false;
    }
    if (j.contains("usage") && j["usage"].is_object() && j["usage"].contains("completion_tokens") &&
        j["usage"]["completion_tokens"].is_number_integer())
      usage_tokens = j["usage"]["completion_tokens"].get<int64_t>();
    bool has_text = false;
    if (j.contains("choices") && j["choices"].is_array()) {
      for (const Json& c : j["choices"]) {
        if (c.contains("text") && c["text"].is_string() && !c["text"].get_ref<const std::string&>().empty())
          has_text = true;
        if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") &&
            c["delta"]["content"].is_string() && !c["delta"]["content"].get_ref<const std::string&>().empty())
          has_text = true;
      }
    }
    if (has_text) {
      if (!first) {
        first = now;
      } else {
        rec.itl_s.push_back(std::chrono::duration<double>(now - *last).count());
      }
      last = now;
      ++rec.chunks;
      tokens_seen->fetch_add(1, std::memory_order_relaxed);
    }
    return true;
  };
  HttpBodyCallback on_body;
  if (o.stream) on_body = [&](std::string_view piece) { return sse.feed(piece, on_event); };
  auto resp = client.request("POST", "/v1/completions", payload, deadline, on_body);
  const auto t_end = SteadyClock::now();
  rec.e2e_s = std::chrono::duration<double>(t_end - t0).count();
  if (!resp.is_ok()) {
    rec.error = resp.status().to_string();
    return rec;
  }
  if (resp->status != 200) {
    std::string msg = resp->body.substr(0, 300);
    try {
      const Json j = Json::parse(resp->body);
      if (j.contains("error") && j["error"].contains("message")) msg = j["error"]["message"].get<std::string>();
    } catch (const Json::exception&) {
    }
    rec.error = fmt::format("HTTP {}: {}", resp->status, msg);
    return rec;
  }
  if (!o.stream) {
    try {
      const Json j = Json::parse(resp->body);
      if (j.contains("usage") && j["usage"].contains("completion_tokens"))
        rec.output_tokens = j["usage"]["completion_tokens"].get<int64_t>();
    } catch (const Json::exception& ex) {
      rec.error = fmt::format("unparsable response: {}", ex.what());
      return rec;
    }
    rec.ttft_s = rec.e2e_s;
    rec.ok = true;
    tokens_seen->fetch_add(rec.output_tokens, std::memory_order_relaxed);
    return rec;
  }
  if (!stream_error.empty()) {
    rec.error = stream_error;
    return rec;
  }
  if (!done) {
    rec.error = "the stream ended without [DONE]";
    return rec;
  }
  if (!first) {
    rec.error = "the stream carried no text";
    return rec;
  }
  rec.ttft_s = std::chrono::duration<double>(*first - t0).count();
  rec.output_tokens = usage_tokens >= 0 ? usage_tokens : rec.chunks;
  rec.ok = true;
  return rec;
}

// The server's answers that shape the workload: the model id and the vocabulary size.
struct ServerInfo {
  std::string model;
  int32_t vocab_size = 0;
};

Result<ServerInfo> probe_server(const HttpUrl& url, const LoadOptions& o) {
  ServerInfo info;
  info.model = o.model;
  HttpClient client(url);
  const auto timeout = std::chrono::milliseconds(10000);
  auto models = client.get("/v1/models", timeout);
  if (!models.is_ok()) return models.status().with_context(fmt::format("server at {} is not reachable", o.url));
  if (info.model.empty()) {
    try {
      const Json j = Json::parse(models->body);
      if (j.contains("data") && j["data"].is_array() && !j["data"].empty())
        info.model = j["data"][0]["id"].get<std::string>();
    } catch (const Json::exception&) {
    }
    if (info.model.empty())
      return Status::invalid_argument(fmt::format("{}/v1/models names no model; pass --model", o.url));
  }
  auto tok = client.get("/tokenizer_info", timeout);  // Tessera (and vLLM) serve it; others may not
  if (tok.is_ok() && tok->status == 200) {
    try {
      const Json j = Json::parse(tok->body);
      if (j.contains("vocab_size") && j["vocab_size"].is_number_integer())
        info.vocab_size = j["vocab_size"].get<int32_t>();
    } catch (const Json::exception&) {
    }
  }
  return info;
}

// Samples the server's gauges until stopped.
class MetricsSampler {
 public:
  MetricsSampler(const HttpUrl& url, int interval_ms, SteadyClock::time_point start)
      : client_(url), interval_(interval_ms), start_(start) {
    thread_ = std::thread([this] { loop(); });
  }
  ~MetricsSampler() { stop(); }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  std::vector<MetricsSample> take() {
    stop();
    return std::move(samples_);
  }

 private:
  void loop() {
    int failures = 0;
    for (;;) {
      const auto t = SteadyClock::now();
      auto r = client_.get("/metrics", std::chrono::milliseconds(std::max(1000, interval_ * 4)));
      if (r.is_ok() && r->status == 200) {
        MetricsSample s;
        s.t_s = seconds_since(start_, t);
        s.values = parse_server_gauges(r->body);
        if (s.values.empty()) return;  // a server without these gauges: nothing to plot
        samples_.push_back(std::move(s));
      } else if ((r.is_ok() && r->status == 404) || ++failures > 20) {
        return;
      }
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_until(lock, t + std::chrono::milliseconds(interval_), [&] { return stopping_; })) return;
    }
  }

  HttpClient client_;
  int interval_;
  SteadyClock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<MetricsSample> samples_;
  std::thread thread_;
};

}  // namespace

Result<RunResult> run_load(const LoadOptions& o) {
  TESSERA_RETURN_IF_ERROR(validate_load_options(o));
  TESSERA_ASSIGN_OR_RETURN(const HttpUrl url, parse_http_url(o.url));
  TESSERA_ASSIGN_OR_RETURN(const ServerInfo info, probe_server(url, o));
  RunResult result;
  int32_t id_max = o.token_id_max > 0 ? o.token_id_max : info.vocab_size > 0 ? info.vocab_size : 256;
  if (id_max <= o.token_id_min) id_max = o.token_id_min + 1;
  result.token_id_max = id_max;
  result.model = info.model;

  Workload workload(o);
  int64_t total = o.num_requests > 0 ? o.num_requests : INT64_MAX;
  total = std::min(total, workload.limit());
  const bool timed = o.duration_s > 0;
  const auto start = SteadyClock::now();
  const auto stop_at = timed ? start + std::chrono::duration_cast<SteadyClock::duration>(
                                           std::chrono::duration<double>(o.duration_s))
                             : SteadyClock::time_point::max();

  std::unique_ptr<MetricsSampler> sampler;
  if (o.metrics_interval_ms > 0) sampler = std::make_unique<MetricsSampler>(url, o.metrics_interval_ms, start);

  std::mutex mu;
  std::condition_variable cv;
  std::vector<RequestRecord> records;
  std::atomic<int64_t> sent{0}, completed{0}, failed{0}, tokens{0};
  int64_t in_flight = 0;  // under mu
  auto finish = [&](RequestRecord rec) {
    std::lock_guard<std::mutex> lock(mu);
    (rec.ok ? completed : failed).fetch_add(1);
    records.push_back(std::move(rec));
    --in_flight;
    cv.notify_all();
  };

  // Closed loop: each client takes the next index until the count or the time runs out.
  // Open loop: this thread releases requests at their arrival times into a queue that an
  // elastic pool of workers drains (a new worker starts whenever none is idle).
  std::vector<std::thread> workers;
  std::atomic<int64_t> next_index{0};
  std::deque<PlannedRequest> queue;
  int idle = 0;
  bool closing = false;
  int clients_left = 0;   // closed loop, under mu
  int starting = 0;       // open loop: workers started but not yet waiting, under mu
  auto worker_closed = [&] {
    HttpClient client(url);
    for (;;) {
      const int64_t i = next_index.fetch_add(1);
      if (i >= total || SteadyClock::now() >= stop_at) break;
      {
        std::lock_guard<std::mutex> lock(mu);
        ++in_flight;
      }
      sent.fetch_add(1);
      finish(execute_request(client, o, info.model, workload, workload.request(i), id_max, start, &tokens));
    }
    std::lock_guard<std::mutex> lock(mu);
    --clients_left;
    cv.notify_all();
  };
  auto worker_open = [&] {
    HttpClient client(url);
    {
      std::lock_guard<std::mutex> lock(mu);
      --starting;
    }
    for (;;) {
      PlannedRequest p;
      {
        std::unique_lock<std::mutex> lock(mu);
        ++idle;
        cv.wait(lock, [&] { return closing || !queue.empty(); });
        --idle;
        if (queue.empty()) return;
        p = queue.front();
        queue.pop_front();
      }
      finish(execute_request(client, o, info.model, workload, p, id_max, start, &tokens));
    }
  };

  auto progress = [&] {
    if (!o.on_progress) return;
    LoadProgress p;
    p.sent = sent.load();
    p.completed = completed.load();
    p.failed = failed.load();
    p.output_tokens = tokens.load();
    p.elapsed_s = seconds_since(start, SteadyClock::now());
    p.in_flight = p.sent - p.completed - p.failed;
    p.target_requests = total == INT64_MAX ? 0 : total;
    p.target_duration_s = o.duration_s;
    o.on_progress(p);
  };
  const auto tick = std::chrono::milliseconds(200);

  if (o.mode == ArrivalMode::kConcurrency) {
    const int clients = static_cast<int>(std::min<int64_t>(o.concurrency, total));
    clients_left = clients;
    for (int c = 0; c < clients; ++c) workers.emplace_back(worker_closed);
    std::unique_lock<std::mutex> lock(mu);
    while (clients_left > 0) {
      lock.unlock();
      progress();
      lock.lock();
      cv.wait_for(lock, tick);
    }
  } else {
    double arrival = 0;
    for (int64_t i = 0; i < total; ++i) {
      arrival = workload.next_arrival_s(i, arrival);
      const auto due = start + std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(arrival));
      if (due >= stop_at) break;
      std::unique_lock<std::mutex> lock(mu);
      while (SteadyClock::now() < due) {
        lock.unlock();
        progress();
        lock.lock();
        cv.wait_until(lock, std::min(due, SteadyClock::now() + tick));
      }
      // Open loop, but bounded: past max_inflight the arrival waits for a slot.
      while (in_flight >= o.max_inflight) cv.wait_for(lock, tick);
      PlannedRequest p = workload.request(i);
      p.arrival_s = arrival;
      queue.push_back(p);
      ++in_flight;
      sent.fetch_add(1);
      if (idle + starting < static_cast<int>(queue.size())) {
        ++starting;
        workers.emplace_back(worker_open);
      }
      cv.notify_all();
    }
    std::unique_lock<std::mutex> lock(mu);
    while (in_flight > 0) {
      lock.unlock();
      progress();
      lock.lock();
      cv.wait_for(lock, tick);
    }
    closing = true;
    cv.notify_all();
  }
  for (std::thread& t : workers) t.join();
  const double duration = seconds_since(start, SteadyClock::now());
  progress();
  if (sampler) result.timeline = sampler->take();
  std::sort(records.begin(), records.end(),
            [](const RequestRecord& a, const RequestRecord& b) { return a.index < b.index; });
  // The measured window runs from the first send to the last completion.
  double first_send = duration, last_end = 0;
  for (const RequestRecord& r : records) {
    first_send = std::min(first_send, r.start_s);
    last_end = std::max(last_end, r.start_s + r.e2e_s);
  }
  const double window = records.empty() ? duration : std::max(1e-9, last_end - first_send);
  result.summary = summarize_run(records, window, o.slo);
  result.requests = std::move(records);
  return result;
}

}  // namespace tessera
