#include "engine/scheduler_config.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "common/kv_config.h"

namespace tessera {
namespace {

// One row of engine/scheduler_knobs.h, with the accessors its member gives.
struct Knob {
  std::string_view key;
  bool whole;  // an int32_t knob
  KnobBound lo, hi;
  double interactive, offline;
  std::string_view help;
  double (*get)(const SchedulerConfig&);
  void (*set)(SchedulerConfig&, double);
};

#define TESSERA_SCHEDULER_ROW(key, member, type, lo, hi, interactive, offline, help)                       \
  Knob{#key, std::is_integral_v<type>, lo, hi, interactive, offline, help,                                 \
       [](const SchedulerConfig& c) -> double { return static_cast<double>(c.member); },                    \
       [](SchedulerConfig& c, double v) { c.member = static_cast<type>(v); }},
#define TESSERA_SPECULATION_ROW(key, member, type, lo, hi, interactive, offline, help)                     \
  Knob{#key, std::is_integral_v<type>, lo, hi, interactive, offline, help,                                 \
       [](const SchedulerConfig& c) -> double { return static_cast<double>(c.speculation.member); },        \
       [](SchedulerConfig& c, double v) { c.speculation.member = static_cast<type>(v); }},

const Knob kKnobs[] = {TESSERA_SCHEDULER_KNOBS(TESSERA_SCHEDULER_ROW) TESSERA_SPECULATION_KNOBS(TESSERA_SPECULATION_ROW)};

#undef TESSERA_SCHEDULER_ROW
#undef TESSERA_SPECULATION_ROW

const Knob* find_knob(std::string_view key) {
  for (const Knob& k : kKnobs)
    if (k.key == key) return &k;
  return nullptr;
}

bool is_speculation_knob(const Knob& k) { return k.key.rfind("spec_", 0) == 0; }

// "must be at least 1", "must be in 1..16", "must be > 0", "must be in [0, 0.5)".
std::string range_text(const Knob& k) {
  const KnobBound& lo = k.lo;
  const KnobBound& hi = k.hi;
  if (k.whole) {
    if (hi.none) return fmt::format("at least {}", lo.value);
    return fmt::format("in {}..{}", lo.value, hi.value);
  }
  if (hi.none) return fmt::format("{} {}", lo.open ? ">" : ">=", lo.value);
  return fmt::format("in {}{}, {}{}", lo.open ? "(" : "[", lo.value, hi.value, hi.open ? ")" : "]");
}

bool in_range(const Knob& k, double v) {
  if (!std::isfinite(v)) return false;
  if (!k.lo.none && (k.lo.open ? v <= k.lo.value : v < k.lo.value)) return false;
  if (!k.hi.none && (k.hi.open ? v >= k.hi.value : v > k.hi.value)) return false;
  return true;
}

Status out_of_range(const Knob& k, double v) {
  return Status::invalid_argument(fmt::format("scheduler knob {} = {}: must be {}", k.key, v, range_text(k)));
}

SchedulerConfig profile_values(bool offline) {
  SchedulerConfig c;
  c.profile = offline ? "offline" : "interactive";
  for (const Knob& k : kKnobs) k.set(c, offline ? k.offline : k.interactive);
  return c;
}

std::string normalize(std::string_view name) {
  while (!name.empty() && name.front() == '-') name.remove_prefix(1);
  std::string s(name);
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

Status parse_value(const Knob& k, std::string_view v, double* out) {
  if (k.whole) {
    int64_t x = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || p != v.data() + v.size() || x < INT32_MIN || x > INT32_MAX)
      return Status::invalid_argument(fmt::format("scheduler knob {}: '{}' is not an integer", k.key, v));
    *out = static_cast<double>(x);
    return Status::ok();
  }
  double x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || !std::isfinite(x))
    return Status::invalid_argument(fmt::format("scheduler knob {}: '{}' is not a number", k.key, v));
  *out = x;
  return Status::ok();
}

Status parse_int(std::string_view knob, std::string_view v, int32_t& out) {
  int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || x < INT32_MIN || x > INT32_MAX)
    return Status::invalid_argument(fmt::format("scheduler knob {}: '{}' is not an integer", knob, v));
  out = static_cast<int32_t>(x);
  return Status::ok();
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
  if (name == "interactive") return profile_values(false);
  if (name == "offline") return profile_values(true);
  return Status::not_found(fmt::format("unknown scheduler profile '{}' (known: {})", name,
                                       fmt::join(scheduler_profile_names(), ", ")));
}

Status validate_speculation_config(const SpeculationConfig& sp) {
  SchedulerConfig c;
  c.speculation = sp;
  for (const Knob& k : kKnobs)
    if (is_speculation_knob(k) && !in_range(k, k.get(c))) return out_of_range(k, k.get(c));
  if (sp.ngram_max < sp.ngram_min)
    return Status::invalid_argument(fmt::format("scheduler knob spec_ngram_max = {}: must be at least spec_ngram_min ({})",
                                                sp.ngram_max, sp.ngram_min));
  return Status::ok();
}

