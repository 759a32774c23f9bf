#include "coordinator/scheduler_config.h"

#include "common/kv_config.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tessera {
namespace {

// Why these numbers (one 7-13B model on one A100/H100-class card as the reference point):
//
// interactive — latency first.
//   max_batch 32: a decode step stays bound by reading the weights (about the same time as
//     batch 1) up to a few dozen sequences, so inter-token latency barely grows with it.
//   max_step_tokens 2048: room for every one of the 32 decodes plus about three prefill
//     chunks, so a burst of arrivals starts within one step, while a step never grows past a
//     few chunks' compute (tens of ms).
//   max_burst_wait_ms 50: a burst of arrivals (each within 10 ms, a fifth of it, of the one before:
//     a client's parallel calls, a load generator's clients starting together) is gathered
//     into one prefill step, where cut after max_wait_ms its stragglers would prefill in a
//     later step beside the first ones' decodes, stalling them all (on a CPU, a 1.1B model's
//     32-client burst: a 4 s step beside 28 decoders, bench/results/serve-vs-vllm/
//     m1b-bf16-20261205.md). A lone request still waits only max_wait_ms.
//   max_wait_ms 2: far below one decode step (10-30 ms), so waiting is invisible in time to
//     first token, yet it gathers requests that arrive together (a client's parallel calls,
//     n > 1) into one prefill step instead of one slow step each.
//   prefill_chunk 512: big enough for the GEMMs to run near peak, small enough that a long
//     prompt delays the others' next token by one modest step, not by the whole prompt.
//   aging 5 s: a batch-class request competes as interactive after at most 5 s per class.
//
// offline — throughput first.
//   max_batch 256 and max_step_tokens 8192: large GEMMs at full efficiency; latency of a
//     single request matters little. max_wait_ms 50 (a few decode steps) gathers many arrivals
//     into one prefill step; prefill_chunk 2048 cuts per-chunk overhead; aging 30 s.
SchedulerConfig interactive_profile() { return SchedulerConfig{}; }

SchedulerConfig offline_profile() {
  SchedulerConfig c;
  c.profile = "offline";
  c.max_batch = 256;
  c.max_step_tokens = 8192;
  c.max_wait_ms = 50.0;
  c.max_burst_wait_ms = 50.0;
  c.prefill_chunk = 2048;
  c.aging_ms = 30000.0;
  return c;
}

std::string normalize(std::string_view name) {
  while (!name.empty() && name.front() == '-') name.remove_prefix(1);
  std::string s(name);
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

Status parse_int(std::string_view knob, std::string_view v, int32_t& out) {
  int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || x < INT32_MIN || x > INT32_MAX)
    return Status::invalid_argument(fmt::format("scheduler knob {}: '{}' is not an integer", knob, v));
  out = static_cast<int32_t>(x);
  return Status::ok();
}

Status parse_double(std::string_view knob, std::string_view v, double& out) {
  double x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || !std::isfinite(x))
    return Status::invalid_argument(fmt::format("scheduler knob {}: '{}' is not a number", knob, v));
  out = x;
  return Status::ok();
}

struct KnobInfo {
  const char* name;
  const char* help;
};

constexpr KnobInfo kKnobs[] = {
    {"max_batch", "Most sequences in one step."},
    {"max_step_tokens", "Token budget per step (decode tokens plus prefill pieces)."},
    {"max_wait_ms", "Longest a new prefill waits for companions, in milliseconds."},
    {"max_burst_wait_ms", "While requests keep arriving close together (within a fifth of this), the wait for "
                          "companions extends up to this long after the first, in milliseconds."},
    {"prefill_chunk", "Longest prefill piece per step, in tokens."},
    {"mixed_prefill_tokens", "Most prefill tokens in a step that also decodes (0: no limit but max_step_tokens)."},
    {"priority_classes", "Number of request priority classes (0 is served first)."},
    {"aging_ms", "Milliseconds in the system after which a request's class improves by one."},
    {"spec_depth", "Most speculative drafts per sequence per step (0: never)."},
    {"spec_ngram_max", "Longest suffix the n-gram proposer looks up."},
    {"spec_ngram_min", "Shortest suffix the n-gram proposer looks up."},
    {"spec_probe_interval", "Steps between probes of a traffic class whose speculation is off."},
    {"spec_probe_steps", "Steps of a speculation probe."},
    {"spec_hysteresis", "Speculation goes off below 1 - h of plain speed and on again above 1 + h."},
    {"spec_draft_layers", "Layers of the shards' self-draft (0: none; the draft proposer)."},
    {"spec_draft_vocab", "Fixed head rows of the self-draft (token ids below it, plus each context's ids)."},
};

