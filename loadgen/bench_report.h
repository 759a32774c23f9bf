// What every benchmark report carries (bench/README.md: numbers land in a results file with the
// machine, the command and the date), and the plotting hand-off to Python/matplotlib.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace tessera {

struct MachineInfo {
  std::string hostname;
  std::string cpu_model;
  int hardware_threads = 0;
  double memory_gib = 0;
  double load_average_1m = 0;  // /proc/loadavg when the info was taken
  double load_average_5m = 0;
};
MachineInfo machine_info();
std::string describe_machine(const MachineInfo& m);  // one line for a results file
std::string utc_date();                              // "2026-11-29 20:11 UTC"

// The repository root this binary was built from (for bench/*.py and .venv).
std::string bench_source_dir();

// An interpreter that can import matplotlib: $TESSERA_BENCH_PYTHON, <source>/.venv/bin/python,
// then python3. With `install`, when none can, creates <source>/.venv if absent and
// pip-installs matplotlib into it (the project's test venv; see scripts/test.sh). The error
// says why plots cannot be drawn.
Result<std::string> find_plot_python(bool install);

// Runs `python <source>/bench/<script> args...`; the error carries the script's output.
Status run_plot_script(const std::string& python, const std::string& script, const std::vector<std::string>& args);

// A results table: markdown (`| a | b |`, numeric columns right-aligned; the first column
// left-aligned when first_left) or aligned plain text for the terminal. `markdown_head`, when
// not empty, replaces `head` in the markdown form (e.g. with units added).
std::string format_table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows,
                         bool markdown, bool first_left, const std::vector<std::string>& markdown_head = {});

// Writes a benchmark's JSON report to `json_path` and, with `plots`, draws its PNGs with
// bench/<script> --out <prefix><out_suffix> <json>, where prefix is `plot_prefix` or else
// json_path without ".json" (no prefix: no plots). When only plots are wanted the JSON goes to a
// temporary file, removed afterwards. Returns the files among prefix + plot_suffixes that exist
// after drawing. A JSON that cannot be written is an error; plots that cannot be drawn are a note
// on stderr.
Result<std::vector<std::string>> write_json_and_plots(const std::string& json_text, const std::string& json_path,
                                                      const std::string& plot_prefix, bool plots, bool install_deps,
                                                      const std::string& script, const std::string& out_suffix,
                                                      const std::vector<std::string>& plot_suffixes);

// Appends `text` to `path` (creating parent directories).
Status append_text_file(const std::string& path, const std::string& text);
Status write_text_file(const std::string& path, const std::string& text);

// Shell quoting for a command line shown to users or run through /bin/sh.
std::string shell_quote(const std::string& s);

}  // namespace tessera
