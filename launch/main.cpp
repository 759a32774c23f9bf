// `tessera`: the user-facing CLI (launch/README.md).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>

#include "launch/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"Tessera: tensor-parallel LLM inference runtime"};
  app.require_subcommand(1);
  std::map<CLI::App*, tessera::cli::Runner> runners;
  auto add = [&](const char* name, const char* help, auto factory) {
    CLI::App* sub = app.add_subcommand(name, help);
    runners[sub] = factory(*sub);
  };
  add("generate", "Generate text from a prompt (streams to stdout)", tessera::cli::add_generate_command);
  add("serve", "Serve the OpenAI API on this node: coordinator and N shards", tessera::cli::add_serve_command);
  add("launch", "Serve across hosts: run the shards with mpirun (--dry-run prints the line)",
      tessera::cli::add_launch_command);
  add("topo", "Print the machine map (hwloc) and the binding each rank would get", tessera::cli::add_topo_command);
  add("tokenize", "Print the token ids of text read on stdin as JSON", tessera::cli::add_tokenize_command);
  add("grammar", "Compile a structured-output constraint as a request would, and check texts against it",
      tessera::cli::add_grammar_command);
  add("plan", "Cost accounts of a deployment: memory bill and predicted step time (--measure: beside measured)",
      tessera::cli::add_plan_command);
  add("eval", "Quality per precision and workload class (code, math, prose) against a reference: KL, perplexity, canaries",
      tessera::cli::add_eval_command);
  add("tune", "Scheduler profile from a trace and an SLO, on a simulator calibrated against the engine",
      tessera::cli::add_tune_command);
  add("bench", "Benchmarks: `bench serve` (load-test an OpenAI-compatible server), `bench scale` (TP scaling)",
      tessera::cli::add_bench_command);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : runners)
    if (sub->parsed()) return run();
  return 2;
}
