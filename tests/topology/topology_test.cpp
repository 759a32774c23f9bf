#include "topology/topology.h"

#include <gtest/gtest.h>

#include <set>

namespace tessera {
namespace {

TEST(TopologyTest, DiscoversThisMachine) {
  auto t = discover_topology();
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_GE(t->cores.size(), 1u);
  EXPECT_GE(t->numa_nodes.size(), 1u);
  const std::string text = format_topology(*t, plan_bindings(*t, 2, DeviceKind::kCpu));
  EXPECT_NE(text.find("rank 1"), std::string::npos) << text;
}

MachineTopology fake_machine(int nodes, int cores_per_node) {
  MachineTopology m;
  m.packages = nodes;
  int cpu = 0;
  for (int n = 0; n < nodes; ++n) {
    NumaNodeInfo node{n, 1ull << 30, {}};
    for (int c = 0; c < cores_per_node; ++c, ++cpu) {
      m.cores.push_back({cpu, n, n, {cpu}});
      node.cpus.push_back(cpu);
    }
    m.numa_nodes.push_back(node);
  }
  return m;
}

TEST(TopologyTest, CpuRanksGetDisjointCores) {
  const MachineTopology m = fake_machine(2, 4);
  for (int ranks : {1, 2, 4, 8}) {
    auto b = plan_bindings(m, ranks, DeviceKind::kCpu);
    ASSERT_EQ(b.size(), static_cast<size_t>(ranks));
    std::set<int> used;
    size_t total = 0;
    for (const auto& r : b) {
      EXPECT_FALSE(r.cpus.empty());
      total += r.cpus.size();
      used.insert(r.cpus.begin(), r.cpus.end());
    }
    EXPECT_EQ(used.size(), total) << ranks << " ranks overlap";
    EXPECT_EQ(total, 8u);
  }
  // Two ranks on two NUMA nodes: one node each.
  auto two = plan_bindings(m, 2, DeviceKind::kCpu);
  EXPECT_EQ(two[0].numa_node, 0);
  EXPECT_EQ(two[1].numa_node, 1);
  auto over = plan_bindings(m, 16, DeviceKind::kCpu);
  EXPECT_NE(over[15].reason.find("oversubscribed"), std::string::npos);
}

TEST(TopologyTest, GpuRanksBindNearTheirGpu) {
  MachineTopology m = fake_machine(2, 4);
  m.gpus = {{"0000:17:00.0", 0x10de, 1, 1, "A"}, {"0000:65:00.0", 0x10de, 1, 0, "B"}};
  auto b = plan_bindings(m, 2, DeviceKind::kCuda);
  EXPECT_EQ(b[0].numa_node, 1);
  EXPECT_EQ(b[0].cpus, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(b[1].numa_node, 0);
  EXPECT_EQ(format_cpu_list({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
}

}  // namespace
}  // namespace tessera
