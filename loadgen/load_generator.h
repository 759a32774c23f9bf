// The serving load generator behind `tessera bench serve`: sends completion requests to any
// OpenAI-compatible endpoint and times each one.
//
// Workload: prompts are token-id lists (POST /v1/completions accepts them) of random ids, and
// requests carry `ignore_eos` and `max_tokens`, so prompt and output lengths are exact. Lengths
// come from a distribution (fixed, uniform, log-normal) or a JSONL trace. Arrivals are either
// closed-loop (a fixed number of concurrent clients, each sending its next request when the
// last one ends) or open-loop (Poisson or fixed-rate arrivals at --rate, or the trace's own
// arrival times); open-loop requests are sent at their arrival time whatever is in flight
// (up to max_inflight). A run stops issuing requests after num_requests or duration_s,
// whichever comes first, and waits for those in flight.
//
// Per request: time to first token (TTFT: request sent -> first streamed token), inter-token
// latencies (ITL: gaps between streamed chunks that carry text), end-to-end latency, and
// TPOT ((e2e - ttft) / (output tokens - 1)). Output tokens come from the stream's usage chunk
// (stream_options.include_usage) when the server sends one, else from the number of chunks.
//
// Goodput: requests per second that finished and met every SLO given: TTFT <= ttft,
// TPOT (the request's mean inter-token latency) <= itl, e2e <= e2e.
//
// Percentiles interpolate linearly between closest ranks (rank = p/100 * (n - 1)), as numpy's
// default does.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tessera {

// A distribution of token counts. Samples are rounded and clamped to [min_tokens, max_tokens].
struct LengthDistribution {
  enum class Kind { kFixed, kUniform, kLogNormal };
  Kind kind = Kind::kFixed;
  double a = 128;  // fixed: the value; uniform: low (inclusive); log-normal: the mean
  double b = 0;    // uniform: high (inclusive); log-normal: sigma of the underlying normal
  int64_t min_tokens = 1;
  int64_t max_tokens = int64_t{1} << 20;

  // "128", "fixed:128", "uniform:64,256", "lognormal:128,0.5" (mean 128, sigma 0.5).
  static Result<LengthDistribution> parse(std::string_view spec);
  int64_t sample(std::mt19937_64& rng) const;
  double mean() const;  // of the unclamped distribution
  std::string to_string() const;
};

// One line of a JSONL trace: {"prompt_tokens": 512, "output_tokens": 128, "arrival_s": 0.25}.
// arrival_s (seconds from the start) is optional.
struct TraceEntry {
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  std::optional<double> arrival_s;
};
// `source` names the text in error messages ("trace.jsonl:3: ...").
Result<std::vector<TraceEntry>> parse_trace(std::string_view jsonl, std::string_view source);
Result<std::vector<TraceEntry>> load_trace(const std::string& path);

// "ttft=200ms,itl=50ms,e2e=2s": any subset; units ms, s or us (default ms). "tpot" = "itl": a
// request's mean time per output token. "itl_p99" instead bounds the P99 of the request's own
// gaps between tokens (a stream that stalls fails it even when its mean is low).
struct SloSpec {
  std::optional<double> ttft_s, itl_s, e2e_s;
  bool itl_per_gap = false;  // itl_s bounds each request's P99 gap ("itl_p99"), not its mean
  static Result<SloSpec> parse(std::string_view spec);
  bool empty() const { return !ttft_s && !itl_s && !e2e_s; }
  std::string to_string() const;
};

enum class ArrivalMode {
  kConcurrency,  // closed loop: `concurrency` clients
  kPoisson,      // open loop: exponential gaps with mean 1/rate
  kFixedRate,    // open loop: gaps of exactly 1/rate
  kTrace,        // open loop: the trace's arrival_s
};
std::string_view arrival_mode_name(ArrivalMode mode);

// Progress while a run is going (for a progress bar).
struct LoadProgress {
  int64_t sent = 0;
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t in_flight = 0;
  int64_t output_tokens = 0;
  double elapsed_s = 0;
  int64_t target_requests = 0;  // 0: bounded by time only
  double target_duration_s = 0;  // 0: bounded by count only
};

