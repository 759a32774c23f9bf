// `tessera tune`: from a request trace and an SLO to a scheduler profile, on the simulator
// (tune/simulator.h) driven by a step-time model fitted on the real engine (tune/step_model.h).
//
//   tessera tune --model M --card C [--tp N] (--trace T.jsonl | --lengths chat|docs|SPEC --rate R)
//                --slo ttft_p99=500ms,itl_p99=100ms --out PROFILE.json [--verify]
//   tessera tune calibrate --model M --card cpu --step-log steps.jsonl [...]   fit and store the step model
//   tessera tune simulate  --model M --card C (--trace | --lengths --rate) [knobs]   one setting, one table
//   tessera tune trace     --lengths chat --rate 4 --arrivals bursty --out T.jsonl  write a trace
//   tessera tune block-size --model M --card C (--lengths | --trace)               what --block-size auto picks
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/flags.h"
#include "engine/scheduler_config.h"
#include "server/server.h"
#include "server/server_cli.h"
#include "launch/commands.h"
#include "launch/measure_step.h"
#include "launch/tune_verify.h"
#include "model/weight_store.h"
#include "plan/hardware.h"
#include "plan/planner.h"
#include "tune/block_size.h"
#include "tune/simulator.h"
#include "tune/step_model.h"
#include "tune/trace.h"
#include "tune/tuner.h"

