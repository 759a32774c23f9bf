// Step plans with a window pool (common/kv_config.h), made the way a coordinator makes them, for
// the shard tests on the CPU (tests/shard/window_pool_test.cpp) and on the CUDA backend
// (tests/gpu/cuda_window_pool_test.cpp): a window block is released as soon as no query from
// the sequence's next piece on reaches it, and released ids go straight to other sequences.
// The same plans without their window fields are the one-pool run to compare with.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <vector>

#include "proto/control_messages.h"
#include "shard/kv_cache.h"

namespace tessera::test {

// The geometry both window-pool tests run with: blocks of 16, a 24-token window (windows span
// two blocks), 24 blocks in the main pool and 10 in the window pool.
inline constexpr int64_t kBlockSize = 16;
inline constexpr int64_t kWindow = 24;
inline constexpr int64_t kNumBlocks = 24;
inline constexpr int64_t kNumWindowBlocks = 10;

// Block ids of two pools for the plans: reference counts (prefix sharing), LIFO free lists (a
// released id is the next one handed out), and for each sequence both tables as the
// coordinator sees them (a released window slot is -1 here; the shard keeps the stale id).
class WindowPlanner {
 public:
  WindowPlanner(int64_t block_size, int64_t window, int64_t num_blocks, int64_t num_window_blocks)
      : block_size_(block_size), window_(window), main_(num_blocks), window_pool_(num_window_blocks) {}

  // A new sequence of n_tokens known tokens (its prompt).
  void add(uint64_t id, int64_t n_tokens) { seqs_[id].tokens = n_tokens; }
  // A new sequence whose first shared_tokens tokens are those of `from` (a prefix-cache hit):
  // its full blocks are shared in both pools (its window slots behind the window of a piece
  // from shared_tokens are -1), a partial last block is copied (copy-on-write) in both pools.
  // The entries go out with its first piece.
  void share_prefix(uint64_t id, uint64_t from, int64_t shared_tokens, int64_t n_tokens, StepPlan& plan) {
    add(id, n_tokens);
    Seq& s = seqs_[id];
    const Seq& f = seqs_.at(from);
    const int64_t full = shared_tokens / block_size_;
    const int64_t dead = first_read_slot(shared_tokens, window_, block_size_);
    for (int64_t j = 0; j < full; ++j) {
      s.main.push_back(ref(main_, f.main[static_cast<size_t>(j)]));
      const int32_t w = f.window[static_cast<size_t>(j)];
      EXPECT_TRUE(j < dead || w >= 0) << "slot " << j << " of sequence " << from << " is gone already";
      s.window.push_back(j < dead ? -1 : ref(window_pool_, w));
    }
    if (shared_tokens % block_size_ != 0) {
      s.main.push_back(take(main_));
      s.window.push_back(take(window_pool_));
      plan.block_copies.push_back({f.main[static_cast<size_t>(full)], s.main.back()});
      plan.window_block_copies.push_back({f.window[static_cast<size_t>(full)], s.window.back()});
    }
  }

  // The piece [start, start + n) of sequence id: first releases its window slots that no query
  // from `start` on reads, then appends the slots the piece needs (window entries of slots
  // behind the window are -1 from the start). A sampled piece that ends at the last known
  // token adds one token.
  ScheduledSequence piece(uint64_t id, int64_t start, int32_t n, bool sample) {
    Seq& s = seqs_.at(id);
    const int64_t dead = first_read_slot(start, window_, block_size_);
    for (int64_t j = 0; j < dead && j < static_cast<int64_t>(s.window.size()); ++j) {
      int32_t& w = s.window[static_cast<size_t>(j)];
      if (w >= 0) put(window_pool_, w);
      w = -1;
    }
    while (static_cast<int64_t>(s.main.size()) * block_size_ < start + n) {
      const auto j = static_cast<int64_t>(s.main.size());
      s.main.push_back(take(main_));
      s.window.push_back(j < dead ? -1 : take(window_pool_));
    }
    ScheduledSequence q;
    q.seq_id = id;
    q.start_pos = start;
    q.num_tokens = n;
    q.sample = sample;
    q.append_blocks.assign(s.main.begin() + static_cast<std::ptrdiff_t>(s.sent), s.main.end());
    q.append_window_blocks.assign(s.window.begin() + static_cast<std::ptrdiff_t>(s.sent), s.window.end());
    s.sent = s.main.size();
    if (sample && start + n == s.tokens) ++s.tokens;
    return q;
  }
  // The decode piece of sequence id (its last known token).
  ScheduledSequence decode(uint64_t id) { return piece(id, seqs_.at(id).tokens - 1, 1, true); }

  // Releases every block of a finished sequence.
  void finish(uint64_t id, StepPlan& plan) {
    Seq& s = seqs_.at(id);
    for (int32_t b : s.main) put(main_, b);
    for (int32_t w : s.window)
      if (w >= 0) put(window_pool_, w);
    seqs_.erase(id);
    plan.finished.push_back(id);
  }

