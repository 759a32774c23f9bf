// The measured choice of the CPU kernels' variants, cached per CPU (as a tuned BLAS does).
//
// The defaults of kernels/cpu/cpu_info.h come from the CPU vendor. tune_kernels() times the
// candidates of a variant on this machine once (a short single-thread R16 decode matmul per
// R16 prefetch distance, tens of milliseconds), takes the fastest where it beats the default
// by a margin, and keeps the result in a cache file keyed by the CPU (vendor, family, model,
// brand string) and ISA, so later processes read it instead of measuring. The choice changes
// speed only: every variant computes the same bits.
//
// TESSERA_CPU_TUNE: "cached" (default: the cached measurement, else measure once and cache it),
// "measure" (measure again and replace the cached value), "off" (the vendor defaults).
// TESSERA_CPU_PREFETCH=<bytes> overrides both. The cache lives in $TESSERA_CACHE_DIR, else
// $XDG_CACHE_HOME/tessera, else $HOME/.cache/tessera (file cpu-tuning.tsv).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/cpu_info.h"

namespace tessera::cpu {

// Applies the policy above once per process (later calls return at once); the result shows in
// kernel_tuning() and describe_cpu(). Call before the first matmul, as set_max_isa.
void tune_kernels();

// ---- the pieces (tests, benchmarks)

// The cache file's key for this CPU and ISA: "vendor/family/model/isa/brand".
std::string tuning_cache_key(const CpuInfo& cpu, std::string_view isa);
std::string tuning_cache_path();  // "" when no directory is known

// The cache file holds one line per key: "<key>\tr16_prefetch=<bytes>". The value for `key`,
// or nullopt (absent or malformed).
std::optional<size_t> cached_r16_prefetch(std::string_view file_text, std::string_view key);
// file_text with the line for `key` set to `bytes` (replaced, or appended).
std::string with_cached_r16_prefetch(std::string_view file_text, std::string_view key, size_t bytes);

struct PrefetchTiming {
  size_t bytes = 0;
  double seconds = 0;  // the best of the repetitions, one pass over the matrix
};
// Times one-token matmuls over a Q4_K matrix of rows x k (rows % 16 == 0, k % 256 == 0) in the
// R16 layout, single-threaded, on the active ISA, for each prefetch distance, each pass read
// from memory (the matrix, on huge pages, evicted from the caches first); repetitions
// alternate between the candidates. The tuning in effect is restored. Empty off the SIMD paths.
std::vector<PrefetchTiming> time_r16_prefetch(const std::vector<size_t>& candidates, int64_t rows, int64_t k,
                                              int reps);
// The default, unless a candidate is faster by more than min_gain (0.05: 5%): then the fastest.
size_t pick_r16_prefetch(const std::vector<PrefetchTiming>& timings, size_t default_bytes, double min_gain);

}  // namespace tessera::cpu
