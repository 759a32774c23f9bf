#include "engine/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace tessera {

struct Scheduler::Sequence {
  uint64_t id = 0;
  uint64_t serial = 0;  // unique per Sequence object, so a stale in-flight entry never matches a reused id
  std::vector<int32_t> tokens;  // prompt, then sampled tokens
  int64_t prompt_len = 0;
  SamplingParams sampling;
  int64_t max_tokens = 0;
  int32_t priority = 0;
  bool reuse_cached_prefix = true;
  Clock::time_point arrival;
  int64_t ticket = 0;
  SequenceState state = SequenceState::kWaiting;
  bool sent = false;           // NewSequence emitted: the shards hold its token list
  bool admitted_once = false;
  bool table_stale = false;    // the shards hold a table from before a preemption
  int64_t shard_table_len = 0; // blocks[0, shard_table_len) are in the shards' table, in order
  int64_t num_computed = 0;    // positions whose KV is in `blocks` (committed by results)
  int64_t high_water = 0;      // most positions ever scheduled (to tell recompute from new work)
  int64_t num_registered = 0;  // leading full blocks already offered to the prefix cache
  std::vector<int32_t> blocks;
  // The window table (with a window pool): one entry per slot of `blocks`, -1 once released.
  // Slots before wlive_from are all -1.
  std::vector<int32_t> wblocks;
  int64_t wlive_from = 0;
  std::vector<BlockHash> hashes;  // hash chain of the full blocks of `tokens`, grown lazily
  std::vector<int32_t> draft;     // proposed tokens for the next decode (set_draft; cleared by schedule())
  int64_t preemptions = 0;
  int64_t cached_prompt_tokens = 0;
  // Scratch for the step being built.
  uint64_t step_mark = 0;       // step id of its piece in this step, if any
  size_t piece_index = 0;
  uint64_t preempted_step = 0;  // step id of its last preemption

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
};

struct Scheduler::Piece {
  Sequence* seq = nullptr;
  int64_t start = 0;
  int64_t n = 0;
  bool is_new = false;       // carries the sequence's NewSequence
  bool dropped = false;      // its sequence was preempted later in the same step
  bool force_reset = false;  // copy-on-write replaced a block the shards already hold
  std::vector<int32_t> draft;  // speculation: the drafts this decode piece verifies (n = 1 + draft.size())
  std::vector<BlockCopy> copies;
  std::vector<BlockCopy> wcopies;  // in the window pool
};

struct Scheduler::StepBuilder {
  uint64_t step_id = 0;
  Clock::time_point now;
  int64_t tokens_left = 0;
  std::vector<Piece> pieces;
  std::vector<int32_t> holds;   // copy-on-write sources, retained until the plan is built
  std::vector<int32_t> wholds;  // the same in the window pool
  bool prefill_in_step = false;
};

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

Clock::duration from_ms(double ms) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, BlockPool& pool, const Clock& clock, WindowPool window)
    : config_(config), pool_(pool), clock_(clock), window_(window) {
  const Status s = validate_scheduler_config(config);
  TESSERA_CHECK(s.is_ok(), "{}", s.to_string());
  if (window_.pool) {
    TESSERA_CHECK(window_.window > 0, "window pool with a window of {} tokens", window_.window);
    TESSERA_CHECK(window_.pool->block_size() == pool_.block_size(), "window pool blocks of {} tokens, block pool {}",
                  window_.pool->block_size(), pool_.block_size());
    const int64_t need =
        window_pool_blocks(window_.window, config_.max_step_tokens, pool_.block_size(), config_.max_batch);
    TESSERA_CHECK(window_.pool->num_blocks() >= need,
                  "window pool of {} blocks; a window of {} tokens, max_step_tokens {} and max_batch {} need {}",
                  window_.pool->num_blocks(), window_.window, config_.max_step_tokens, config_.max_batch, need);
  }
  max_wait_ = from_ms(config.max_wait_ms);
  max_burst_wait_ = std::max(max_wait_, from_ms(config.max_burst_wait_ms));
  // Requests a client or a load generator starts together reach the server spread over a few
  // ms (a 32-client start on 2 busy cores: gaps above 2 ms), so the chain tolerates a fifth of
  // the burst's cap between arrivals.
  burst_gap_ = std::max(max_wait_, max_burst_wait_ / 5);
  aging_ = from_ms(config.aging_ms);
  if (aging_.count() <= 0) aging_ = Clock::duration(1);
}

Scheduler::~Scheduler() = default;

// ---- requests --------------------------------------------------------------------------------

