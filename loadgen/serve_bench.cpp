#include "loadgen/serve_bench.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loadgen/bench_report.h"

namespace tessera {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

std::string format_load(const ServeLevel& l) {
  if (l.mode == "concurrency") return fmt::format("{} client{}", l.load, l.load == 1 ? "" : "s");
  if (l.mode == "trace") return "trace";
  return fmt::format("{:g} req/s", l.load);
}

// Rounds to `decimals` places so the JSON stays small (times in ms to the microsecond).
double rounded(double x, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(x * scale) / scale;
}

Json stats_json_ms(const LatencyStats& s) {
  return {{"count", s.count},
          {"mean", rounded(s.mean * 1e3, 3)},
          {"p50", rounded(s.p50 * 1e3, 3)},
          {"p90", rounded(s.p90 * 1e3, 3)},
          {"p99", rounded(s.p99 * 1e3, 3)},
          {"min", rounded(s.min * 1e3, 3)},
          {"max", rounded(s.max * 1e3, 3)}};
}

Json level_json(const ServeLevel& l, bool with_requests) {
  const RunSummary& s = l.result.summary;
  Json summary = {{"sent", s.sent},
                  {"completed", s.completed},
                  {"failed", s.failed},
                  {"good", s.good},
                  {"prompt_tokens", s.prompt_tokens},
                  {"output_tokens", s.output_tokens},
                  {"duration_s", s.duration_s},
                  {"request_throughput", s.request_throughput},
                  {"output_token_throughput", s.output_token_throughput},
                  {"total_token_throughput", s.total_token_throughput},
                  {"goodput", s.goodput},
                  {"ttft_ms", stats_json_ms(s.ttft)},
                  {"itl_ms", stats_json_ms(s.itl)},
                  {"tpot_ms", stats_json_ms(s.tpot)},
                  {"e2e_ms", stats_json_ms(s.e2e)},
                  {"errors", s.errors}};
  Json timeline = Json::array();
  for (const MetricsSample& m : l.result.timeline) {
    Json t = {{"t_s", rounded(m.t_s, 3)}};
    for (const auto& [k, v] : m.values) t[k] = rounded(v, 5);
    timeline.push_back(std::move(t));
  }
  Json out = {{"mode", l.mode}, {"load", l.load}, {"summary", summary}, {"timeline", timeline}};
  if (!with_requests) return out;
  Json requests = Json::array();
  for (const RequestRecord& r : l.result.requests) {
    Json j = {{"index", r.index},
              {"ok", r.ok},
              {"prompt_tokens", r.prompt_tokens},
              {"output_tokens", r.output_tokens},
              {"start_s", rounded(r.start_s, 6)},
              {"ttft_ms", rounded(r.ttft_s * 1e3, 3)},
              {"e2e_ms", rounded(r.e2e_s * 1e3, 3)},
              {"tpot_ms", rounded(r.tpot_s() * 1e3, 3)}};
    if (!r.ok) j["error"] = r.error;
    requests.push_back(std::move(j));
  }
  out["requests"] = std::move(requests);
  return out;
}

Json report_json(const ServeBenchOptions& o, const std::vector<ServeLevel>& levels, const MachineInfo& machine,
                 const std::string& date) {
  const LoadOptions& lo = o.load;
  Json config = {{"url", lo.url},
                 {"model", levels.empty() ? lo.model : levels.front().result.model},
                 {"prompt_tokens", lo.trace.empty() ? lo.prompt_tokens.to_string() : "trace"},
                 {"output_tokens", lo.trace.empty() ? lo.output_tokens.to_string() : "trace"},
                 {"num_requests", lo.num_requests},
                 {"duration_s", lo.duration_s},
                 {"stream", lo.stream},
                 {"ignore_eos", lo.ignore_eos},
                 {"temperature", lo.temperature},
                 {"seed", lo.seed},
                 {"slo", lo.slo.to_string()}};
  Json lv = Json::array();
  for (const ServeLevel& l : levels) lv.push_back(level_json(l, o.json_requests));
  return {{"kind", "serve"},
          {"title", o.title},
          {"date", date},
          {"command", o.command_line},
          {"machine",
           {{"hostname", machine.hostname},
            {"cpu", machine.cpu_model},
            {"hardware_threads", machine.hardware_threads},
            {"memory_gib", machine.memory_gib},
            {"load_average_1m", machine.load_average_1m},
            {"load_average_5m", machine.load_average_5m}}},
          {"config", config},
          {"levels", lv}};
}

// A one-line progress bar on stderr, redrawn in place.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  void update(const std::string& label, const LoadProgress& p) {
    if (!enabled_) return;
    double frac = 0;
    if (p.target_requests > 0) frac = static_cast<double>(p.completed + p.failed) / static_cast<double>(p.target_requests);
    if (p.target_duration_s > 0) frac = std::max(frac, std::min(1.0, p.elapsed_s / p.target_duration_s));
    frac = std::clamp(frac, 0.0, 1.0);
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(std::lround(frac * kWidth));
    const double rate = p.elapsed_s > 0 ? static_cast<double>(p.output_tokens) / p.elapsed_s : 0;
    std::string line = fmt::format("\r{:<12} [{}{}] {:3.0f}% {} done{} {} failed {} in flight {:.0f} tok/s {:.1f}s",
                                   label, std::string(static_cast<size_t>(filled), '#'),
                                   std::string(static_cast<size_t>(kWidth - filled), '.'), frac * 100,
                                   p.completed, p.target_requests > 0 ? fmt::format("/{}", p.target_requests) : "",
                                   p.failed, p.in_flight, rate, p.elapsed_s);
    std::fputs(line.c_str(), stderr);
    std::fputs("\x1b[K", stderr);  // clear the rest of the line
    std::fflush(stderr);
    drawn_ = true;
  }
  void end() {
    if (enabled_ && drawn_) std::fputs("\n", stderr);
    drawn_ = false;
  }

 private:
  bool enabled_;
  bool drawn_ = false;
};

