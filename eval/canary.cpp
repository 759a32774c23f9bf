#include "eval/canary.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tessera {

namespace {

using Json = nlohmann::json;

// The driver: reads programs (JSONL) from argv[1], writes verdicts (JSONL, same order) to
// argv[2]. Parsing is checked in the driver (ast.parse never runs the code); each program runs
// in a child interpreter with resource limits set before exec.
constexpr const char* kDriver = R"PY(
import ast, json, os, resource, subprocess, sys, tempfile
src, dst, timeout, mem_mb = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
def limits():
    os.setsid()
    mem = mem_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = int(timeout) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
out = open(dst, "w")
for line in open(src):
    p = json.loads(line)
    v = {"id": p["id"], "parses": False, "passed": False, "detail": ""}
    try:
        ast.parse(p["source"])
        v["parses"] = True
    except SyntaxError as e:
        v["detail"] = "SyntaxError: %s (line %s)" % (e.msg, e.lineno)
    except Exception as e:
        v["detail"] = "%s: %s" % (type(e).__name__, e)
    if v["parses"]:
        with tempfile.TemporaryDirectory() as d:
            # Output goes to files, not pipes (a child that keeps a pipe open cannot stall the
            # driver), and the program's whole process group is killed when it ends or times
            # out (nothing it forked outlives it).
            with tempfile.TemporaryFile() as err_file:
                proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", p["source"] + "\n" + p["test"]],
                                        cwd=d, env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=err_file, preexec_fn=limits)
                try:
                    rc = proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    rc = None
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
                if rc is None:
                    proc.wait()
                    v["detail"] = "timed out after %.1f s" % timeout
                else:
                    v["passed"] = rc == 0
                    if rc != 0:
                        err_file.seek(0)
                        err = err_file.read()[-4096:].decode("utf-8", "replace").strip().splitlines()
                        v["detail"] = err[-1][:200] if err else "exit status %d" % rc
    out.write(json.dumps(v) + "\n")
out.close()
)PY";

}  // namespace

std::string cut_code_completion(const std::string& completion) {
  size_t pos = 0;
  while (pos < completion.size()) {
    const size_t nl = completion.find('\n', pos);
    if (nl == std::string::npos) break;
    const size_t next = nl + 1;
    if (next < completion.size() && completion[next] != ' ' && completion[next] != '\t' &&
        completion[next] != '\n' && completion[next] != '\r')
      return completion.substr(0, nl + 1);
    pos = next;
  }
  return completion;
}

bool math_answer_matches(const std::string& completion, const std::string& answer) {
  std::string line = completion.substr(0, completion.find('\n'));
  const auto not_space = [](char c) { return c != ' ' && c != '\t' && c != '\r'; };
  while (!line.empty() && !not_space(line.front())) line.erase(line.begin());
  while (!line.empty() && (!not_space(line.back()) || line.back() == '.')) line.pop_back();
  return !line.empty() && line == answer;
}

Result<std::vector<CodeVerdict>> run_code_programs(const std::vector<CodeProgram>& programs,
                                                  const std::string& python, const SandboxLimits& limits) {
  namespace fs = std::filesystem;
  std::vector<CodeVerdict> verdicts;
  if (programs.empty()) return verdicts;
  char tmpl[] = "/tmp/tessera-canary-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Status::io_error("cannot make a temporary directory for the canaries");
  const fs::path dir(tmpl);
  const std::string in = (dir / "programs.jsonl").string(), out = (dir / "verdicts.jsonl").string();
  {
    std::ofstream f(in);
    for (const CodeProgram& p : programs)
      f << Json{{"id", p.id}, {"source", p.source}, {"test", p.test}}.dump() << "\n";
  }
  const std::string timeout = fmt::format("{}", limits.timeout_s), mem = fmt::format("{}", limits.memory_mb);
  const pid_t pid = fork();
  if (pid < 0) {
    fs::remove_all(dir);
    return Status::io_error("fork failed for the canary driver");
  }
  if (pid == 0) {
    execlp(python.c_str(), python.c_str(), "-I", "-c", kDriver, in.c_str(), out.c_str(), timeout.c_str(),
           mem.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::ifstream f(out);
  std::string line;
  while (f && std::getline(f, line)) {
    try {
      const Json j = Json::parse(line);
      verdicts.push_back({j.at("parses").get<bool>(), j.at("passed").get<bool>(), j.at("detail").get<std::string>()});
    } catch (const Json::exception& e) {
      fs::remove_all(dir);
      return Status::internal(fmt::format("canary driver ({}): unreadable verdict: {}", python, e.what()));
    }
  }
  fs::remove_all(dir);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || verdicts.size() != programs.size())
    return Status::unavailable(fmt::format(
        "canary driver: `{}` {} with {} of {} verdicts (is a Python 3 interpreter there?)", python,
        WIFEXITED(status) ? fmt::format("exited with status {}", WEXITSTATUS(status)) : std::string("was killed"),
        verdicts.size(), programs.size()));
  return verdicts;
}

}  // namespace tessera