Status Scheduler::add(SchedulerRequest r) {
  const auto fail = [&](std::string why) {
    return Status::invalid_argument(fmt::format("request {}: {}", r.seq_id, why));
  };
  if (seqs_.count(r.seq_id)) return fail("this sequence id is already in use");
  if (r.prompt.empty()) return fail("prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0) return fail(fmt::format("prompt token {} is {}; token ids are >= 0", i, r.prompt[i]));
  if (r.max_tokens < 1) return fail(fmt::format("max_tokens is {}; it must be at least 1", r.max_tokens));
  if (r.priority < 0 || r.priority >= config_.priority_classes)
    return fail(fmt::format("priority is {}; it must be in 0..{}", r.priority, config_.priority_classes - 1));
  // The last generated token's KV is never needed, hence the -1.
  const int64_t positions = static_cast<int64_t>(r.prompt.size()) + r.max_tokens - 1;
  const int64_t blocks = ceil_div(positions, pool_.block_size());
  if (blocks > pool_.num_blocks())
    return Status::resource_exhausted(fmt::format(
        "request {}: {} prompt tokens + {} max_tokens need {} KV blocks of {} tokens; the pool has {} in all",
        r.seq_id, r.prompt.size(), r.max_tokens, blocks, pool_.block_size(), pool_.num_blocks()));
  auto s = std::make_unique<Sequence>();
  s->id = r.seq_id;
  s->serial = next_serial_++;
  s->prompt_len = static_cast<int64_t>(r.prompt.size());
  s->tokens = std::move(r.prompt);
  s->sampling = r.sampling;
  s->max_tokens = r.max_tokens;
  s->priority = r.priority;
  s->reuse_cached_prefix = r.reuse_cached_prefix;
  s->arrival = r.arrival.value_or(clock_.now());
  s->ticket = ++next_ticket_;
  waiting_.push_back(s.get());
  seqs_.emplace(r.seq_id, std::move(s));
  return Status::ok();
}

void Scheduler::release_blocks(Sequence& s) {
  // Last block first: the LRU cache then evicts a prefix's tail before its head, and the head
  // is what other requests share.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) pool_.release(*it);
  s.blocks.clear();
  for (auto it = s.wblocks.rbegin(); it != s.wblocks.rend(); ++it)
    if (*it >= 0) window_.pool->release(*it);
  s.wblocks.clear();
  s.wlive_from = 0;
}

// The first table slot a query at `start` (or later) reads in the windowed layers.
int64_t Scheduler::first_window_slot(int64_t start) const {
  return first_read_slot(start, window_.window, pool_.block_size());
}

// Whether s.wblocks holds every window block a first piece at `start` after a hit of k blocks reads.
bool Scheduler::window_covered(const Sequence& s, int64_t k, int64_t start) const {
  for (int64_t i = first_window_slot(start); i < k; ++i)
    if (s.wblocks[static_cast<size_t>(i)] < 0) return false;
  return true;
}

// Releases the window blocks no query from `start` on reads again.
void Scheduler::slide_window(Sequence& s, int64_t start) {
  if (!window_.pool) return;
  const int64_t first = std::min<int64_t>(first_window_slot(start), static_cast<int64_t>(s.wblocks.size()));
  for (int64_t i = s.wlive_from; i < first; ++i) {
    int32_t& w = s.wblocks[static_cast<size_t>(i)];
    if (w >= 0) window_.pool->release(w);
    w = -1;
  }
  s.wlive_from = std::max(s.wlive_from, first);
}

void Scheduler::drop(uint64_t seq_id, bool aborted) {
  auto it = seqs_.find(seq_id);
  Sequence& s = *it->second;
  if (s.state == SequenceState::kRunning) {
    release_blocks(s);
    running_.erase(std::find(running_.begin(), running_.end(), &s));
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &s));
  }
  if (s.sent) pending_finished_.push_back(seq_id);
  ++(aborted ? stats_.aborted : stats_.finished);
  seqs_.erase(it);
}

bool Scheduler::abort(uint64_t seq_id) {
  if (!seqs_.count(seq_id)) return false;
  drop(seq_id, /*aborted=*/true);
  return true;
}

bool Scheduler::finish(uint64_t seq_id) {
  if (!seqs_.count(seq_id)) return false;
  drop(seq_id, /*aborted=*/false);
  return true;
}

// ---- ranking ---------------------------------------------------------------------------------

int Scheduler::effective_class(const Sequence& s, Clock::time_point now) const {
  const auto age = now - s.arrival;
  if (age.count() <= 0) return s.priority;
  const int64_t steps = age / aging_;
  return static_cast<int>(std::max<int64_t>(0, s.priority - steps));
}

bool Scheduler::ranks_before(const Sequence& a, const Sequence& b, Clock::time_point now) const {
  const int ca = effective_class(a, now), cb = effective_class(b, now);
  if (ca != cb) return ca < cb;
  return a.ticket < b.ticket;
}

bool Scheduler::schedulable(const Sequence& s) const { return s.generated() < s.max_tokens; }

int64_t Scheduler::remaining(const Sequence& s) const {
  return static_cast<int64_t>(s.tokens.size()) - s.num_computed;
}

// ---- prefix cache ----------------------------------------------------------------------------

const std::vector<BlockHash>& Scheduler::block_hashes(Sequence& s, int64_t n_blocks) {
  const int64_t bs = pool_.block_size();
  TESSERA_CHECK(n_blocks * bs <= static_cast<int64_t>(s.tokens.size()), "hash of a partial block");
  while (static_cast<int64_t>(s.hashes.size()) < n_blocks) {
    const int64_t i = static_cast<int64_t>(s.hashes.size());
    const BlockHash parent = i == 0 ? kRootBlockHash : s.hashes.back();
    s.hashes.push_back(BlockPool::hash_block(parent, std::span<const int32_t>(s.tokens).subspan(i * bs, bs)));
  }
  return s.hashes;
}

int64_t Scheduler::match_prefix(Sequence& s) {
  s.blocks.clear();
  s.wblocks.clear();
  if (!pool_.prefix_cache_enabled() || (!s.reuse_cached_prefix && s.generated() == 0)) return 0;
  const int64_t bs = pool_.block_size();
  const int64_t full = static_cast<int64_t>(s.tokens.size()) / bs;
  const auto& h = block_hashes(s, full);
  for (int64_t i = 0; i < full; ++i) {
    auto b = pool_.find_cached(h[i], i == 0 ? kRootBlockHash : h[i - 1],
                               std::span<const int32_t>(s.tokens).subspan(i * bs, bs));
    if (!b) break;
    s.blocks.push_back(*b);  // not retained yet: admit() decides
  }
  return static_cast<int64_t>(s.blocks.size());
}

