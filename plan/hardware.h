// The cards `tessera plan` prices a deployment on (plan/README.md): datasheet presets for NVIDIA
// A100-40GB, A100-80GB, H100-80GB (SXM) and H200-141GB, and the local CPU, whose read bandwidth,
// FMA throughput and thread-pool dispatch cost are measured on the spot.
//
// Units: bytes, bytes per second, FLOP per second, seconds. Figures are nominal (datasheet) unless
// `source` says measured; the planner states them next to every number that uses them.
// Thread-safety: values; probe_local_cpu() starts its own threads and must not run concurrently
// with other timing-sensitive work if its numbers are to mean anything.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tessera {

// The link a tensor-parallel group's collectives travel over.
struct LinkSpec {
  std::string name;                // "NVLink 3", "PCIe 4.0 x16", "host memory"
  double bandwidth = 0;            // bytes/s, one direction, per device
  double hop_latency_s = 0;        // latency of one ring step
};

struct CardSpec {
  std::string name;                // "A100-80GB", "cpu"
  std::string description;         // "NVIDIA A100 SXM4 80GB (HBM2e)"
  bool is_cpu = false;
  uint64_t memory_bytes = 0;       // device memory (host RAM for the CPU)
  uint64_t runtime_reserve_bytes = 0;  // CUDA context, cuBLAS workspace, NCCL buffers: never KV
  double memory_bandwidth = 0;     // bytes/s, sustained read
  double peak_flops = 0;           // dense FP16/BF16 tensor-core FLOP/s (CPU: measured FP32 FMA)
  int activation_bytes = 2;        // activations and small vectors: fp16 on GPU, fp32 on CPU
  double launch_s = 0;             // host cost of one kernel launch (CPU: one parallel_for)
  double graph_node_s = 0;         // per kernel inside a CUDA graph; 0: the card has no graphs
  double graph_launch_s = 0;       // one graph launch per step
  LinkSpec fast_link;              // NVLink (GPU) / host memory (CPU): the default TP link
  LinkSpec slow_link;              // PCIe (GPU); equal to fast_link on the CPU
  std::string source;              // "datasheet" or "measured: ..."
};

// Preset names, in display order: "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB".
std::vector<std::string> card_preset_names();
// Case-insensitive; accepts short aliases ("a100" = A100-80GB, "h100", "h200", "a100-40g").
// NotFound naming the choices for an unknown name. "cpu" is not a preset: use probe_local_cpu().
Result<CardSpec> card_preset(std::string_view name);

struct CpuProbeOptions {
  int threads = 0;                 // 0: hardware concurrency
  uint64_t buffer_bytes = 0;       // 0: 8 x the last-level cache, at least 256 MiB, at most 2 GiB
  int passes = 5;                  // the best pass counts
};

struct CpuProbe {
  int threads = 0;
  uint64_t llc_bytes = 0;          // last-level cache of cpu0 (sysfs), 0 if unknown
  uint64_t buffer_bytes = 0;
  double read_bandwidth = 0;       // bytes/s, best pass over the buffer with all threads
  double fma_flops = 0;            // FLOP/s, FP32 fused multiply-add on all threads
  double dispatch_s = 0;           // one parallel_for of trivial work on a warm pool
  uint64_t memory_bytes = 0;       // physical RAM
  double seconds = 0;              // time the probe took
};

// Measures this machine (about a second). Errors: the buffer cannot be allocated.
Result<CpuProbe> probe_local_cpu(const CpuProbeOptions& options);
// The card for a probe: memory = RAM, bandwidth and peak as measured, links over host memory.
CardSpec cpu_card(const CpuProbe& probe);

}  // namespace tessera
