#include "tune/tuner.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <chrono>
#include <cmath>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tessera {
namespace {

std::string label_of(const SchedulerConfig& c, int64_t block) {
  return fmt::format("batch {}, step {}, wait {:g} ms, chunk {}, block {}{}", c.max_batch, c.max_step_tokens,
                     c.max_wait_ms, c.prefill_chunk, block,
                     c.priority_classes > 1 ? fmt::format(", aging {:g} ms", c.aging_ms) : std::string());
}

// Candidates ranked: meeting the SLO first, then goodput, then output throughput.
bool better(const TuneCandidate& a, const TuneCandidate& b) {
  if (a.meets_slo != b.meets_slo) return a.meets_slo;
  const double ga = a.result.summary.goodput, gb = b.result.summary.goodput;
  if (std::abs(ga - gb) > 0.01 * std::max(ga, gb)) return ga > gb;
  const double ta = a.result.summary.output_token_throughput, tb = b.result.summary.output_token_throughput;
  if (std::abs(ta - tb) > 1e-9 * std::max(ta, tb)) return ta > tb;
  return a.result.summary.ttft.p99 < b.result.summary.ttft.p99;
}

void simulate_all(const std::vector<SimRequest>& trace, const TuneOptions& o, std::vector<TuneCandidate>& cands,
                  size_t from, Status& error) {
  std::atomic<size_t> next{from};
  std::mutex mu;
  const int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  auto work = [&] {
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= cands.size()) return;
      TuneCandidate& c = cands[i];
      SimOptions so;
      so.scheduler = c.scheduler;
      so.block_size = c.block_size;
      so.num_blocks = kv_blocks_for(o.kv_bytes, o.kv_bytes_per_token, c.block_size);
      so.cost = o.cost;
      so.slo = o.slo;
      so.request_overhead_s = o.request_overhead_s;
      so.keep_requests = false;
      auto r = simulate(trace, so);
      if (!r.is_ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (error.is_ok()) error = r.status().with_context(c.label);
        continue;
      }
      c.result = std::move(*r);
      c.meets_slo = meets_p99_slo(c.result.summary, o.slo, o.slo_margin);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

}  // namespace

bool meets_p99_slo(const RunSummary& s, const SloSpec& slo, double margin) {
  if (s.failed > 0 || s.completed == 0) return false;
  const double f = 1.0 - margin;
  if (slo.ttft_s && s.ttft.p99 > *slo.ttft_s * f) return false;
  if (slo.itl_s && s.itl.p99 > *slo.itl_s * f) return false;
  if (slo.e2e_s && s.e2e.p99 > *slo.e2e_s * f) return false;
  return true;
}

int64_t kv_blocks_for(int64_t kv_bytes, uint64_t kv_bytes_per_token, int64_t block_size) {
  if (kv_bytes <= 0 || kv_bytes_per_token == 0 || block_size <= 0) return 0;
  return kv_bytes / static_cast<int64_t>(kv_bytes_per_token * static_cast<uint64_t>(block_size));
}

Result<TuneResult> run_tune(const std::vector<SimRequest>& trace, const TuneOptions& o) {
  if (trace.empty()) return Status::invalid_argument("tune: the trace has no requests");
  if (o.slo.empty()) return Status::invalid_argument("tune: --slo needs a target (ttft_p99=500ms, itl_p99=100ms)");
  if (!(o.slo_margin >= 0 && o.slo_margin < 1))
    return Status::invalid_argument(fmt::format("tune: --slo-margin {}: expected a fraction in [0, 1)", o.slo_margin));
  for (int64_t b : o.block_sizes)
    if (kv_blocks_for(o.kv_bytes, o.kv_bytes_per_token, b) < 1)
      return Status::invalid_argument(fmt::format("tune: a KV budget of {} bytes holds no block of {} tokens", o.kv_bytes, b));
  const auto wall0 = std::chrono::steady_clock::now();
  TuneResult out;
  auto add = [&](SchedulerConfig c, int64_t block) {
    c.profile = c.profile == "offline" || c.profile == "interactive" ? c.profile : "tuned";
    TuneCandidate t;
    t.scheduler = c;
    t.block_size = block;
    t.label = label_of(c, block);
    if (!validate_scheduler_config(c).is_ok()) return false;
    for (const TuneCandidate& e : out.candidates)
      if (e.label == t.label) return false;
    out.candidates.push_back(std::move(t));
    return true;
  };
  // The built-in profiles, at the base block size.
  const int64_t base_block = o.block_sizes.empty() ? 16 : o.block_sizes.front();
  for (const std::string& name : scheduler_profile_names()) {
    SchedulerConfig p = *scheduler_profile(name);
    p.priority_classes = o.base.priority_classes;
    p.speculation = o.base.speculation;
    if (add(p, 16)) out.builtin.push_back(out.candidates.size() - 1);
  }
  (void)base_block;
  // Stage 1: the grid.
  for (int32_t mb : o.max_batch)
    for (int32_t st : o.max_step_tokens)
      for (double w : o.max_wait_ms)
        for (int64_t b : o.block_sizes) {
          SchedulerConfig c = o.base;
          c.profile = "tuned";
          c.max_batch = mb;
          c.max_step_tokens = st;
          c.max_wait_ms = w;
          c.prefill_chunk = std::min(512, st);
          add(c, b);
        }
  Status error;
  simulate_all(trace, o, out.candidates, 0, error);
  if (!error.is_ok()) return error;
  // Stage 2: chunk and aging around the five best.
  std::vector<size_t> order(out.candidates.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return better(out.candidates[a], out.candidates[b]); });
  const size_t stage1 = out.candidates.size();
  int32_t classes = 1;
  for (const SimRequest& r : trace) classes = std::max(classes, r.priority + 1);
  for (size_t k = 0; k < std::min<size_t>(5, order.size()); ++k) {
    const TuneCandidate seed = out.candidates[order[k]];
    for (int32_t chunk : o.prefill_chunk) {
      if (chunk > seed.scheduler.max_step_tokens) continue;
      SchedulerConfig c = seed.scheduler;
      c.profile = "tuned";
      c.prefill_chunk = chunk;
      add(c, seed.block_size);
      if (classes > 1)
        for (double aging : o.aging_ms) {
          c.aging_ms = aging;
          add(c, seed.block_size);
        }
    }
  }
  simulate_all(trace, o, out.candidates, stage1, error);
  if (!error.is_ok()) return error;
  size_t best = 0;
  for (size_t i = 1; i < out.candidates.size(); ++i)
    if (better(out.candidates[i], out.candidates[best])) best = i;
  out.recommended = best;
  out.meets_slo = out.candidates[best].meets_slo;
  // The throughput / P99 TTFT front.
  for (TuneCandidate& a : out.candidates) {
    a.pareto = true;
    for (const TuneCandidate& b : out.candidates) {
      const auto &sa = a.result.summary, &sb = b.result.summary;
      if (&a != &b && sb.output_token_throughput >= sa.output_token_throughput && sb.ttft.p99 <= sa.ttft.p99 &&
          (sb.output_token_throughput > sa.output_token_throughput || sb.ttft.p99 < sa.ttft.p99)) {
        a.pareto = false;
        break;
      }
    }
  }
  out.sim_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return out;
}