// With a window pool: the longest prefix hit k' <= k whose first computed position finds every
// window block it reads in the window pool's cache. s.wblocks = those blocks for slots [0, k')
// (-1 before the first one read), not retained yet: admit() decides.
int64_t Scheduler::window_prefix(Sequence& s, int64_t k, int64_t n_tok) {
  if (!window_.pool || k == 0) return k;
  const int64_t bs = pool_.block_size();
  const auto& h = block_hashes(s, k);
  s.wblocks.assign(static_cast<size_t>(k), -1);
  for (int64_t i = 0; i < k; ++i) {
    auto b = window_.pool->find_cached(h[i], i == 0 ? kRootBlockHash : h[i - 1],
                                       std::span<const int32_t>(s.tokens).subspan(i * bs, bs));
    if (b) s.wblocks[static_cast<size_t>(i)] = *b;
  }
  while (k > 0 && !window_covered(s, k, k * bs == n_tok ? n_tok - 1 : k * bs)) --k;
  s.wblocks.resize(static_cast<size_t>(k));
  return k;
}

// True when a running sequence is still computing full prompt blocks that `s` would find in the
// prefix cache once they are done: the other choices of an n > 1 request, or requests with the
// same system prompt admitted together. `s` then waits (a step per prefill piece of the other)
// instead of computing the same blocks again; it is admitted with the cache hit after.
bool Scheduler::prefix_in_flight(Sequence& s) {
  if (!pool_.prefix_cache_enabled() || (!s.reuse_cached_prefix && s.generated() == 0)) return false;
  const int64_t bs = pool_.block_size();
  const int64_t full = static_cast<int64_t>(s.tokens.size()) / bs;
  if (full == 0) return false;
  const std::vector<BlockHash>& mine = block_hashes(s, full);
  for (Sequence* r : running_) {
    const int64_t r_full = std::min<int64_t>(static_cast<int64_t>(r->tokens.size()) / bs, full);
    if (r == &s || r_full == 0 || r->num_computed >= r_full * bs) continue;
    const std::vector<BlockHash>& theirs = block_hashes(*r, r_full);
    int64_t shared = 0;
    while (shared < r_full && theirs[static_cast<size_t>(shared)] == mine[static_cast<size_t>(shared)]) ++shared;
    // The next block `r` computes must be one the cache lacks (a sequence recomputing a cached
    // last token into a copy makes nothing new).
    const int64_t next = r->num_computed / bs;
    if (next >= shared) continue;
    const auto i = static_cast<size_t>(next);
    if (!pool_.find_cached(
            mine[i], i == 0 ? kRootBlockHash : mine[i - 1],
            std::span<const int32_t>(s.tokens).subspan(i * static_cast<size_t>(bs), static_cast<size_t>(bs))))
      return true;
  }
  return false;
}

void Scheduler::register_computed_blocks(Sequence& s) {
  const int64_t bs = pool_.block_size();
  const int64_t full = std::min<int64_t>(s.num_computed / bs, static_cast<int64_t>(s.blocks.size()));
  if (!pool_.prefix_cache_enabled() || full <= s.num_registered) return;
  const auto& h = block_hashes(s, full);
  for (int64_t i = s.num_registered; i < full; ++i) {
    const BlockHash parent = i == 0 ? kRootBlockHash : h[i - 1];
    const auto toks = std::span<const int32_t>(s.tokens).subspan(i * bs, bs);
    pool_.register_full_block(s.blocks[i], h[i], parent, toks);
    if (window_.pool && s.wblocks[static_cast<size_t>(i)] >= 0)
      window_.pool->register_full_block(s.wblocks[static_cast<size_t>(i)], h[i], parent, toks);
  }
  s.num_registered = full;
}

// ---- building a step -------------------------------------------------------------------------

// New blocks a piece [start, end) needs: blocks past the table's end, plus a private copy of
// every block already in the table that the piece writes and that is shared or cached.
int64_t Scheduler::blocks_needed(const Sequence& s, int64_t start, int64_t end) const {
  const int64_t bs = pool_.block_size();
  const auto have = static_cast<int64_t>(s.blocks.size());
  int64_t n = std::max<int64_t>(0, ceil_div(end, bs) - have);
  for (int64_t i = start / bs; i < have && i * bs < end; ++i)
    if (pool_.ref_count(s.blocks[i]) > 1 || pool_.is_cached(s.blocks[i])) ++n;
  return n;
}

Scheduler::Sequence* Scheduler::pick_victim(const StepBuilder& b, const Sequence& s) const {
  Sequence* victim = nullptr;
  for (Sequence* r : running_) {
    if (r != &s) {
      // Never one whose NewSequence is in this plan, nor one that only waits to be finished.
      if (r->step_mark == b.step_id && b.pieces[r->piece_index].is_new) continue;
      if (!schedulable(*r)) continue;
    }
    if (!victim || ranks_before(*victim, *r, b.now)) victim = r;
  }
  return victim;
}

void Scheduler::preempt(StepBuilder& b, Sequence& v) {
  if (v.step_mark == b.step_id) {
    Piece& p = b.pieces[v.piece_index];
    TESSERA_CHECK(!p.is_new && !p.dropped, "preempting sequence {} admitted in this step", v.id);
    p.dropped = true;
    b.tokens_left += p.n;
    v.step_mark = 0;
  }
  release_blocks(v);
  v.num_computed = 0;
  v.num_registered = 0;
  v.shard_table_len = 0;
  v.table_stale = v.sent;
  v.state = SequenceState::kWaiting;
  v.ticket = --front_ticket_;
  v.preempted_step = b.step_id;
  ++v.preemptions;
  ++stats_.preemptions;
  running_.erase(std::find(running_.begin(), running_.end(), &v));
  waiting_.push_back(&v);
}

