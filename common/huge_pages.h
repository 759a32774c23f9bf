// Memory for model weights on transparent huge pages where the kernel offers them.
//
// Decode streams every weight byte once per token. With 4 KiB pages a 1 GB model is 250,000
// pages: a TLB miss (a two-level walk in a virtual machine) every 4 KiB of the stream, and on
// AMD Zen 4 the hardware prefetchers stop at each page boundary. Backed by 2 MiB pages the same
// single-thread read runs 1.4-1.9x faster (kernels/cpu R16 matmul from DRAM, Zen 4:
// bench/results/cpu_vs_llama_cpp.md). Linux's default THP mode ("madvise") gives huge pages
// only to ranges that ask, so buffers of at least kHugePageMinBytes are mapped 2 MiB-aligned and
// marked MADV_HUGEPAGE; smaller ones, and systems without THP, get ordinary memory (the advice
// is only a hint: nothing fails where it is ignored). TESSERA_HUGE_PAGES=0 turns it off.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace tessera {

constexpr size_t kHugePageBytes = size_t{2} << 20;
constexpr size_t kHugePageMinBytes = size_t{1} << 20;

// bytes > 0; never returns nullptr (throws std::bad_alloc as operator new does). Memory from
// huge_page_alloc(n) goes back through huge_page_free(p, n) with the same n.
void* huge_page_alloc(size_t bytes);
void huge_page_free(void* p, size_t bytes) noexcept;

// Whether huge pages are asked for (TESSERA_HUGE_PAGES, read once; default on).
bool huge_pages_enabled();

template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)
  T* allocate(size_t n) { return static_cast<T*>(huge_page_alloc(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { huge_page_free(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept { return true; }
};

// Owned weight bytes (matrices copied, quantized or re-laid at load).
using WeightBytes = std::vector<uint8_t, HugePageAllocator<uint8_t>>;

}  // namespace tessera