namespace tessera::cli {
namespace {

// Where the engine runs and what it holds: the model's plan on a card, its KV budget, and the
// step-time model (measured for this model x card x TP, else the roofline prior).
struct DeploymentArgs {
  std::string model;
  std::string precision;
  std::string card = "cpu";
  int tp = 1;
  std::string kv_dtype = "fp32";
  double headroom = 0.10;
  double kv_gb = 0;          // cap on the KV budget per rank; 0: 2 GiB on the CPU (as serve), the plan's room on a card
  int64_t kv_blocks = 0;     // overrides the budget: the pool's blocks at every block size tried
  std::string step_models;   // store; default <model>.steps.json
  bool prior = false;        // ignore the store
};

struct Deployment {
  Plan plan;
  StepTimeModel cost;
  int64_t kv_bytes = 0;
  uint64_t kv_bytes_per_token = 0;
  int64_t fixed_blocks = 0;
  int64_t blocks(int64_t block_size) const {
    return fixed_blocks > 0 ? fixed_blocks : kv_blocks_for(kv_bytes, kv_bytes_per_token, block_size);
  }
};

void add_deployment_flags(CLI::App& app, DeploymentArgs& d) {
  app.add_option("--model", d.model, "model file / HF directory, or a named shape (llama-2-70b, ...), as `tessera plan`");
  app.add_option("--precision", d.precision, "weight precision (default: as stored; a named shape needs one: INT4, ...)");
  app.add_option("--card", d.card, "cpu (this machine) or a card preset: A100-80GB, H100-80GB, ...")->capture_default_str();
  app.add_option("--tp", d.tp, "tensor-parallel ranks")->check(CLI::Range(1, 512))->capture_default_str();
  app.add_option("--kv-dtype", d.kv_dtype, "KV element type the pool is sized for")->capture_default_str();
  app.add_option("--headroom", d.headroom, "fraction of memory never planned for")->capture_default_str();
  app.add_option("--kv-gb", d.kv_gb, "KV budget per rank in GiB (default: 2 on the CPU as `serve`, else the plan's room)");
  app.add_option("--kv-blocks", d.kv_blocks, "KV pool blocks (overrides the budget; e.g. what a server reported)");
  app.add_option("--step-models", d.step_models, "step-model store (default: <model>.steps.json)");
  app.add_flag("--prior", d.prior, "use the planner's roofline prior even when a measured step model exists");
}

Result<Deployment> resolve_deployment(const DeploymentArgs& a) {
  if (a.model.empty()) return Status::invalid_argument("--model is required (a model file, or a named shape with --precision)");
  TESSERA_ASSIGN_OR_RETURN(PlanModel model, load_plan_model(a.model));
  PlanInput in;
  in.model = model.config;
  in.model_name = model.name;
  if (a.precision.empty() || a.precision == "stored") {
    if (!model.has_weights)
      return Status::invalid_argument(fmt::format("{} is a shape without weights: give --precision", a.model));
    in.weights = model.stored_layers;
    in.embeddings = model.stored_embeddings;
  } else {
    TESSERA_ASSIGN_OR_RETURN(in.weights, precision_preset(a.precision));
    in.embeddings = in.weights;
  }
  const bool cpu = a.card == "cpu" || a.card == "CPU";
  if (cpu) {
    TESSERA_ASSIGN_OR_RETURN(CpuProbe probe, probe_local_cpu({}));
    in.card = cpu_card(probe);
  } else {
    TESSERA_ASSIGN_OR_RETURN(in.card, card_preset(a.card));
  }
  TESSERA_ASSIGN_OR_RETURN(in.kv_dtype, parse_kv_dtype(a.kv_dtype));
  in.tp = a.tp;
  in.headroom = a.headroom;
  in.block_size = 16;
  in.context_length = model.config.max_positions;
  TESSERA_ASSIGN_OR_RETURN(Plan plan, make_plan(in));
  Deployment d;
  const MemoryBill& m = plan.memory;
  d.kv_bytes_per_token = m.window_pool ? m.kv_bytes_per_token_global : m.kv_bytes_per_token;
  int64_t budget = m.kv_room_bytes - static_cast<int64_t>(m.window_pool_bytes);
  const double cap_gb = a.kv_gb > 0 ? a.kv_gb : (cpu ? 2.0 : 0.0);
  if (cap_gb > 0) budget = std::min<int64_t>(budget > 0 ? budget : INT64_MAX, static_cast<int64_t>(cap_gb * (1ull << 30)));
  if (budget <= 0 && a.kv_blocks <= 0)
    return Status::resource_exhausted(fmt::format("{} on {} x{}: no memory left for the KV cache ({} bytes)", model.name,
                                                  in.card.name, a.tp, budget));
  d.kv_bytes = budget;
  d.fixed_blocks = a.kv_blocks;
  // The step model: measured for this card and TP when the store has it, else the prior.
  const std::string card_key = cpu ? "cpu" : in.card.name;
  const std::string store = !a.step_models.empty() ? a.step_models : step_model_path(a.model);
  bool found = false;
  if (!a.prior && model.has_weights) {
    auto models = load_step_models(store);
    if (models.is_ok()) {
      if (const StepTimeModel* m2 = find_step_model(*models, card_key, a.tp)) {
        d.cost = *m2;
        found = true;
      }
    } else if (models.status().code() != StatusCode::kNotFound) {
      return models.status();
    }
  }
  if (!found) {
    d.cost = prior_step_model(plan);
    d.cost.card = card_key;
  }
  d.plan = std::move(plan);
  return d;
}

// The trace: a file, or generated from a length mix and a rate.
struct TraceArgs {
  std::string trace;
  std::string lengths;
  double rate = 0;
  std::string arrivals = "poisson";
  int64_t num_requests = 1000;
  uint64_t seed = 1;
  int32_t priority_classes = 1;
};

void add_trace_flags(CLI::App& app, TraceArgs& t) {
  app.add_option("--trace", t.trace, "JSONL of {arrival_s, prompt_tokens, output_tokens[, priority]}");
  app.add_option("--lengths", t.lengths, "length mix: chat, docs, docs-2k, PROMPT/OUTPUT (lognormal:512,0.5/64) or MIX*W+MIX*W (chat*0.9+docs-2k*0.1)");
  app.add_option("--rate", t.rate, "requests per second (with --lengths)");
  app.add_option("--arrivals", t.arrivals, "poisson, bursty, bursty:CV or fixed")->capture_default_str();
  app.add_option("--num-requests,-n", t.num_requests, "requests to generate")->capture_default_str();
  app.add_option("--seed", t.seed, "trace seed")->capture_default_str();
  app.add_option("--priority-classes", t.priority_classes, "generated priorities uniform in [0, N)")->capture_default_str();
}

Result<std::vector<SimRequest>> resolve_trace(const TraceArgs& t) {
  if (!t.trace.empty()) {
    if (!t.lengths.empty() || t.rate > 0) return Status::invalid_argument("--trace and --lengths/--rate are exclusive");
    return load_sim_trace(t.trace);
  }
  if (t.lengths.empty() || !(t.rate > 0))
    return Status::invalid_argument("give --trace FILE, or --lengths chat|docs|SPEC with --rate R");
  TraceSpec s;
  TESSERA_ASSIGN_OR_RETURN(s.lengths, parse_length_mix(t.lengths));
  TESSERA_ASSIGN_OR_RETURN(s.arrivals, ArrivalSpec::parse(t.arrivals));
  s.rate = t.rate;
  s.num_requests = t.num_requests;
  s.seed = t.seed;
  s.priority_classes = t.priority_classes;
  return generate_trace(s);
}

// "ttft_p99=500ms,itl_p99=100ms" (and the load generator's ttft=, itl=, e2e=).
// "ttft_p99=500ms,itl_p99=100ms": P99 targets over the run; a request counts for goodput when its
// TTFT is within the TTFT target and the P99 of its own gaps within the ITL one (SloSpec's
// itl_p99). "ttft" and "itl" alone mean the same here.
Result<SloSpec> parse_tune_slo(std::string spec) {
  size_t p;
  while ((p = spec.find("ttft_p99")) != std::string::npos) spec.erase(p + 4, 4);
  auto slo = SloSpec::parse(spec);
  if (slo.is_ok() && slo->itl_s) slo->itl_per_gap = true;
  return slo;
}

void print_summary_row(const char* tag, const RunSummary& s, int64_t preemptions) {
  std::printf("%-10s %9.1f %7.2f %8.2f %9.0f %9.0f %8.1f %8.1f %7lld\n", tag, s.output_token_throughput,
              s.request_throughput, s.goodput, s.ttft.p50 * 1e3, s.ttft.p99 * 1e3, s.itl.p50 * 1e3, s.itl.p99 * 1e3,
              static_cast<long long>(preemptions));
}

void print_summary_header() {
  std::printf("%-10s %9s %7s %8s %9s %9s %8s %8s %7s\n", "", "out tok/s", "req/s", "goodput", "TTFT p50", "TTFT p99",
              "ITL p50", "ITL p99", "preempt");
}

std::string summary_json(const RunSummary& s, int64_t preemptions) {
  nlohmann::json j{{"completed", s.completed},
                   {"failed", s.failed},
                   {"duration_s", s.duration_s},
                   {"output_tok_s", s.output_token_throughput},
                   {"req_s", s.request_throughput},
                   {"goodput", s.goodput},
                   {"ttft_p50_s", s.ttft.p50},
                   {"ttft_p99_s", s.ttft.p99},
                   {"itl_p50_s", s.itl.p50},
                   {"itl_p99_s", s.itl.p99},
                   {"e2e_p50_s", s.e2e.p50},
                   {"e2e_p99_s", s.e2e.p99},
                   {"preemptions", preemptions}};
  return j.dump();
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return Status::io_error(fmt::format("{}: cannot write", path));
  out << text;
  return out ? Status::ok() : Status::io_error(fmt::format("{}: write failed", path));
}

std::vector<TraceEntry> to_load_trace(const std::vector<SimRequest>& trace) {
  std::vector<TraceEntry> out;
  for (const SimRequest& r : trace) out.push_back({r.prompt_tokens, r.output_tokens, r.arrival_s});
  return out;
}

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("tessera") : p.string();
}

// ---- calibrate ----

struct CalibrateArgs {
  DeploymentArgs dep;
  std::vector<std::string> logs;
  std::string out;
  std::string measure_blocks = "auto";  // auto: on for the CPU card
  int64_t block_context = 4096;
  int threads = 0;
};

// The block term measured apart: decode steps of 8 sequences at one context, KV blocks of 16 and
// of 256 tokens, three rounds alternating after a warm-up (a shared machine's drift hits both
// sizes alike); the median of the rounds' differences over the difference in block-table entries
// walked, >= 0.
Result<double> measure_per_block(const CalibrateArgs& a) {
  TESSERA_ASSIGN_OR_RETURN(auto store, WeightStore::open(a.dep.model));
  MeasureArgs m;
  m.model = a.dep.model;
  m.tp = a.dep.tp;
  m.threads = a.threads;
  m.batch = 8;
  m.steps = 8;
  TESSERA_ASSIGN_OR_RETURN(m.kv_dtype, parse_kv_dtype(a.dep.kv_dtype));
  const int64_t context = std::min<int64_t>(a.block_context, store->config().max_positions - m.steps - 8);
  constexpr int64_t kSmall = 16, kLarge = 256;
  if (context < 2 * kLarge)
    return Status::invalid_argument(fmt::format(
        "--measure-blocks: the model's {} positions leave no context long enough to tell blocks of {} from {}",
        store->config().max_positions, kSmall, kLarge));
  m.block_size = kSmall;  // a warm-up run: the first one in a process pays the weights' page-in
  TESSERA_RETURN_IF_ERROR(measure_decode_steps(m, context).status());
  std::vector<double> diffs;
  for (int round = 0; round < 3; ++round) {
    double t[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      m.block_size = (round + k) % 2 == 0 ? kSmall : kLarge;  // alternate which size goes first
      TESSERA_ASSIGN_OR_RETURN(Measured r, measure_decode_steps(m, context));
      t[m.block_size == kSmall ? 0 : 1] = r.step_median_s;
    }
    diffs.push_back(t[0] - t[1]);
    std::printf("  blocks measured apart, round %d: %lld-token context, %lld sequences: block %lld %.3f ms, "
                "block %lld %.3f ms\n",
                round + 1, static_cast<long long>(context), static_cast<long long>(m.batch),
                static_cast<long long>(kSmall), t[0] * 1e3, static_cast<long long>(kLarge), t[1] * 1e3);
  }
  std::sort(diffs.begin(), diffs.end());
  // Block-table entries one decode step walks at each size (step_features.h: ceil((s + 1) / block)).
  const auto entries = [&](int64_t block) { return m.batch * ((context + 1 + block - 1) / block); };
  return std::max(0.0, diffs[1]) / static_cast<double>(entries(kSmall) - entries(kLarge));
}

int run_calibrate(const CalibrateArgs& a) {
  std::vector<StepRecord> steps;
  for (const std::string& path : a.logs) {
    auto s = load_step_log(path);
    if (!s.is_ok()) return fail(s.status().to_string());
    steps.insert(steps.end(), s->begin(), s->end());
  }
  const bool cpu = a.dep.card == "cpu" || a.dep.card == "CPU";
  std::optional<double> per_block;
  if (a.measure_blocks == "on" || (a.measure_blocks == "auto" && cpu)) {
    if (!cpu) return fail("--measure-blocks on: the block measurement runs on this machine's CPU (--card cpu)");
    auto measured = measure_per_block(a);
    if (measured.is_ok()) {
      per_block = *measured;
    } else if (a.measure_blocks == "on" || measured.status().code() != StatusCode::kInvalidArgument) {
      return fail(measured.status().to_string());
    } else {  // auto, a model too short to tell the block sizes apart: the block term from the logs
      std::printf("  blocks not measured apart (%s): the block term is fitted on the step logs\n",
                  std::string(measured.status().message()).c_str());
    }
  }
  auto model = fit_step_model(steps, std::filesystem::path(a.dep.model).filename().string(), cpu ? "cpu" : a.dep.card,
                              a.dep.tp, per_block);
  if (!model.is_ok()) return fail(model.status().to_string());
  std::fputs(format_step_model(*model).c_str(), stdout);
  const std::string store = !a.out.empty() ? a.out : step_model_path(a.dep.model);
  Status s = save_step_model(store, *model);
  if (!s.is_ok()) return fail(s.to_string());
  std::printf("stored in %s\n", store.c_str());
  return 0;
}

// ---- simulate ----

struct SimulateArgs {
  DeploymentArgs dep;
  TraceArgs trace;
  SchedulerFlags scheduler;
  int64_t block_size = 0;
  std::string slo;
  std::string json;
  double overhead_ms = 0;
  bool no_jitter = false;
  uint64_t sim_seed = 1;
  double level = 1.0;
  std::string level_from;
};

int run_simulate(const SimulateArgs& a) {
  auto dep = resolve_deployment(a.dep);
  if (!dep.is_ok()) return fail(dep.status().to_string());
  auto trace = resolve_trace(a.trace);
  if (!trace.is_ok()) return fail(trace.status().to_string());
  SchedulerConfig c;
  if (Status s = a.scheduler.apply(c); !s.is_ok()) return fail(s.to_string());
  auto slo = parse_tune_slo(a.slo);
  if (!slo.is_ok()) return fail(slo.status().to_string());
  SimOptions o;
  o.scheduler = c;
  o.block_size = a.block_size > 0 ? a.block_size : (c.block_size > 0 ? c.block_size : 16);
  o.num_blocks = dep->blocks(o.block_size);
  o.cost = dep->cost;
  o.slo = *slo;
  o.request_overhead_s = a.overhead_ms * 1e-3;
  o.keep_requests = false;
  o.jitter = !a.no_jitter;
  o.seed = a.sim_seed;
  o.level = a.level;
  if (!a.level_from.empty()) {
    auto log = load_step_log(a.level_from);
    if (!log.is_ok()) return fail(log.status().to_string());
    auto level = step_level(o.cost, *log);
    if (!level.is_ok()) return fail(fmt::format("--level-from {}: {}", a.level_from, level.status().message()));
    o.level = *level;
  }
  auto r = simulate(*trace, o);
  if (!r.is_ok()) return fail(r.status().to_string());
  std::fputs(format_step_model(dep->cost).c_str(), stdout);
  std::printf("%s, block %lld, %lld KV blocks; %zu requests simulated in %.2f s (%lld steps)\n",
              format_scheduler_config(c).c_str(), static_cast<long long>(o.block_size),
              static_cast<long long>(o.num_blocks), trace->size(), r->sim_wall_s, static_cast<long long>(r->steps));
  print_summary_header();
  print_summary_row("simulated", r->summary, r->preemptions);
  if (o.level != 1.0) std::printf("steps at %.3f x the model's time (--level%s)\n", o.level, a.level_from.empty() ? "" : "-from");
  std::printf("mean batch %.1f, mean step tokens %.1f, busy %.0f%%, fragmentation %.1f%%, peak KV use %.1f%%\n",
              r->mean_batch, r->mean_step_tokens, 100 * r->busy_fraction, 100 * r->mean_fragmentation,
              100 * r->peak_kv_usage);
  if (!a.json.empty()) {
    nlohmann::json j = nlohmann::json::parse(summary_json(r->summary, r->preemptions));
    j["steps"] = r->steps;
    j["mean_batch"] = r->mean_batch;
    j["mean_fragmentation"] = r->mean_fragmentation;
    j["block_size"] = o.block_size;
    j["level"] = o.level;
    j["kv_blocks"] = o.num_blocks;
    j["step_model"] = nlohmann::json::parse(step_model_to_json(dep->cost));
    if (Status s = write_file(a.json, j.dump(2) + "\n"); !s.is_ok()) return fail(s.to_string());
  }
  return 0;
}

// ---- trace ----

struct TraceCmdArgs {
  TraceArgs trace;
  std::string out;
};

int run_trace(const TraceCmdArgs& a) {
  auto t = resolve_trace(a.trace);
  if (!t.is_ok()) return fail(t.status().to_string());
  if (Status s = save_sim_trace(a.out, *t); !s.is_ok()) return fail(s.to_string());
  const TraceLengthStats st = trace_length_stats(*t);
  std::printf("%s: %zu requests over %.1f s (%.2f req/s), mean prompt %.0f, mean output %.0f tokens\n", a.out.c_str(),
              t->size(), t->back().arrival_s, st.offered_rate, st.mean_prompt, st.mean_output);
  return 0;
}

// ---- block-size ----

struct BlockSizeArgs {
  DeploymentArgs dep;
  TraceArgs trace;
  int64_t max_batch = 32;
  bool markdown = false;
};

int run_block_size(BlockSizeArgs a) {
  auto dep = resolve_deployment(a.dep);
  if (!dep.is_ok()) return fail(dep.status().to_string());
  if (a.trace.trace.empty() && a.trace.rate <= 0) a.trace.rate = 1;  // lengths only: any rate
  auto trace = resolve_trace(a.trace);
  if (!trace.is_ok()) return fail(trace.status().to_string());
  auto c = choose_block_size(*trace, dep->cost, a.max_batch);
  if (!c.is_ok()) return fail(c.status().to_string());
  std::fputs(format_step_model(dep->cost).c_str(), stdout);
  std::fputs(format_block_size_choice(*c, a.markdown).c_str(), stdout);
  std::printf("%s\n", c->reason.c_str());
  return 0;
}

// ---- tune ----

struct TuneArgs {
  DeploymentArgs dep;
  TraceArgs trace;
  std::string slo;
  double slo_margin = 0.15;
  std::string out;
  std::string table;
  std::string json;
  std::string plot;
  int threads = 0;
  bool quick = false;
  bool verify = false;
  int verify_top = 2;
  std::string verify_trace;
  std::vector<std::string> serve_args;
  std::string verify_dir;
};

int run_tune_main(const TuneArgs& a) {
  auto dep = resolve_deployment(a.dep);
  if (!dep.is_ok()) return fail(dep.status().to_string());
  auto trace = resolve_trace(a.trace);
  if (!trace.is_ok()) return fail(trace.status().to_string());
  auto slo = parse_tune_slo(a.slo);
  if (!slo.is_ok()) return fail(slo.status().to_string());
  if (slo->empty()) return fail("--slo: give a target, e.g. ttft_p99=500ms,itl_p99=100ms");
  if (a.out.empty()) return fail("--out PROFILE.json is required");
  TuneOptions o;
  o.kv_bytes = dep->kv_bytes;
  o.kv_bytes_per_token = dep->kv_bytes_per_token;
  if (dep->fixed_blocks > 0) {
    // A fixed pool: express it as a budget at 16-token blocks, so every block size holds as many tokens.
    o.kv_bytes_per_token = 1;
    o.kv_bytes = dep->fixed_blocks * 16;
  }
  o.cost = dep->cost;
  o.slo = *slo;
  o.slo_margin = a.slo_margin;
  o.threads = a.threads;
  int32_t classes = 1;
  for (const SimRequest& r : *trace) classes = std::max(classes, r.priority + 1);
  o.base.priority_classes = std::max(2, classes);
  if (a.quick) {
    o.max_batch = {8, 32};
    o.max_step_tokens = {512, 2048};
    o.max_wait_ms = {0, 20};
    o.block_sizes = {16, 64};
    o.prefill_chunk = {256, 512};
  }
  std::fputs(format_step_model(dep->cost).c_str(), stdout);
  const TraceLengthStats st = trace_length_stats(*trace);
  std::printf("trace: %zu requests, %.2f req/s offered, mean prompt %.0f, mean output %.0f tokens; KV budget %.2f GiB\n",
              trace->size(), st.offered_rate, st.mean_prompt, st.mean_output,
              static_cast<double>(o.kv_bytes) / (1ull << 30));
  auto r = run_tune(*trace, o);
  if (!r.is_ok()) return fail(r.status().to_string());
  const std::string table = format_tune_table(*r, *slo, false);
  std::fputs(table.c_str(), stdout);
  std::printf("%zu settings simulated in %.1f s\n", r->candidates.size(), r->sim_seconds);
  const TuneCandidate& best = r->candidates[r->recommended];
  const std::string comment = fmt::format(
      "tessera tune: {} for SLO {} on {} ({} requests, {:.2f} req/s); simulated goodput {:.2f} req/s, P99 TTFT {:.0f} ms{}",
      dep->cost.model, slo->to_string(), dep->cost.card, trace->size(), st.offered_rate, best.result.summary.goodput,
      best.result.summary.ttft.p99 * 1e3, r->meets_slo ? "" : " (no setting met the SLO: the best goodput)");
  if (Status s = write_file(a.out, tuned_profile_json(best, comment)); !s.is_ok()) return fail(s.to_string());
  std::printf("recommended: %s%s\nwrote %s (serve --scheduler-config %s)\n", best.label.c_str(),
              r->meets_slo ? "" : " (NO setting met the SLO)", a.out.c_str(), a.out.c_str());
  if (!a.table.empty())
    if (Status s = write_file(a.table, format_tune_table(*r, *slo, true)); !s.is_ok()) return fail(s.to_string());
  std::string json_path = a.json;
  if (json_path.empty() && !a.plot.empty()) json_path = a.plot + ".json";
  if (!json_path.empty())
    if (Status s = write_file(json_path, tune_candidates_json(*r, *slo)); !s.is_ok()) return fail(s.to_string());
  if (!a.plot.empty()) {
    // The checkout's .venv has matplotlib once any plot was made (bench serve installs it).
    const std::string venv = std::string(TESSERA_SOURCE_DIR) + "/.venv/bin/python";
    const std::string python = std::filesystem::exists(venv) ? venv : "python3";
    const std::string cmd = fmt::format("{} {}/tools/plot_tune.py {} {}.png", python, TESSERA_SOURCE_DIR, json_path, a.plot);
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "warning: the plot failed (%s)\n", cmd.c_str());
  }
  if (!a.verify) return 0;