// Frees the blocks a piece of `n` tokens of `s` needs by preempting the lowest-ranked running
// sequences. false when `s` itself was the lowest and has been preempted.
bool Scheduler::make_room(StepBuilder& b, Sequence& s, int64_t n) {
  const int64_t start = s.num_computed;
  const int64_t end = start + n;
  int64_t blocks = blocks_needed(s, start, end);
  while (pool_.num_free() < blocks) {
    Sequence* v = pick_victim(b, s);
    TESSERA_CHECK(v != nullptr, "no preemption victim for sequence {}", s.id);
    preempt(b, *v);
    if (v == &s) return false;
    blocks = blocks_needed(s, start, end);
  }
  return true;
}

void Scheduler::add_piece(StepBuilder& b, Sequence& s, int64_t start, int64_t n) {
  const int64_t bs = pool_.block_size();
  const int64_t end = start + n;
  Piece p;
  p.seq = &s;
  p.start = start;
  p.n = n;
  p.is_new = !s.sent;
  for (int64_t i = start / bs; i < static_cast<int64_t>(s.blocks.size()) && i * bs < end; ++i) {
    const int32_t old = s.blocks[i];
    if (pool_.ref_count(old) == 1 && !pool_.is_cached(old)) continue;
    auto fresh = pool_.allocate();
    TESSERA_CHECK(fresh.has_value(), "copy-on-write of block {}: no free block after make_room", old);
    p.copies.push_back({old, *fresh});
    b.holds.push_back(old);  // our reference now keeps the source alive until the copy is planned
    s.blocks[i] = *fresh;
    if (i < s.shard_table_len) p.force_reset = true;
  }
  if (window_.pool) {
    // The window pool is sized so that none of this can fail (window_pool_blocks).
    for (int64_t i = start / bs; i < static_cast<int64_t>(s.wblocks.size()) && i * bs < end; ++i) {
      const int32_t old = s.wblocks[static_cast<size_t>(i)];
      TESSERA_CHECK(old >= 0, "sequence {}: the piece at {} writes window slot {}, which was released", s.id, start, i);
      if (window_.pool->ref_count(old) == 1 && !window_.pool->is_cached(old)) continue;
      auto fresh = window_.pool->allocate();
      TESSERA_CHECK(fresh.has_value(), "copy-on-write of window block {}: the window pool is exhausted", old);
      p.wcopies.push_back({old, *fresh});
      b.wholds.push_back(old);
      s.wblocks[static_cast<size_t>(i)] = *fresh;
      if (i < s.shard_table_len) p.force_reset = true;
    }
  }
  while (static_cast<int64_t>(s.blocks.size()) * bs < end) {
    auto fresh = pool_.allocate();
    TESSERA_CHECK(fresh.has_value(), "sequence {}: no free block after make_room", s.id);
    s.blocks.push_back(*fresh);
    if (window_.pool) {
      auto wfresh = window_.pool->allocate();
      TESSERA_CHECK(wfresh.has_value(), "sequence {}: the window pool is exhausted", s.id);
      s.wblocks.push_back(*wfresh);
    }
  }
  if (n > 1) b.prefill_in_step = true;
  b.tokens_left -= n;
  s.step_mark = b.step_id;
  s.piece_index = b.pieces.size();
  b.pieces.push_back(std::move(p));
}

void Scheduler::schedule_running(StepBuilder& b, Sequence& s, int64_t n, std::vector<int32_t> draft) {
  if (!make_room(b, s, n)) return;
  add_piece(b, s, s.num_computed, n);
  b.pieces.back().draft = std::move(draft);
}

// How many of s's drafts its decode piece can carry: within max_tokens (every draft kept plus
// the token after it must still be allowed), prefill_chunk (the window pool's sizing), the
// tokens the step has left after `decoders_after` more one-token decodes, and the blocks that
// are free beyond `reserve` (what those decodes need): speculation never preempts anyone.
int64_t Scheduler::draft_room(const StepBuilder& b, const Sequence& s, int64_t decoders_after, int64_t reserve) const {
  int64_t k = std::min<int64_t>(static_cast<int64_t>(s.draft.size()), s.max_tokens - s.generated() - 1);
  k = std::min<int64_t>({k, config_.prefill_chunk - 1, b.tokens_left - 1 - decoders_after});
  const int64_t c = s.num_computed;
  const int64_t base = blocks_needed(s, c, c + 1);
  while (k > 0 && blocks_needed(s, c, c + 1 + k) - base > pool_.num_free() - reserve - base) --k;
  if (k > 0 && window_.pool) {
    const int64_t wnew = ceil_div(c + 1 + k, pool_.block_size()) - static_cast<int64_t>(s.wblocks.size());
    if (wnew > window_.pool->num_free()) k = 0;
  }
  return std::max<int64_t>(0, k);
}

bool Scheduler::should_hold(const StepBuilder& b) const {
  if (max_wait_.count() <= 0 || b.prefill_in_step) return false;
  int64_t fresh = 0, fresh_tokens = 0;
  for (const Sequence* s : waiting_) {
    if (s->sent) continue;
    ++fresh;
    fresh_tokens += static_cast<int64_t>(s->tokens.size());
  }
  const std::optional<Clock::time_point> deadline = hold_deadline();
  if (fresh == 0 || !deadline || b.now >= *deadline) return false;
  // Enough company already: the step would be full anyway.
  const int64_t free_slots = config_.max_batch - static_cast<int64_t>(running_.size());
  if (fresh >= free_slots || fresh_tokens >= b.tokens_left) return false;
  return true;
}

