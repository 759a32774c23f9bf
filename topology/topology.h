// Machine topology from hwloc (packages, NUMA nodes, cores, caches, PCI GPUs) and the binding
// each shard rank gets: a GPU shard near its GPU, CPU shards on disjoint core sets (plan/README.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera {

struct CoreInfo {
  int index = 0;             // logical core index
  int package = 0;
  int numa_node = 0;
  std::vector<int> pus;      // OS cpu numbers of its hardware threads
};

struct NumaNodeInfo {
  int os_index = 0;
  uint64_t memory_bytes = 0;
  std::vector<int> cpus;     // OS cpu numbers
};

struct GpuInfo {
  std::string pci_bus_id;    // "0000:17:00.0"
  uint16_t vendor_id = 0;
  uint16_t device_id = 0;
  int numa_node = -1;        // -1: unknown
  std::string name;
};

struct MachineTopology {
  int packages = 0;
  std::vector<NumaNodeInfo> numa_nodes;
  std::vector<CoreInfo> cores;
  uint64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;  // per cache instance, first found
  std::vector<GpuInfo> gpus;  // NVIDIA PCI display/3D devices
  uint64_t total_memory_bytes = 0;
};

Result<MachineTopology> discover_topology();

enum class DeviceKind { kCpu, kCuda };

struct RankBinding {
  int rank = 0;
  std::vector<int> cpus;     // OS cpu numbers the rank's threads may use
  int numa_node = -1;        // memory binding; -1: none
  std::string reason;        // "cores 0-1 of NUMA node 0", "near GPU 0000:17:00.0"
};

// CPU shards: the cores are split into n_ranks disjoint contiguous sets (NUMA-aligned when the
// rank count allows). When n_ranks exceeds the cores, ranks share cores (oversubscribed) and the
// reason says so. CUDA shards: rank r uses GPU r % gpus; its cores are those of the GPU's NUMA
// node split among the ranks on that node.
std::vector<RankBinding> plan_bindings(const MachineTopology& topo, int n_ranks, DeviceKind kind);

// Binds the calling process's threads and memory allocation policy. Errors are reported, not
// fatal: a process that cannot be bound still runs.
Status bind_current_process(const RankBinding& binding);

// The machine map and the bindings, as `tessera topo` prints them.
std::string format_topology(const MachineTopology& topo, const std::vector<RankBinding>& bindings);

// "0-3,8" from {0,1,2,3,8}.
std::string format_cpu_list(const std::vector<int>& cpus);

}  // namespace tessera