std::string markdown_section(const ServeBenchOptions& o, const std::vector<ServeLevel>& levels,
                             const MachineInfo& before, const MachineInfo& after, const std::string& date,
                             const std::vector<std::string>& plots) {
  const LoadOptions& lo = o.load;
  std::string md = fmt::format("## {} ({})\n\n", o.title.empty() ? "Serving benchmark" : o.title, date);
  md += fmt::format("- machine: {}\n", describe_machine(before));
  md += fmt::format("- load average after the run: {:.2f} (1 min), {:.2f} (5 min)\n", after.load_average_1m,
                    after.load_average_5m);
  md += fmt::format("- command: `{}`\n", o.command_line);
  const std::string model = !levels.empty() ? levels.front().result.model : lo.model;
  md += fmt::format("- server: {} model `{}`; prompts {} tokens, outputs {} tokens (ignore_eos: {}), {}\n", lo.url,
                    model,
                    lo.trace.empty() ? lo.prompt_tokens.to_string() : "from the trace",
                    lo.trace.empty() ? lo.output_tokens.to_string() : "from the trace", lo.ignore_eos,
                    lo.stream ? "streaming" : "not streaming");
  md += fmt::format("- bounds: {} requests{} per level; SLO for goodput: {}\n\n",
                    lo.num_requests > 0 ? std::to_string(lo.num_requests) : "unbounded",
                    lo.duration_s > 0 ? fmt::format(", at most {:g} s", lo.duration_s) : "",
                    lo.slo.empty() ? "none (every completed request counts)" : lo.slo.to_string());
  md += format_serve_table(levels, /*markdown=*/true);
  md += "\n";
  for (const std::string& p : plots) {
    std::error_code ec;
    fs::path rel = fs::relative(fs::absolute(p), fs::absolute(o.markdown_path).parent_path(), ec);
    if (ec || rel.empty()) rel = fs::absolute(p);
    md += fmt::format("![{}]({})\n", fs::path(p).stem().string(), rel.string());
  }
  if (!plots.empty()) md += "\n";
  return md;
}

}  // namespace