double knob_value(const SchedulerConfig& c, std::string_view name) {
  if (name == "max_batch") return c.max_batch;
  if (name == "max_step_tokens") return c.max_step_tokens;
  if (name == "max_wait_ms") return c.max_wait_ms;
  if (name == "max_burst_wait_ms") return c.max_burst_wait_ms;
  if (name == "prefill_chunk") return c.prefill_chunk;
  if (name == "mixed_prefill_tokens") return c.mixed_prefill_tokens;
  if (name == "priority_classes") return c.priority_classes;
  if (name == "spec_depth") return c.speculation.max_depth;
  if (name == "spec_ngram_max") return c.speculation.ngram_max;
  if (name == "spec_ngram_min") return c.speculation.ngram_min;
  if (name == "spec_probe_interval") return c.speculation.probe_interval;
  if (name == "spec_probe_steps") return c.speculation.probe_steps;
  if (name == "spec_hysteresis") return c.speculation.hysteresis;
  if (name == "spec_draft_layers") return c.speculation.draft_layers;
  if (name == "spec_draft_vocab") return c.speculation.draft_vocab;
  return c.aging_ms;
}

// Prometheus label values escape backslash, quote and newline.
std::string escape_label(std::string_view v) {
  std::string out;
  for (char ch : v) {
    if (ch == '\\' || ch == '"') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out;
}

}  // namespace

std::vector<std::string> scheduler_profile_names() { return {"interactive", "offline"}; }

Result<SchedulerConfig> scheduler_profile(std::string_view name) {
  if (name == "interactive") return interactive_profile();
  if (name == "offline") return offline_profile();
  return Status::not_found(fmt::format("unknown scheduler profile '{}' (known: {})", name,
                                       fmt::join(scheduler_profile_names(), ", ")));
}

Status validate_scheduler_config(const SchedulerConfig& c) {
  auto bad = [](std::string_view knob, auto value, std::string_view why) {
    return Status::invalid_argument(fmt::format("scheduler knob {} = {}: {}", knob, value, why));
  };
  if (c.max_batch < 1) return bad("max_batch", c.max_batch, "must be at least 1");
  if (c.max_step_tokens < c.max_batch)
    return bad("max_step_tokens", c.max_step_tokens,
               fmt::format("must be at least max_batch ({}) so every running sequence can decode each step",
                           c.max_batch));
  if (c.prefill_chunk < 1) return bad("prefill_chunk", c.prefill_chunk, "must be at least 1");
  if (c.mixed_prefill_tokens < 0)
    return bad("mixed_prefill_tokens", c.mixed_prefill_tokens, "must be >= 0 (0: no limit but max_step_tokens)");
  if (!std::isfinite(c.max_wait_ms) || c.max_wait_ms < 0) return bad("max_wait_ms", c.max_wait_ms, "must be >= 0");
  if (!std::isfinite(c.max_burst_wait_ms) || c.max_burst_wait_ms < 0)
    return bad("max_burst_wait_ms", c.max_burst_wait_ms, "must be >= 0");
  if (c.priority_classes < 1 || c.priority_classes > 16)
    return bad("priority_classes", c.priority_classes, "must be in 1..16");
  if (!std::isfinite(c.aging_ms) || c.aging_ms <= 0) return bad("aging_ms", c.aging_ms, "must be > 0");
  if (c.block_size != 0 && !validate_block_size(c.block_size).is_ok())
    return bad("block_size", c.block_size,
               fmt::format("must be 0 (not set) or in {}..{} tokens", kMinBlockSize, kMaxBlockSize));
  return validate_speculation_config(c.speculation);
}