// Preempts running sequences of a strictly lower effective class than `s` (lowest rank first)
// until `needed` blocks are free, but only if that can succeed. `keep` are blocks `s` is about
// to take from the cache: freeing them does not help it.
bool Scheduler::preempt_lower_classes(StepBuilder& b, const Sequence& s, int64_t needed,
                                      const std::vector<int32_t>& keep) {
  const int cls = effective_class(s, b.now);
  std::vector<Sequence*> victims;
  for (Sequence* r : running_) {
    if (effective_class(*r, b.now) <= cls || !schedulable(*r)) continue;
    if (r->step_mark == b.step_id && b.pieces[r->piece_index].is_new) continue;
    victims.push_back(r);
  }
  std::sort(victims.begin(), victims.end(), [&](Sequence* x, Sequence* y) { return ranks_before(*y, *x, b.now); });
  auto kept_free = [&] {
    int64_t n = 0;
    for (int32_t k : keep) n += pool_.ref_count(k) == 0;
    return n;
  };
  int64_t avail = pool_.num_free() - kept_free();
  size_t take = 0;
  while (avail < needed && take < victims.size()) {
    for (int32_t blk : victims[take]->blocks)
      if (pool_.ref_count(blk) == 1 && std::find(keep.begin(), keep.end(), blk) == keep.end()) ++avail;
    ++take;
  }
  if (avail < needed) return false;
  for (size_t i = 0; i < take && pool_.num_free() - kept_free() < needed; ++i) preempt(b, *victims[i]);
  return pool_.num_free() - kept_free() >= needed;
}

// The running sequence `s` may take the batch slot of: the lowest-ranked one of a strictly
// lower effective class that is not new in this step; nullptr if none.
Scheduler::Sequence* Scheduler::slot_victim(const StepBuilder& b, const Sequence& s) const {
  const int cls = effective_class(s, b.now);
  Sequence* victim = nullptr;
  for (Sequence* r : running_) {
    if (effective_class(*r, b.now) <= cls || !schedulable(*r)) continue;
    if (r->step_mark == b.step_id && b.pieces[r->piece_index].is_new) continue;
    if (victim == nullptr || ranks_before(*victim, *r, b.now)) victim = r;
  }
  return victim;
}

bool Scheduler::preempt_for_slot(StepBuilder& b, const Sequence& s) {
  Sequence* v = slot_victim(b, s);
  if (v == nullptr) return false;
  preempt(b, *v);
  return true;
}

bool Scheduler::admit(StepBuilder& b, Sequence& s) {
  const int64_t bs = pool_.block_size();
  const auto n_tok = static_cast<int64_t>(s.tokens.size());
  // s.blocks = the matched blocks (s.wblocks their window blocks), not yet retained.
  const int64_t matched = window_prefix(s, match_prefix(s), n_tok);
  const int64_t chunk = config_.prefill_chunk;

  struct Option {
    int64_t k, start, n, needed;
  };
  auto option = [&](int64_t k) {
    Option o{k, k * bs, 0, 0};
    if (o.start == n_tok) o.start = n_tok - 1;  // everything cached: recompute the last token (COW)
    o.n = std::min({n_tok - o.start, chunk, b.tokens_left});
    const int64_t end = o.start + o.n;
    o.needed = std::max<int64_t>(0, ceil_div(end, bs) - k) + (o.start < k * bs ? 1 : 0);
    for (int64_t i = 0; i < k; ++i) o.needed += pool_.ref_count(s.blocks[i]) == 0;  // leaves the free list
    return o;
  };
  Option o = option(matched);
  if (pool_.num_free() < o.needed && o.start < o.k * bs) {
    // The copy-on-write needs one block more than recomputing the whole last block.
    Option alt = option(matched - 1);
    if (pool_.num_free() >= alt.needed && (!window_.pool || window_covered(s, alt.k, alt.start))) o = alt;
  }
  if (pool_.num_free() < o.needed) {
    std::vector<int32_t> keep(s.blocks.begin(), s.blocks.begin() + o.k);
    const int64_t new_blocks = o.needed - static_cast<int64_t>(
                                              std::count_if(keep.begin(), keep.end(),
                                                            [&](int32_t k) { return pool_.ref_count(k) == 0; }));
    if (!preempt_lower_classes(b, s, new_blocks, keep)) {
      s.blocks.clear();
      s.wblocks.clear();
      return false;
    }
    o = option(o.k);
    TESSERA_CHECK(pool_.num_free() >= o.needed, "admission of {} after preemption", s.id);
  }
  s.blocks.resize(static_cast<size_t>(o.k));
  for (int32_t blk : s.blocks) pool_.retain(blk);
  if (window_.pool) {
    s.wblocks.resize(static_cast<size_t>(o.k));
    s.wlive_from = std::min<int64_t>(first_window_slot(o.start), o.k);
    for (int64_t i = 0; i < o.k; ++i) {
      int32_t& w = s.wblocks[static_cast<size_t>(i)];
      if (i < s.wlive_from) w = -1;
      else window_.pool->retain(w);
    }
  }
  s.num_computed = o.start;
  s.num_registered = std::min(o.k, o.start / bs);
  if (!s.admitted_once) {
    s.admitted_once = true;
    s.cached_prompt_tokens = o.start;
    pool_.record_prefix_query(n_tok, o.start);
    ++stats_.admitted;
  }
  s.state = SequenceState::kRunning;
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &s));
  running_.push_back(&s);
  add_piece(b, s, o.start, o.n);
  return true;
}

