// The continuous-batching scheduler (ARCHITECTURE.md "One step", step 2): decides, step by step, which sequences run,
// which tokens of each are computed, and which KV blocks they use, and emits the StepPlan the
// shards execute (proto/control_messages.h, proto/README.md).
//
// The engine loop (one thread owns the Scheduler, its BlockPool and the Clock's readings):
//
//   add() requests as they arrive;
//   loop:
//     plan = schedule();             // nullopt: nothing to run now
//     if (!plan) { wait for an arrival, at most time_until_next_decision(); continue; }
//     result = shards.run_step(*plan);
//     on_result(result);             // appends every sampled token to its sequence
//     for each sequence that stopped (EOS, max_tokens, stop string): finish(id);
//     for each client that went away: abort(id);
//
// At most one plan is in flight: schedule() must not be called again before on_result() (or
// on_step_failed()) for the previous plan. finish()/abort() may be called at any time outside
// schedule(); tokens of an in-flight plan for a sequence that is gone are ignored.
//
// What a plan means to a shard (the contract the tests check with a simulated shard):
//  * new_sequences: a sequence's prompt and sampling parameters, sent once, in the first plan
//    that schedules it. The shard's token list is the prompt, then every token it samples.
//  * finished: ids whose shard state is dropped before anything else in the step. Only ids the
//    shards know (sent in an earlier plan) appear; a request finished or aborted before it was
//    ever scheduled never reaches the shards.
//  * block_copies: whole-block KV copies done before the step (copy-on-write).
//  * scheduled[i]: clear the table if reset_blocks, append append_blocks, then compute positions
//    [start_pos, start_pos + num_tokens) of the token list; the table then covers those
//    positions and holds the KV of every position < start_pos. sample is set exactly when the
//    piece ends at the last known token (last prefill chunk, a decode step, the end of a
//    recompute); the shard then samples one token, which comes back in StepResult::tokens.
//
// Policy:
//  * Order within a step: running sequences that decode (one token each), then running
//    sequences in the middle of a prefill or a recompute (a piece of at most prefill_chunk
//    tokens each), then admissions from the waiting queue, all within max_step_tokens. At most
//    max_batch sequences are running (holding KV blocks) at once, and max_step_tokens >=
//    max_batch, so every running decode is in every step: a prompt, however long, delays the
//    others' next token by at most one chunk's compute. With mixed_prefill_tokens > 0, a step
//    that decodes carries at most that many prefill tokens (pieces and admissions together),
//    so the decoders' next token waits for at most that much prefill; steps without decodes
//    take prefill up to max_step_tokens.
//  * Rank: (effective class, ticket), lower first. The effective class is the request's
//    priority minus one per aging_ms since its arrival (never below 0), so nothing starves:
//    every request eventually competes as class 0, where the oldest ticket wins. Tickets are
//    FCFS; a preempted sequence gets a ticket ahead of every other, so it resumes first.
//  * Admission is strictly in rank order and stops at the first request that cannot start
//    (no batch slot, no tokens left, no blocks): a big request at the head is not overtaken
//    forever by smaller ones behind it.
//  * A full batch (max_batch running) does not hold back a better class: a request takes the
//    slot of the lowest-ranked running sequence of a strictly lower effective class (preempted
//    as below), so a class-0 arrival starts within max_burst_wait_ms plus one step however long the
//    batch-class work runs. Within a class nobody is preempted for a slot.
//  * max_wait_ms: a request that has never run may wait up to max_wait_ms after its arrival for
//    companions, so that arrivals close together share one prefill step (one slow step instead
//    of several, and bigger GEMMs). A companion arriving within max_wait_ms starts a burst:
//    while new requests keep arriving, each within the burst gap (max(max_wait_ms,
//    max_burst_wait_ms / 5)) of the one before, the wait runs to a gap after the newest, but at
//    most to max_burst_wait_ms after the first (a burst is gathered, not cut; a lone request
//    waits max_wait_ms). The wait ends early when the waiting prompts would fill the
//    step (tokens or batch slots), or when a running prefill is in this step anyway (joining it
//    costs the decoders nothing more). Preempted sequences never wait.
//  * Blocks run out: a running sequence that needs a block preempts the lowest-ranked running
//    sequence (lowest class, newest first), possibly itself. An admission may preempt only
//    running sequences of a strictly lower effective class, and only when that frees enough.
//    Preemption is by recompute: the victim's blocks are released (full blocks stay in the
//    prefix cache), it goes back to the waiting queue ahead of its class, and when it runs again
//    its plan entry has reset_blocks set and recomputes its token list (prompt and the tokens
//    generated so far, in chunks, from the first position the prefix cache cannot supply),
//    sampling at the end; the shards keep its token list and sampler meanwhile.
//  * Prefix cache: at admission the token list's full blocks are matched against the cache;
//    the first piece starts at the first uncached token. When every token is cached, the last
//    token is recomputed into a private copy of the last block (copy-on-write). A sequence's
//    full blocks are registered in the cache once the step that computed them has returned,
//    so a request admitted in the same step as another with the same prefix does not share it.
//  * A sequence that has generated max_tokens tokens is not scheduled again; the engine is
//    expected to finish() it (it keeps its blocks until then).
//  * Window pool (common/kv_config.h; optional): the sliding-window layers' KV lives in a second
//    pool, and each sequence has a second table (the window table) with one entry per slot of
//    its block table. When a step's result is committed, a sequence whose next query is at c
//    releases the window blocks of slots wholly before c - window + 1 (their entries become -1:
//    no query of it reads them again), so between steps it holds only that query's window.
//    Full window blocks are registered in the window pool's prefix cache under the same hash as
//    the block-table slot and stay there when released, until evicted. A prefix hit of k blocks is taken only
//    as far as the window pool still holds the window blocks the first computed position
//    reads; it is shortened to the longest k that does. Copy-on-write applies to both pools.
//    The window pool is sized by window_pool_blocks (max_batch, max_step_tokens), so it never
//    runs out and never preempts anyone.
//
// Thread-safety: none; the engine thread owns the scheduler (ARCHITECTURE.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "proto/control_messages.h"
#include "common/status.h"
#include "engine/block_pool.h"
#include "engine/clock.h"
#include "engine/scheduler_config.h"

