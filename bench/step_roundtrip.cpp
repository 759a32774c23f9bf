// tessera-bench-step: the control plane's cost. Starts TP shards (mpirun for TP > 1) and a
// ShardGroup in this process, then measures
//   1. the coordinator -> shards -> coordinator round trip of an empty step, and
//   2. real decode steps: wall time per step beside the shards' own compute time, whose
//      difference is the per-step overhead (transport, encoding, scheduling, wake-ups).
// Prints a markdown table; --out appends it, with the machine, command and date, to a file.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <thread>

#include "server/shard_group.h"
#include "server/shard_launcher.h"
#include "common/env.h"
#include "common/logging.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

struct Summary {
  double mean = 0, p50 = 0, p99 = 0, min = 0;
};

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  s.p50 = v[v.size() / 2];
  s.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  s.min = v.front();
  return s;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

struct Args {
  std::string model;
  int tp = 2;
  int steps = 2000;
  int decode_steps = 200;
  int batch = 8;
  std::string out;
};

int run(const Args& a, const std::string& command_line) {
  set_log_level(LogLevel::kWarn);
  ShardGroupOptions go;
  go.world_size = a.tp;
  go.endpoint = "ipc:///tmp/tessera-bench-" + std::to_string(::getpid()) + ".ctl";
  go.max_blocks = 4096;
  auto group = ShardGroup::create(go);
  if (!group.is_ok()) {
    std::fprintf(stderr, "error: %s\n", group.status().to_string().c_str());
    return 1;
  }
  ShardLaunchSpec spec;
  spec.shard_binary = sibling_executable("tessera-shard");
  spec.model_path = a.model;
  spec.coordinator_endpoint = (*group)->endpoint();
  spec.tp = a.tp;
  spec.runtime.device = "cpu";
  auto child = ChildProcess::spawn(build_shard_command(spec));
  if (!child.is_ok()) {
    std::fprintf(stderr, "error: %s\n", child.status().to_string().c_str());
    return 1;
  }
  Status s = (*group)->start([&] {
    return child->running() ? Status::ok() : Status::unavailable("shards exited during start-up");
  });
  if (!s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
    return 1;
  }
  ShardGroup& g = **group;

  // 1. Empty steps.
  std::vector<double> empty_us;
  for (int i = 0; i < a.steps + 100; ++i) {
    const auto t0 = Clock::now();
    auto r = g.run_step(StepPlan{});
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (!r.is_ok()) {
      std::fprintf(stderr, "error: %s\n", r.status().to_string().c_str());
      return 1;
    }
    if (i >= 100) empty_us.push_back(us);
  }

  // 2. Decode steps of `batch` sequences (prompt of 16 tokens each, greedy).
  StepPlan plan;
  std::vector<int64_t> known(static_cast<size_t>(a.batch), 16);
  int32_t next_block = 0;
  const int64_t bs = g.plan().block_size;
  for (int i = 0; i < a.batch; ++i) {
    NewSequence n;
    n.seq_id = static_cast<uint64_t>(i + 1);
    for (int t = 0; t < 16; ++t) n.prompt_ids.push_back(1 + (i * 7 + t * 13) % 200);
    n.sampling.temperature = 0.0f;
    n.sampling.has_seed = true;
    plan.new_sequences.push_back(n);
    ScheduledSequence q{n.seq_id, 0, 16, true, {}, false};
    for (int64_t b = 0; b < (16 + 1 + a.decode_steps + bs - 1) / bs; ++b) q.append_blocks.push_back(next_block++);
    plan.scheduled.push_back(q);
  }
  auto prefill = g.run_step(plan);
  if (!prefill.is_ok()) {
    std::fprintf(stderr, "error: %s\n", prefill.status().to_string().c_str());
    return 1;
  }
  std::vector<double> wall_us, compute_us, comm_us;
  for (int step = 0; step < a.decode_steps; ++step) {
    StepPlan d;
    for (int i = 0; i < a.batch; ++i) {
      d.scheduled.push_back({static_cast<uint64_t>(i + 1), known[static_cast<size_t>(i)], 1, true, {}, false});
      ++known[static_cast<size_t>(i)];
    }
    const auto t0 = Clock::now();
    auto r = g.run_step(d);
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (!r.is_ok()) {
      std::fprintf(stderr, "error: %s\n", r.status().to_string().c_str());
      return 1;
    }
    wall_us.push_back(us);
    compute_us.push_back(static_cast<double>(r->compute_micros));
    comm_us.push_back(static_cast<double>(r->comm_micros));
  }
  g.shutdown("benchmark done");
  child->wait_for(std::chrono::milliseconds(5000));

  const Summary e = summarize(empty_us), w = summarize(wall_us), c = summarize(compute_us), m = summarize(comm_us);
  std::vector<double> overhead;
  for (size_t i = 0; i < wall_us.size(); ++i) overhead.push_back(wall_us[i] - compute_us[i]);
  const Summary o = summarize(overhead);
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::ostringstream t;
  t << "## Control-plane round trip, TP " << a.tp << " (" << date << ")\n\n"
    << "- machine: " << host << ", " << cpu_model() << ", " << std::thread::hardware_concurrency() << " hardware threads\n"
    << "- command: `" << command_line << "`\n"
    << "- model for decode steps: `" << a.model << "`, " << a.batch << " sequences per step\n\n"
    << "| measure | mean µs | p50 µs | p99 µs | min µs |\n|---|---|---|---|---|\n";
  auto row = [&](const char* name, const Summary& x) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "| %s | %.1f | %.1f | %.1f | %.1f |\n", name, x.mean, x.p50, x.p99, x.min);
    t << buf;
  };
  row("empty step round trip", e);
  row("decode step, coordinator wall", w);
  row("decode step, rank 0 compute (incl. collectives)", c);
  row("decode step, rank 0 in collectives", m);
  row("decode step overhead (wall - compute)", o);
  t << "\n";
  std::fputs(t.str().c_str(), stdout);
  if (!a.out.empty()) {
    std::ofstream f(a.out, std::ios::app);
    f << t.str();
  }
  return 0;
}

// stories260K from the reference test data: $TESSERA_TESTDATA, else the copy the build unpacks
// from tests/data/ beside this program (<build>/bin/../testdata).
std::string default_model() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string built = (exe.parent_path().parent_path() / "testdata").string();
  return testdata_dir(built) + "/stories260K/stories260K-f32.gguf";
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::Args a;
  a.model = tessera::default_model();
  CLI::App app{"tessera-bench-step: control-plane round trip and per-step overhead"};
  app.add_option("--model", a.model, "model for the decode steps")->capture_default_str();
  app.add_option("--tp", a.tp)->capture_default_str();
  app.add_option("--steps", a.steps, "empty steps to time")->capture_default_str();
  app.add_option("--decode-steps", a.decode_steps)->capture_default_str();
  app.add_option("--batch", a.batch, "sequences per decode step")->capture_default_str();
  app.add_option("--out", a.out, "append the table to this file");
  CLI11_PARSE(app, argc, argv);
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  return tessera::run(a, cmd);
}