std::optional<StepPlan> Scheduler::schedule() {
  TESSERA_CHECK(!in_flight_, "schedule() while step {} is in flight", next_step_id_ - 1);
  StepBuilder b;
  b.step_id = next_step_id_;
  b.now = clock_.now();
  b.tokens_left = config_.max_step_tokens;

  std::vector<Sequence*> order = running_;
  std::sort(order.begin(), order.end(), [&](Sequence* x, Sequence* y) { return ranks_before(*x, *y, b.now); });
  auto ready = [&](const Sequence* s) {
    return s->state == SequenceState::kRunning && s->step_mark != b.step_id && schedulable(*s);
  };
  // 1. Decodes: one token each (plus its drafts, where it has some and there is room), highest
  // rank first.
  auto decodes = [&](const Sequence* s) { return ready(s) && remaining(*s) == 1 && s->num_computed > 0; };
  int64_t decoders_left = 0, reserve = 0;
  for (Sequence* s : order) {
    if (!decodes(s)) continue;
    ++decoders_left;
    reserve += blocks_needed(*s, s->num_computed, s->num_computed + 1);
  }
  int64_t decoded = 0;
  for (Sequence* s : order) {
    if (!decodes(s)) continue;
    if (b.tokens_left < 1) break;
    --decoders_left;
    ++decoded;
    std::vector<int32_t> draft;
    reserve -= blocks_needed(*s, s->num_computed, s->num_computed + 1);
    if (!s->draft.empty()) {
      const int64_t k = draft_room(b, *s, decoders_left, reserve);
      draft.assign(s->draft.begin(), s->draft.begin() + k);
    }
    const auto n = static_cast<int64_t>(1 + draft.size());
    schedule_running(b, *s, n, std::move(draft));
  }
  for (auto& [id, s] : seqs_) s->draft.clear();
  // A step that decodes takes at most mixed_prefill_tokens of prefill beside (the decoders'
  // inter-token latency); one that does not, as much as max_step_tokens holds.
  if (decoded > 0 && config_.mixed_prefill_tokens > 0)
    b.tokens_left = std::min<int64_t>(b.tokens_left, config_.mixed_prefill_tokens);
  // 2. Prefills and recomputes already under way: one piece each.
  for (Sequence* s : order) {
    if (!ready(s)) continue;
    if (b.tokens_left < 1) break;
    schedule_running(b, *s, std::min({remaining(*s), static_cast<int64_t>(config_.prefill_chunk), b.tokens_left}), {});
  }
  // 3. Admissions, strictly in rank order.
  stats_.held = 0;
  if (!waiting_.empty()) {
    std::vector<Sequence*> queue = waiting_;
    std::sort(queue.begin(), queue.end(), [&](Sequence* x, Sequence* y) { return ranks_before(*x, *y, b.now); });
    // Decided once, at the first new request: once released, the whole group goes.
    std::optional<bool> hold;
    for (Sequence* s : queue) {
      if (s->preempted_step == b.step_id) break;
      if (b.tokens_left < 1) break;
      if (static_cast<int64_t>(running_.size()) >= config_.max_batch && !slot_victim(b, *s)) break;
      if (!s->sent && !hold) hold = should_hold(b);
      if (!s->sent && *hold) {
        for (const Sequence* w : waiting_) stats_.held += !w->sent;
        break;
      }
      if (prefix_in_flight(*s)) {  // not a lack of room: the ones behind it may still go
        ++stats_.prefix_waits;
        continue;
      }
      if (static_cast<int64_t>(running_.size()) >= config_.max_batch && !preempt_for_slot(b, *s)) break;
      if (!admit(b, *s)) break;
    }
  }

  // Build the plan.
  StepPlan plan;
  plan.step_id = b.step_id;
  const int64_t bs = pool_.block_size();
  int64_t batch = 0, step_tokens = 0;
  for (Piece& p : b.pieces) {
    if (p.dropped) continue;
    Sequence& s = *p.seq;
    const int64_t end = p.start + p.n;
    const auto k = static_cast<int64_t>(p.draft.size());
    ScheduledSequence q;
    q.seq_id = s.id;
    q.start_pos = p.start;
    q.num_tokens = static_cast<int32_t>(p.n);
    q.sample = end - k == static_cast<int64_t>(s.tokens.size());
    q.draft_tokens = p.draft;
    q.reset_blocks = s.table_stale || p.force_reset;
    const int64_t from = q.reset_blocks ? 0 : s.shard_table_len;
    q.append_blocks.assign(s.blocks.begin() + from, s.blocks.end());
    if (window_.pool) q.append_window_blocks.assign(s.wblocks.begin() + from, s.wblocks.end());
    s.shard_table_len = static_cast<int64_t>(s.blocks.size());
    s.table_stale = false;
    if (p.is_new) {
      plan.new_sequences.push_back({s.id, s.tokens, s.sampling});
      s.sent = true;
    }
    plan.block_copies.insert(plan.block_copies.end(), p.copies.begin(), p.copies.end());
    plan.window_block_copies.insert(plan.window_block_copies.end(), p.wcopies.begin(), p.wcopies.end());
    for (int64_t i = p.start / bs; i < ceil_div(end, bs); ++i) {
      const auto fill = static_cast<int32_t>(std::min<int64_t>(bs, end - i * bs));
      pool_.set_fill(s.blocks[i], fill);
      if (window_.pool) window_.pool->set_fill(s.wblocks[static_cast<size_t>(i)], fill);
    }
    const int64_t recompute = std::max<int64_t>(0, std::min(end, s.high_water) - p.start);
    const int64_t fresh_prompt = std::max<int64_t>(0, std::min(end, s.prompt_len) - std::max(p.start, s.high_water));
    stats_.recompute_tokens += recompute;
    stats_.prefill_tokens += fresh_prompt;
    stats_.decode_tokens += p.n - k - recompute - fresh_prompt;
    stats_.draft_tokens += k;
    s.high_water = std::max(s.high_water, end - k);
    in_flight_pieces_.push_back({s.id, s.serial, end, q.sample, k});
    plan.scheduled.push_back(std::move(q));
    ++batch;
    step_tokens += p.n;
  }
  for (int32_t blk : b.holds) pool_.release(blk);
  for (int32_t blk : b.wholds) window_.pool->release(blk);
  if (plan.scheduled.empty() && pending_finished_.empty()) {
    in_flight_pieces_.clear();
    return std::nullopt;
  }
  plan.finished = std::move(pending_finished_);
  pending_finished_.clear();
  ++next_step_id_;
  in_flight_ = true;
  ++stats_.steps;
  stats_.last_batch_size = batch;
  stats_.last_step_tokens = step_tokens;
  return plan;
}

