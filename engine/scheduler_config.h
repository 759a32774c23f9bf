// The scheduler's config: its knobs (one table, engine/scheduler_knobs.h), the named profiles,
// and how they are set (flags, a JSON config file) and shown (start-up log line, Prometheus
// gauges). Everything here iterates the table; no knob is named in this file's code.
//
// Precedence: a profile gives every knob a value; a config file may name a profile and set
// knobs on top of it; flags set knobs on top of that. A profile named on the command line wins
// over the file's "profile" (apply_scheduler_layers).
//
//   Flags (server/server_cli.h registers them for serve, launch, tessera-coordinator and
//   `tune simulate`; both `--name value` and `--name=value`; '-' and '_' are interchangeable):
//     --profile interactive|offline   (--scheduler-profile in scheduler_config_from_flags)
//     --scheduler-config FILE         JSON object: {"profile": "offline", "max_batch": 128, ...}
//     --speculation off|auto|ngram|draft
//     --<knob> VALUE                  every row of engine/scheduler_knobs.h: --max-batch N, --spec-depth N, ...
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/scheduler_knobs.h"
#include "engine/speculation.h"

namespace tessera {

struct SchedulerConfig {
  std::string profile = "interactive";  // the profile the values started from (a label)
  // max_batch, max_step_tokens, max_wait_ms, max_burst_wait_ms, prefill_chunk,
  // mixed_prefill_tokens, priority_classes, aging_ms: engine/scheduler_knobs.h says what each is.
  TESSERA_SCHEDULER_KNOBS(TESSERA_KNOB_FIELD)
  SpeculationConfig speculation;        // drafts and their gate; mode: what a request without the field gets
  // KV tokens per block the config was tuned for (`tessera tune` writes it); 0: not set, the
  // --block-size flag (or its default) decides. An explicit --block-size wins over it.
  int32_t block_size = 0;
};

// "interactive" or "offline"; NotFound listing the known names otherwise.
Result<SchedulerConfig> scheduler_profile(std::string_view name);
std::vector<std::string> scheduler_profile_names();

// InvalidArgument naming the knob and value: a value outside its row's range, a non-finite one,
// max_step_tokens < max_batch (every running sequence must be able to decode in each step), a
// block_size outside common/kv_config.h's range, and the speculation knobs
// (validate_speculation_config).
Status validate_scheduler_config(const SchedulerConfig& config);

// Sets one knob by name ("max_batch" or "max-batch", ...; "profile" resets every knob to that
// profile). InvalidArgument naming the knob for an unknown name or a value that does not parse.
// Does not validate the combination (call validate_scheduler_config when done).
Status set_scheduler_knob(SchedulerConfig& config, std::string_view name, std::string_view value);

// Applies a JSON object's fields to `config` ("profile" first, then the knobs; numbers or
// numeric strings). `source` names the text in errors (e.g. the file's path). Unknown keys are
// errors: a misspelt knob in an operator's file should not be silently ignored ("comment" is
// the one free-text field).
Status apply_scheduler_json(SchedulerConfig& config, std::string_view json_text, std::string_view source);
// Reads and applies a JSON config file (IoError naming the path if it cannot be read).
Status apply_scheduler_config_file(SchedulerConfig& config, const std::string& path);

// Parses the scheduler flags out of `args` (see the top of this file), starting from the
// interactive profile, and validates the result. Arguments that are not scheduler flags are
// appended to `rest` in order; when `rest` is null they are an error.
Result<SchedulerConfig> scheduler_config_from_flags(const std::vector<std::string>& args,
                                                    std::vector<std::string>* rest = nullptr);

// One line for the start-up log, every knob in table order:
// "scheduler: profile=interactive max_batch=32 max_step_tokens=2048 max_wait_ms=2 ... speculation=auto spec_depth=4 ..."
std::string format_scheduler_config(const SchedulerConfig& config);
// Prometheus text exposition: a HELP and TYPE line and one gauge per knob, e.g.
// tessera_scheduler_max_batch{profile="interactive"} 32
std::string scheduler_config_prometheus(const SchedulerConfig& config);

// What the command-line and file layers need to know of a knob, one entry per table row plus
// `speculation` (the mode), in table order.
struct SchedulerKnobInfo {
  std::string_view key;   // "max_batch"
  std::string flag;       // "--max-batch"
  std::string help;       // the row's help, its range and the two profiles' values
};
const std::vector<SchedulerKnobInfo>& scheduler_knob_infos();

// The layers of precedence applied in order: a profile (empty: keep `config`'s values), then a
// JSON config file (empty: none; its "profile" applies unless one was given here), then knobs by
// name (empty values are skipped), then validation. For command lines that collect these.
Status apply_scheduler_layers(SchedulerConfig& config, std::string_view profile, const std::string& config_file,
                              const std::vector<std::pair<std::string, std::string>>& knobs);

// Every knob as a JSON object's text, keys in table order ("profile" first, then "comment" when
// given), for a profile file that `--scheduler-config` reads back.
std::string scheduler_config_json(const SchedulerConfig& config, const std::string& comment = "");

}  // namespace tessera
