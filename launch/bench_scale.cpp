#include "launch/bench_scale.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loadgen/bench_report.h"
#include "common/logging.h"
#include "server/shard_group.h"
#include "server/shard_launcher.h"

namespace tessera {
namespace {

using SteadyClock = std::chrono::steady_clock;
using Json = nlohmann::json;
namespace fs = std::filesystem;

double ms_since(SteadyClock::time_point t0) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - t0).count();
}

// The synthetic model for the run, made with tessera-make-model when not cached yet.
Result<std::string> scale_model(const ScaleBenchOptions& o) {
  if (!o.model.empty()) {
    if (!fs::exists(o.model)) return Status::not_found(fmt::format("--model '{}' does not exist", o.model));
    return o.model;
  }
  const fs::path dir = o.model_cache_dir.empty() ? fs::temp_directory_path() / "tessera-bench-models"
                                                 : fs::path(o.model_cache_dir);
  const fs::path out = dir / fmt::format("synthetic-{}-{}.gguf", o.preset, o.type);
  if (fs::exists(out)) return out.string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path partial = dir / fmt::format("synthetic-{}-{}.{}.partial.gguf", o.preset, o.type, ::getpid());
  const std::vector<std::string> argv = {sibling_executable("tessera-make-model"), "--preset", o.preset, "--format",
                                         "gguf", "--type", o.type, "--out", partial.string()};
  std::fprintf(stderr, "making the synthetic model: %s\n", format_command(argv).c_str());
  TESSERA_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::spawn(argv));
  if (!child.wait_for(std::chrono::minutes(30))) return Status::deadline_exceeded("tessera-make-model did not finish");
  if (child.exit_code() != 0)
    return Status::internal(fmt::format("tessera-make-model exited with {} ({})", child.exit_code(), format_command(argv)));
  fs::rename(partial, out, ec);
  if (ec) return Status::io_error(fmt::format("cannot move {} to {}: {}", partial.string(), out.string(), ec.message()));
  return out.string();
}

Result<ScalePoint> measure(const ScaleBenchOptions& o, const std::string& model, int tp) {
  ScalePoint pt;
  pt.tp = tp;
  ShardGroupOptions go;
  go.world_size = tp;
  go.endpoint = fmt::format("ipc:///tmp/tessera-scale-{}-{}.ctl", ::getpid(), tp);
  const int64_t positions = o.prompt_tokens + o.warmup_steps + o.decode_steps + 1;
  go.max_blocks = o.batch * ((positions + go.block_size - 1) / go.block_size) + 8;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<ShardGroup> group, ShardGroup::create(go));
  ShardLaunchSpec spec;
  spec.shard_binary = sibling_executable("tessera-shard");
  spec.model_path = model;
  spec.coordinator_endpoint = group->endpoint();
  spec.tp = tp;
  spec.runtime.device = o.device;
  spec.runtime.threads = o.threads;
  TESSERA_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::spawn(build_shard_command(spec)));
  Status s = group->start([&] {
    return child.running() ? Status::ok() : Status::unavailable(fmt::format("the TP {} shards exited during start-up", tp));
  });
  if (!s.is_ok()) return s;
  ShardGroup& g = *group;
  if (!g.hellos().empty()) pt.shard_device = g.hellos()[0].device;
  const int64_t bs = g.plan().block_size;

  // Prefill: every sequence's prompt in one step.
  StepPlan plan;
  std::vector<int64_t> known(static_cast<size_t>(o.batch), o.prompt_tokens);
  int32_t next_block = 0;
  for (int i = 0; i < o.batch; ++i) {
    NewSequence n;
    n.seq_id = static_cast<uint64_t>(i + 1);
    for (int t = 0; t < o.prompt_tokens; ++t) n.prompt_ids.push_back(1 + (i * 7 + t * 13) % 200);
    n.sampling.temperature = 0.0f;
    n.sampling.has_seed = true;
    plan.new_sequences.push_back(n);
    ScheduledSequence q{n.seq_id, 0, o.prompt_tokens, true, {}, false};
    for (int64_t b = 0; b < (positions + bs - 1) / bs; ++b) q.append_blocks.push_back(next_block++);
    plan.scheduled.push_back(q);
  }
  const auto t_prefill = SteadyClock::now();
  auto prefill = g.run_step(plan);
  pt.prefill_ms = ms_since(t_prefill);
  if (!prefill.is_ok()) return prefill.status().with_context(fmt::format("TP {} prefill", tp));

  std::vector<double> wall_ms;
  double compute_sum = 0, comm_sum = 0, wall_sum = 0;
  for (int step = 0; step < o.warmup_steps + o.decode_steps; ++step) {
    StepPlan d;
    for (int i = 0; i < o.batch; ++i) {
      d.scheduled.push_back({static_cast<uint64_t>(i + 1), known[static_cast<size_t>(i)], 1, true, {}, false});
      ++known[static_cast<size_t>(i)];
    }
    const auto t0 = SteadyClock::now();
    auto r = g.run_step(d);
    const double ms = ms_since(t0);
    if (!r.is_ok()) return r.status().with_context(fmt::format("TP {} decode step {}", tp, step));
    if (step < o.warmup_steps) continue;
    wall_ms.push_back(ms);
    wall_sum += ms;
    compute_sum += static_cast<double>(r->compute_micros) / 1e3;
    comm_sum += static_cast<double>(r->comm_micros) / 1e3;
  }
  g.shutdown("scale benchmark done");
  if (!child.wait_for(std::chrono::milliseconds(10000))) child.terminate();

  const double n = static_cast<double>(wall_ms.size());
  pt.step_ms = latency_stats(wall_ms);
  pt.compute_ms = (compute_sum - comm_sum) / n;
  pt.allreduce_ms = comm_sum / n;
  pt.host_ms = (wall_sum - compute_sum) / n;
  pt.decode_tokens_per_s = static_cast<double>(o.batch) * n / (wall_sum / 1e3);
  return pt;
}