struct LoadOptions {
  std::string url = "http://127.0.0.1:8000";  // server root (the /v1/... paths are appended)
  std::string model;                           // the request's "model"
  ArrivalMode mode = ArrivalMode::kConcurrency;
  double rate = 1.0;       // requests per second (Poisson, fixed rate)
  int concurrency = 1;     // clients (closed loop)
  int64_t num_requests = 100;  // 0: unbounded (then duration_s must be set)
  double duration_s = 0;       // 0: unbounded (then num_requests must be set)
  LengthDistribution prompt_tokens{LengthDistribution::Kind::kFixed, 128};
  LengthDistribution output_tokens{LengthDistribution::Kind::kFixed, 128};
  std::vector<TraceEntry> trace;  // when set: lengths (cycled) and, for kTrace, arrivals
  bool stream = true;
  bool ignore_eos = true;
  double temperature = 0.0;
  int32_t token_id_min = 10;   // prompt ids are uniform in [token_id_min, token_id_max)
  int32_t token_id_max = 0;    // 0: ask the server (/tokenizer_info vocab), else 256
  uint64_t seed = 1;
  SloSpec slo;
  double request_timeout_s = 600;
  int metrics_interval_ms = 100;  // /metrics sampling period (0: off)
  int max_inflight = 4096;        // open loop: requests in flight at most
  std::function<void(const LoadProgress&)> on_progress;  // called every ~200 ms from the run's thread
};

// What the workload says about request i.
struct PlannedRequest {
  int64_t index = 0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  double arrival_s = 0;  // open loop only
};

// Deterministic workload: lengths of request i depend only on (seed, i) (or the trace).
class Workload {
 public:
  explicit Workload(const LoadOptions& options);
  PlannedRequest request(int64_t index) const;
  // Open loop: the arrival of request `index`, given the previous one's; sequential use.
  double next_arrival_s(int64_t index, double previous_arrival_s);
  std::vector<int32_t> prompt_ids(const PlannedRequest& r, int32_t id_min, int32_t id_max) const;
  // Requests the workload can produce (the trace length for kTrace arrivals, else unbounded).
  int64_t limit() const;

 private:
  const LoadOptions& o_;
  std::mt19937_64 arrival_rng_;
};

struct RequestRecord {
  int64_t index = 0;
  int64_t prompt_tokens = 0;          // sent
  int64_t max_tokens = 0;             // requested
  int64_t output_tokens = 0;          // received (usage, else chunks)
  int64_t chunks = 0;                 // streamed chunks carrying text
  double start_s = 0;                 // send time, from the run's start
  double ttft_s = 0;
  double e2e_s = 0;
  std::vector<double> itl_s;          // gaps between text chunks
  bool ok = false;
  std::string error;
  double tpot_s() const;              // (e2e - ttft) / (output - 1); 0 for one token
};

// Named gauges of one /metrics scrape ("batch_size", "kv_usage", "running", "waiting").
struct MetricsSample {
  double t_s = 0;
  std::map<std::string, double> values;
};

struct LatencyStats {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, min = 0, max = 0;
};

struct RunSummary {
  int64_t sent = 0, completed = 0, failed = 0;
  int64_t good = 0;                  // completed and within every SLO
  int64_t prompt_tokens = 0, output_tokens = 0;
  double duration_s = 0;             // first send to last completion
  double request_throughput = 0;     // completed / duration
  double output_token_throughput = 0;
  double total_token_throughput = 0;  // (prompt + output) / duration
  double goodput = 0;                // good / duration
  LatencyStats ttft, itl, tpot, e2e;  // seconds
  std::vector<std::string> errors;   // distinct messages, first few
};

struct RunResult {
  std::vector<RequestRecord> requests;  // by index
  std::vector<MetricsSample> timeline;
  RunSummary summary;
  int32_t token_id_max = 0;             // the id range used
  std::string model;                    // the model id the requests named
};

// p in [0, 100] of `values` (any order); 0 when empty.
double percentile(std::vector<double> values, double p);
LatencyStats latency_stats(std::vector<double> values);
bool meets_slo(const RequestRecord& r, const SloSpec& slo);
RunSummary summarize_run(const std::vector<RequestRecord>& requests, double duration_s, const SloSpec& slo);

// Prometheus text -> the gauges the benchmark plots, under plain names: batch_size, kv_usage,
// running, waiting (Tessera's tessera_* names and vLLM's vllm:* names). Labels are summed over.
std::map<std::string, double> parse_server_gauges(std::string_view prometheus_text);

// Validates the options (counts, rates, bounds); the message names the flag.
Status validate_load_options(const LoadOptions& options);

// Runs one load level. Fails only when the run could not start (bad options, server not
// reachable); individual request failures are counted in the result.
Result<RunResult> run_load(const LoadOptions& options);

}  // namespace tessera