std::string format_tune_table(const TuneResult& r, const SloSpec& slo, bool md) {
  std::vector<size_t> rows;
  for (size_t i = 0; i < r.candidates.size(); ++i)
    if (r.candidates[i].pareto) rows.push_back(i);
  std::sort(rows.begin(), rows.end(), [&](size_t a, size_t b) {
    return r.candidates[a].result.summary.output_token_throughput > r.candidates[b].result.summary.output_token_throughput;
  });
  std::string out;
  auto header = [&] {
    if (md) {
      out += "| | setting | out tok/s | req/s | goodput req/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | "
             "preempt | SLO |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    } else {
      out += fmt::format("{:<12} {:<58} {:>9} {:>7} {:>8} {:>9} {:>9} {:>8} {:>8} {:>7} {:>4}\n", "", "setting",
                         "out tok/s", "req/s", "goodput", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "preempt", "SLO");
    }
  };
  auto row = [&](const char* tag, const TuneCandidate& c) {
    const RunSummary& s = c.result.summary;
    const std::string label = c.scheduler.profile == "tuned" ? c.label : c.scheduler.profile + " (" + c.label + ")";
    if (md) {
      out += fmt::format("| {} | {} | {:.1f} | {:.2f} | {:.2f} | {:.0f} | {:.0f} | {:.1f} | {:.1f} | {} | {} |\n", tag,
                         label, s.output_token_throughput, s.request_throughput, s.goodput, s.ttft.p50 * 1e3,
                         s.ttft.p99 * 1e3, s.itl.p50 * 1e3, s.itl.p99 * 1e3, c.result.preemptions,
                         c.meets_slo ? "yes" : "no");
    } else {
      out += fmt::format("{:<12} {:<58} {:>9.1f} {:>7.2f} {:>8.2f} {:>9.0f} {:>9.0f} {:>8.1f} {:>8.1f} {:>7} {:>4}\n", tag,
                         label.substr(0, 58), s.output_token_throughput, s.request_throughput, s.goodput,
                         s.ttft.p50 * 1e3, s.ttft.p99 * 1e3, s.itl.p50 * 1e3, s.itl.p99 * 1e3, c.result.preemptions,
                         c.meets_slo ? "yes" : "no");
    }
  };
  out += fmt::format("Pareto front (output throughput against P99 TTFT) of {} simulated settings; SLO {}\n",
                     r.candidates.size(), slo.to_string());
  header();
  for (size_t i : rows) row(i == r.recommended ? "recommended" : (r.candidates[i].meets_slo ? "front, SLO" : "front"), r.candidates[i]);
  out += md ? "\n" : "";
  out += "Recommended and built-in profiles:\n";
  header();
  row("recommended", r.candidates[r.recommended]);
  for (size_t i : r.builtin) row("built-in", r.candidates[i]);
  return out;
}

