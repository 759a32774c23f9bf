#include "launch/tune_verify.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <thread>

#include "loadgen/http_client.h"

extern char** environ;

namespace tessera::cli {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The port is free when we look; the server binds it a moment later. Another process could take
// it in between, which shows up as a server that fails to start, with the reason in its log.
Result<int> pick_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::io_error(fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return Status::io_error(fmt::format("cannot pick a free port on 127.0.0.1: {}", std::strerror(err)));
  return static_cast<int>(ntohs(addr.sin_port));
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("wait status {}", status);
}

// The last `max_lines` lines of the server's log, for error messages ("" when there is no log).
std::string log_tail(const std::string& path, size_t max_lines) {
  if (path.empty()) return "";
  std::ifstream in(path);
  std::deque<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(std::move(line));
    if (lines.size() > max_lines) lines.pop_front();
  }
  std::string tail;
  for (const std::string& l : lines) tail += "\n  " + l;
  return tail.empty() ? "" : fmt::format("\nlast lines of {}:{}", path, tail);
}

// Owns the server's process group so that every way out of run_profile_on_engine stops it.
class ServerProcess {
 public:
  explicit ServerProcess(pid_t pid) : pid_(pid) {}
  ~ServerProcess() { stop(); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Reaps the leader when it has exited; `status` then holds its wait status.
  bool exited(int* status) {
    if (!reaped_ && ::waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
    if (reaped_ && status) *status = status_;
    return reaped_;
  }

  // SIGTERM lets the server drain and exit cleanly; SIGKILL after the grace period. The final
  // group SIGKILL also catches helpers the server started (shards) that outlived it.
  void stop(milliseconds grace = milliseconds(30000)) {
    if (pid_ <= 0) return;
    if (!exited(nullptr)) {
      ::kill(-pid_, SIGTERM);
      const auto deadline = Clock::now() + grace;
      while (!exited(nullptr) && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(50));
    }
    ::kill(-pid_, SIGKILL);
    if (!reaped_) {
      while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
      }
      reaped_ = true;
    }
    pid_ = -1;
  }

 private:
  pid_t pid_;
  bool reaped_ = false;
  int status_ = 0;
};

Result<pid_t> spawn_server(const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::string log = log_path.empty() ? "/dev/null" : log_path;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // stdin from /dev/null: a server in a background process group that read the terminal would stop (SIGTTIN).
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group, so one kill(-pgid) reaches the server and everything it starts.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0].c_str(), &actions, &attr, args.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    return Status::unavailable(
        fmt::format("cannot start '{}' (log {}): {}", argv[0], log, std::strerror(rc)));
  return pid;
}

// Polls /health until it answers 200; a starting server refuses connections or answers 503.
Status wait_until_healthy(ServerProcess& server, int port, const VerifyOptions& options) {
  HttpClientOptions client_options;
  client_options.connect_timeout = milliseconds(1000);
  HttpClient client(HttpUrl{"127.0.0.1", port, ""}, client_options);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.startup_timeout_s));
  std::string last_answer = "no answer yet";
  for (;;) {
    int status = 0;
    if (server.exited(&status))
      return Status::unavailable(fmt::format("server on port {} exited during startup ({}){}", port,
                                             describe_wait_status(status), log_tail(options.log_path, 20)));
    auto health = client.get("/health", milliseconds(1000));
    if (health && health->status == 200) return Status::ok();
    last_answer = health ? fmt::format("HTTP {} {}", health->status, health->body) : health.status().to_string();
    if (Clock::now() >= deadline)
      return Status::unavailable(fmt::format("server on port {} not healthy after {} s (last /health: {}){}", port,
                                             options.startup_timeout_s, last_answer, log_tail(options.log_path, 20)));
    std::this_thread::sleep_for(milliseconds(200));
  }
}

}  // namespace

Result<RunSummary> run_profile_on_engine(const VerifyOptions& options, const std::string& profile_path,
                                         int64_t block_size) {
  TESSERA_ASSIGN_OR_RETURN(const int port, pick_free_port());

  LoadOptions load;
  load.url = fmt::format("http://127.0.0.1:{}", port);
  load.mode = ArrivalMode::kTrace;
  load.trace = options.trace;
  load.num_requests = static_cast<int64_t>(options.trace.size());
  load.slo = options.slo;
  load.ignore_eos = true;
  load.temperature = 0;
  load.stream = true;
  load.metrics_interval_ms = 0;
  // A bad trace is known now; finding out after a server startup of minutes would waste them.
  TESSERA_RETURN_IF_ERROR(validate_load_options(load));

  std::vector<std::string> argv = {options.tessera_exe, "serve", "--model", options.model, "--host", "127.0.0.1",
                                   "--port", std::to_string(port), "--scheduler-config", profile_path};
  if (block_size > 0) argv.insert(argv.end(), {"--block-size", std::to_string(block_size)});
  argv.insert(argv.end(), options.serve_args.begin(), options.serve_args.end());

  TESSERA_ASSIGN_OR_RETURN(const pid_t pid, spawn_server(argv, options.log_path));
  ServerProcess server(pid);
  TESSERA_RETURN_IF_ERROR(wait_until_healthy(server, port, options));

  auto run = run_load(load);
  server.stop();
  if (!run) return run.status().with_context(fmt::format("profile {} on port {}", profile_path, port));
  return std::move(run->summary);
}

}  // namespace tessera::cli
