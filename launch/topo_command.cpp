// `tessera topo`: the machine map from hwloc and the binding each rank would get.
#include <cstdio>
#include <memory>

#include "launch/commands.h"
#include "topology/topology.h"

namespace tessera::cli {
namespace {

struct TopoArgs {
  int ranks = 0;  // 0: one per GPU, else one per NUMA node... default 2 on CPU
  std::string device = "cpu";
};

int run_topo(const TopoArgs& a) {
  auto topo = discover_topology();
  if (!topo.is_ok()) return fail(topo.status().to_string());
  const DeviceKind kind = a.device == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
  int ranks = a.ranks;
  if (ranks <= 0) ranks = kind == DeviceKind::kCuda && !topo->gpus.empty() ? static_cast<int>(topo->gpus.size())
                                                                          : static_cast<int>(topo->numa_nodes.size());
  std::fputs(format_topology(*topo, plan_bindings(*topo, std::max(1, ranks), kind)).c_str(), stdout);
  return 0;
}

}  // namespace

Runner add_topo_command(CLI::App& app) {
  auto a = std::make_shared<TopoArgs>();
  app.add_option("--ranks", a->ranks, "ranks to plan bindings for (default: one per GPU, or per NUMA node)");
  app.add_option("--device", a->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  return [a] { return run_topo(*a); };
}

}  // namespace tessera::cli