std::string format_serve_table(const std::vector<ServeLevel>& levels, bool markdown) {
  const std::vector<std::string> head = {"load",     "ok/sent",  "req/s",    "out tok/s", "goodput",
                                         "TTFT p50", "TTFT p90", "TTFT p99", "ITL p50",   "ITL p90",
                                         "ITL p99",  "E2E p50",  "E2E p99"};
  std::vector<std::vector<std::string>> rows;
  for (const ServeLevel& l : levels) {
    const RunSummary& s = l.result.summary;
    // "-" where nothing was measured (no ITL without streaming, nothing when every request failed).
    auto ms = [](const LatencyStats& st, double seconds) {
      return st.count == 0 ? std::string("-") : fmt::format("{:.1f}", seconds * 1e3);
    };
    rows.push_back({format_load(l), fmt::format("{}/{}", s.completed, s.sent), fmt::format("{:.2f}", s.request_throughput),
                    fmt::format("{:.1f}", s.output_token_throughput), fmt::format("{:.2f}", s.goodput),
                    ms(s.ttft, s.ttft.p50), ms(s.ttft, s.ttft.p90), ms(s.ttft, s.ttft.p99), ms(s.itl, s.itl.p50),
                    ms(s.itl, s.itl.p90), ms(s.itl, s.itl.p99), ms(s.e2e, s.e2e.p50), ms(s.e2e, s.e2e.p99)});
  }
  std::vector<std::string> md_head = head;
  for (size_t i = 5; i < md_head.size(); ++i) md_head[i] += " ms";
  if (markdown) return format_table(head, rows, true, /*first_left=*/true, md_head);
  std::string out = format_table(head, rows, false, /*first_left=*/true);
  out += "(latencies in ms; goodput in requests/s meeting the SLO)\n";
  return out;
}

int run_serve_bench(const ServeBenchOptions& o) {
  std::vector<LoadOptions> plans;
  if (!o.sweep_concurrency.empty()) {
    for (int c : o.sweep_concurrency) {
      LoadOptions l = o.load;
      l.mode = ArrivalMode::kConcurrency;
      l.concurrency = c;
      plans.push_back(l);
    }
  } else if (!o.sweep_rate.empty()) {
    for (double r : o.sweep_rate) {
      LoadOptions l = o.load;
      if (l.mode != ArrivalMode::kFixedRate) l.mode = ArrivalMode::kPoisson;
      l.rate = r;
      plans.push_back(l);
    }
  } else {
    plans.push_back(o.load);
  }
  for (const LoadOptions& l : plans) {
    Status s = validate_load_options(l);
    if (!s.is_ok()) {
      std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
      return 1;
    }
  }
  const bool progress = !o.no_progress && (o.force_progress || ::isatty(STDERR_FILENO));
  ProgressBar bar(progress);
  const MachineInfo before = machine_info();
  const std::string date = utc_date();
  std::vector<ServeLevel> levels;
  for (LoadOptions l : plans) {
    ServeLevel level;
    level.mode = std::string(arrival_mode_name(l.mode));
    level.load = l.mode == ArrivalMode::kConcurrency ? l.concurrency : l.mode == ArrivalMode::kTrace ? 0 : l.rate;
    const std::string label = format_load(level);
    l.on_progress = [&](const LoadProgress& p) { bar.update(label, p); };
    if (!progress) std::fprintf(stderr, "running %s ...\n", label.c_str());
    auto r = run_load(l);
    bar.end();
    if (!r.is_ok()) {
      std::fprintf(stderr, "error: %s\n", r.status().to_string().c_str());
      return 1;
    }
    level.result = std::move(*r);
    for (const std::string& e : level.result.summary.errors)
      std::fprintf(stderr, "warning: %s: a request failed: %s\n", label.c_str(), e.c_str());
    levels.push_back(std::move(level));
  }
  const MachineInfo after = machine_info();
  std::fputs(format_serve_table(levels, false).c_str(), stdout);
  std::fflush(stdout);

  const Json report = report_json(o, levels, before, date);
  auto drawn = write_json_and_plots(report.dump() + "\n", o.json_path, o.plot_prefix, o.plots, o.install_plot_deps,
                                    "plot_serve.py", "", {"-latency.png", "-timeline.png"});
  if (!drawn.is_ok()) {
    std::fprintf(stderr, "error: %s\n", drawn.status().to_string().c_str());
    return 1;
  }
  const std::vector<std::string>& plots = *drawn;
  if (!o.markdown_path.empty()) {
    Status s = append_text_file(o.markdown_path, markdown_section(o, levels, before, after, date, plots));
    if (!s.is_ok()) {
      std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
      return 1;
    }
    std::printf("appended to %s\n", o.markdown_path.c_str());
  }
  return 0;
}

}  // namespace tessera
