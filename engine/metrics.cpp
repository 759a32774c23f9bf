#include "engine/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace tessera {

void MetricsRegistry::declare_counter(const std::string& name, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.try_emplace(name, Metric{Kind::kCounter, help, {}, {}});
}

void MetricsRegistry::declare_gauge(const std::string& name, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.try_emplace(name, Metric{Kind::kGauge, help, {}, {}});
}

void MetricsRegistry::declare_histogram(const std::string& name, const std::string& help, std::vector<double> buckets) {
  std::sort(buckets.begin(), buckets.end());
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.try_emplace(name, Metric{Kind::kHistogram, help, std::move(buckets), {}});
}

void MetricsRegistry::add(const std::string& name, double delta, const std::string& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = metrics_.find(name);
  if (it != metrics_.end()) it->second.series[labels].value += delta;
}

void MetricsRegistry::set(const std::string& name, double value, const std::string& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = metrics_.find(name);
  if (it != metrics_.end()) it->second.series[labels].value = value;
}

void MetricsRegistry::set_series(const std::string& name,
                                 std::initializer_list<std::pair<std::string, double>> series) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = metrics_.find(name);
  if (it == metrics_.end()) return;
  for (const auto& [labels, value] : series) it->second.series[labels].value = value;
}

void MetricsRegistry::observe(const std::string& name, double value, const std::string& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = metrics_.find(name);
  if (it == metrics_.end()) return;
  Metric& m = it->second;
  Series& s = m.series[labels];
  if (s.bucket_counts.empty()) s.bucket_counts.assign(m.buckets.size(), 0);
  for (size_t i = 0; i < m.buckets.size(); ++i)
    if (value <= m.buckets[i]) ++s.bucket_counts[i];
  s.sum += value;
  ++s.count;
}

double MetricsRegistry::value(const std::string& name, const std::string& labels) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = metrics_.find(name);
  if (it == metrics_.end()) return 0;
  auto s = it->second.series.find(labels);
  return s == it->second.series.end() ? 0 : s->second.value;
}

uint64_t MetricsRegistry::count(const std::string& name, const std::string& labels) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = metrics_.find(name);
  if (it == metrics_.end()) return 0;
  auto s = it->second.series.find(labels);
  return s == it->second.series.end() ? 0 : s->second.count;
}

std::string MetricsRegistry::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  auto braces = [](const std::string& labels, const std::string& extra = "") {
    std::string l = labels;
    if (!extra.empty()) l += (l.empty() ? "" : ",") + extra;
    return l.empty() ? std::string() : "{" + l + "}";
  };
  for (const auto& [name, m] : metrics_) {
    const char* type = m.kind == Kind::kCounter ? "counter" : m.kind == Kind::kGauge ? "gauge" : "histogram";
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, m.help, name, type);
    if (m.kind != Kind::kHistogram && m.series.empty()) out += fmt::format("{} 0\n", name);
    for (const auto& [labels, s] : m.series) {
      if (m.kind != Kind::kHistogram) {
        out += fmt::format("{}{} {}\n", name, braces(labels), s.value);
        continue;
      }
      for (size_t i = 0; i < m.buckets.size(); ++i)
        out += fmt::format("{}_bucket{} {}\n", name, braces(labels, fmt::format("le=\"{}\"", m.buckets[i])),
                           i < s.bucket_counts.size() ? s.bucket_counts[i] : 0);
      out += fmt::format("{}_bucket{} {}\n", name, braces(labels, "le=\"+Inf\""), s.count);
      out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, braces(labels), s.sum, name, braces(labels), s.count);
    }
  }
  return out;
}

std::vector<double> latency_buckets_s() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

std::vector<double> token_buckets() { return {1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768}; }

}  // namespace tessera
