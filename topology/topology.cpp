#include "topology/topology.h"

#include <hwloc.h>

#include <algorithm>
#include <map>

#include "common/check.h"

namespace tessera {
namespace {

std::vector<int> bitmap_cpus(hwloc_const_bitmap_t set) {
  std::vector<int> cpus;
  if (!set) return cpus;
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) cpus.push_back(i);
  return cpus;
}

// Owns an hwloc topology for the duration of one call.
class HwlocTopology {
 public:
  Status init() {
    if (hwloc_topology_init(&topo_) != 0) return Status::unavailable("hwloc_topology_init failed");
    initialized_ = true;
    hwloc_topology_set_io_types_filter(topo_, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo_) != 0) return Status::unavailable("hwloc_topology_load failed");
    return Status::ok();
  }
  ~HwlocTopology() {
    if (initialized_) hwloc_topology_destroy(topo_);
  }
  hwloc_topology_t get() const { return topo_; }

 private:
  hwloc_topology_t topo_{};
  bool initialized_ = false;
};

int numa_of(hwloc_topology_t topo, hwloc_obj_t obj) {
  hwloc_obj_t nonio = hwloc_get_non_io_ancestor_obj(topo, obj);
  if (!nonio || !nonio->nodeset) return -1;
  const int first = hwloc_bitmap_first(nonio->nodeset);
  return first;
}

}  // namespace

Result<MachineTopology> discover_topology() {
  HwlocTopology h;
  TESSERA_RETURN_IF_ERROR(h.init());
  hwloc_topology_t topo = h.get();
  MachineTopology m;
  m.packages = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE));

  const int n_numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n_numa; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NumaNodeInfo info;
    info.os_index = static_cast<int>(node->os_index);
    info.memory_bytes = node->attr ? node->attr->numanode.local_memory : 0;
    info.cpus = bitmap_cpus(node->cpuset);
    m.total_memory_bytes += info.memory_bytes;
    m.numa_nodes.push_back(std::move(info));
  }

  const int n_cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  for (int i = 0; i < n_cores; ++i) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, static_cast<unsigned>(i));
    CoreInfo c;
    c.index = i;
    c.pus = bitmap_cpus(core->cpuset);
    hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, core);
    c.package = pkg ? static_cast<int>(pkg->logical_index) : 0;
    c.numa_node = core->nodeset ? hwloc_bitmap_first(core->nodeset) : 0;
    m.cores.push_back(std::move(c));
  }
  if (m.cores.empty()) {  // some virtual machines expose only PUs
    const int n_pu = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    for (int i = 0; i < n_pu; ++i) {
      hwloc_obj_t pu = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PU, static_cast<unsigned>(i));
      m.cores.push_back({i, 0, 0, {static_cast<int>(pu->os_index)}});
    }
  }

  struct CacheType {
    hwloc_obj_type_t type;
    uint64_t* out;
  } caches[] = {{HWLOC_OBJ_L1CACHE, &m.l1d_bytes}, {HWLOC_OBJ_L2CACHE, &m.l2_bytes}, {HWLOC_OBJ_L3CACHE, &m.l3_bytes}};
  for (const CacheType& ct : caches) {
    hwloc_obj_t c = hwloc_get_obj_by_type(topo, ct.type, 0);
    if (c && c->attr) *ct.out = c->attr->cache.size;
  }

  for (hwloc_obj_t pci = hwloc_get_next_pcidev(topo, nullptr); pci; pci = hwloc_get_next_pcidev(topo, pci)) {
    const auto& a = pci->attr->pcidev;
    const unsigned class_hi = a.class_id >> 8;
    if (a.vendor_id != 0x10de || (class_hi != 0x03)) continue;  // NVIDIA display / 3D controllers
    GpuInfo g;
    char bus[32];
    std::snprintf(bus, sizeof(bus), "%04x:%02x:%02x.%01x", a.domain, a.bus, a.dev, a.func);
    g.pci_bus_id = bus;
    g.vendor_id = a.vendor_id;
    g.device_id = a.device_id;
    g.numa_node = numa_of(topo, pci);
    const char* name = hwloc_obj_get_info_by_name(pci, "PCIDevice");
    g.name = name ? name : "NVIDIA GPU";
    m.gpus.push_back(std::move(g));
  }
  return m;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string s;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(cpus[i]);
    if (j > i) s += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return s.empty() ? "-" : s;
}