namespace tessera {

struct SchedulerRequest {
  uint64_t seq_id = 0;            // unique for the life of the process (the shards' key)
  std::vector<int32_t> prompt;    // token ids, non-empty, each >= 0
  SamplingParams sampling;        // sent to the shards unchanged (seed it if ranks must agree)
  int64_t max_tokens = 16;        // most tokens the engine will let it generate, >= 1
  int32_t priority = 0;           // class in [0, priority_classes); 0 is served first
  std::optional<Clock::time_point> arrival;  // when the request arrived; default: now at add()
  // False: the prompt is computed from position 0 even where the prefix cache holds it, because
  // the caller needs every prompt position's logits (echo with logprobs). Its blocks still go to
  // the cache for others. Once it has generated a token (a preempted sequence recomputing), the
  // cache is used again.
  bool reuse_cached_prefix = true;
};

enum class SequenceState { kWaiting, kRunning };

// The window pool a scheduler manages beside its block pool: none when pool is null.
struct WindowPool {
  BlockPool* pool = nullptr;  // same block size as the block pool; at least window_pool_blocks(window,
                              // max_step_tokens, block_size, max_batch) blocks
  int64_t window = 0;         // tokens: a query at p reads the windowed layers' keys in (p - window, p]
};

struct SequenceInfo {
  SequenceState state = SequenceState::kWaiting;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t computed_tokens = 0;  // positions whose KV is in the cache (as of the last result)
  int64_t blocks = 0;           // blocks in its table
  int64_t window_blocks = 0;    // window-pool blocks it holds (entries of its window table that are not -1)
  int32_t priority = 0;
  int64_t preemptions = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens its first admission took from the prefix cache
  bool sent = false;                 // the shards know it
};

struct SchedulerStats {
  int64_t running = 0;           // sequences holding KV blocks
  int64_t waiting = 0;           // queued (new or preempted)
  int64_t held = 0;              // of the waiting, new ones held back by max_wait_ms at the last step
  int64_t last_batch_size = 0;   // sequences in the last plan
  int64_t last_step_tokens = 0;  // tokens in the last plan
  int64_t steps = 0;             // plans emitted
  int64_t preemptions = 0;       // total
  int64_t admitted = 0;          // first admissions (total)
  int64_t finished = 0;          // finish() of live sequences (total)
  int64_t aborted = 0;           // abort() of live sequences (total)
  int64_t prefill_tokens = 0;    // prompt tokens computed for the first time (total)
  int64_t decode_tokens = 0;     // one-token decode pieces (total)
  int64_t draft_tokens = 0;      // speculative drafts sent with decode pieces (total)
  int64_t recompute_tokens = 0;  // tokens computed again after a preemption (total)
  int64_t prefix_waits = 0;      // admissions put off a step for a prefix another sequence is computing (total)
  BlockPoolStats kv;
  BlockPoolStats kv_window;  // the window pool (all zero without one)
};

class Scheduler {
 public:
  // `config` must pass validate_scheduler_config (checked). `pool` and `clock` must outlive the
  // scheduler; the pool must be used by nobody else.
  // `window` (optional) is the window pool: its size and block size are checked.
  Scheduler(const SchedulerConfig& config, BlockPool& pool, const Clock& clock, WindowPool window = {});
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. InvalidArgument naming the field for an empty prompt, a negative token
  // id, max_tokens < 1, a priority outside [0, priority_classes) or an id already live;
  // ResourceExhausted when the request could never fit: prompt + max_tokens - 1 positions need
  // more blocks than the whole pool.
  Status add(SchedulerRequest request);
  // Drops a sequence, running or waiting: its blocks are released and, if the shards know it,
  // its id goes into the next plan's `finished`. false if the id is not live. finish() is the
  // same for a sequence that stopped normally (only the counters differ).
  bool abort(uint64_t seq_id);
  bool finish(uint64_t seq_id);

