#include "loadgen/bench_report.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "common/env.h"

#ifndef TESSERA_SOURCE_DIR
#define TESSERA_SOURCE_DIR ""
#endif

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct CommandOutput {
  int exit_code = -1;
  std::string output;
};

// Runs a shell command line, collecting stdout and stderr.
CommandOutput run_shell(const std::string& line) {
  CommandOutput r;
  FILE* p = ::popen((line + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), p)) r.output += buf;
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

bool has_matplotlib(const std::string& python) {
  return run_shell(shell_quote(python) + " -c 'import matplotlib' ").exit_code == 0;
}

}  // namespace

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,@+%") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

MachineInfo machine_info() {
  MachineInfo m;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  m.hostname = host;
  m.hardware_threads = static_cast<int>(std::thread::hardware_concurrency());
  std::ifstream cpu("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpu, line)) {
    if (line.rfind("model name", 0) == 0) {
      m.cpu_model = line.substr(line.find(':') + 2);
      break;
    }
  }
  if (m.cpu_model.empty()) m.cpu_model = "unknown CPU";
  std::ifstream mem("/proc/meminfo");
  while (std::getline(mem, line)) {
    if (line.rfind("MemTotal:", 0) == 0) {
      m.memory_gib = std::strtod(line.c_str() + 9, nullptr) / (1024.0 * 1024.0);
      break;
    }
  }
  std::ifstream load("/proc/loadavg");
  load >> m.load_average_1m >> m.load_average_5m;
  return m;
}

std::string describe_machine(const MachineInfo& m) {
  return fmt::format("{}, {}, {} hardware threads, {:.0f} GiB RAM; load average {:.2f} (1 min), {:.2f} (5 min)",
                     m.hostname, m.cpu_model, m.hardware_threads, m.memory_gib, m.load_average_1m,
                     m.load_average_5m);
}

std::string utc_date() {
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  return date;
}

std::string bench_source_dir() {
  const std::string built = TESSERA_SOURCE_DIR;
  if (!built.empty() && fs::exists(fs::path(built) / "bench")) return built;
  // A relocated build: build/bin/tessera -> ../../
  char exe[PATH_MAX] = {};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    const fs::path root = fs::path(std::string(exe, static_cast<size_t>(n))).parent_path().parent_path().parent_path();
    if (fs::exists(root / "bench" / "plot_serve.py")) return root.string();
  }
  return built.empty() ? "." : built;
}

Result<std::string> find_plot_python(bool install) {
  const std::string root = bench_source_dir();
  const std::string venv = (fs::path(root) / ".venv").string();
  const std::string venv_python = venv + "/bin/python";
  std::vector<std::string> candidates;
  const std::string forced = env_string("TESSERA_BENCH_PYTHON", "");
  if (!forced.empty()) candidates.push_back(forced);
  if (fs::exists(venv_python)) candidates.push_back(venv_python);
  candidates.push_back("python3");
  for (const std::string& p : candidates)
    if (has_matplotlib(p)) return p;
  if (!install) {
    std::string tried;
    for (const std::string& c : candidates) tried += (tried.empty() ? "" : ", ") + c;
    return Status::not_found("no Python with matplotlib (tried " + tried + ")");
  }
  if (!fs::exists(venv_python)) {
    std::fprintf(stderr, "note: creating %s for the plots\n", venv.c_str());
    const CommandOutput r = run_shell("python3 -m venv " + shell_quote(venv));
    if (r.exit_code != 0) return Status::unavailable("cannot create " + venv + ": " + r.output);
  }
  std::fprintf(stderr, "note: installing matplotlib into %s for the plots (--no-plots skips them)\n", venv.c_str());
  const CommandOutput r =
      run_shell(shell_quote(venv + "/bin/pip") + " install --quiet --disable-pip-version-check matplotlib");
  if (r.exit_code != 0 || !has_matplotlib(venv_python))
    return Status::unavailable("matplotlib could not be installed into " + venv + ": " + r.output.substr(0, 500));
  return venv_python;
}