std::vector<RankBinding> plan_bindings(const MachineTopology& topo, int n_ranks, DeviceKind kind) {
  std::vector<RankBinding> out;
  if (n_ranks <= 0) return out;
  // Cores grouped by NUMA node, in order.
  std::map<int, std::vector<const CoreInfo*>> by_node;
  for (const CoreInfo& c : topo.cores) by_node[c.numa_node].push_back(&c);

  auto split = [&](const std::vector<const CoreInfo*>& cores, int parts, int part) {
    std::vector<int> cpus;
    const int n = static_cast<int>(cores.size());
    if (n == 0) return cpus;
    if (parts <= n) {
      const int begin = part * n / parts, end = (part + 1) * n / parts;
      for (int i = begin; i < end; ++i) cpus.insert(cpus.end(), cores[static_cast<size_t>(i)]->pus.begin(), cores[static_cast<size_t>(i)]->pus.end());
    } else {  // oversubscribed: share cores round-robin
      const auto& c = cores[static_cast<size_t>(part % n)];
      cpus.insert(cpus.end(), c->pus.begin(), c->pus.end());
    }
    std::sort(cpus.begin(), cpus.end());
    return cpus;
  };

  std::vector<const CoreInfo*> all;
  for (auto& [node, cores] : by_node) all.insert(all.end(), cores.begin(), cores.end());

  for (int r = 0; r < n_ranks; ++r) {
    RankBinding b;
    b.rank = r;
    if (kind == DeviceKind::kCuda && !topo.gpus.empty()) {
      const GpuInfo& g = topo.gpus[static_cast<size_t>(r) % topo.gpus.size()];
      int node = g.numa_node >= 0 && by_node.count(g.numa_node) ? g.numa_node : by_node.begin()->first;
      // Ranks sharing this node split its cores.
      int peers = 0, me = 0;
      for (int q = 0; q < n_ranks; ++q) {
        const GpuInfo& gq = topo.gpus[static_cast<size_t>(q) % topo.gpus.size()];
        const int nq = gq.numa_node >= 0 && by_node.count(gq.numa_node) ? gq.numa_node : by_node.begin()->first;
        if (nq == node) {
          if (q == r) me = peers;
          ++peers;
        }
      }
      b.cpus = split(by_node[node], peers, me);
      b.numa_node = node;
      b.reason = "near GPU " + g.pci_bus_id + " (NUMA node " + std::to_string(node) + ")";
    } else {
      const int n_cores = static_cast<int>(all.size());
      b.cpus = split(all, n_ranks, r);
      if (!b.cpus.empty()) {
        for (const CoreInfo* c : all)
          if (std::find(c->pus.begin(), c->pus.end(), b.cpus.front()) != c->pus.end()) b.numa_node = c->numa_node;
      }
      b.reason = n_ranks <= n_cores ? "cores of its own" : "oversubscribed: " + std::to_string(n_ranks) + " ranks on " +
                                                            std::to_string(n_cores) + " cores";
    }
    out.push_back(std::move(b));
  }
  return out;
}

Status bind_current_process(const RankBinding& binding) {
  if (binding.cpus.empty()) return Status::ok();
  HwlocTopology h;
  TESSERA_RETURN_IF_ERROR(h.init());
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  for (int c : binding.cpus) hwloc_bitmap_set(set, static_cast<unsigned>(c));
  Status status;
  if (hwloc_set_cpubind(h.get(), set, HWLOC_CPUBIND_PROCESS) != 0)
    status = Status::unavailable("cannot bind to cpus " + format_cpu_list(binding.cpus));
  if (binding.numa_node >= 0) {
    hwloc_bitmap_t nodes = hwloc_bitmap_alloc();
    hwloc_bitmap_set(nodes, static_cast<unsigned>(binding.numa_node));
    // Best effort: a single-node machine or a restricted container may refuse.
    hwloc_set_membind(h.get(), nodes, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_PROCESS | HWLOC_MEMBIND_BYNODESET);
    hwloc_bitmap_free(nodes);
  }
  hwloc_bitmap_free(set);
  return status;
}

std::string format_topology(const MachineTopology& t, const std::vector<RankBinding>& bindings) {
  std::string s = fmt::format("machine: {} package(s), {} NUMA node(s), {} core(s), {:.1f} GiB\n", t.packages,
                              t.numa_nodes.size(), t.cores.size(),
                              static_cast<double>(t.total_memory_bytes) / (1ull << 30));
  s += fmt::format("caches: L1d {} KiB, L2 {} KiB, L3 {} KiB\n", t.l1d_bytes >> 10, t.l2_bytes >> 10, t.l3_bytes >> 10);
  for (const NumaNodeInfo& n : t.numa_nodes)
    s += fmt::format("  NUMA node {}: cpus {}, {:.1f} GiB\n", n.os_index, format_cpu_list(n.cpus),
                     static_cast<double>(n.memory_bytes) / (1ull << 30));
  for (const CoreInfo& c : t.cores)
    s += fmt::format("  core {}: package {}, NUMA node {}, cpus {}\n", c.index, c.package, c.numa_node,
                     format_cpu_list(c.pus));
  if (t.gpus.empty()) s += "GPUs: none found on the PCI bus\n";
  for (const GpuInfo& g : t.gpus)
    s += fmt::format("  GPU {} [{:04x}:{:04x}] {}: NUMA node {}\n", g.pci_bus_id, g.vendor_id, g.device_id, g.name,
                     g.numa_node);
  if (!bindings.empty()) s += "bindings:\n";
  for (const RankBinding& b : bindings)
    s += fmt::format("  rank {}: cpus {}, memory on NUMA node {} ({})\n", b.rank, format_cpu_list(b.cpus), b.numa_node,
                     b.reason);
  return s;
}

}  // namespace tessera
