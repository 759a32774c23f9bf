// Subcommands of the `tessera` CLI. Each registers its options on a CLI11 app and returns the
// callback that runs it; the callback returns the process exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace tessera::cli {

using Runner = std::function<int()>;

Runner add_generate_command(CLI::App& app);
Runner add_tokenize_command(CLI::App& app);
Runner add_topo_command(CLI::App& app);
Runner add_serve_command(CLI::App& app);
Runner add_launch_command(CLI::App& app);
Runner add_plan_command(CLI::App& app);   // memory bill and step-time prediction
Runner add_bench_command(CLI::App& app);  // `bench serve`, `bench scale`
Runner add_eval_command(CLI::App& app);   // quality per precision and workload class

// Prints "error: <message>" to stderr and returns 1 (the common error exit).
int fail(const std::string& message);

}  // namespace tessera::cli