Status set_scheduler_knob(SchedulerConfig& c, std::string_view raw_name, std::string_view value) {
  const std::string name = normalize(raw_name);
  if (name == "profile" || name == "scheduler_profile") {
    TESSERA_ASSIGN_OR_RETURN(c, scheduler_profile(value));
    return Status::ok();
  }
  if (name == "max_batch") return parse_int(name, value, c.max_batch);
  if (name == "max_step_tokens") return parse_int(name, value, c.max_step_tokens);
  if (name == "max_wait_ms") return parse_double(name, value, c.max_wait_ms);
  if (name == "max_burst_wait_ms") return parse_double(name, value, c.max_burst_wait_ms);
  if (name == "prefill_chunk") return parse_int(name, value, c.prefill_chunk);
  if (name == "mixed_prefill_tokens") return parse_int(name, value, c.mixed_prefill_tokens);
  if (name == "priority_classes") return parse_int(name, value, c.priority_classes);
  if (name == "aging_ms") return parse_double(name, value, c.aging_ms);
  if (name == "block_size" || name == "kv_block_size") return parse_int(name, value, c.block_size);
  SpeculationConfig& sp = c.speculation;
  if (name == "speculation") {
    auto mode = parse_spec_mode(value);
    if (!mode.is_ok()) return mode.status().with_context("scheduler knob speculation");
    sp.mode = *mode;
    return Status::ok();
  }
  if (name == "spec_depth") return parse_int(name, value, sp.max_depth);
  if (name == "spec_ngram_max") return parse_int(name, value, sp.ngram_max);
  if (name == "spec_ngram_min") return parse_int(name, value, sp.ngram_min);
  if (name == "spec_probe_interval") return parse_int(name, value, sp.probe_interval);
  if (name == "spec_probe_steps") return parse_int(name, value, sp.probe_steps);
  if (name == "spec_hysteresis") return parse_double(name, value, sp.hysteresis);
  if (name == "spec_draft_layers") return parse_int(name, value, sp.draft_layers);
  if (name == "spec_draft_vocab") return parse_int(name, value, sp.draft_vocab);
  return Status::invalid_argument(fmt::format("unknown scheduler knob '{}'", raw_name));
}

namespace {

// `apply_profile` false: a "profile" field is checked but leaves the knobs alone (the command
// line named the profile).
Status apply_json(SchedulerConfig& c, std::string_view text, std::string_view source, bool apply_profile) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return Status::invalid_argument(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  if (!j.is_object()) return Status::invalid_argument(fmt::format("{}: expected a JSON object of scheduler knobs", source));
  auto as_text = [&](const std::string& key, const nlohmann::json& v) -> Result<std::string> {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_number()) return v.dump();
    return Status::invalid_argument(fmt::format("{}: field '{}' must be a number or a string", source, key));
  };
  // The profile first, so knobs in the same file apply on top of it whatever the key order.
  if (auto it = j.find("profile"); it != j.end()) {
    TESSERA_ASSIGN_OR_RETURN(std::string v, as_text("profile", *it));
    SchedulerConfig p;
    TESSERA_RETURN_IF_ERROR(set_scheduler_knob(p, "profile", v).with_context(source));
    if (apply_profile) c = p;
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "profile" || it.key() == "comment") continue;
    TESSERA_ASSIGN_OR_RETURN(std::string v, as_text(it.key(), it.value()));
    TESSERA_RETURN_IF_ERROR(set_scheduler_knob(c, it.key(), v).with_context(source));
  }
  return Status::ok();
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::io_error(fmt::format("{}: cannot open the scheduler config file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::io_error(fmt::format("{}: cannot read the scheduler config file", path));
  return ss.str();
}

}  // namespace

Status apply_scheduler_json(SchedulerConfig& c, std::string_view text, std::string_view source) {
  return apply_json(c, text, source, /*apply_profile=*/true);
}

Status apply_scheduler_config_file(SchedulerConfig& c, const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, read_text(path));
  return apply_json(c, text, path, /*apply_profile=*/true);
}