Status run_plot_script(const std::string& python, const std::string& script, const std::vector<std::string>& args) {
  const std::string path = (fs::path(bench_source_dir()) / "bench" / script).string();
  if (!fs::exists(path)) return Status::not_found("plot script " + path + " not found");
  std::string line = shell_quote(python) + " " + shell_quote(path);
  for (const std::string& a : args) line += " " + shell_quote(a);
  const CommandOutput r = run_shell(line);
  if (r.exit_code != 0) return Status::internal(script + " failed (exit " + std::to_string(r.exit_code) + "): " + r.output);
  return Status::ok();
}

Status append_text_file(const std::string& path, const std::string& text) {
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  std::ofstream f(path, std::ios::app);
  if (!f) return Status::io_error("cannot open " + path + " for appending");
  f << text;
  if (!f) return Status::io_error("cannot write " + path);
  return Status::ok();
}

Status write_text_file(const std::string& path, const std::string& text) {
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  std::ofstream f(path, std::ios::trunc);
  if (!f) return Status::io_error("cannot open " + path + " for writing");
  f << text;
  if (!f) return Status::io_error("cannot write " + path);
  return Status::ok();
}

std::string format_table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows,
                         bool markdown, bool first_left, const std::vector<std::string>& markdown_head) {
  std::string out;
  if (markdown) {
    const std::vector<std::string>& h = markdown_head.empty() ? head : markdown_head;
    out += "|";
    for (const std::string& c : h) out += " " + c + " |";
    out += "\n|";
    for (size_t i = 0; i < h.size(); ++i) out += i == 0 && first_left ? "---|" : "---:|";
    out += "\n";
    for (const auto& r : rows) {
      out += "|";
      for (const std::string& c : r) out += " " + c + " |";
      out += "\n";
    }
    return out;
  }
  std::vector<size_t> width(head.size());
  for (size_t i = 0; i < head.size(); ++i) width[i] = head[i].size();
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size() && i < width.size(); ++i) width[i] = std::max(width[i], r[i].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (size_t i = 0; i < cells.size() && i < width.size(); ++i)
      s += (i ? "  " : "") + (i == 0 && first_left ? fmt::format("{:<{}}", cells[i], width[i])
                                                    : fmt::format("{:>{}}", cells[i], width[i]));
    return s + "\n";
  };
  out += line(head);
  for (const auto& r : rows) out += line(r);
  return out;
}

Result<std::vector<std::string>> write_json_and_plots(const std::string& json_text, const std::string& json_path,
                                                      const std::string& plot_prefix, bool plots, bool install_deps,
                                                      const std::string& script, const std::string& out_suffix,
                                                      const std::vector<std::string>& plot_suffixes) {
  std::string prefix = plot_prefix;
  if (prefix.empty() && !json_path.empty()) {
    prefix = json_path;
    if (prefix.size() > 5 && prefix.substr(prefix.size() - 5) == ".json") prefix.resize(prefix.size() - 5);
  }
  const bool want_plots = plots && !prefix.empty();
  std::string path = json_path;
  const bool temporary = path.empty() && want_plots;
  if (temporary) path = (fs::temp_directory_path() / fmt::format("tessera-bench-{}.json", ::getpid())).string();
  if (!path.empty()) {
    TESSERA_RETURN_IF_ERROR(write_text_file(path, json_text));
    if (!temporary) std::printf("wrote %s\n", path.c_str());
  }
  std::vector<std::string> drawn;
  if (want_plots) {
    auto python = find_plot_python(install_deps);
    Status s = python.is_ok() ? run_plot_script(*python, script, {"--out", prefix + out_suffix, path}) : python.status();
    if (!s.is_ok()) {
      std::fprintf(stderr, "note: no plots: %s\n", s.message().c_str());
    } else {
      for (const std::string& suffix : plot_suffixes) {
        if (!fs::exists(prefix + suffix)) continue;
        drawn.push_back(prefix + suffix);
        std::printf("wrote %s\n", drawn.back().c_str());
      }
    }
  }
  if (temporary) {
    std::error_code ec;
    fs::remove(path, ec);
  }
  return drawn;
}

}  // namespace tessera