  // The top candidates and the two built-in profiles on the real engine, on a held-out trace.
  std::vector<SimRequest> held;
  if (!a.verify_trace.empty()) {
    auto h = load_sim_trace(a.verify_trace);
    if (!h.is_ok()) return fail(h.status().to_string());
    held = std::move(*h);
  } else {
    TraceArgs t = a.trace;
    t.seed += 1000;
    auto h = resolve_trace(t);
    if (!h.is_ok()) return fail("--verify: a held-out trace needs --lengths/--rate or --verify-trace: " +
                                h.status().to_string());
    held = std::move(*h);
  }
  std::vector<size_t> order(r->candidates.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const TuneCandidate &cx = r->candidates[x], &cy = r->candidates[y];
    if (cx.meets_slo != cy.meets_slo) return cx.meets_slo;
    return cx.result.summary.goodput > cy.result.summary.goodput;
  });
  std::vector<size_t> runs = {r->recommended};
  for (size_t i : order)
    if (static_cast<int>(runs.size()) < a.verify_top && i != r->recommended &&
        r->candidates[i].scheduler.profile == "tuned")
      runs.push_back(i);
  for (size_t i : r->builtin) runs.push_back(i);
  const std::string dir = a.verify_dir.empty() ? a.out + ".verify" : a.verify_dir;
  std::filesystem::create_directories(dir);
  VerifyOptions vo;
  vo.tessera_exe = self_exe();
  vo.model = a.dep.model;
  vo.serve_args = a.serve_args;
  vo.trace = to_load_trace(held);
  vo.slo = *slo;
  std::printf("\nverify on the real engine: %zu held-out requests, %zu settings\n", held.size(), runs.size());
  std::printf("%-44s %9s %7s %8s %9s %9s %8s %8s %4s\n", "setting", "out tok/s", "req/s", "goodput", "TTFT p50",
              "TTFT p99", "ITL p50", "ITL p99", "SLO");
  nlohmann::json vj = nlohmann::json::array();
  for (size_t k = 0; k < runs.size(); ++k) {
    const TuneCandidate& c = r->candidates[runs[k]];
    const std::string name = c.scheduler.profile == "tuned" ? (runs[k] == r->recommended ? "recommended" : fmt::format("candidate{}", k))
                                                            : c.scheduler.profile;
    const std::string profile = fmt::format("{}/{}.json", dir, name);
    if (Status s = write_file(profile, tuned_profile_json(c, c.label)); !s.is_ok()) return fail(s.to_string());
    vo.log_path = fmt::format("{}/{}.log", dir, name);
    auto real = run_profile_on_engine(vo, profile, c.block_size);
    if (!real.is_ok()) return fail(fmt::format("--verify {}: {}", name, real.status().to_string()));
    const bool ok = meets_p99_slo(*real, *slo);
    std::printf("%-44s %9.1f %7.2f %8.2f %9.0f %9.0f %8.1f %8.1f %4s\n", (name + ": " + c.label).substr(0, 44).c_str(),
                real->output_token_throughput, real->request_throughput, real->goodput, real->ttft.p50 * 1e3,
                real->ttft.p99 * 1e3, real->itl.p50 * 1e3, real->itl.p99 * 1e3, ok ? "yes" : "no");
    std::fflush(stdout);
    vj.push_back({{"name", name}, {"label", c.label}, {"meets_slo", ok},
                  {"real", nlohmann::json::parse(summary_json(*real, 0))},
                  {"simulated", nlohmann::json::parse(summary_json(c.result.summary, c.result.preemptions))}});
  }
  if (Status s = write_file(dir + "/verify.json", vj.dump(2) + "\n"); !s.is_ok()) return fail(s.to_string());
  return 0;
}

}  // namespace

