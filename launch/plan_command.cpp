// `tessera plan`: the memory bill and predicted decode-step time of a deployment (plan/README.md),
// and with --measure the same configuration run on this machine's CPU, measured beside the
// prediction.
//
// --measure runs the engine in this process (launch/measure_step.h): decode steps of `batch`
// sequences at the decode context, timed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "common/mapped_file.h"
#include "plan/hardware.h"
#include "plan/planner.h"
#include "engine/scheduler_config.h"
#include "cli/default_model.h"
#include "cli/flags.h"
#include "eval/report.h"
#include "grammar/grammar.h"
#include "grammar/mask_cost.h"
#include "launch/commands.h"
#include "launch/measure_step.h"
#include "tokenizer/tokenizer.h"

namespace tessera::cli {
namespace {

struct PlanArgs {
  std::string model;
  std::string precision;        // empty: as stored in the model file
  std::string embed_precision;  // empty: as --precision
  std::string quality_report;   // empty: <model>.eval.json when it exists
  KvDtypeFlag kv_dtype;  // auto unless given
  int tp = 1;
  std::string card = "A100-80GB";
  std::string link = "nvlink";
  double headroom = 0.10;
  int64_t block_size = 16;
  int64_t context_length = 0;
  std::string lengths;
  double mean_prompt = 0;
  double mean_output = 0;
  int64_t batch = 1;
  int64_t decode_context = -1;
  std::string profile = "interactive";
  int64_t max_batch = 0;
  int64_t max_step_tokens = 0;
  int threads = 0;
  double memory_gb = 0;
  double bandwidth_gbs = 0;
  double peak_tflops = 0;
  bool json = false;
  bool measure = false;
  int measure_steps = 16;
  int64_t constrained = 0;  // sequences of the decode batch under a structured-output constraint
  std::string schema;       // their JSON Schema file (default: grammar/mask_cost.h's 20-property one)
};


Result<CardSpec> resolve_card(const PlanArgs& a) {
  CardSpec card;
  if (a.card == "cpu" || a.card == "CPU") {
    CpuProbeOptions o;
    o.threads = a.threads;
    TESSERA_ASSIGN_OR_RETURN(CpuProbe probe, probe_local_cpu(o));
    card = cpu_card(probe);
  } else {
    TESSERA_ASSIGN_OR_RETURN(card, card_preset(a.card));
  }
  // Overrides for a card the presets do not know (or to check a what-if).
  if (a.memory_gb > 0) card.memory_bytes = static_cast<uint64_t>(a.memory_gb * 1e9);
  if (a.bandwidth_gbs > 0) card.memory_bandwidth = a.bandwidth_gbs * 1e9;
  if (a.peak_tflops > 0) card.peak_flops = a.peak_tflops * 1e12;
  if (a.memory_gb > 0 || a.bandwidth_gbs > 0 || a.peak_tflops > 0) card.source += ", overridden on the command line";
  return card;
}

Result<PlanInput> build_input(const PlanArgs& a, const PlanModel& model) {
  PlanInput in;
  in.model = model.config;
  in.model_name = model.name;
  if (a.precision.empty() || a.precision == "stored") {
    if (!model.has_weights)
      return Status::invalid_argument(fmt::format(
          "{} holds no weights to take the precision from: give --precision ({})", model.name,
          fmt::join(precision_names(), ", ")));
    in.weights = model.stored_layers;
  } else {
    TESSERA_ASSIGN_OR_RETURN(in.weights, precision_preset(a.precision));
  }
  if (!a.embed_precision.empty() && a.embed_precision != "stored") {
    TESSERA_ASSIGN_OR_RETURN(in.embeddings, precision_preset(a.embed_precision));
  } else if (model.has_weights && (a.embed_precision == "stored" || a.precision.empty() || a.precision == "stored")) {
    in.embeddings = model.stored_embeddings;
  } else {
    in.embeddings = in.weights;
  }
  TESSERA_ASSIGN_OR_RETURN(in.card, resolve_card(a));
  // auto: what the runtime's caches store (fp32 on the CPU and on CUDA), so the plan is what runs.
  in.kv_dtype = a.kv_dtype.value.value_or(KvDtype::kF32);  // auto: what every card stores
  in.tp = a.tp;
  in.use_slow_link = a.link == "pcie";
  in.headroom = a.headroom;
  in.block_size = a.block_size;
  in.context_length = a.context_length > 0 ? a.context_length : model.config.max_positions;
  if (!a.lengths.empty()) {
    TESSERA_ASSIGN_OR_RETURN(in.lengths, parse_length_distribution(a.lengths, in.context_length));
  } else if (a.mean_prompt > 0 || a.mean_output > 0) {
    // Request lengths with only their means known: geometric (memoryless) around prompt + output.
    TESSERA_ASSIGN_OR_RETURN(in.lengths,
                             SequenceLengths::geometric(std::max(1.0, a.mean_prompt + a.mean_output), in.context_length));
  }
  in.batch = a.batch;
  in.decode_context = a.decode_context;
  // A decoding sequence is, on average, its prompt plus half its output long.
  if (in.decode_context < 0 && (a.mean_prompt > 0 || a.mean_output > 0))
    in.decode_context = static_cast<int64_t>(std::llround(a.mean_prompt + a.mean_output / 2));
  TESSERA_ASSIGN_OR_RETURN(SchedulerConfig sched, scheduler_profile(a.profile));
  in.max_batch = a.max_batch > 0 ? a.max_batch : std::max<int64_t>(sched.max_batch, a.batch);
  in.max_step_tokens = a.max_step_tokens > 0 ? a.max_step_tokens : std::max<int64_t>(sched.max_step_tokens, in.max_batch);
  return in;
}

std::string format_measured(const Plan& p, const Measured& m) {
  const auto bytes = [](uint64_t b) { return format_bytes(static_cast<double>(b)); };
  const auto ms = [](double s) { return fmt::format("{:.3f} ms", s * 1e3); };
  std::string out = fmt::format(
      "\nMEASURED on this CPU: TP {} ({} threads per rank), batch {}, context {}, {} timed decode steps after 2 "
      "warm-up steps\n",
      m.tp, m.threads_per_rank, m.batch, m.context, m.steps);
  out += fmt::format("  {:<26}{:>26}{:>26}{:>10}\n", "", "predicted", "measured", "ratio");
  auto line = [&](std::string_view what, const std::string& pred, const std::string& meas, double ratio) {
    out += fmt::format("  {:<26}{:>26}{:>26}{:>10}\n", what, pred, meas,
                       std::isfinite(ratio) && ratio > 0 ? fmt::format("{:.2f}", ratio) : std::string("-"));
  };
  line("weights per rank", bytes(p.memory.weight_bytes), bytes(m.weight_bytes),
       static_cast<double>(m.weight_bytes) / static_cast<double>(p.memory.weight_bytes));
  line("KV bytes per token", fmt::format("{} B", p.memory.kv_bytes_per_token), fmt::format("{} B", m.kv_bytes_per_token),
       static_cast<double>(m.kv_bytes_per_token) / static_cast<double>(p.memory.kv_bytes_per_token));
  line("step floor (mem/compute)", ms(p.time.floor_s), ms(m.step_min_s) + " (min)", m.step_min_s / p.time.floor_s);
  line("step (all terms)", ms(p.time.step_s), ms(m.step_median_s) + " (median)", m.step_median_s / p.time.step_s);
  if (m.tp > 1)
    line("collectives per step", ms(p.time.all_reduce_s + p.time.all_gather_s), ms(m.comm_s),
         m.comm_s / (p.time.all_reduce_s + p.time.all_gather_s));
  line("tokens/s", fmt::format("{:.1f}", p.time.tokens_per_s), fmt::format("{:.1f}", m.batch / m.step_median_s),
       (m.batch / m.step_median_s) / p.time.tokens_per_s);
  out += fmt::format("  measured weights: the rank's matrices, embedding, LM-head slice and fp32 norm vectors as "
                     "loaded; KV: the CPU cache ({}); steps: wall time of rank 0's forward pass (mean {}).\n",
                     kv_dtype_name(p.input.kv_dtype), ms(m.step_mean_s));
  return out;
}

std::string to_json_text(const nlohmann::ordered_json& j) {
  try {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } catch (const std::exception& e) {
    return fmt::format("{{\"error\": \"JSON encoding failed: {}\"}}", e.what());
  }
}

std::string measured_json(const Measured& m) {
  nlohmann::ordered_json j = {
      {"tp", m.tp},
      {"threads_per_rank", m.threads_per_rank},
      {"batch", m.batch},
      {"context", m.context},
      {"steps", m.steps},
      {"weight_bytes", m.weight_bytes},
      {"kv_bytes_per_token", m.kv_bytes_per_token},
      {"step_median_s", m.step_median_s},
      {"step_mean_s", m.step_mean_s},
      {"step_min_s", m.step_min_s},
      {"comm_s", m.comm_s},
      {"tokens_per_s", m.step_median_s > 0 ? static_cast<double>(m.batch) / m.step_median_s : 0.0},
  };
  return to_json_text(j);
}

// The measured quality of each precision (`tessera eval`'s report), when there is one for this
// model file: beside the memory bill, what each precision costs.
std::string quality_section(const PlanArgs& a, const PlanModel& model) {
  if (!model.has_weights) return {};
  const std::string path = a.quality_report.empty() ? default_eval_report_path(a.model) : a.quality_report;
  auto report = load_eval_report(path);
  if (!report.is_ok()) {
    if (a.quality_report.empty() && report.status().code() == StatusCode::kNotFound)
      return fmt::format("\nQuality by precision: not measured (no {}; `tessera eval --model {}` measures it)\n", path,
                         a.model);
    return fmt::format("\nQuality by precision: {}\n", report.status().to_string());
  }
  auto sha = model_sha256(a.model);
  if (!sha.is_ok()) return fmt::format("\nQuality by precision: {}\n", sha.status().to_string());
  auto it = report->models.find(*sha);
  if (it == report->models.end())
    return fmt::format("\nQuality by precision: {} has no measurement of this model file (sha256 {})\n", path,
                       sha->substr(0, 12));
  return format_quality_bill(it->second, path);
}

// Structured outputs (--constrained N): the schema's compile time and token mask times measured on
// this model's vocabulary, and what N masks a step cost beside the predicted step. The engine
// computes a step's masks one after another on its own thread while the ranks run the forward
// pass (docs/structured_outputs.md), so they cost the step nothing until they take longer than it.
Result<nlohmann::ordered_json> constrained_bill(const PlanArgs& a, const Plan& plan) {
  auto tok = load_tokenizer_for_model(a.model);
  if (!tok.is_ok()) return tok.status().with_context("--constrained measures masks on the model's vocabulary");
  std::string schema = mixed_schema(20);
  std::string source = "a 20-property schema (strings with maxLength 12, integer ranges, numbers, booleans, enums, arrays)";
  if (!a.schema.empty()) {
    auto text = read_text_file(a.schema);
    if (!text.is_ok()) return text.status().with_context("--schema");
    schema = std::move(*text);
    source = a.schema;
  }
  GrammarCompilerOptions go;
  go.compile_timeout = std::chrono::milliseconds(600000);
  TESSERA_ASSIGN_OR_RETURN(auto compiler, GrammarCompiler::create(**tok, (*tok)->vocab_size(), (*tok)->eos_ids(), go));
  auto cost = measure_mask_cost(*compiler, {GrammarKind::kJsonSchema, schema}, 5, 1234, (*tok)->eos_ids());
  if (!cost.is_ok()) return cost.status().with_context(source);
  double mean = 0;
  for (double us : cost->mask_us) mean += us;
  mean /= std::max<size_t>(1, cost->mask_us.size());
  const double n = static_cast<double>(a.constrained);
  const double step_ms = plan.time.step_graph_s * 1e3;
  const double masks_ms = n * mean / 1e3, masks_p99_ms = n * quantile(cost->mask_us, 0.99) / 1e3;
  return nlohmann::ordered_json{
      {"constrained_sequences", a.constrained},
      {"schema", source},
      {"vocabulary", (*tok)->vocab_size()},
      {"compile_ms", cost->compile_ms},
      {"mask_us_p50", quantile(cost->mask_us, 0.5)},
      {"mask_us_p99", quantile(cost->mask_us, 0.99)},
      {"mask_us_mean", mean},
      {"masks_timed", cost->mask_us.size()},
      {"step_masks_ms", masks_ms},
      {"step_masks_p99_ms", masks_p99_ms},
      {"predicted_step_ms", step_ms},
      {"predicted_step_with_masks_ms", std::max(step_ms, masks_ms)},
  };
}

std::string format_constrained(const nlohmann::ordered_json& j, bool cpu) {
  const double masks = j["step_masks_ms"].get<double>(), step = j["predicted_step_ms"].get<double>();
  std::string out = fmt::format(
      "\nStructured outputs ({} of the batch's sequences constrained by {}; measured on this {}-token vocabulary):\n"
      "  compile {:.1f} ms once per schema (then cached); mask per token p50 {:.1f} us, p99 {:.1f} us, mean {:.1f} us "
      "({} masks timed)\n"
      "  a step's masks: {:.3f} ms (mean; {:.3f} ms at p99), computed on the engine thread while the forward pass "
      "runs (predicted {:.3f} ms): ",
      j["constrained_sequences"].get<int64_t>(), j["schema"].get<std::string>(), j["vocabulary"].get<int64_t>(),
      j["compile_ms"].get<double>(), j["mask_us_p50"].get<double>(), j["mask_us_p99"].get<double>(),
      j["mask_us_mean"].get<double>(), j["masks_timed"].get<size_t>(), masks, j["step_masks_p99_ms"].get<double>(),
      step);
  out += masks <= step ? "hidden behind it\n"
                       : fmt::format("{:.3f} ms longer than it: the step takes the masks' time\n", masks - step);
  if (cpu)
    out += "  (on a CPU deployment the engine thread shares the cores with the shards: the masks' time is taken from "
           "them, bench/results/structured-outputs.md)\n";
  return out;
}

int run_plan(const PlanArgs& a) {
  auto model = load_plan_model(a.model);
  if (!model.is_ok()) return fail(model.status().to_string());
  if (a.measure) {
    if (a.card != "cpu" && a.card != "CPU")
      return fail("--measure runs the local engine on this machine's CPU: give --card cpu");
    if (!model->has_weights) return fail("--measure needs a model file with weights (an HF directory or a .gguf)");
    if (!a.precision.empty() && a.precision != "stored")
      return fail("--measure runs the weights as stored: leave --precision out");
    if (a.kv_dtype.value && !kv_dtype_stored(*a.kv_dtype.value, KvBackend::kCpu))
      return fail(fmt::format("--measure runs the KV cache the CPU backend stores: --kv-dtype {}, not {}",
                              kv_dtypes_stored_text(KvBackend::kCpu), kv_dtype_name(*a.kv_dtype.value)));
  }
  auto in = build_input(a, *model);
  if (!in.is_ok()) return fail(in.status().to_string());
  auto plan = make_plan(*in);
  if (!plan.is_ok()) return fail(plan.status().to_string());

  std::optional<nlohmann::ordered_json> constrained;
  if (a.constrained > 0) {
    if (a.constrained > a.batch)
      return fail(fmt::format("--constrained {}: more than the decode batch (--batch {})", a.constrained, a.batch));
    auto c = constrained_bill(a, *plan);
    if (!c.is_ok()) return fail(c.status().to_string());
    constrained = std::move(*c);
  }
  // The bill first: a measurement that fails (or takes a while) still leaves it on the screen.
  if (!a.json) {
    std::fputs(format_plan(*plan).c_str(), stdout);
    if (constrained) std::fputs(format_constrained(*constrained, a.card == "cpu" || a.card == "CPU").c_str(), stdout);
    std::fputs(quality_section(a, *model).c_str(), stdout);
    std::fflush(stdout);
  }
  std::string measured_text;
  int rc = 0;
  if (a.measure) {
    MeasureArgs ma;
    ma.model = a.model;
    ma.tp = a.tp;
    ma.threads = a.threads;
    ma.batch = a.batch;
    ma.block_size = in->block_size;
    ma.kv_dtype = in->kv_dtype;
    ma.steps = a.measure_steps;
    auto measured = measure_decode_steps(ma, plan->time.context);
    if (measured.is_ok()) {
      measured_text = a.json ? measured_json(*measured) : format_measured(*plan, *measured);
    } else {
      rc = fail("--measure: " + measured.status().to_string());
      measured_text = a.json ? to_json_text({{"error", measured.status().to_string()}}) : "";
    }
  }
  if (a.json) {
    std::string text = plan_to_json(*plan);
    if (constrained) text = text.substr(0, text.rfind('}')) + ",\n  \"structured_outputs\": " + to_json_text(*constrained) + "\n}";
    if (a.measure) {
      // Splice the measurement in as one more top-level field.
      text = text.substr(0, text.rfind('}')) + ",\n  \"measured\": " + measured_text + "\n}";
    }
    std::printf("%s\n", text.c_str());
  } else {
    std::fputs(measured_text.c_str(), stdout);
  }
  if (rc != 0) return rc;
  for (const PlanWarning& w : plan->warnings)
    if (w.fatal) return 3;  // the bill is printed, but the plan cannot run
  return 0;
}

}  // namespace

Runner add_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  add_model_flag(app, a->model,
                 "HF directory, config.json, .gguf, or a preset: " + fmt::format("{}", fmt::join(model_preset_names(), ", ")));
  app.add_option("--precision", a->precision,
                 "weight precision: " + fmt::format("{}", fmt::join(precision_names(), ", ")) +
                     " (default: as stored in the model file)");
  app.add_option("--embed-precision", a->embed_precision, "embedding and LM head precision (default: as --precision)");
  app.add_option("--quality-report", a->quality_report,
                 "`tessera eval` report whose measured quality per precision is shown beside the bill (default: "
                 "<model>.eval.json when it exists)");
  add_kv_dtype_flag(app, a->kv_dtype, KvDtypeUse::kPlan);
  app.add_option("--tp", a->tp, "tensor-parallel degree")->capture_default_str();
  app.add_option("--card", a->card,
                 "card: " + fmt::format("{}", fmt::join(card_preset_names(), ", ")) + ", or cpu (measured now)")
      ->capture_default_str();
  app.add_option("--link", a->link, "link between TP ranks: nvlink or pcie")
      ->check(CLI::IsMember({"nvlink", "pcie"}))->capture_default_str();
  app.add_option("--headroom", a->headroom, "fraction of memory never planned for")->capture_default_str();
  add_block_size_flag(app, a->block_size);
  app.add_option("--context-length", a->context_length, "the longest sequence to plan for (default: the model's)");
  app.add_option("--lengths", a->lengths, "request length distribution: fixed:N, uniform:LO:HI, geometric:MEAN");
  app.add_option("--mean-prompt", a->mean_prompt, "mean prompt tokens (with --mean-output: geometric lengths)");
  app.add_option("--mean-output", a->mean_output, "mean output tokens");
  app.add_option("--batch", a->batch, "decode batch for the time bill")->capture_default_str();
  app.add_option("--decode-context", a->decode_context,
                 "context of each decoding sequence (default: mean prompt + half the mean output, else the mean length)");
  app.add_option("--profile", a->profile,
                 "scheduler profile for max_batch / max_step_tokens: interactive, offline")
      ->capture_default_str();
  app.add_option("--max-batch", a->max_batch, "logit rows in the workspace (default: the profile's)");
  app.add_option("--max-step-tokens", a->max_step_tokens, "activation rows in the workspace (default: the profile's)");
  app.add_option("--threads", a->threads, "CPU threads for --card cpu and --measure (0 = all)")->capture_default_str();
  app.add_option("--memory-gb", a->memory_gb, "override the card's memory (GB)");
  app.add_option("--bandwidth-gbs", a->bandwidth_gbs, "override the card's memory bandwidth (GB/s)");
  app.add_option("--peak-tflops", a->peak_tflops, "override the card's peak (TFLOP/s)");
  app.add_flag("--json", a->json, "print the bill as JSON");
  app.add_flag("--measure", a->measure, "also run the local engine (CPU) on this configuration and print measured numbers");
  app.add_option("--measure-steps", a->measure_steps, "decode steps to time with --measure")->capture_default_str();
  app.add_option("--constrained", a->constrained,
                 "sequences of the decode batch under a structured-output constraint: the schema's compile time and "
                 "token mask times measured on the model's vocabulary, and a step's masks beside the predicted step")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--schema", a->schema, "with --constrained: their JSON Schema file (default: a 20-property schema)");
  return [a] {
    const Status model = resolve_model_flag(a->model);
    if (!model.is_ok()) return fail(model.to_string());
    return run_plan(*a);
  };
}

}  // namespace tessera::cli
