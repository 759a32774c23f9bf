// `tessera serve`: one node: the coordinator (this process) and N shards it starts itself
// (a tessera-shard for TP = 1, mpirun for TP > 1). Ctrl-C stops every process it started.
// `tessera launch`: the same across hosts (--hosts / --hostfile): builds and runs the mpirun
// line for the shards, with the coordinator here, reachable over tcp; --dry-run prints it.
// --launch-agent, --mca and --mpirun-arg shape that mpirun line (how it reaches the other
// hosts, which networks Open MPI uses).
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "cli/flags.h"
#include "common/process.h"
#include "server/server_cli.h"
#include "eval/report.h"
#include "launch/commands.h"

namespace tessera::cli {

namespace {

// --quality-budget / --quality-report: the deployment starts only with a precision whose loss,
// measured by `tessera eval` on this model file, is within budget for every class it serves.
struct QualityGateFlags {
  std::string budget;
  std::string report;
};

std::shared_ptr<QualityGateFlags> add_quality_gate_flags(CLI::App& app) {
  auto g = std::make_shared<QualityGateFlags>();
  app.add_option("--quality-budget", g->budget,
                 "refuse to start unless the served precision's measured loss is within budget: "
                 "class=max_kl pieces, e.g. code=0.05,math=0.05,chat=0.02 (mean KL from the reference in nats per "
                 "token, from `tessera eval`; chat is measured on prose)");
  app.add_option("--quality-report", g->report, "the `tessera eval` report (default: <model>.eval.json)");
  return g;
}

// Ok (printing what passed) or the error naming the numbers.
Status check_quality_gate(const QualityGateFlags& g, const ServerOptions& o) {
  if (g.budget.empty()) {
    if (!g.report.empty()) return Status::invalid_argument("--quality-report without --quality-budget: nothing to check");
    return Status::ok();
  }
  TESSERA_ASSIGN_OR_RETURN(QualityBudget budget, parse_quality_budget(g.budget));
  const std::string precision =
      served_precision_name(o.shard.quant == WeightQuant::kNone ? "" : std::string(weight_quant_name(o.shard.quant)),
                            !o.shard.imatrix.empty());
  const std::string report = g.report.empty() ? default_eval_report_path(o.model_path) : g.report;
  TESSERA_ASSIGN_OR_RETURN(std::string line, apply_quality_gate(o.model_path, precision, budget, report));
  std::fprintf(stderr, "%s\n", line.c_str());
  return Status::ok();
}

}  // namespace

Runner add_serve_command(CLI::App& app) {
  auto cli = std::make_shared<ServerCli>();
  cli->add_to(app, /*spawns_shards=*/true);
  auto gate = add_quality_gate_flags(app);
  return [cli, gate] {
    Status s = cli->finish();
    if (!s.is_ok()) return fail(s.to_string());
    if (Status b = resolve_auto_block_size(cli->options); !b.is_ok()) return fail(b.to_string());
    if (Status g = check_quality_gate(*gate, cli->options); !g.is_ok()) return fail(g.to_string());
    return run_server(cli->options);
  };
}

Runner add_launch_command(CLI::App& app) {
  auto cli = std::make_shared<ServerCli>();
  auto dry_run = std::make_shared<bool>(false);
  cli->add_to(app, /*spawns_shards=*/true);
  app.add_option("--hosts", cli->options.hosts, "hosts for the shards (comma-separated, host or host:slots)")
      ->delimiter(',');
  app.add_option("--hostfile", cli->options.hostfile, "an Open MPI hostfile for the shards");
  app.add_option("--launch-agent", cli->options.launch_agent,
                 "how mpirun starts its daemons on the other hosts (Open MPI plm_rsh_agent; default ssh): a "
                 "command called as `AGENT HOST COMMAND...`, like ssh");
  auto mca = std::make_shared<std::vector<std::pair<std::string, std::string>>>();
  app.add_option("--mca", *mca, "an Open MPI parameter for mpirun and the shards: --mca NAME VALUE (repeatable)");
  app.add_option("--mpirun-arg", cli->options.extra_mpirun_args,
                 "an extra argument for mpirun (repeatable; --mpirun-arg=-x for one that starts with a dash)");
  app.add_flag("--dry-run", *dry_run, "print the coordinator and mpirun command lines, start nothing");
  auto gate = add_quality_gate_flags(app);
  return [cli, dry_run, mca, gate] {
    Status s = cli->finish();
    if (!s.is_ok()) return fail(s.to_string());
    if (Status b = resolve_auto_block_size(cli->options); !b.is_ok()) return fail(b.to_string());
    ServerOptions& o = cli->options;
    if (Status g = check_quality_gate(*gate, o); !g.is_ok()) return fail(g.to_string());
    for (const auto& [name, value] : *mca) o.extra_mpirun_args.insert(o.extra_mpirun_args.end(), {"--mca", name, value});
    if (o.shard_endpoint.empty()) o.shard_endpoint = "tcp://0.0.0.0:7070";
    if (*dry_run) {
      const std::string port = o.shard_endpoint.substr(o.shard_endpoint.rfind(':') + 1);
      std::printf("# coordinator (this process, outside mpirun): HTTP on %s:%d, shards connect to %s\n", o.host.c_str(),
                  o.port, o.shard_endpoint.c_str());
      o.force_mpirun = true;
      std::printf("%s\n", describe_shard_command(o, "tcp://" + this_hostname() + ":" + port).c_str());
      return 0;
    }
    o.force_mpirun = true;  // launch always runs the shards under mpirun, even one
    return run_server(o);
  };
}

}  // namespace tessera::cli