Status resolve_auto_block_size(ServerOptions& o) {
  if (!o.block_size_auto) return Status::ok();
  std::vector<SimRequest> mix;
  if (!o.expected_trace.empty()) {
    TESSERA_ASSIGN_OR_RETURN(mix, load_sim_trace(o.expected_trace));
  } else {
    TraceSpec spec;
    TESSERA_ASSIGN_OR_RETURN(spec.lengths, parse_length_mix(o.expected_lengths));
    spec.num_requests = 4000;
    TESSERA_ASSIGN_OR_RETURN(mix, generate_trace(spec));
  }
  DeploymentArgs d;
  d.model = o.model_path;
  d.tp = o.tp;
  // A measured model for this TP: the CPU's when the shards run there, else any card's.
  std::string card = "cpu";
  if (o.shard.device != "cpu") {
    if (auto models = load_step_models(step_model_path(o.model_path)); models.is_ok())
      for (const StepTimeModel& m : *models)
        if (m.tp == o.tp && m.card != "cpu") card = m.card;
  }
  d.card = card;
  TESSERA_ASSIGN_OR_RETURN(Deployment dep, resolve_deployment(d));
  TESSERA_ASSIGN_OR_RETURN(BlockSizeChoice choice, choose_block_size(mix, dep.cost, o.scheduler.max_batch));
  o.block_size = choice.block_size;
  o.block_size_auto = false;
  o.block_size_source = "auto";
  o.block_size_reason = fmt::format("{} for {}", choice.reason,
                                    o.expected_trace.empty() ? "--expected-lengths " + o.expected_lengths
                                                             : "--expected-trace " + o.expected_trace);
  std::fprintf(stderr, "--block-size auto:\n%s%s\n", format_block_size_choice(choice, false).c_str(),
               o.block_size_reason.c_str());
  return Status::ok();
}

