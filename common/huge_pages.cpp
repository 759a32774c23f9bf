#include "common/huge_pages.h"

#include "common/env.h"


#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace tessera {
namespace {
size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
constexpr size_t kSmallPage = 4096;
}  // namespace

bool huge_pages_enabled() {
  static const bool kOn = env_int("TESSERA_HUGE_PAGES", 1) != 0;
  return kOn;
}

#if defined(__linux__)
// Large buffers: an anonymous mapping 2 MiB-aligned (mapped with one huge page of slack, the
// unaligned head and the tail beyond the rounded size unmapped again), advised MADV_HUGEPAGE.
// The length is rounded to 4 KiB only: a last partial 2 MiB stays on small pages, so nothing
// past the buffer is ever resident.
void* huge_page_alloc(size_t bytes) {
  if (bytes < kHugePageMinBytes || !huge_pages_enabled()) return ::operator new(bytes);
  const size_t len = round_up(bytes, kSmallPage);
  const size_t span = len + kHugePageBytes;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = round_up(base, kHugePageBytes);
  if (aligned > base) ::munmap(raw, aligned - base);
  const uintptr_t end = aligned + len, span_end = base + span;
  if (span_end > end) ::munmap(reinterpret_cast<void*>(end), span_end - end);
  ::madvise(reinterpret_cast<void*>(aligned), len, MADV_HUGEPAGE);  // a hint; ignored where THP is off
  return reinterpret_cast<void*>(aligned);
}

void huge_page_free(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes < kHugePageMinBytes || !huge_pages_enabled()) {
    ::operator delete(p);
    return;
  }
  ::munmap(p, round_up(bytes, kSmallPage));
}
#else
void* huge_page_alloc(size_t bytes) { return ::operator new(bytes); }
void huge_page_free(void* p, size_t) noexcept { ::operator delete(p); }
#endif

}  // namespace tessera