// ---- results ---------------------------------------------------------------------------------

Status Scheduler::on_result(const StepResult& result) {
  if (!in_flight_) return Status::internal("on_result: no step is in flight");
  if (!result.error.empty()) {
    on_step_failed();
    return Status::invalid_argument(fmt::format("step {} failed: {}", result.step_id, result.error));
  }
  in_flight_ = false;
  std::vector<const StepToken*> tokens;
  tokens.reserve(result.tokens.size());
  for (const StepToken& t : result.tokens) tokens.push_back(&t);
  std::string problems;
  // A piece's tokens in order: one for a plain sampling piece, 1 .. draft + 1 for a speculative one.
  std::vector<int32_t> got;
  auto take_tokens = [&](uint64_t id, int64_t most) {
    got.clear();
    for (auto& t : tokens) {
      if (t && t->seq_id == id) {
        got.push_back(t->token);
        t = nullptr;
      }
    }
    if (static_cast<int64_t>(got.size()) > most) {
      problems += most == 1 ? fmt::format("; sequence {} got {} tokens", id, got.size())
                            : fmt::format("; sequence {} got {} tokens for {} drafts", id, got.size(), most - 1);
      got.resize(static_cast<size_t>(most));
    }
  };
  for (const InFlight& f : in_flight_pieces_) {
    auto it = seqs_.find(f.seq_id);
    const bool live = it != seqs_.end() && it->second->serial == f.serial;
    if (f.sample) take_tokens(f.seq_id, 1 + f.draft);
    if (!live) continue;  // finished or aborted while the step ran
    Sequence& s = *it->second;
    TESSERA_CHECK(s.state == SequenceState::kRunning, "sequence {} left running while its step was in flight", s.id);
    if (f.sample && got.empty()) problems += fmt::format("; no sampled token for sequence {}", s.id);
    if (f.draft > 0) {
      // Positions computed: the last known token and the drafts kept (one fewer than the
      // tokens drawn); the rejected drafts' slots are given back.
      s.num_computed = f.end - f.draft - 1 + std::max<int64_t>(1, static_cast<int64_t>(got.size()));
      trim_blocks(s);
    } else {
      s.num_computed = f.end;
    }
    if (f.sample) s.tokens.insert(s.tokens.end(), got.begin(), got.end());
    register_computed_blocks(s);
    slide_window(s, s.num_computed);  // between steps a sequence holds only its next query's window
  }
  for (const StepToken* t : tokens)
    if (t) problems += fmt::format("; unexpected token for sequence {}", t->seq_id);
  in_flight_pieces_.clear();
  if (!problems.empty())
    return Status::invalid_argument(fmt::format("step {}: result does not match the plan{}", result.step_id, problems));
  return Status::ok();
}

// After a speculative piece: the table keeps the blocks that hold the computed positions (the
// shards cut theirs the same way); the blocks taken for rejected drafts go back to the pool.
void Scheduler::trim_blocks(Sequence& s) {
  const int64_t bs = pool_.block_size();
  const int64_t keep = ceil_div(s.num_computed, bs);
  while (static_cast<int64_t>(s.blocks.size()) > keep) {
    pool_.release(s.blocks.back());
    s.blocks.pop_back();
    if (window_.pool) {
      if (s.wblocks.back() >= 0) window_.pool->release(s.wblocks.back());
      s.wblocks.pop_back();
    }
  }
  s.shard_table_len = std::min(s.shard_table_len, keep);
  if (keep > 0) {
    const auto fill = static_cast<int32_t>(s.num_computed - (keep - 1) * bs);
    pool_.set_fill(s.blocks[static_cast<size_t>(keep - 1)], fill);
    if (window_.pool && s.wblocks[static_cast<size_t>(keep - 1)] >= 0)
      window_.pool->set_fill(s.wblocks[static_cast<size_t>(keep - 1)], fill);
  }
}

void Scheduler::set_draft(uint64_t seq_id, std::vector<int32_t> draft) {
  auto it = seqs_.find(seq_id);
  if (it != seqs_.end()) it->second->draft = std::move(draft);
}

std::vector<uint64_t> Scheduler::decoders() const {
  std::vector<uint64_t> ids;
  for (const Sequence* s : running_)
    if (schedulable(*s) && remaining(*s) == 1 && s->num_computed > 0) ids.push_back(s->id);
  return ids;
}

std::vector<uint64_t> Scheduler::on_step_failed() {
  std::vector<uint64_t> ids;
  for (const InFlight& f : in_flight_pieces_) {
    auto it = seqs_.find(f.seq_id);
    if (it != seqs_.end() && it->second->serial == f.serial) ids.push_back(f.seq_id);
  }
  in_flight_pieces_.clear();
  in_flight_ = false;
  return ids;
}

// ---- queries ---------------------------------------------------------------------------------

