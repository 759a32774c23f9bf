// Block ids for tests that drive a forward pass directly (no engine): a LIFO free list over
// [0, num_blocks), for any block size (the kernels' block-size invariance tests use sizes the
// serving block pool refuses).
#pragma once

#include <cstdint>
#include <vector>

namespace tessera::test {

class TestBlockAllocator {
 public:
  explicit TestBlockAllocator(int64_t num_blocks) {
    for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
  }
  // Grows `table` so it covers positions [0, n_tokens); false when blocks ran out.
  bool ensure(std::vector<int32_t>& table, int64_t n_tokens, int64_t block_size) {
    const int64_t need = (n_tokens + block_size - 1) / block_size;
    while (static_cast<int64_t>(table.size()) < need) {
      if (free_.empty()) return false;
      table.push_back(free_.back());
      free_.pop_back();
    }
    return true;
  }
  void release(std::vector<int32_t>& table) {
    for (auto it = table.rbegin(); it != table.rend(); ++it) free_.push_back(*it);
    table.clear();
  }

 private:
  std::vector<int32_t> free_;
};

}  // namespace tessera::test
