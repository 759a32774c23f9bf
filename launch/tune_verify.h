// `tessera tune --verify`: one scheduler profile on the real engine. Starts `tessera serve`
// (this executable) with the profile and block size on an ephemeral port, replays a trace
// against it with the load generator (loadgen/load_generator.h, open loop at the trace's arrival
// times), stops the server (SIGTERM, then SIGKILL after a grace period) and returns what the
// load generator measured.
#pragma once

#include <string>
#include <vector>

#include "loadgen/load_generator.h"
#include "common/status.h"

namespace tessera::cli {

struct VerifyOptions {
  std::string tessera_exe;               // this executable ("/proc/self/exe" resolved)
  std::string model;                     // --model for serve
  std::vector<std::string> serve_args;   // extra serve flags (--threads 2, --tp 2, ...)
  std::vector<TraceEntry> trace;         // with arrival_s
  SloSpec slo;
  double startup_timeout_s = 300;
  std::string log_path;                  // the server's stdout+stderr go here ("" : /dev/null)
};

// profile_path: a scheduler-config JSON; block_size > 0: passed as --block-size.
// Unavailable when the server does not come up (the message ends with the log's last lines).
Result<RunSummary> run_profile_on_engine(const VerifyOptions& options, const std::string& profile_path,
                                         int64_t block_size);

}  // namespace tessera::cli
