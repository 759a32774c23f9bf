// Prometheus metrics: counters, gauges and histograms with fixed buckets, rendered in the text
// exposition format for GET /metrics. Thread-safe: the engine thread updates, HTTP threads
// render; one mutex guards the registry (updates are a few per token, far from contended).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

class MetricsRegistry {
 public:
  // Declares a metric once (name, help). Labels are given per update as `key="value",...`.
  void declare_counter(const std::string& name, const std::string& help);
  void declare_gauge(const std::string& name, const std::string& help);
  void declare_histogram(const std::string& name, const std::string& help, std::vector<double> buckets);

  void add(const std::string& name, double delta = 1.0, const std::string& labels = "");
  void set(const std::string& name, double value, const std::string& labels = "");
  // Several series of one gauge at once (labels, value): a scrape sees all of them or none of
  // them changed (e.g. the KV block states, which add up to the pool).
  void set_series(const std::string& name, std::initializer_list<std::pair<std::string, double>> series);
  void observe(const std::string& name, double value, const std::string& labels = "");

  double value(const std::string& name, const std::string& labels = "") const;  // counter/gauge, for tests
  uint64_t count(const std::string& name, const std::string& labels = "") const;  // histogram samples
  std::string render() const;

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct Series {
    double value = 0;
    std::vector<uint64_t> bucket_counts;
    double sum = 0;
    uint64_t count = 0;
  };
  struct Metric {
    Kind kind;
    std::string help;
    std::vector<double> buckets;
    std::map<std::string, Series> series;  // by label string
  };
  mutable std::mutex mu_;
  std::map<std::string, Metric> metrics_;
};

// Latency buckets in seconds (1 ms .. 60 s) and length buckets in tokens.
std::vector<double> latency_buckets_s();
std::vector<double> token_buckets();

}  // namespace tessera
