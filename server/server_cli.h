// Command-line options of a serving process, shared by `tessera serve`, `tessera launch` and
// `tessera-coordinator`: register them on a CLI11 app, then finish() turns them into
// ServerOptions (profile, then a config file, then individual knobs, then validation).
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>

#include <map>
#include <memory>
#include <string>

#include "cli/default_model.h"
#include "cli/flags.h"
#include "common/status.h"
#include "server/server.h"

namespace tessera {

// The scheduler's command-line layer: --profile, --scheduler-config and one flag per knob of
// engine/scheduler_knobs.h (with --speculation), for `serve`, `launch`, `tessera-coordinator`
// and `tune simulate`. apply() layers them in their order of precedence and validates.
struct SchedulerFlags {
  std::string profile;  // empty: interactive, or the config file's "profile"
  std::string file;
  std::map<std::string, std::string> knobs;  // knob key -> value given on the command line

  void add_to(CLI::App& app) {
    app.add_option("--profile", profile,
                   "scheduler profile: interactive or offline (wins over a --scheduler-config file's \"profile\")")
        ->default_str("interactive");
    app.add_option("--scheduler-config", file, "JSON file of scheduler knobs (`tessera tune` writes one)");
    for (const SchedulerKnobInfo& k : scheduler_knob_infos()) {
      std::string& value = knobs[std::string(k.key)];
      // A flag the command already has (`tune simulate`'s --priority-classes, which also shapes
      // its generated trace) sets the knob too.
      if (CLI::Option* existing = app.get_option_no_throw(k.flag))
        existing->each([&value](const std::string& v) { value = v; });
      else
        app.add_option(k.flag, value, k.help);
    }
  }
  Status apply(SchedulerConfig& config) const {
    std::vector<std::pair<std::string, std::string>> given(knobs.begin(), knobs.end());
    return apply_scheduler_layers(config, profile, file, given);
  }
};

struct ServerCli {
  ServerOptions options;
  SchedulerFlags scheduler;
  double max_kv_gb = 0;
  std::string block_size_text;

  void add_to(CLI::App& app, bool spawns_shards) {
    ServerOptions& o = options;
    cli::add_model_flag(app, o.model_path, "HF model directory or .gguf file");
    app.add_option("--model-name", o.model_name, "the model id clients use (default: the file or directory name)");
    app.add_option("--chat-template", o.chat_template_path, "Jinja chat template file (overrides the model's)");
    app.add_option("--tp", o.tp, "tensor-parallel shards")->capture_default_str()->check(CLI::Range(1, 512));
    app.add_option("--host", o.host, "HTTP address to listen on")->capture_default_str();
    app.add_option("--port", o.port, "HTTP port (0: ephemeral)")->capture_default_str();
    app.add_option("--block-size", block_size_text,
                   "KV cache tokens per block (16..1024), or auto: chosen for --expected-lengths / --expected-trace by "
                   "the step-time model (default 16, or the --scheduler-config's block_size)");
    app.add_option("--expected-lengths", o.expected_lengths,
                   "the request lengths --block-size auto plans for: chat, docs, docs-2k, PROMPT/OUTPUT or MIX*W+MIX*W")
        ->capture_default_str();
    app.add_option("--expected-trace", o.expected_trace, "a JSONL trace whose lengths --block-size auto plans for");
    // The shards' options: all of them for a command that starts shards; what it plans with
    // (--kv-dtype) for a coordinator whose shards start elsewhere.
    cli::add_shard_runtime_flags(app, o.shard,
                                 spawns_shards ? cli::ShardFlagsFor::kLauncher : cli::ShardFlagsFor::kCoordinator);
    app.add_option("--headroom", o.headroom, "fraction of each shard's memory never planned for KV")->capture_default_str();
    app.add_option("--max-kv-gb", max_kv_gb, "cap on each shard's KV cache (default: 2 for CPU shards)");
    cli::add_window_pool_flag(app, o.kv_window_pool);
    app.add_option("--max-queued", o.max_queued_sequences, "queued sequences before 429")->capture_default_str();
    scheduler.add_to(app);
    app.add_option("--step-log", o.step_log_path,
                   "append one JSON line per engine step (its tokens, sequences, context and times) to this file, "
                   "for `tessera tune calibrate`");
    app.add_option("--shard-endpoint", o.shard_endpoint, "control endpoint the shards connect to");
    app.add_option("--heartbeat-timeout-ms", o.heartbeat_timeout_ms,
                   "declare a silent shard dead (one on another host; one on this host whose process is gone)")
        ->capture_default_str();
    app.add_option("--dead-timeout-ms", o.dead_timeout_ms,
                   "declare a silent shard on this host dead although its process is alive (a loaded or stopped host)")
        ->capture_default_str();
    app.add_option("--max-restarts", o.max_restarts,
                   "restart a failed shard group (with backoff) at most this many times in a row (0: never)")
        ->check(CLI::Range(0, 1000))
        ->capture_default_str();
    app.add_option("--grammar-compile-timeout", o.grammar_compile_timeout_ms,
                   "milliseconds a structured-output request's schema, regex or grammar may take to compile "
                   "(beyond: 400; the compilation finishes in the background and is cached)")
        ->check(CLI::Range(int64_t{1}, int64_t{600000}))
        ->capture_default_str();
    app.add_option("--reasoning-parser", o.reasoning_parser,
                   "chat replies' <think> ... </think> part as reasoning_content, a schema or tool call constrained "
                   "after it: auto (when the chat template writes <think>), think, none")
        ->check(CLI::IsMember({"auto", "think", "none"}))
        ->capture_default_str();
    app.add_option("--shutdown-grace", o.shutdown_grace_s,
                   "seconds the requests in flight get to finish after SIGTERM / SIGINT (new ones get 503)")
        ->check(CLI::Range(0.0, 86400.0))
        ->capture_default_str();
    if (spawns_shards) {
      app.add_option("--bind", o.bind, "auto (shards bind from hwloc), none, or core (mpirun binds)")
          ->check(CLI::IsMember({"auto", "none", "core"}));
      app.add_option("--shard-arg", o.extra_shard_args, "an extra argument for every shard (repeatable)")->group("");
    }
  }

  Status finish() {
    ServerOptions& o = options;
    TESSERA_RETURN_IF_ERROR(cli::resolve_model_flag(o.model_path));
    TESSERA_RETURN_IF_ERROR(scheduler.apply(o.scheduler));
    if (block_size_text == "auto") {
      o.block_size_auto = true;
      o.block_size_source = "auto";
    } else if (!block_size_text.empty()) {
      int64_t b = 0;
      auto [p, ec] = std::from_chars(block_size_text.data(), block_size_text.data() + block_size_text.size(), b);
      if (ec != std::errc() || p != block_size_text.data() + block_size_text.size())
        return Status::invalid_argument("--block-size '" + block_size_text + "': expected a number of tokens or auto");
      TESSERA_RETURN_IF_ERROR(validate_block_size(b).with_context("--block-size"));
      o.block_size = b;
      o.block_size_source = "flag";
    } else if (o.scheduler.block_size > 0) {
      o.block_size = o.scheduler.block_size;
      o.block_size_source = "scheduler-config";
    }
    if (max_kv_gb > 0) o.max_kv_bytes = static_cast<uint64_t>(max_kv_gb * (1ull << 30));
    return Status::ok();
  }
};

}  // namespace tessera