Status validate_scheduler_config(const SchedulerConfig& c) {
  for (const Knob& k : kKnobs)
    if (!is_speculation_knob(k) && !in_range(k, k.get(c))) return out_of_range(k, k.get(c));
  if (c.max_step_tokens < c.max_batch)
    return Status::invalid_argument(
        fmt::format("scheduler knob max_step_tokens = {}: must be at least max_batch ({}) so every running sequence "
                    "can decode each step",
                    c.max_step_tokens, c.max_batch));
  if (c.block_size != 0 && !validate_block_size(c.block_size).is_ok())
    return Status::invalid_argument(fmt::format("scheduler knob block_size = {}: must be 0 (not set) or in {}..{} tokens",
                                                c.block_size, kMinBlockSize, kMaxBlockSize));
  return validate_speculation_config(c.speculation);
}

Status set_scheduler_knob(SchedulerConfig& c, std::string_view raw_name, std::string_view value) {
  const std::string name = normalize(raw_name);
  if (name == "profile" || name == "scheduler_profile") {
    TESSERA_ASSIGN_OR_RETURN(c, scheduler_profile(value));
    return Status::ok();
  }
  if (name == "block_size" || name == "kv_block_size") return parse_int(name, value, c.block_size);
  if (name == "speculation") {
    auto mode = parse_spec_mode(value);
    if (!mode.is_ok()) return mode.status().with_context("scheduler knob speculation");
    c.speculation.mode = *mode;
    return Status::ok();
  }
  const Knob* k = find_knob(name);
  if (!k) return Status::invalid_argument(fmt::format("unknown scheduler knob '{}'", raw_name));
  double v = 0;
  TESSERA_RETURN_IF_ERROR(parse_value(*k, value, &v));
  k->set(c, v);
  return Status::ok();
}

const std::vector<SchedulerKnobInfo>& scheduler_knob_infos() {
  static const std::vector<SchedulerKnobInfo> infos = [] {
    std::vector<SchedulerKnobInfo> out;
    auto flag = [](std::string_view key) {
      std::string f = "--" + std::string(key);
      for (char& ch : f)
        if (ch == '_') ch = '-';
      return f;
    };
    for (const Knob& k : kKnobs) {
      if (k.key == "spec_depth")
        out.push_back({"speculation", "--speculation",
                       "speculative decoding for requests without the field: off, auto (gated by measured acceptance), "
                       "ngram (always), draft (the self-draft, always; needs --spec-draft-layers)"});
      const std::string profiles =
          k.interactive == k.offline ? fmt::format("default {}", k.interactive)
                                     : fmt::format("interactive {}, offline {}", k.interactive, k.offline);
      out.push_back({k.key, flag(k.key), fmt::format("{} ({}; {})", k.help, range_text(k), profiles)});
    }
    return out;
  }();
  return infos;
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

Status apply_scheduler_layers(SchedulerConfig& c, std::string_view profile, const std::string& config_file,
                              const std::vector<std::pair<std::string, std::string>>& knobs) {
  if (!profile.empty()) {
    TESSERA_ASSIGN_OR_RETURN(c, scheduler_profile(profile));
  }
  if (!config_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(std::string text, read_text(config_file));
    TESSERA_RETURN_IF_ERROR(apply_json(c, text, config_file, /*apply_profile=*/profile.empty()));
  }
  for (const auto& [k, v] : knobs)
    if (!v.empty()) TESSERA_RETURN_IF_ERROR(set_scheduler_knob(c, k, v));
  return validate_scheduler_config(c);
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
    const bool ours = key == "scheduler_profile" || key == "scheduler_config" || key == "speculation" ||
                      find_knob(key) != nullptr;
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
  TESSERA_RETURN_IF_ERROR(apply_scheduler_layers(c, profile, file, knobs));
  return c;
}

std::string format_scheduler_config(const SchedulerConfig& c) {
  std::string out = "scheduler: profile=" + c.profile;
  for (const Knob& k : kKnobs) {
    if (k.key == "spec_depth") {
      if (c.block_size > 0) out += fmt::format(" block_size={}", c.block_size);
      out += fmt::format(" speculation={}", spec_mode_name(c.speculation.mode));
    }
    out += fmt::format(" {}={}", k.key, k.get(c));
  }
  return out;
}

std::string scheduler_config_prometheus(const SchedulerConfig& c) {
  std::string out;
  const std::string label = escape_label(c.profile);
  for (const Knob& k : kKnobs) {
    out += fmt::format("# HELP tessera_scheduler_{} {}\n# TYPE tessera_scheduler_{} gauge\n", k.key, k.help, k.key);
    out += fmt::format("tessera_scheduler_{}{{profile=\"{}\"}} {}\n", k.key, label, k.get(c));
  }
  out += "# HELP tessera_scheduler_speculation The speculation mode of requests without the field (1 on its label)\n"
         "# TYPE tessera_scheduler_speculation gauge\n";
  out += fmt::format("tessera_scheduler_speculation{{profile=\"{}\",mode=\"{}\"}} 1\n", label,
                     spec_mode_name(c.speculation.mode));
  return out;
}

std::string scheduler_config_json(const SchedulerConfig& c, const std::string& comment) {
  nlohmann::ordered_json j;
  j["profile"] = c.profile;
  for (const Knob& k : kKnobs) {
    if (k.key == "spec_depth") {
      if (c.block_size > 0) j["block_size"] = c.block_size;
      j["speculation"] = std::string(spec_mode_name(c.speculation.mode));
    }
    if (k.whole) j[std::string(k.key)] = static_cast<int64_t>(k.get(c));
    else j[std::string(k.key)] = k.get(c);
  }
  if (!comment.empty()) j["comment"] = comment;
  return j.dump(2) + "\n";
}

}  // namespace tessera
