#include "tune/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <unordered_map>

#include <fmt/format.h>

#include "engine/block_pool.h"
#include "engine/clock.h"
#include "engine/scheduler.h"
#include "engine/step_features.h"

namespace tessera {
namespace {

using Seconds = std::chrono::duration<double>;

struct Live {
  size_t index = 0;
  int64_t generated = 0;
  double last_emit_s = 0;
};

// Distinct ids per request (no prefix-cache hits), as random prompts are.
std::vector<int32_t> prompt_ids(size_t index, int64_t n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t x = index * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  for (auto& id : ids) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 29;
    id = static_cast<int32_t>(10 + x % 30000);
  }
  return ids;
}

}  // namespace

Result<SimResult> simulate(const std::vector<SimRequest>& trace, const SimOptions& o) {
  TESSERA_RETURN_IF_ERROR(validate_scheduler_config(o.scheduler));
  TESSERA_RETURN_IF_ERROR(validate_block_size(o.block_size));
  if (!(o.level > 0) || !std::isfinite(o.level))
    return Status::invalid_argument(fmt::format("simulator: level {}: expected a factor > 0", o.level));
  if (o.num_blocks < 1) return Status::invalid_argument(fmt::format("simulator: KV pool of {} blocks", o.num_blocks));
  if (trace.empty()) return Status::invalid_argument("simulator: the trace has no requests");
  for (size_t i = 1; i < trace.size(); ++i)
    if (trace[i].arrival_s < trace[i - 1].arrival_s)
      return Status::invalid_argument(fmt::format("simulator: trace request {} arrives before request {}", i, i - 1));
  const auto wall0 = std::chrono::steady_clock::now();
  auto pool = BlockPool::create({o.num_blocks, static_cast<int32_t>(o.block_size), true});
  if (!pool.is_ok()) return pool.status();
  ManualClock clock;
  const Clock::time_point t0 = clock.now();
  Scheduler sched(o.scheduler, *pool, clock);

  SimResult out;
  std::vector<RequestRecord> records(trace.size());
  std::unordered_map<uint64_t, Live> live;
  double now = 0;
  auto move_to = [&](double t) {
    if (t > now) {
      clock.advance(std::chrono::duration_cast<Clock::duration>(Seconds(t - now)));
      now = t;
    }
  };
  size_t next = 0;
  double busy = 0, frag_sum = 0, batch_sum = 0, tokens_sum = 0;
  int64_t frag_steps = 0;
  std::vector<uint64_t> done;
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (;;) {
    while (next < trace.size() && trace[next].arrival_s <= now) {
      const SimRequest& r = trace[next];
      RequestRecord& rec = records[next];
      rec.index = static_cast<int64_t>(next);
      rec.prompt_tokens = r.prompt_tokens;
      rec.max_tokens = r.output_tokens;
      rec.start_s = r.arrival_s;
      SchedulerRequest q;
      q.seq_id = next + 1;
      q.prompt = prompt_ids(next, r.prompt_tokens);
      q.max_tokens = r.output_tokens;
      q.priority = std::clamp<int32_t>(r.priority, 0, o.scheduler.priority_classes - 1);
      q.arrival = t0 + std::chrono::duration_cast<Clock::duration>(Seconds(r.arrival_s));
      Status s = sched.add(std::move(q));
      if (!s.is_ok()) {
        rec.error = s.message();
        ++out.rejected;
      } else {
        live[next + 1] = Live{next, 0, 0};
      }
      ++next;
    }
    if (!sched.has_work()) {
      if (next >= trace.size()) break;
      move_to(trace[next].arrival_s);
      continue;
    }
    std::optional<StepPlan> plan = sched.schedule();
    if (!plan) {
      double wake = std::numeric_limits<double>::infinity();
      if (auto d = sched.time_until_next_decision()) wake = now + std::max(Seconds(*d).count(), 1e-6);
      if (next < trace.size()) wake = std::min(wake, trace[next].arrival_s);
      if (!std::isfinite(wake))
        return Status::internal(fmt::format("simulator: the scheduler has work but plans nothing at t={:.3f} s", now));
      move_to(std::max(wake, now + 1e-9));
      continue;
    }
    const StepFeatures f = step_features(*plan, o.block_size);
    double dt = f.tokens > 0 ? o.cost.predict_s(f) * o.cost.block_factor(o.block_size, f.tokens) : o.cost.empty_step_s;
    if (o.jitter) dt *= o.cost.jitter(unit(rng), f.tokens);
    dt *= o.level;
    busy += dt;
    if (f.tokens > 0) {
      batch_sum += static_cast<double>(f.sequences);
      tokens_sum += static_cast<double>(f.tokens);
    }
    move_to(now + dt);
    StepResult result;
    result.step_id = plan->step_id;
    for (const ScheduledSequence& q : plan->scheduled)
      if (q.sample) result.tokens.push_back(StepToken{q.seq_id, 1, 0.0f, {}});
    Status s = sched.on_result(result);
    if (!s.is_ok()) return Status::internal(fmt::format("simulator: step {}: {}", plan->step_id, s.message()));
    ++(f.tokens > 0 ? out.steps : out.empty_steps);
    done.clear();
    for (const StepToken& t : result.tokens) {
      auto it = live.find(t.seq_id);
      if (it == live.end()) continue;
      Live& l = it->second;
      RequestRecord& rec = records[l.index];
      if (l.generated == 0) rec.ttft_s = now - rec.start_s + o.request_overhead_s;
      else rec.itl_s.push_back(now - l.last_emit_s);
      l.last_emit_s = now;
      ++l.generated;
      if (l.generated >= rec.max_tokens) done.push_back(t.seq_id);
    }
    for (uint64_t id : done) {
      Live& l = live[id];
      RequestRecord& rec = records[l.index];
      rec.output_tokens = l.generated;
      rec.chunks = l.generated;
      rec.e2e_s = now - rec.start_s + o.request_overhead_s;
      rec.ok = true;
      sched.finish(id);
      live.erase(id);
    }
    const BlockPoolStats kv = pool->stats();
    if (kv.used_blocks > 0) {
      frag_sum += kv.fragmentation;
      ++frag_steps;
    }
    out.peak_kv_usage = std::max(out.peak_kv_usage, kv.usage);
  }
  const SchedulerStats st = sched.stats();
  out.preemptions = st.preemptions;
  const double first = trace.front().arrival_s;
  double last = first;
  for (const RequestRecord& r : records)
    if (r.ok) last = std::max(last, r.start_s + r.e2e_s);
  // ITL percentiles need the gaps even when records are dropped: summarize first.
  out.summary = summarize_run(records, last - first, o.slo);
  out.mean_batch = out.steps > 0 ? batch_sum / static_cast<double>(out.steps) : 0;
  out.mean_step_tokens = out.steps > 0 ? tokens_sum / static_cast<double>(out.steps) : 0;
  out.busy_fraction = last > first ? busy / (last - first) : 0;
  out.mean_fragmentation = frag_steps > 0 ? frag_sum / static_cast<double>(frag_steps) : 0;
  if (o.keep_requests) out.requests = std::move(records);
  out.sim_wall_s = Seconds(std::chrono::steady_clock::now() - wall0).count();
  return out;
}

}  // namespace tessera
