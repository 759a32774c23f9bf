// Subcommands of the `tessera` CLI. Each registers its options on a CLI11 app and returns the
// callback that runs it; the callback returns the process exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace tessera {
struct ServerOptions;
class Status;
}  // namespace tessera

namespace tessera::cli {

using Runner = std::function<int()>;

Runner add_generate_command(CLI::App& app);
Runner add_tokenize_command(CLI::App& app);
Runner add_grammar_command(CLI::App& app);  // compile a constraint, check texts against it
Runner add_topo_command(CLI::App& app);
Runner add_serve_command(CLI::App& app);
Runner add_launch_command(CLI::App& app);
Runner add_plan_command(CLI::App& app);   // memory bill and step-time prediction
Runner add_bench_command(CLI::App& app);  // `bench serve`, `bench scale`
Runner add_eval_command(CLI::App& app);   // quality per precision and workload class
Runner add_tune_command(CLI::App& app);   // scheduler profile from a trace and an SLO, on the simulator

// `--block-size auto` (tune/block_size.h): picks o.block_size for o.expected_trace or
// o.expected_lengths with the step-time model stored for the model (TP o.tp; the CPU entry when
// the shards run on the CPU), else the roofline prior of this CPU; sets the source and reason.
// No-op unless o.block_size_auto.
Status resolve_auto_block_size(ServerOptions& o);

// Prints "error: <message>" to stderr and returns 1 (the common error exit).
int fail(const std::string& message);

}  // namespace tessera::cli