Result<SchedulerConfig> scheduler_config_from_flags(const std::vector<std::string>& args,
                                                    std::vector<std::string>* rest) {
  std::string profile, file;
  std::vector<std::pair<std::string, std::string>> knobs;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      if (!rest) return Status::invalid_argument(fmt::format("unexpected argument '{}'", a));
      rest->push_back(a);
      continue;
    }
    std::string name = a, value;
    bool has_value = false;
    if (auto eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      has_value = true;
    }
    const std::string key = normalize(name);
    const bool ours = key == "scheduler_profile" || key == "scheduler_config" || key == "max_batch" ||
                      key == "max_step_tokens" || key == "max_wait_ms" || key == "max_burst_wait_ms" ||
                      key == "prefill_chunk" ||
                      key == "mixed_prefill_tokens" ||
                      key == "priority_classes" || key == "aging_ms" || key == "speculation" ||
                      key.rfind("spec_", 0) == 0;
    if (!ours) {
      if (!rest) return Status::invalid_argument(fmt::format("unknown flag '{}'", a));
      rest->push_back(a);
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return Status::invalid_argument(fmt::format("flag {} needs a value", name));
      value = args[++i];
    }
    if (key == "scheduler_profile") profile = value;
    else if (key == "scheduler_config") file = value;
    else knobs.emplace_back(key, value);
  }
  SchedulerConfig c;
  if (!profile.empty()) {
    TESSERA_ASSIGN_OR_RETURN(c, scheduler_profile(profile));
  }
  if (!file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(std::string text, read_text(file));
    TESSERA_RETURN_IF_ERROR(apply_json(c, text, file, /*apply_profile=*/profile.empty()));
  }
  for (const auto& [k, v] : knobs) TESSERA_RETURN_IF_ERROR(set_scheduler_knob(c, k, v));
  TESSERA_RETURN_IF_ERROR(validate_scheduler_config(c));
  return c;
}

std::string format_scheduler_config(const SchedulerConfig& c) {
  return fmt::format(
      "scheduler: profile={} max_batch={} max_step_tokens={} max_wait_ms={} max_burst_wait_ms={} prefill_chunk={} "
      "mixed_prefill_tokens={} priority_classes={} aging_ms={}{} speculation={} spec_depth={} spec_ngram={}..{} "
      "spec_probe={}/{} spec_hysteresis={}{}",
      c.profile, c.max_batch, c.max_step_tokens, c.max_wait_ms, c.max_burst_wait_ms, c.prefill_chunk,
      c.mixed_prefill_tokens,
      c.priority_classes, c.aging_ms,
      c.block_size > 0 ? fmt::format(" block_size={}", c.block_size) : std::string(),
      spec_mode_name(c.speculation.mode), c.speculation.max_depth, c.speculation.ngram_min, c.speculation.ngram_max,
      c.speculation.probe_steps, c.speculation.probe_interval, c.speculation.hysteresis,
      c.speculation.draft_layers > 0
          ? fmt::format(" spec_draft_layers={} spec_draft_vocab={}", c.speculation.draft_layers, c.speculation.draft_vocab)
          : std::string());
}

std::string scheduler_config_prometheus(const SchedulerConfig& c) {
  std::string out;
  const std::string label = escape_label(c.profile);
  for (const KnobInfo& k : kKnobs) {
    out += fmt::format("# HELP tessera_scheduler_{} {}\n# TYPE tessera_scheduler_{} gauge\n", k.name, k.help, k.name);
    out += fmt::format("tessera_scheduler_{}{{profile=\"{}\"}} {}\n", k.name, label, knob_value(c, k.name));
  }
  out += "# HELP tessera_scheduler_speculation The speculation mode of requests without the field (1 on its label)\n"
         "# TYPE tessera_scheduler_speculation gauge\n";
  out += fmt::format("tessera_scheduler_speculation{{profile=\"{}\",mode=\"{}\"}} 1\n", label,
                     spec_mode_name(c.speculation.mode));
  return out;
}

}  // namespace tessera