std::string tuned_profile_json(const TuneCandidate& c, const std::string& comment) {
  // Every knob is written, so the profile named is only the label it reads back with.
  SchedulerConfig s = c.scheduler;
  s.profile = "interactive";
  s.block_size = static_cast<int32_t>(c.block_size);
  return scheduler_config_json(s, comment);
}

std::string tune_candidates_json(const TuneResult& r, const SloSpec& slo) {
  nlohmann::json j;
  j["slo"] = slo.to_string();
  j["recommended"] = r.recommended;
  j["builtin"] = r.builtin;
  j["candidates"] = nlohmann::json::array();
  for (const TuneCandidate& c : r.candidates) {
    const RunSummary& s = c.result.summary;
    j["candidates"].push_back({{"label", c.label},
                               {"profile", c.scheduler.profile},
                               {"max_batch", c.scheduler.max_batch},
                               {"max_step_tokens", c.scheduler.max_step_tokens},
                               {"max_wait_ms", c.scheduler.max_wait_ms},
                               {"prefill_chunk", c.scheduler.prefill_chunk},
                               {"aging_ms", c.scheduler.aging_ms},
                               {"block_size", c.block_size},
                               {"output_tok_s", s.output_token_throughput},
                               {"req_s", s.request_throughput},
                               {"goodput", s.goodput},
                               {"ttft_p50_s", s.ttft.p50},
                               {"ttft_p99_s", s.ttft.p99},
                               {"itl_p50_s", s.itl.p50},
                               {"itl_p99_s", s.itl.p99},
                               {"preemptions", c.result.preemptions},
                               {"meets_slo", c.meets_slo},
                               {"pareto", c.pareto}});
  }
  return j.dump(1);
}

}  // namespace tessera
