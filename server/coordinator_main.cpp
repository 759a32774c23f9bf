// tessera-coordinator: the coordinator alone. It serves the OpenAI API and waits for shards
// started elsewhere (e.g. `mpirun -np N tessera-shard --coordinator tcp://HOST:PORT ...`), so it
// can run outside mpirun on any host the shards reach.
#include <cstdio>

#include "server/server_cli.h"

int main(int argc, char** argv) {
  tessera::ServerCli cli;
  CLI::App app{"tessera-coordinator: OpenAI API, scheduler and KV accounting for shards started elsewhere"};
  cli.add_to(app, /*spawns_shards=*/false);
  CLI11_PARSE(app, argc, argv);
  cli.options.spawn_shards = false;
  if (cli.options.shard_endpoint.empty()) cli.options.shard_endpoint = "tcp://0.0.0.0:7070";
  tessera::Status s = cli.finish();
  if (!s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
    return 1;
  }
  return tessera::run_server(cli.options);
}
