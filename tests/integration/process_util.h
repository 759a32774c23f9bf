// Running the project's executables from integration tests.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/env.h"

namespace tessera::testing {

struct ProcessResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline std::string bin(const std::string& name) {
  return env_string("TESSERA_BIN_DIR", "build/bin") + "/" + name;
}

inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs a shell command to completion; `on_line` sees each output line as it arrives.
inline ProcessResult run(const std::string& command, const std::function<void(const std::string&)>& on_line = {}) {
  ProcessResult r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (fgets(buf, sizeof(buf), p)) {
    r.output += buf;
    if (on_line) on_line(buf);
  }
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

inline std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

// Live (non-zombie) processes whose command line contains `pattern`.
inline int count_live_processes(const std::string& pattern) {
  const ProcessResult r = run("ps -eo stat=,args= | grep -F -- " + quote(pattern) + " | grep -v -e grep -e '^Z' | wc -l");
  return std::atoi(r.output.c_str());
}

inline bool wait_until(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return cond();
}

// The whole number that follows the first `before` in `text` when `after` comes right behind it
// (e.g. "drafts proposed, 12 kept": before "drafts proposed, ", after " kept"); -1 when there is
// none. (No std::regex in the tests: under the sanitizers its libstdc++ headers warn at -O2,
// and a warning fails that build.)
inline long long number_between(const std::string& text, const std::string& before, const std::string& after) {
  const size_t at = text.find(before);
  if (at == std::string::npos) return -1;
  size_t end = at + before.size();
  const size_t start = end;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
  if (end == start || text.compare(end, after.size(), after) != 0) return -1;
  return std::stoll(text.substr(start, end - start));
}

}  // namespace tessera::testing
