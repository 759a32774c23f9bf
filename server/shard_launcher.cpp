#include "server/shard_launcher.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/env.h"

extern char** environ;

namespace tessera {

std::string sibling_executable(const std::string& name) {
  char exe[PATH_MAX] = {};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return name;
  return (std::filesystem::path(std::string(exe, static_cast<size_t>(n))).parent_path() / name).string();
}

std::vector<std::string> build_shard_command(const ShardLaunchSpec& s) {
  std::vector<std::string> shard = {s.shard_binary, "--model", s.model_path, "--coordinator", s.coordinator_endpoint};
  if (s.coordinator_pid > 0) shard.insert(shard.end(), {"--coordinator-pid", std::to_string(s.coordinator_pid)});
  if (s.bind != "auto") shard.push_back("--no-bind");
  const std::vector<std::string> runtime = shard_runtime_argv(s.runtime);
  shard.insert(shard.end(), runtime.begin(), runtime.end());
  shard.insert(shard.end(), s.extra_shard_args.begin(), s.extra_shard_args.end());
  const bool mpi = s.tp > 1 || s.force_mpirun || !s.hosts.empty() || !s.hostfile.empty();
  if (!mpi) return shard;

  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(s.tp)};
  if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");
  if (!s.hostfile.empty()) {
    cmd.insert(cmd.end(), {"--hostfile", s.hostfile});
  } else if (!s.hosts.empty()) {
    std::string list;
    for (const std::string& h : s.hosts) list += (list.empty() ? "" : ",") + h;
    cmd.insert(cmd.end(), {"--host", list});
  } else {
    // One host: more ranks than cores need --oversubscribe (they then run unbound and slow).
    const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    if (s.tp > cores) cmd.push_back("--oversubscribe");
  }
  if (s.bind == "core") {
    cmd.insert(cmd.end(), {"--bind-to", "core", "--map-by", "core"});
  } else {
    cmd.insert(cmd.end(), {"--bind-to", "none"});  // shards bind themselves from the hwloc map
  }
  // The shards' environment knobs travel with the job (mpirun warns about unset ones).
  for (const char* knob : {"TESSERA_LOG_LEVEL", "TESSERA_CUDA_LIBRARY"})
    if (std::getenv(knob)) cmd.insert(cmd.end(), {"-x", knob});
  if (!s.launch_agent.empty()) cmd.insert(cmd.end(), {"--mca", "plm_rsh_agent", s.launch_agent});
  cmd.insert(cmd.end(), s.extra_mpirun_args.begin(), s.extra_mpirun_args.end());
  cmd.insert(cmd.end(), shard.begin(), shard.end());
  return cmd;
}

std::string format_command(const std::vector<std::string>& argv) {
  std::string line;
  for (const std::string& a : argv) {
    if (!line.empty()) line += ' ';
    const bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                                         "-_./:=,@+") == std::string::npos;
    if (plain) {
      line += a;
    } else {
      line += '\'';
      for (char c : a) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
      line += '\'';
    }
  }
  return line;
}

ChildProcess::ChildProcess(ChildProcess&& o) noexcept : pid_(o.pid_), exited_(o.exited_), exit_code_(o.exit_code_) {
  o.pid_ = -1;
}

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    terminate();
    pid_ = o.pid_;
    exited_ = o.exited_;
    exit_code_ = o.exit_code_;
    o.pid_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() { terminate(); }

Result<ChildProcess> ChildProcess::spawn(const std::vector<std::string>& argv) {
  if (argv.empty()) return Status::invalid_argument("empty command");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, argv[0].c_str(), nullptr, &attr, args.data(), environ);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Status::unavailable("cannot start '" + argv[0] + "': " + std::strerror(rc));
  ChildProcess c;
  c.pid_ = pid;
  return c;
}

bool ChildProcess::running() {
  if (pid_ <= 0 || exited_) return false;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return true;
  exited_ = true;
  exit_code_ = r < 0 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return false;
}

bool ChildProcess::wait_for(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

void ChildProcess::terminate(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return;
  if (running()) {
    // The leader first (mpirun stops and reaps its ranks itself), then the whole group.
    ::kill(pid_, SIGTERM);
    if (!wait_for(grace)) {
      ::kill(-pid_, SIGTERM);
      if (!wait_for(std::chrono::milliseconds(500))) {
        ::kill(-pid_, SIGKILL);
        wait_for(std::chrono::milliseconds(5000));
      }
    }
  }
  // Stragglers of the group (e.g. ranks mpirun left behind) go too.
  ::kill(-pid_, SIGKILL);
  pid_ = -1;
}

}  // namespace tessera