  int64_t window_ids_reused() const { return window_pool_.reused; }
  int64_t window_high_water() const { return window_pool_.high_water; }

 private:
  struct Pool {
    explicit Pool(int64_t n) : refs(static_cast<size_t>(n), 0), handed(static_cast<size_t>(n), false) {
      for (int64_t b = n - 1; b >= 0; --b) free.push_back(static_cast<int32_t>(b));
    }
    std::vector<int32_t> free;
    std::vector<int> refs;
    std::vector<bool> handed;  // given out before
    int64_t in_use = 0, high_water = 0, reused = 0;
  };
  struct Seq {
    int64_t tokens = 0;
    std::vector<int32_t> main, window;
    size_t sent = 0;  // entries the shard has
  };

  static int32_t take(Pool& p) {
    EXPECT_FALSE(p.free.empty()) << "the test's pool ran out";
    if (p.free.empty()) return 0;
    const int32_t b = p.free.back();
    p.free.pop_back();
    p.refs[static_cast<size_t>(b)] = 1;
    p.reused += p.handed[static_cast<size_t>(b)] ? 1 : 0;
    p.handed[static_cast<size_t>(b)] = true;
    p.high_water = std::max(p.high_water, ++p.in_use);
    return b;
  }
  static int32_t ref(Pool& p, int32_t b) {
    ++p.refs[static_cast<size_t>(b)];
    return b;
  }
  static void put(Pool& p, int32_t b) {
    if (--p.refs[static_cast<size_t>(b)] > 0) return;
    p.free.push_back(b);
    --p.in_use;
  }

  int64_t block_size_, window_;
  Pool main_, window_pool_;
  std::map<uint64_t, Seq> seqs_;
};

struct WindowScenario {
  std::vector<StepPlan> plans;  // with window tables and window copies
  int64_t window_ids_reused = 0;
  int64_t window_high_water = 0;
};

// The plan of a one-pool shard: the same steps without the window fields.
inline StepPlan without_window(StepPlan p) {
  for (ScheduledSequence& s : p.scheduled) s.append_window_blocks.clear();
  p.window_block_copies.clear();
  return p;
}

// Three sequences over `steps` steps (>= 16), prompts of ids below `vocab`: A (56 tokens) is
// prefilled in two chunks and decodes; B arrives at step 3 with A's 56 prompt tokens and 9 of
// its own (A's full blocks shared, its partial block copied in both pools, the window slots
// behind B's window -1) and decodes; C (40 tokens) is prefilled in two chunks from step 8,
// alongside the decodes, and decodes; A finishes at step 14. The window pool has
// num_window_blocks blocks, so its ids go round from sequence to sequence.
inline WindowScenario window_scenario(int64_t block_size, int64_t window, int64_t num_blocks, int64_t num_window_blocks,
                                      const SamplingParams& sampling, int32_t vocab, int64_t steps = 24) {
  WindowPlanner w(block_size, window, num_blocks, num_window_blocks);
  auto tokens = [&](int64_t n, int32_t salt) {
    std::vector<int32_t> t = {1};
    for (int32_t i = 1; i < n; ++i) t.push_back(3 + (i * 53 + i * i * 7 + salt) % (vocab - 3));
    return t;
  };
  const std::vector<int32_t> a = tokens(56, 0), c = tokens(40, 11);
  std::vector<int32_t> b(a.begin(), a.end());
  for (int32_t i = 0; i < 9; ++i) b.push_back(3 + (i * 31 + 5) % (vocab - 3));
  WindowScenario out;
  for (int64_t step = 1; step <= steps; ++step) {
    StepPlan p;
    p.step_id = static_cast<uint64_t>(step);
    const bool a_live = step < 14;
    if (step == 14) w.finish(1, p);
    if (step == 1) {
      p.new_sequences.push_back({1, a, sampling});
      w.add(1, static_cast<int64_t>(a.size()));
      p.scheduled.push_back(w.piece(1, 0, 30, false));
    } else if (step == 2) {
      p.scheduled.push_back(w.piece(1, 30, 26, true));
    } else if (a_live) {
      p.scheduled.push_back(w.decode(1));
    }
    if (step == 3) {
      p.new_sequences.push_back({2, b, sampling});
      w.share_prefix(2, 1, 56, static_cast<int64_t>(b.size()), p);
      p.scheduled.push_back(w.piece(2, 56, 9, true));
    } else if (step > 3) {
      p.scheduled.push_back(w.decode(2));
    }
    if (step == 8) {
      p.new_sequences.push_back({3, c, sampling});
      w.add(3, static_cast<int64_t>(c.size()));
      p.scheduled.push_back(w.piece(3, 0, 20, false));
    } else if (step == 9) {
      p.scheduled.push_back(w.piece(3, 20, 20, true));
    } else if (step > 9) {
      p.scheduled.push_back(w.decode(3));
    }
    out.plans.push_back(std::move(p));
  }
  out.window_ids_reused = w.window_ids_reused();
  out.window_high_water = w.window_high_water();
  return out;
}

}  // namespace tessera::test