  // The next step, or nullopt when there is nothing to run now (nothing live, everything held
  // by max_wait_ms, or sequences waiting to be finished). A plan with only `finished` ids is
  // emitted when there is nothing else to do, so the shards drop their state promptly.
  std::optional<StepPlan> schedule();
  // Speculation: tokens proposed to follow seq_id's last token, for the next schedule() only
  // (which clears every draft). A decode piece carries as many of them as fit (draft_room:
  // max_tokens, prefill_chunk, the step's tokens, free blocks; never a preemption) and
  // on_result then takes 1 .. k + 1 tokens for it, keeps the drafts the shards accepted and
  // releases the blocks of the rejected ones. Ignored for an id that is not live.
  void set_draft(uint64_t seq_id, std::vector<int32_t> draft);
  // The running sequences whose next piece is a decode (their drafts would be used), in
  // admission order.
  std::vector<uint64_t> decoders() const;
  // Commits the in-flight plan: computed positions advance, full blocks join the prefix cache,
  // sampled tokens are appended. InvalidArgument if the result is inconsistent with the plan
  // (a sampled token missing, unexpected or duplicated; the rest is still committed), or if
  // result.error is set (then nothing is committed, as for on_step_failed()). Internal if no
  // plan is in flight.
  Status on_result(const StepResult& result);
  // The in-flight plan failed: forgets it without committing anything and returns the ids of
  // the sequences it scheduled, whose shard state is now unknown (the engine aborts them).
  std::vector<uint64_t> on_step_failed();

  // How long until a held request's max_wait_ms runs out (zero if it already has); nullopt
  // when no new request is waiting. The engine waits at most this long for an arrival before
  // calling schedule() again.
  std::optional<Clock::duration> time_until_next_decision() const;
  // Anything live (running or waiting) or ids still to send in `finished`.
  bool has_work() const;
  bool in_flight() const { return in_flight_; }