// When the new requests' wait for companions ends (scheduler.h, max_wait_ms).
std::optional<Clock::time_point> Scheduler::hold_deadline() const {
  if (max_wait_.count() <= 0) return std::nullopt;
  // A lone request waits max_wait_ms. A companion within that time starts a burst: while
  // arrivals keep coming, each within the burst gap of the one before, the wait runs to a gap
  // after the last of them (a longer gap ends the chain), never past max_burst_wait_ms.
  std::vector<Clock::time_point> times;
  for (const Sequence* s : waiting_)
    if (!s->sent) times.push_back(s->arrival);
  if (times.empty()) return std::nullopt;
  std::sort(times.begin(), times.end());
  const Clock::time_point first = times.front();
  if (times.size() == 1 || times[1] - first > max_wait_) return first + max_wait_;
  Clock::time_point last = first;
  for (const Clock::time_point t : times) {
    if (t - last > burst_gap_) break;
    last = t;
  }
  return std::min(std::max(first + max_wait_, last + burst_gap_), first + max_burst_wait_);
}

std::optional<Clock::duration> Scheduler::time_until_next_decision() const {
  const std::optional<Clock::time_point> deadline = hold_deadline();
  if (!deadline) return std::nullopt;
  const auto left = *deadline - clock_.now();
  return left.count() > 0 ? left : Clock::duration::zero();
}

bool Scheduler::has_work() const { return !seqs_.empty() || !pending_finished_.empty(); }

bool Scheduler::contains(uint64_t seq_id) const { return seqs_.count(seq_id) > 0; }

const std::vector<int32_t>& Scheduler::tokens(uint64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  TESSERA_CHECK(it != seqs_.end(), "tokens() of unknown sequence {}", seq_id);
  return it->second->tokens;
}

std::optional<SequenceInfo> Scheduler::info(uint64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return std::nullopt;
  const Sequence& s = *it->second;
  SequenceInfo i;
  i.state = s.state;
  i.prompt_tokens = s.prompt_len;
  i.generated_tokens = s.generated();
  i.computed_tokens = s.num_computed;
  i.blocks = static_cast<int64_t>(s.blocks.size());
  i.window_blocks = std::count_if(s.wblocks.begin(), s.wblocks.end(), [](int32_t w) { return w >= 0; });
  i.priority = s.priority;
  i.preemptions = s.preemptions;
  i.cached_prompt_tokens = s.cached_prompt_tokens;
  i.sent = s.sent;
  return i;
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s = stats_;
  s.running = static_cast<int64_t>(running_.size());
  s.waiting = static_cast<int64_t>(waiting_.size());
  s.kv = pool_.stats();
  if (window_.pool) s.kv_window = window_.pool->stats();
  return s;
}

Status Scheduler::check_invariants() const {
  TESSERA_RETURN_IF_ERROR(pool_.check_invariants());
  if (static_cast<int64_t>(running_.size()) > config_.max_batch)
    return Status::internal(fmt::format("{} running, max_batch {}", running_.size(), config_.max_batch));
  if (running_.size() + waiting_.size() != seqs_.size())
    return Status::internal(fmt::format("{} running + {} waiting but {} sequences", running_.size(), waiting_.size(),
                                        seqs_.size()));
  std::vector<int64_t> refs(static_cast<size_t>(pool_.num_blocks()), 0);
  const int64_t bs = pool_.block_size();
  for (const Sequence* s : running_) {
    if (s->state != SequenceState::kRunning) return Status::internal(fmt::format("sequence {}: state", s->id));
    if (static_cast<int64_t>(s->blocks.size()) * bs < s->num_computed)
      return Status::internal(fmt::format("sequence {}: {} blocks for {} computed tokens", s->id, s->blocks.size(),
                                          s->num_computed));
    for (int32_t b : s->blocks) ++refs[static_cast<size_t>(b)];
  }
  for (const Sequence* s : waiting_) {
    if (s->state != SequenceState::kWaiting || !s->blocks.empty())
      return Status::internal(fmt::format("waiting sequence {} holds {} blocks", s->id, s->blocks.size()));
  }
  for (int32_t b = 0; b < pool_.num_blocks(); ++b)
    if (pool_.ref_count(b) != refs[static_cast<size_t>(b)])
      return Status::internal(fmt::format("block {}: ref {} but {} tables hold it", b, pool_.ref_count(b),
                                          refs[static_cast<size_t>(b)]));
  if (!window_.pool) return Status::ok();
  // The window pool: references, and every slot the next query reads is live.
  TESSERA_RETURN_IF_ERROR(window_.pool->check_invariants());
  const int64_t per_seq = window_blocks_per_sequence(window_.window, bs);
  std::vector<int64_t> wrefs(static_cast<size_t>(window_.pool->num_blocks()), 0);
  for (const Sequence* s : running_) {
    if (s->wblocks.size() != s->blocks.size())
      return Status::internal(fmt::format("sequence {}: {} window slots for {} blocks", s->id, s->wblocks.size(),
                                          s->blocks.size()));
    int64_t live = 0;
    for (size_t i = 0; i < s->wblocks.size(); ++i) {
      const int32_t w = s->wblocks[i];
      if (w >= 0) {
        ++wrefs[static_cast<size_t>(w)];
        ++live;
      } else if (static_cast<int64_t>(i) >= first_window_slot(s->num_computed)) {
        return Status::internal(fmt::format("sequence {}: window slot {} released, but a query at {} reads it", s->id,
                                            i, s->num_computed));
      }
    }
    if (live > per_seq)
      return Status::internal(fmt::format("sequence {} holds {} window blocks; at most {}", s->id, live, per_seq));
  }
  for (const Sequence* s : waiting_)
    if (!s->wblocks.empty()) return Status::internal(fmt::format("waiting sequence {} holds window slots", s->id));
  for (int32_t b = 0; b < window_.pool->num_blocks(); ++b)
    if (window_.pool->ref_count(b) != wrefs[static_cast<size_t>(b)])
      return Status::internal(fmt::format("window block {}: ref {} but {} window tables hold it", b,
                                          window_.pool->ref_count(b), wrefs[static_cast<size_t>(b)]));
  return Status::ok();
}

}  // namespace tessera
