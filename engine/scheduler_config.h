// The scheduler's knobs (DESIGN §4), its named profiles, and how they are set (flags, a JSON
// config file) and shown (start-up log line, Prometheus gauges).
//
// Precedence: a profile gives every knob a value; a config file may name a profile and set
// knobs on top of it; flags set knobs on top of that. `--scheduler-profile` on the command
// line wins over the file's "profile".
//
//   Flags (both `--name value` and `--name=value`; '-' and '_' are interchangeable):
//     --scheduler-profile interactive|offline
//     --scheduler-config FILE         JSON object: {"profile": "offline", "max_batch": 128, ...}
//     --max-batch N  --max-step-tokens N  --max-wait-ms MS  --max-burst-wait-ms MS  --prefill-chunk N
//     --mixed-prefill-tokens N
//     --priority-classes N  --aging-ms MS
//     --speculation off|auto|ngram|draft  --spec-depth N  --spec-ngram-max N  --spec-ngram-min N
//     --spec-probe-interval STEPS  --spec-probe-steps STEPS  --spec-hysteresis H
//   (coordinator/speculation.h says what the speculation knobs do)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "coordinator/speculation.h"

namespace tessera {

struct SchedulerConfig {
  std::string profile = "interactive";  // the profile the values started from (a label)
  int32_t max_batch = 32;               // most sequences in one step (and most running at once)
  int32_t max_step_tokens = 2048;       // token budget per step: decode tokens + prefill pieces
  double max_wait_ms = 2.0;             // longest a new prefill waits for companions
  // A companion within max_wait_ms starts a burst: while new requests keep arriving, each
  // within max(max_wait_ms, max_burst_wait_ms / 5) of the one before, the wait extends to that
  // gap after the newest, but never past max_burst_wait_ms after the first (<= max_wait_ms: no
  // extension).
  double max_burst_wait_ms = 50.0;
  int32_t prefill_chunk = 512;          // longest prefill (or recompute) piece per step, tokens
  // Most prefill (and recompute) tokens in a step that also decodes (0: only max_step_tokens
  // limits them): what one step's prefill adds to the running sequences' inter-token latency.
  // Steps without decodes are not limited (nobody waits on them).
  int32_t mixed_prefill_tokens = 0;
  int32_t priority_classes = 2;         // request priority in [0, classes); 0 is served first
  double aging_ms = 5000.0;             // a request's class improves by one per aging_ms in the system
  SpeculationConfig speculation;        // drafts and their gate; mode: what a request without the field gets
  // KV tokens per block the config was tuned for (`tessera tune` writes it); 0: not set, the
  // --block-size flag (or its default) decides. An explicit --block-size wins over it.
  int32_t block_size = 0;
};

// "interactive" or "offline"; NotFound listing the known names otherwise.
Result<SchedulerConfig> scheduler_profile(std::string_view name);
std::vector<std::string> scheduler_profile_names();

// InvalidArgument naming the knob and value: max_batch < 1, max_step_tokens < max_batch
// (every running sequence must be able to decode in each step), prefill_chunk < 1,
// mixed_prefill_tokens < 0,
// max_wait_ms < 0, max_burst_wait_ms < 0, priority_classes outside 1..16, aging_ms <= 0, non-finite values, and the
// speculation knobs (validate_speculation_config).
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

// One line for the start-up log:
// "scheduler: profile=interactive max_batch=32 max_step_tokens=2048 max_wait_ms=2 ..."
std::string format_scheduler_config(const SchedulerConfig& config);
// Prometheus text exposition: a HELP and TYPE line and one gauge per knob, e.g.
// tessera_scheduler_max_batch{profile="interactive"} 32
std::string scheduler_config_prometheus(const SchedulerConfig& config);

}  // namespace tessera
