// `tessera bench serve`: runs the load generator (loadgen/load_generator.h) at one load or a
// sweep of loads against an OpenAI-compatible server and reports, per load level: request and
// token throughput, goodput under the SLO, and TTFT / ITL / E2E at P50, P90 and P99. Output:
// a table on stdout, optionally a JSON file, PNG plots (bench/plot_serve.py: latency
// percentiles against offered load; batch size and KV usage over time when the server exports
// them on /metrics) and a markdown section (machine, command, date, numbers) appended to a
// results file. A progress bar goes to stderr when it is a terminal (or with `progress`).
#pragma once

#include <string>
#include <vector>

#include "loadgen/load_generator.h"

namespace tessera {

struct ServeBenchOptions {
  LoadOptions load;                     // one level; a sweep replaces concurrency or rate
  std::vector<int> sweep_concurrency;   // closed-loop levels
  std::vector<double> sweep_rate;       // open-loop levels (requests/s)
  std::string title;                    // names the run in reports and plot legends
  std::string json_path;                // "" : no JSON file (a temporary one feeds the plots)
  bool json_requests = false;           // also write every request's record into the JSON
  std::string plot_prefix;              // "" : the JSON path without ".json"; PNGs are <prefix>-*.png
  bool plots = true;
  bool install_plot_deps = true;        // may create .venv and pip-install matplotlib
  std::string markdown_path;            // "" : none; else a section is appended
  bool force_progress = false;          // progress bar even when stderr is not a terminal
  bool no_progress = false;
  std::string command_line;             // for the reports
};

// One load level's outcome.
struct ServeLevel {
  std::string mode;   // "concurrency", "poisson", "fixed-rate", "trace"
  double load = 0;    // clients or requests/s (0 for a trace)
  RunResult result;
};

// The terminal/markdown table: one row per level.
std::string format_serve_table(const std::vector<ServeLevel>& levels, bool markdown);

// Runs every level and writes the reports; returns the process exit code (0 when every level
// ran, even if some requests failed; 1 when a level could not run).
int run_serve_bench(const ServeBenchOptions& options);

}  // namespace tessera