Json points_json(const std::vector<ScalePoint>& points) {
  Json a = Json::array();
  for (const ScalePoint& p : points)
    a.push_back({{"tp", p.tp},
                 {"shard_device", p.shard_device},
                 {"decode_tokens_per_s", p.decode_tokens_per_s},
                 {"prefill_ms", p.prefill_ms},
                 {"step_ms",
                  {{"mean", p.step_ms.mean}, {"p50", p.step_ms.p50}, {"p90", p.step_ms.p90}, {"p99", p.step_ms.p99},
                   {"min", p.step_ms.min}, {"max", p.step_ms.max}}},
                 {"compute_ms", p.compute_ms},
                 {"allreduce_ms", p.allreduce_ms},
                 {"host_ms", p.host_ms},
                 {"speedup", p.speedup},
                 {"efficiency", p.efficiency}});
  return a;
}

}  // namespace

void compute_scaling(std::vector<ScalePoint>& points) {
  if (points.empty()) return;
  const ScalePoint base = points.front();
  for (ScalePoint& p : points) {
    p.speedup = base.decode_tokens_per_s > 0 ? p.decode_tokens_per_s / base.decode_tokens_per_s : 0;
    p.efficiency = p.speedup * static_cast<double>(base.tp) / static_cast<double>(p.tp);
  }
}

std::string format_scale_table(const std::vector<ScalePoint>& points, bool markdown) {
  const std::vector<std::string> head = {"TP",         "decode tok/s", "step p50 ms", "step p99 ms", "compute ms",
                                         "all-reduce ms", "host ms",   "prefill ms",  "speedup",     "efficiency"};
  std::vector<std::vector<std::string>> rows;
  for (const ScalePoint& p : points)
    rows.push_back({std::to_string(p.tp), fmt::format("{:.1f}", p.decode_tokens_per_s), fmt::format("{:.2f}", p.step_ms.p50),
                    fmt::format("{:.2f}", p.step_ms.p99), fmt::format("{:.2f}", p.compute_ms),
                    fmt::format("{:.2f}", p.allreduce_ms), fmt::format("{:.2f}", p.host_ms),
                    fmt::format("{:.1f}", p.prefill_ms), fmt::format("{:.2f}x", p.speedup),
                    fmt::format("{:.0f}%", p.efficiency * 100)});
  return format_table(head, rows, markdown, /*first_left=*/false);
}

Result<std::vector<int>> parse_tp_list(std::string_view text) {
  std::vector<int> out;
  std::set<int> seen;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t e = text.find(',', pos);
    if (e == std::string_view::npos) e = text.size();
    const std::string item(text.substr(pos, e - pos));
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 512)
      return Status::invalid_argument(fmt::format("--tp '{}': '{}' is not a TP degree in 1..512", text, item));
    if (!seen.insert(static_cast<int>(v)).second)
      return Status::invalid_argument(fmt::format("--tp '{}': {} appears twice", text, v));
    out.push_back(static_cast<int>(v));
    pos = e + 1;
    if (e == text.size()) break;
  }
  return out;
}

