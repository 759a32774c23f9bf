// What every benchmark report carries (CONVENTIONS: numbers land in a results file with the
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

// Appends `text` to `path` (creating parent directories).
Status append_text_file(const std::string& path, const std::string& text);
Status write_text_file(const std::string& path, const std::string& text);

// Shell quoting for a command line shown to users or run through /bin/sh.
std::string shell_quote(const std::string& s);

}  // namespace tessera