  bool contains(uint64_t seq_id) const;
  // Prompt, then every sampled token. Precondition: contains(seq_id).
  const std::vector<int32_t>& tokens(uint64_t seq_id) const;
  std::optional<SequenceInfo> info(uint64_t seq_id) const;

  SchedulerStats stats() const;
  const SchedulerConfig& config() const { return config_; }
  const BlockPool& pool() const { return pool_; }
  const BlockPool* window_pool() const { return window_.pool; }
  // Cross-checks the scheduler's tables with the pool's reference counts: for tests.
  Status check_invariants() const;

 private:
  struct Sequence;
  struct Piece;
  struct StepBuilder;

  int effective_class(const Sequence& s, Clock::time_point now) const;
  bool ranks_before(const Sequence& a, const Sequence& b, Clock::time_point now) const;
  bool schedulable(const Sequence& s) const;
  int64_t remaining(const Sequence& s) const;
  int64_t blocks_needed(const Sequence& s, int64_t start, int64_t end) const;
  bool make_room(StepBuilder& b, Sequence& s, int64_t n);
  Sequence* pick_victim(const StepBuilder& b, const Sequence& s) const;
  void preempt(StepBuilder& b, Sequence& victim);
  void schedule_running(StepBuilder& b, Sequence& s, int64_t n, std::vector<int32_t> draft);
  int64_t draft_room(const StepBuilder& b, const Sequence& s, int64_t decoders_after, int64_t reserve) const;
  void trim_blocks(Sequence& s);
  void add_piece(StepBuilder& b, Sequence& s, int64_t start, int64_t n);
  bool should_hold(const StepBuilder& b) const;
  // When the new requests' wait for companions ends (max_wait_ms, max_burst_wait_ms); nullopt:
  // none waits, or waiting is off.
  std::optional<Clock::time_point> hold_deadline() const;
  Sequence* slot_victim(const StepBuilder& b, const Sequence& s) const;
  bool preempt_for_slot(StepBuilder& b, const Sequence& s);
  bool admit(StepBuilder& b, Sequence& s);
  bool preempt_lower_classes(StepBuilder& b, const Sequence& s, int64_t needed, const std::vector<int32_t>& keep);
  int64_t match_prefix(Sequence& s);
  bool prefix_in_flight(Sequence& s);
  const std::vector<BlockHash>& block_hashes(Sequence& s, int64_t n_blocks);
  void register_computed_blocks(Sequence& s);
  void release_blocks(Sequence& s);
  int64_t first_window_slot(int64_t start) const;
  bool window_covered(const Sequence& s, int64_t k, int64_t start) const;
  void slide_window(Sequence& s, int64_t start);
  int64_t window_prefix(Sequence& s, int64_t k, int64_t n_tok);
  void drop(uint64_t seq_id, bool aborted);

  SchedulerConfig config_;
  BlockPool& pool_;
  const Clock& clock_;
  WindowPool window_;
  Clock::duration max_wait_, max_burst_wait_, burst_gap_;
  Clock::duration aging_;
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> seqs_;
  std::vector<Sequence*> running_;  // holding blocks
  std::vector<Sequence*> waiting_;  // not holding blocks
  std::vector<uint64_t> pending_finished_;
  uint64_t next_serial_ = 1;
  int64_t next_ticket_ = 0;
  int64_t front_ticket_ = 0;  // preempted sequences count down from here
  uint64_t next_step_id_ = 1;
  // The plan in flight: per scheduled piece, what on_result commits.
  struct InFlight {
    uint64_t seq_id;
    uint64_t serial;
    int64_t end;  // positions computed once the step returns (with drafts: if all are kept)
    bool sample;
    int64_t draft;  // drafts the piece verifies
  };
  bool in_flight_ = false;
  std::vector<InFlight> in_flight_pieces_;
  SchedulerStats stats_;
};

}  // namespace tessera