Runner add_tune_command(CLI::App& app) {
  app.require_subcommand(0, 1);
  auto t = std::make_shared<TuneArgs>();
  add_deployment_flags(app, t->dep);
  add_trace_flags(app, t->trace);
  app.add_option("--slo", t->slo, "targets: ttft_p99=500ms,itl_p99=100ms (P99 TTFT, P99 inter-token; goodput per request)");
  app.add_option("--slo-margin", t->slo_margin,
                 "a simulated candidate meets the SLO within targets x (1 - margin): the simulator's P99 error")
      ->capture_default_str();
  app.add_option("--out", t->out, "write the recommended profile here (scheduler-config JSON for serve)");
  app.add_option("--table", t->table, "also write the Pareto table as markdown");
  app.add_option("--json", t->json, "every simulated setting as JSON");
  app.add_option("--plot", t->plot, "PNG of throughput against P99 TTFT (PREFIX.png; needs matplotlib)");
  app.add_option("--threads", t->threads, "simulation threads (0: all cores)");
  app.add_flag("--quick", t->quick, "a small grid (for tests)");
  app.add_flag("--verify", t->verify, "run the recommendation, the runner-up and the built-in profiles on the real engine");
  app.add_option("--verify-top", t->verify_top, "tuned settings to verify")->capture_default_str();
  app.add_option("--verify-trace", t->verify_trace, "held-out trace for --verify (default: the spec with seed + 1000)");
  app.add_option("--serve-arg", t->serve_args, "an extra flag for the verifying `tessera serve` (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--verify-dir", t->verify_dir, "profiles and server logs of --verify (default: OUT.verify)");

  auto c = std::make_shared<CalibrateArgs>();
  CLI::App* cal = app.add_subcommand("calibrate", "Fit the step-time model on `serve --step-log` files and store it");
  add_deployment_flags(*cal, c->dep);
  cal->add_option("--step-log", c->logs, "step log(s) from `tessera serve --step-log`")->required();
  cal->add_option("--out", c->out, "store (default: <model>.steps.json)");
  cal->add_option("--measure-blocks", c->measure_blocks,
                  "time decode steps at KV blocks of 16 and 256 tokens (alternating) and take the block term from "
                  "them instead of the step logs: auto (on for --card cpu), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cal->add_option("--block-context", c->block_context, "the context of --measure-blocks' decode steps")
      ->check(CLI::Range(int64_t{512}, int64_t{1} << 20))
      ->capture_default_str();
  cal->add_option("--threads", c->threads, "CPU threads of --measure-blocks (0: all)")->capture_default_str();

  auto s = std::make_shared<SimulateArgs>();
  CLI::App* sim = app.add_subcommand("simulate", "Run one setting on the simulator");
  add_deployment_flags(*sim, s->dep);
  add_trace_flags(*sim, s->trace);
  s->scheduler.add_to(*sim);
  sim->add_option("--block-size", s->block_size, "KV block size (default: the config's, else 16)");
  sim->add_option("--slo", s->slo, "for goodput: ttft_p99=...,itl_p99=...");
  sim->add_option("--json", s->json, "write the summary as JSON");
  sim->add_flag("--no-jitter", s->no_jitter, "every step takes the model's prediction (no measured jitter)");
  sim->add_option("--sim-seed", s->sim_seed, "seed of the simulated step jitter")->capture_default_str();
  sim->add_option("--level", s->level, "every step's time x this: the machine against the calibration (1.15: 15% slower)")
      ->check(CLI::PositiveNumber);
  sim->add_option("--level-from", s->level_from,
                  "a `serve --step-log` of a real run: simulate at the level it ran at (median measured / predicted)")
      ->excludes("--level");
  sim->add_option("--overhead-ms", s->overhead_ms, "client round trip outside the engine, added to TTFT")->capture_default_str();

  auto tr = std::make_shared<TraceCmdArgs>();
  CLI::App* trc = app.add_subcommand("trace", "Write a generated trace as JSONL (for bench serve --trace and tune --trace)");
  add_trace_flags(*trc, tr->trace);
  trc->add_option("--out", tr->out, "JSONL path")->required();

  auto b = std::make_shared<BlockSizeArgs>();
  CLI::App* bs = app.add_subcommand("block-size", "What --block-size auto picks for a length mix, and why");
  add_deployment_flags(*bs, b->dep);
  add_trace_flags(*bs, b->trace);
  bs->add_option("--max-batch", b->max_batch, "decode batch of the step compared")->capture_default_str();
  bs->add_flag("--markdown", b->markdown, "markdown table");

  return [&app, cal, sim, trc, bs, t, c, s, tr, b]() -> int {
    if (cal->parsed()) return run_calibrate(*c);
    if (sim->parsed()) return run_simulate(*s);
    if (trc->parsed()) return run_trace(*tr);
    if (bs->parsed()) return run_block_size(*b);
    return run_tune_main(*t);
  };
}

}  // namespace tessera::cli