int run_scale_bench(const ScaleBenchOptions& o) {
  if (o.tp_list.empty()) return std::fprintf(stderr, "error: --tp lists no degree\n"), 1;
  if (o.batch < 1 || o.prompt_tokens < 1 || o.decode_steps < 1 || o.warmup_steps < 0)
    return std::fprintf(stderr, "error: --batch, --prompt-tokens and --decode-steps must be >= 1\n"), 1;
  // Quiet shards (warnings and errors only) unless the user chose a level; mpirun forwards it.
  ::setenv("TESSERA_LOG_LEVEL", "warn", /*overwrite=*/0);
  const LogLevel saved_level = log_level();
  if (saved_level < LogLevel::kWarn) set_log_level(LogLevel::kWarn);
  auto model = scale_model(o);
  if (!model.is_ok()) return std::fprintf(stderr, "error: %s\n", model.status().to_string().c_str()), 1;
  const MachineInfo before = machine_info();
  const std::string date = utc_date();
  std::vector<ScalePoint> points;
  for (int tp : o.tp_list) {
    std::fprintf(stderr, "TP %d: %d sequences, %d prompt tokens, %d decode steps ...\n", tp, o.batch, o.prompt_tokens,
                 o.decode_steps);
    auto p = measure(o, *model, tp);
    if (!p.is_ok()) return std::fprintf(stderr, "error: %s\n", p.status().to_string().c_str()), 1;
    points.push_back(std::move(*p));
  }
  set_log_level(saved_level);
  compute_scaling(points);
  const MachineInfo after = machine_info();
  std::fputs(format_scale_table(points, false).c_str(), stdout);
  std::fflush(stdout);

  const Json report = {{"kind", "scale"},
                       {"title", o.title},
                       {"date", date},
                       {"command", o.command_line},
                       {"machine",
                        {{"hostname", before.hostname},
                         {"cpu", before.cpu_model},
                         {"hardware_threads", before.hardware_threads},
                         {"load_average_1m", before.load_average_1m},
                         {"load_average_5m", before.load_average_5m}}},
                       {"config",
                        {{"model", *model},
                         {"batch", o.batch},
                         {"prompt_tokens", o.prompt_tokens},
                         {"decode_steps", o.decode_steps},
                         {"warmup_steps", o.warmup_steps},
                         {"threads_per_shard", o.threads},
                         {"device", o.device}}},
                       {"points", points_json(points)}};
  auto drawn = write_json_and_plots(report.dump() + "\n", o.json_path, o.plot_prefix, o.plots, o.install_plot_deps,
                                    "plot_scale.py", "-scaling.png", {"-scaling.png"});
  if (!drawn.is_ok()) return std::fprintf(stderr, "error: %s\n", drawn.status().to_string().c_str()), 1;
  const std::string plot = drawn->empty() ? std::string() : drawn->front();
  if (!o.markdown_path.empty()) {
    std::string md = fmt::format("## {} ({})\n\n", o.title.empty() ? "Tensor-parallel scaling" : o.title, date);
    md += fmt::format("- machine: {}\n", describe_machine(before));
    md += fmt::format("- load average after the run: {:.2f} (1 min), {:.2f} (5 min)\n", after.load_average_1m,
                      after.load_average_5m);
    md += fmt::format("- command: `{}`\n", o.command_line);
    md += fmt::format("- workload: model `{}`, {} sequences, {} prompt tokens, {} timed decode steps after {} warm-up "
                      "steps, device {}\n",
                      *model, o.batch, o.prompt_tokens, o.decode_steps, o.warmup_steps, o.device);
    for (const ScalePoint& p : points) md += fmt::format("- TP {}: rank 0 is {}\n", p.tp, p.shard_device);
    md += "\n" + format_scale_table(points, true) + "\n";
    if (!plot.empty()) {
      std::error_code ec;
      fs::path rel = fs::relative(fs::absolute(plot), fs::absolute(o.markdown_path).parent_path(), ec);
      if (ec || rel.empty()) rel = fs::absolute(plot);
      md += fmt::format("![scaling]({})\n\n", rel.string());
    }
    Status s = append_text_file(o.markdown_path, md);
    if (!s.is_ok()) return std::fprintf(stderr, "error: %s\n", s.to_string().c_str()), 1;
    std::printf("appended to %s\n", o.markdown_path.c_str());
  }
  return 0;
}

}  // namespace tessera
