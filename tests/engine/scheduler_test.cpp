// The scheduler, step by step, against a simulated shard that enforces the StepPlan contract
// (proto/control_messages.h, engine/scheduler.h) strictly, with a manual clock.
//
// Each plan is summarised in one line, e.g. "-3 +1 c4>9 1:0+16 2:31+1sr":
//   -id finished, +id new sequence, cS>D block copy, id:start+n piece ("s": sample,
//   "r": reset_blocks). Scenario tables compare these lines step by step.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "engine/scheduler_config.h"

namespace tessera {
namespace {

using std::chrono::milliseconds;

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9e3779b97f4a7c15ULL ^ (b + 0x632be59bd9b4e019ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A shard that does what tessera-shard does with a plan, but with a "KV" slot that holds the
// identity of the whole prefix it was computed from. It fails the test (ADD_FAILURE, with the
// step) on any breach of the contract:
//  * step ids consecutive; finished ids known; a new sequence sent once, never again;
//  * each scheduled id known and once per plan; 1 <= num_tokens; 0 <= start; end <= tokens;
//    sample exactly when the piece ends at the last known token;
//  * the table (after reset/append) holds valid, distinct block ids and exactly covers
//    [0, end) (no block allocated ahead);
//  * every position < start holds the KV of this sequence's own prefix (so prefix-cache hits,
//    copies and recomputes are right), read before anything of this step is written: a piece
//    never depends on another piece of the same step;
//  * no block written by one piece appears in another scheduled sequence's table;
//  * batch and token limits;
//  * with a window pool: the window table has an entry per slot of the table, and every
//    position a query reads in the window layers, (start - window, start), holds the
//    sequence's own KV in its window block; no window block a piece writes is in the live part
//    of another scheduled sequence's window table (released slots keep stale ids, as on a real
//    shard, and are never read).
// A sampled token is a function of the KV identity of the last position, so a sequence's
// output does not depend on how it was scheduled, only on its own tokens.
class SimShard {
 public:
  SimShard(int64_t num_blocks, int32_t bs, const SchedulerConfig& cfg, int64_t window_blocks = 0, int64_t window = 0)
      : bs_(bs),
        num_blocks_(num_blocks),
        cfg_(cfg),
        kv_(static_cast<size_t>(num_blocks * bs), 0),
        num_wblocks_(window_blocks),
        window_(window),
        kvw_(static_cast<size_t>(window_blocks * bs), 0) {}

  StepResult execute(const StepPlan& plan) {
    StepResult r;
    r.step_id = plan.step_id;
    const std::string at = "step " + std::to_string(plan.step_id) + ": ";
    if (plan.step_id != last_step_ + 1) ADD_FAILURE() << at << "after step " << last_step_;
    last_step_ = plan.step_id;
    for (uint64_t id : plan.finished) {
      if (!seqs_.erase(id)) ADD_FAILURE() << at << "finished id " << id << " the shard never knew";
    }
    for (const NewSequence& n : plan.new_sequences) {
      if (!ever_.insert(n.seq_id).second) ADD_FAILURE() << at << "sequence " << n.seq_id << " sent twice";
      if (n.prompt_ids.empty()) ADD_FAILURE() << at << "empty prompt";
      seqs_[n.seq_id].tokens = n.prompt_ids;
    }
    for (const BlockCopy& c : plan.block_copies) {
      if (!valid(c.src) || !valid(c.dst) || c.src == c.dst) {
        ADD_FAILURE() << at << "copy " << c.src << "->" << c.dst;
        continue;
      }
      std::copy_n(&kv_[slot(c.src, 0)], bs_, &kv_[slot(c.dst, 0)]);
    }
    for (const BlockCopy& c : plan.window_block_copies) {
      if (!wvalid(c.src) || !wvalid(c.dst) || c.src == c.dst) {
        ADD_FAILURE() << at << "window copy " << c.src << "->" << c.dst;
        continue;
      }
      std::copy_n(&kvw_[slot(c.src, 0)], bs_, &kvw_[slot(c.dst, 0)]);
    }
    if (static_cast<int64_t>(plan.scheduled.size()) > cfg_.max_batch)
      ADD_FAILURE() << at << plan.scheduled.size() << " sequences, max_batch " << cfg_.max_batch;
    int64_t total = 0;
    std::set<uint64_t> ids;
    std::map<int32_t, uint64_t> written;  // block -> writer
    std::map<int32_t, uint64_t> wwritten;  // window block -> writer
    // Tables and reads first.
    for (const ScheduledSequence& q : plan.scheduled) {
      total += q.num_tokens;
      if (!ids.insert(q.seq_id).second) ADD_FAILURE() << at << "sequence " << q.seq_id << " twice";
      auto it = seqs_.find(q.seq_id);
      if (it == seqs_.end()) {
        ADD_FAILURE() << at << "unknown sequence " << q.seq_id;
        continue;
      }
      Seq& s = it->second;
      const int64_t end = q.start_pos + q.num_tokens;
      const auto known = static_cast<int64_t>(s.tokens.size());
      const auto k = static_cast<int64_t>(q.draft_tokens.size());
      if (k > 0 && (!q.sample || q.start_pos + 1 != known || q.num_tokens != k + 1))
        ADD_FAILURE() << at << "sequence " << q.seq_id << " drafts " << k << " on [" << q.start_pos << ", " << end
                      << ") of " << known;
      if (q.num_tokens < 1 || q.start_pos < 0 || end - k > known)
        ADD_FAILURE() << at << "sequence " << q.seq_id << " positions [" << q.start_pos << ", " << end << ") of "
                      << known;
      if (q.sample != (end - k == known))
        ADD_FAILURE() << at << "sequence " << q.seq_id << " sample=" << q.sample << " ends at " << end << " of "
                      << known;
      if (q.reset_blocks) s.table.clear();
      s.table.insert(s.table.end(), q.append_blocks.begin(), q.append_blocks.end());
      std::set<int32_t> distinct(s.table.begin(), s.table.end());
      if (distinct.size() != s.table.size()) ADD_FAILURE() << at << "sequence " << q.seq_id << " repeats a block";
      for (int32_t b : s.table)
        if (!valid(b)) ADD_FAILURE() << at << "block " << b;
      if (static_cast<int64_t>(s.table.size()) != (end + bs_ - 1) / bs_) {
        ADD_FAILURE() << at << "sequence " << q.seq_id << " table of " << s.table.size() << " blocks for " << end
                      << " positions";
        continue;
      }
      std::vector<uint64_t> ident = identities(s.tokens);
      for (int64_t p = 0; p < q.start_pos && p < known; ++p) {
        if (kv_[slot(s.table[p / bs_], p % bs_)] != ident[p]) {
          ADD_FAILURE() << at << "sequence " << q.seq_id << " reads wrong KV at position " << p << " (block "
                        << s.table[p / bs_] << ")";
          break;
        }
      }
      for (int64_t i = q.start_pos / bs_; i * bs_ < end; ++i) written[s.table[i]] = q.seq_id;
      if (num_wblocks_ == 0) {
        if (!q.append_window_blocks.empty()) ADD_FAILURE() << at << "window blocks without a window pool";
        continue;
      }
      if (q.reset_blocks) s.wtable.clear();
      s.wtable.insert(s.wtable.end(), q.append_window_blocks.begin(), q.append_window_blocks.end());
      if (s.wtable.size() != s.table.size()) {
        ADD_FAILURE() << at << "sequence " << q.seq_id << " window table of " << s.wtable.size() << " for "
                      << s.table.size() << " blocks";
        continue;
      }
      const int64_t first = std::max<int64_t>(0, q.start_pos - window_ + 1);
      std::set<int32_t> wdistinct;
      for (int64_t i = first / bs_; i < static_cast<int64_t>(s.wtable.size()); ++i) {
        const int32_t w = s.wtable[static_cast<size_t>(i)];
        if (!wvalid(w)) ADD_FAILURE() << at << "sequence " << q.seq_id << " window slot " << i << " read, block " << w;
        else if (!wdistinct.insert(w).second) ADD_FAILURE() << at << "sequence " << q.seq_id << " repeats window block " << w;
      }
      for (int64_t p = first; p < q.start_pos && p < known; ++p) {
        const int32_t w = s.wtable[static_cast<size_t>(p / bs_)];
        if (!wvalid(w) || kvw_[slot(w, p % bs_)] != ident[p]) {
          ADD_FAILURE() << at << "sequence " << q.seq_id << " reads wrong window KV at position " << p << " (block "
                        << w << ")";
          break;
        }
      }
      for (int64_t i = q.start_pos / bs_; i * bs_ < end; ++i) wwritten[s.wtable[static_cast<size_t>(i)]] = q.seq_id;
    }
    if (total > cfg_.max_step_tokens) ADD_FAILURE() << at << total << " tokens, budget " << cfg_.max_step_tokens;
    for (const ScheduledSequence& q : plan.scheduled) {
      auto it = seqs_.find(q.seq_id);
      if (it == seqs_.end()) continue;
      for (int32_t b : it->second.table) {
        auto w = written.find(b);
        if (w != written.end() && w->second != q.seq_id)
          ADD_FAILURE() << at << "block " << b << " written by " << w->second << " is in the table of " << q.seq_id;
      }
      const std::vector<int32_t>& wt = it->second.wtable;
      for (size_t i = static_cast<size_t>(std::max<int64_t>(0, q.start_pos - window_ + 1) / bs_); i < wt.size(); ++i) {
        auto w = wwritten.find(wt[i]);
        if (w != wwritten.end() && w->second != q.seq_id)
          ADD_FAILURE() << at << "window block " << wt[i] << " written by " << w->second << " is live in the table of "
                        << q.seq_id;
      }
    }
    // Writes and samples.
    for (const ScheduledSequence& q : plan.scheduled) {
      auto it = seqs_.find(q.seq_id);
      if (it == seqs_.end()) continue;
      Seq& s = it->second;
      const int64_t end = q.start_pos + q.num_tokens;
      // Drafts join the token list for this step's KV (a rejected draft's slots hold its KV
      // until they are written again, as on a real shard).
      std::vector<int32_t> toks = s.tokens;
      toks.insert(toks.end(), q.draft_tokens.begin(), q.draft_tokens.end());
      if (static_cast<int64_t>(s.table.size()) * bs_ < end || end > static_cast<int64_t>(toks.size())) continue;
      std::vector<uint64_t> ident = identities(toks);
      for (int64_t p = q.start_pos; p < end; ++p) kv_[slot(s.table[p / bs_], p % bs_)] = ident[p];
      if (num_wblocks_ > 0 && s.wtable.size() == s.table.size())
        for (int64_t p = q.start_pos; p < end; ++p) {
          const int32_t w = s.wtable[static_cast<size_t>(p / bs_)];
          if (wvalid(w)) kvw_[slot(w, p % bs_)] = ident[p];
        }
      if (q.sample && !q.draft_tokens.empty()) {
        // Verification: row i's token follows position start + i; draft i is kept while it
        // equals it. Then the tables keep only the computed positions' blocks.
        const auto k = static_cast<int64_t>(q.draft_tokens.size());
        int64_t drawn = 0;
        for (int64_t i = 0; i <= k; ++i) {
          const int64_t pos = q.start_pos + i;
          const auto tok = static_cast<int32_t>(kv_[slot(s.table[pos / bs_], pos % bs_)] % 50000);
          s.tokens.push_back(tok);
          r.tokens.push_back({q.seq_id, tok, -0.5f, {}});
          ++drawn;
          if (i == k || tok != q.draft_tokens[static_cast<size_t>(i)]) break;
        }
        const auto keep = static_cast<size_t>((q.start_pos + drawn + bs_ - 1) / bs_);
        if (s.table.size() > keep) s.table.resize(keep);
        if (s.wtable.size() > keep) s.wtable.resize(keep);
        ++verified_;
        kept_ += drawn - 1;
      } else if (q.sample) {
        const uint64_t last = kv_[slot(s.table[(end - 1) / bs_], (end - 1) % bs_)];
        const auto tok = static_cast<int32_t>(last % 50000);
        s.tokens.push_back(tok);
        r.tokens.push_back({q.seq_id, tok, -0.5f, {}});
      }
    }
    return r;
  }

  const std::vector<int32_t>* tokens(uint64_t id) const {
    auto it = seqs_.find(id);
    return it == seqs_.end() ? nullptr : &it->second.tokens;
  }
  size_t live() const { return seqs_.size(); }
  int64_t verified() const { return verified_; }
  int64_t kept() const { return kept_; }
  // The n tokens this shard would sample after `tokens` (what a perfect proposer proposes).
  static std::vector<int32_t> continuation(std::vector<int32_t> tokens, int64_t n) {
    std::vector<int32_t> out;
    for (int64_t i = 0; i < n; ++i) {
      const auto tok = static_cast<int32_t>(identities(tokens).back() % 50000);
      out.push_back(tok);
      tokens.push_back(tok);
    }
    return out;
  }

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    std::vector<int32_t> table;
    std::vector<int32_t> wtable;
  };
  bool valid(int32_t b) const { return b >= 0 && b < num_blocks_; }
  bool wvalid(int32_t b) const { return b >= 0 && b < num_wblocks_; }
  size_t slot(int32_t block, int64_t off) const { return static_cast<size_t>(block * bs_ + off); }
  static std::vector<uint64_t> identities(const std::vector<int32_t>& t) {
    std::vector<uint64_t> id(t.size());
    uint64_t h = 1;
    for (size_t i = 0; i < t.size(); ++i) id[i] = h = mix(h, static_cast<uint64_t>(t[i]) + 1);
    return id;
  }

  int64_t bs_, num_blocks_;
  SchedulerConfig cfg_;
  std::vector<uint64_t> kv_;
  int64_t num_wblocks_, window_;
  std::vector<uint64_t> kvw_;
  std::map<uint64_t, Seq> seqs_;
  std::set<uint64_t> ever_;
  uint64_t last_step_ = 0;
  int64_t verified_ = 0, kept_ = 0;
};

std::string summarize(const StepPlan& p) {
  std::string s;
  auto add = [&](const std::string& x) { s += (s.empty() ? "" : " ") + x; };
  for (uint64_t id : p.finished) add("-" + std::to_string(id));
  for (const NewSequence& n : p.new_sequences) add("+" + std::to_string(n.seq_id));
  for (const BlockCopy& c : p.block_copies) add("c" + std::to_string(c.src) + ">" + std::to_string(c.dst));
  for (const ScheduledSequence& q : p.scheduled)
    add(std::to_string(q.seq_id) + ":" + std::to_string(q.start_pos) + "+" + std::to_string(q.num_tokens) +
        (q.sample ? "s" : "") + (q.reset_blocks ? "r" : ""));
  return s;
}

// The piece of `id` in a summary line, e.g. "16+33sr" for "2:16+33sr"; empty if none.
std::string piece_of(const std::string& line, uint64_t id) {
  const std::string key = std::to_string(id) + ":";
  size_t pos = 0;
  while ((pos = line.find(key, pos)) != std::string::npos) {
    if (pos == 0 || line[pos - 1] == ' ') {
      const size_t end = line.find(' ', pos);
      return line.substr(pos + key.size(), end == std::string::npos ? std::string::npos : end - pos - key.size());
    }
    pos += key.size();
  }
  return "";
}

SchedulerConfig knobs(int32_t max_batch, int32_t step_tokens, int32_t chunk, double wait_ms = 0,
                      int32_t classes = 2, double aging_ms = 1e9) {
  SchedulerConfig c;
  c.profile = "test";
  c.max_batch = max_batch;
  c.max_step_tokens = step_tokens;
  c.prefill_chunk = chunk;
  c.max_wait_ms = wait_ms;
  c.priority_classes = classes;
  c.aging_ms = aging_ms;
  return c;
}

std::vector<int32_t> prompt_of(int32_t base, int len) {
  std::vector<int32_t> t(static_cast<size_t>(len));
  for (int i = 0; i < len; ++i) t[static_cast<size_t>(i)] = base + i;
  return t;
}

// The engine around the scheduler: runs each plan on the simulated shard, feeds the result
// back, finishes sequences after their output length, and checks the invariants each step.
// `window` > 0: with a window pool of exactly window_pool_blocks blocks.
struct Harness {
  Harness(const SchedulerConfig& cfg, int64_t num_blocks, int32_t bs = 16, bool cache = true, int64_t window = 0)
      : pool(std::move(BlockPool::create({num_blocks, bs, cache})).value()),
        wpool(window > 0 ? std::make_unique<BlockPool>(std::move(
                               BlockPool::create({window_pool_blocks(window, cfg.max_step_tokens, bs, cfg.max_batch), bs,
                                                  cache}))
                                                           .value())
                         : nullptr),
        sched(cfg, pool, clock, {wpool.get(), window}),
        shard(num_blocks, bs, cfg, wpool ? wpool->num_blocks() : 0, window) {}

  Status add(uint64_t id, std::vector<int32_t> prompt, int64_t out_len, int32_t priority = 0,
             bool reuse_cached_prefix = true) {
    SchedulerRequest r;
    r.seq_id = id;
    r.prompt = std::move(prompt);
    r.max_tokens = out_len;
    r.priority = priority;
    r.reuse_cached_prefix = reuse_cached_prefix;
    out_len_[id] = out_len;
    return sched.add(std::move(r));
  }
  Status add(uint64_t id, int prompt_len, int64_t out_len, int32_t priority = 0) {
    return add(id, prompt_of(static_cast<int32_t>(id) * 1000, prompt_len), out_len, priority);
  }

  // One engine iteration; the plan's summary, or "idle" when schedule() had nothing to run.
  std::string step() {
    // Liveness, checked around every schedule(): a running sequence that can decode is in the
    // plan unless it was preempted; one in the middle of a prefill is, unless preempted or the
    // step's token budget is spent.
    std::vector<uint64_t> decoding, prefilling;
    for (const auto& [id, len] : out_len_) {
      const auto info = sched.info(id);
      if (!info || info->state != SequenceState::kRunning || info->generated_tokens >= len) continue;
      const int64_t known = info->prompt_tokens + info->generated_tokens;
      (known - info->computed_tokens == 1 && info->computed_tokens > 0 ? decoding : prefilling).push_back(id);
    }
    if (drafter)
      for (uint64_t id : sched.decoders()) sched.set_draft(id, drafter(sched.tokens(id)));
    std::optional<StepPlan> plan = sched.schedule();
    if (wpool) peak_window_used = std::max(peak_window_used, wpool->num_used());
    if (!plan) {
      EXPECT_TRUE(decoding.empty() && prefilling.empty()) << "idle while sequences are running";
      return "idle";
    }
    const std::string line = summarize(*plan);
    int64_t step_tokens = 0;
    for (const ScheduledSequence& q : plan->scheduled) step_tokens += q.num_tokens;
    for (uint64_t id : decoding)
      EXPECT_TRUE(!piece_of(line, id).empty() || sched.info(id)->state == SequenceState::kWaiting)
          << "decode of " << id << " stalled: " << line;
    for (uint64_t id : prefilling)
      EXPECT_TRUE(!piece_of(line, id).empty() || sched.info(id)->state == SequenceState::kWaiting ||
                  step_tokens == sched.config().max_step_tokens)
          << "prefill of " << id << " stalled: " << line;
    for (const ScheduledSequence& q : plan->scheduled) ever_scheduled.insert(q.seq_id);
    for (const NewSequence& n : plan->new_sequences) first_step.emplace(n.seq_id, steps);
    ++steps;
    StepResult r = shard.execute(*plan);
    Status s = sched.on_result(r);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    for (const StepToken& t : r.tokens) {
      if (!sched.contains(t.seq_id)) continue;
      const std::vector<int32_t>* mine = shard.tokens(t.seq_id);
      EXPECT_TRUE(mine && *mine == sched.tokens(t.seq_id)) << "token lists differ for " << t.seq_id;
      const auto info = sched.info(t.seq_id);
      if (info->generated_tokens >= out_len_[t.seq_id]) {
        outputs[t.seq_id] = sched.tokens(t.seq_id);
        sched.finish(t.seq_id);
      }
    }
    Status inv = sched.check_invariants();
    EXPECT_TRUE(inv.is_ok()) << inv.to_string();
    return line;
  }

  // Steps until there is nothing left (at most `limit` steps); the summaries. When the
  // scheduler holds requests, the clock jumps to its next decision, as the engine's wait would.
  std::vector<std::string> run(int limit = 1000) {
    std::vector<std::string> lines;
    while (sched.has_work() && limit-- > 0) {
      lines.push_back(step());
      if (lines.back() == "idle") {
        auto wait = sched.time_until_next_decision();
        EXPECT_TRUE(wait.has_value()) << "idle with work but no decision pending";
        if (!wait) break;
        clock.advance(*wait);
      }
    }
    return lines;
  }

  // Speculation: drafts for every decoding sequence before each schedule() (none when empty).
  std::function<std::vector<int32_t>(const std::vector<int32_t>&)> drafter;
  ManualClock clock;
  BlockPool pool;
  std::unique_ptr<BlockPool> wpool;
  Scheduler sched;
  SimShard shard;
  int steps = 0;
  int64_t peak_window_used = 0;  // window blocks in use right after a schedule()
  std::set<uint64_t> ever_scheduled;
  std::map<uint64_t, int> first_step;
  std::map<uint64_t, std::vector<int32_t>> outputs;
  std::map<uint64_t, int64_t> out_len_;
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += "  " + x + "\n";
  return s;
}

// ---- table-driven scenarios ------------------------------------------------------------------

struct ReqSpec {
  uint64_t id;
  int prompt_len;
  int out_len;
  int priority = 0;
  int at_step = 0;  // added before this engine iteration
};

struct Scenario {
  const char* name;
  SchedulerConfig cfg;
  int64_t num_blocks;
  std::vector<ReqSpec> reqs;
  std::vector<std::string> expected;  // every step, to the end
};

class SchedulerScenarioTest : public ::testing::TestWithParam<Scenario> {};

TEST_P(SchedulerScenarioTest, StepByStep) {
  const Scenario& sc = GetParam();
  Harness h(sc.cfg, sc.num_blocks);
  std::vector<std::string> lines;
  int last_add = 0;
  for (const ReqSpec& r : sc.reqs) last_add = std::max(last_add, r.at_step);
  for (int i = 0; i < 500 && (h.sched.has_work() || i <= last_add); ++i) {
    for (const ReqSpec& r : sc.reqs) {
      if (r.at_step == i) {
        ASSERT_TRUE(h.add(r.id, r.prompt_len, r.out_len, r.priority).is_ok());
      }
    }
    lines.push_back(h.step());
  }
  EXPECT_EQ(lines, sc.expected) << "actual:\n" << join(lines);
  EXPECT_FALSE(h.sched.has_work());
  EXPECT_EQ(h.pool.num_used(), 0);
  EXPECT_EQ(h.shard.live(), 0u);
  for (const ReqSpec& r : sc.reqs) EXPECT_EQ(h.outputs[r.id].size(), static_cast<size_t>(r.prompt_len + r.out_len));
}

const Scenario kScenarios[] = {
    {"SingleRequestPrefillThenDecode",
     knobs(4, 64, 64),
     8,
     {{1, 5, 3}},
     {"+1 1:0+5s", "1:5+1s", "1:6+1s", "-1"}},
    {"LongPromptIsChunkedAndNeverStallsDecode",
     // Sequence 1 decodes while 2's 40-token prompt is prefilled in chunks of 16: 1 is in
     // every step.
     knobs(4, 64, 16),
     16,
     {{1, 4, 8}, {2, 40, 2, 0, 2}},
     {"+1 1:0+4s", "1:4+1s", "+2 1:5+1s 2:0+16", "1:6+1s 2:16+16", "1:7+1s 2:32+8s", "1:8+1s 2:40+1s",
      "-2 1:9+1s", "1:10+1s", "-1"}},
    {"TokenBudgetSplitsAdmissions",
     // 8 tokens per step: the second prompt starts with the 2 tokens left, the third waits
     // for the budget.
     knobs(4, 8, 8),
     16,
     {{1, 6, 2}, {2, 6, 2}, {3, 6, 2}},
     {"+1 +2 1:0+6s 2:0+2", "+3 1:6+1s 2:2+4s 3:0+3", "-1 2:6+1s 3:3+3s", "-2 3:6+1s", "-3"}},
    {"MaxBatchHoldsTheThirdRequest",
     knobs(2, 64, 64),
     16,
     {{1, 4, 2}, {2, 4, 3}, {3, 4, 1}},
     {"+1 +2 1:0+4s 2:0+4s", "1:4+1s 2:4+1s", "-1 +3 2:5+1s 3:0+4s", "-2 -3"}},
    {"InteractiveAdmittedBeforeBatch",
     // One slot; the batch request (class 1) came first but the interactive one runs first.
     knobs(1, 64, 64),
     16,
     {{1, 4, 2, 1}, {2, 4, 2, 0}},
     {"+2 2:0+4s", "2:4+1s", "-2 +1 1:0+4s", "1:4+1s", "-1"}},
    {"FcfsWithinAClass",
     knobs(1, 64, 64),
     16,
     {{1, 4, 1, 1}, {2, 4, 1, 1}, {3, 4, 1, 1}},
     {"+1 1:0+4s", "-1 +2 2:0+4s", "-2 +3 3:0+4s", "-3"}},
};

INSTANTIATE_TEST_SUITE_P(Scenarios, SchedulerScenarioTest, ::testing::ValuesIn(kScenarios),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- preemption ------------------------------------------------------------------------------

TEST(SchedulerTest, PreemptionByRecomputeThenResume) {
  // 4 blocks of 16. Each sequence alone fits (16 + 40 - 1 positions = 4 blocks), together not.
  Harness h(knobs(4, 256, 256), 4, 16, /*cache=*/false);
  ASSERT_TRUE(h.add(1, 16, 40).is_ok());
  ASSERT_TRUE(h.add(2, 16, 40).is_ok());
  std::vector<std::string> lines = h.run();
  // Steps 0..: both prefill, decode to position 32 where each needs a third block: 2 (newest)
  // is the victim; it resumes once 1 is done, with reset_blocks and a recompute of its prompt
  // and the 16 tokens it generated (positions 0..32), sampling at the end.
  ASSERT_GE(lines.size(), 20u);
  EXPECT_EQ(lines[0], "+1 +2 1:0+16s 2:0+16s");
  EXPECT_EQ(h.sched.stats().preemptions, 1);
  int resume = -1;
  for (size_t i = 0; i < lines.size(); ++i)
    if (lines[i].find("2:0+33sr") != std::string::npos) resume = static_cast<int>(i);
  ASSERT_GE(resume, 0) << join(lines);
  EXPECT_NE(lines[static_cast<size_t>(resume)].find("-1"), std::string::npos) << "resumes when 1 finishes";
  EXPECT_EQ(h.outputs[1].size(), 56u);
  EXPECT_EQ(h.outputs[2].size(), 56u);
  EXPECT_EQ(h.pool.num_used(), 0);
  // The same output as alone: recompute reproduced the KV exactly.
  Harness solo(knobs(4, 256, 256), 4, 16, false);
  ASSERT_TRUE(solo.add(2, 16, 40).is_ok());
  solo.run();
  EXPECT_EQ(solo.outputs[2], h.outputs[2]);
}

TEST(SchedulerTest, PreemptionStepByStep) {
  // Smaller: 3 blocks of 16; two 16-token prompts generating 18 tokens (33 positions, 3 blocks).
  Harness h(knobs(4, 256, 256), 3, 16, /*cache=*/false);
  ASSERT_TRUE(h.add(1, 16, 18).is_ok());
  ASSERT_TRUE(h.add(2, 16, 18).is_ok());
  std::vector<std::string> expected = {"+1 +2 1:0+16s 2:0+16s"};
  // Position 16 needs a second block each: only one is free, so 2 is preempted at once.
  expected.push_back("1:16+1s");
  for (int p = 17; p < 33; ++p) expected.push_back("1:" + std::to_string(p) + "+1s");
  // 1 has 18 tokens after position 32's sample: finished. 2 recomputes its 17 known tokens.
  expected.push_back("-1 2:0+17sr");
  for (int p = 17; p < 33; ++p) expected.push_back("2:" + std::to_string(p) + "+1s");
  expected.push_back("-2");
  EXPECT_EQ(h.run(), expected) << join(h.run());
  EXPECT_EQ(h.sched.stats().preemptions, 1);
}

TEST(SchedulerTest, BatchClassIsPreemptedFirst) {
  // The batch request is older but of the lower class: it is the victim, not the newer
  // interactive one.
  Harness h(knobs(4, 256, 256), 3, 16, /*cache=*/false);
  ASSERT_TRUE(h.add(1, 16, 18, /*priority=*/1).is_ok());
  ASSERT_TRUE(h.add(2, 16, 18, /*priority=*/0).is_ok());
  EXPECT_EQ(h.step(), "+2 +1 2:0+16s 1:0+16s");
  EXPECT_EQ(h.step(), "2:16+1s");
  EXPECT_EQ(h.sched.info(1)->state, SequenceState::kWaiting);
  EXPECT_EQ(h.sched.info(1)->preemptions, 1);
  h.run();
  EXPECT_EQ(h.outputs[1].size(), 34u);
  EXPECT_EQ(h.pool.num_used(), 0);
}

TEST(SchedulerTest, InteractiveArrivalPreemptsBatchWork) {
  // A full pool of batch work; an interactive request takes blocks from it at admission.
  Harness h(knobs(4, 256, 256), 4, 16, /*cache=*/false);
  ASSERT_TRUE(h.add(1, 32, 20, /*priority=*/1).is_ok());
  ASSERT_TRUE(h.add(2, 32, 20, /*priority=*/1).is_ok());
  EXPECT_EQ(h.step(), "+1 +2 1:0+32s 2:0+32s");  // all 4 blocks
  ASSERT_TRUE(h.add(3, 8, 2, /*priority=*/0).is_ok());
  // 1 and 2 decode into their second blocks' free slots; 3 needs one block: the newest batch
  // sequence (2) is preempted, its decode piece withdrawn from the plan.
  EXPECT_EQ(h.step(), "+3 1:32+1s 3:0+8s");
  EXPECT_EQ(h.sched.info(2)->state, SequenceState::kWaiting);
  // Interactive work does not preempt work of its own class at admission: a second
  // interactive request waits for blocks.
  h.run();
  EXPECT_EQ(h.outputs[2].size(), 52u);
  EXPECT_EQ(h.pool.num_used(), 0);
}

TEST(SchedulerTest, SameClassAdmissionDoesNotPreempt) {
  Harness h(knobs(4, 256, 256), 2, 16, /*cache=*/false);
  ASSERT_TRUE(h.add(1, 32, 1).is_ok());
  EXPECT_EQ(h.step(), "+1 1:0+32s");
  ASSERT_TRUE(h.add(2, 8, 1).is_ok());
  // 1 is done after one token but not yet finished in this iteration? It is: out_len 1.
  EXPECT_EQ(h.step(), "-1 +2 2:0+8s");
  h.run();
  EXPECT_EQ(h.sched.stats().preemptions, 0);
}

// ---- no starvation ---------------------------------------------------------------------------

TEST(SchedulerTest, BatchRequestIsNotStarvedBySustainedInteractiveLoad) {
  // One slot, a new interactive request every step (more than can be served), 10 ms per
  // step, aging 100 ms: the batch request competes as interactive after 100 ms and, being the
  // oldest, runs next.
  Harness h(knobs(1, 64, 64, 0, 2, 100), 64);
  ASSERT_TRUE(h.add(1, 4, 2, /*priority=*/1).is_ok());
  uint64_t next = 100;
  for (int i = 0; i < 60 && h.sched.contains(1); ++i) {
    ASSERT_TRUE(h.add(next++, 4, 2, 0).is_ok());
    ASSERT_TRUE(h.add(next++, 4, 2, 0).is_ok());
    h.step();
    h.clock.advance(milliseconds(10));
  }
  ASSERT_TRUE(h.first_step.count(1)) << "the batch request never ran";
  EXPECT_LE(h.first_step[1], 12);
  EXPECT_GE(h.first_step[1], 9) << "it must not jump the queue before aging";
  EXPECT_EQ(h.outputs[1].size(), 6u);
}

TEST(SchedulerTest, WithoutAgingBatchWaitsForInteractive) {
  // Control for the test above: with aging effectively off, the batch request does wait.
  Harness h(knobs(1, 64, 64, 0, 2, 1e9), 64);
  ASSERT_TRUE(h.add(1, 4, 2, 1).is_ok());
  uint64_t next = 100;
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(h.add(next++, 4, 2, 0).is_ok());
    h.step();
    h.clock.advance(milliseconds(10));
  }
  EXPECT_FALSE(h.first_step.count(1));
}

// ---- abort -----------------------------------------------------------------------------------

TEST(SchedulerTest, AbortWaitingAndRunningFreesBlocks) {
  Harness h(knobs(1, 64, 64), 8);
  ASSERT_TRUE(h.add(1, 20, 10).is_ok());
  ASSERT_TRUE(h.add(2, 20, 10).is_ok());
  EXPECT_EQ(h.step(), "+1 1:0+20s");
  EXPECT_EQ(h.pool.num_used(), 2);
  EXPECT_TRUE(h.sched.abort(2));  // waiting, never sent: no "finished" for it
  EXPECT_FALSE(h.sched.abort(2));
  EXPECT_TRUE(h.sched.abort(1));  // running
  EXPECT_EQ(h.pool.num_used(), 0);
  EXPECT_TRUE(h.sched.has_work());  // the shards must still drop 1
  EXPECT_EQ(h.step(), "-1");
  EXPECT_FALSE(h.sched.has_work());
  EXPECT_EQ(h.step(), "idle");
  EXPECT_EQ(h.sched.stats().aborted, 2);
}

TEST(SchedulerTest, AbortDuringAStepIgnoresItsToken) {
  Harness h(knobs(4, 64, 64), 8);
  ASSERT_TRUE(h.add(1, 4, 5).is_ok());
  ASSERT_TRUE(h.add(2, 4, 5).is_ok());
  auto plan = h.sched.schedule();
  ASSERT_TRUE(plan);
  StepResult r = h.shard.execute(*plan);
  EXPECT_TRUE(h.sched.abort(1));  // the client went away while the step ran
  ASSERT_TRUE(h.sched.on_result(r).is_ok());
  EXPECT_EQ(h.sched.tokens(2).size(), 5u);
  auto next = h.sched.schedule();
  ASSERT_TRUE(next);
  EXPECT_EQ(summarize(*next), "-1 2:4+1s");
  ASSERT_TRUE(h.sched.on_result(h.shard.execute(*next)).is_ok());
}

TEST(SchedulerTest, PreemptedWaitingSequenceIsDroppedByShardsOnAbort) {
  Harness h(knobs(4, 256, 256), 3, 16, false);
  ASSERT_TRUE(h.add(1, 16, 18).is_ok());
  ASSERT_TRUE(h.add(2, 16, 18).is_ok());
  h.step();
  h.step();  // 2 preempted: waiting, but the shards know it
  ASSERT_EQ(h.sched.info(2)->state, SequenceState::kWaiting);
  EXPECT_TRUE(h.sched.abort(2));
  EXPECT_EQ(h.step(), "-2 1:17+1s");
}

// ---- max_wait_ms -----------------------------------------------------------------------------

TEST(SchedulerTest, MaxWaitHoldsALonePrefillUntilItsDeadline) {
  Harness h(knobs(4, 256, 64, /*wait_ms=*/10), 32);
  ASSERT_TRUE(h.add(1, 8, 2).is_ok());
  EXPECT_EQ(h.step(), "idle");
  EXPECT_EQ(h.sched.stats().held, 1);
  ASSERT_TRUE(h.sched.time_until_next_decision().has_value());
  EXPECT_EQ(*h.sched.time_until_next_decision(), milliseconds(10));
  h.clock.advance(milliseconds(9));
  EXPECT_EQ(h.step(), "idle");
  EXPECT_EQ(*h.sched.time_until_next_decision(), milliseconds(1));
  h.clock.advance(milliseconds(1));
  EXPECT_EQ(*h.sched.time_until_next_decision(), milliseconds(0));
  EXPECT_EQ(h.step(), "+1 1:0+8s");
  EXPECT_FALSE(h.sched.time_until_next_decision().has_value());
}

// max_burst_wait_ms: a companion within max_wait_ms starts a burst; arrivals each within the
// burst gap (max(max_wait_ms, max_burst_wait_ms / 5)) of the one before keep the new requests
// waiting (to a gap after the newest), up to max_burst_wait_ms after the first; a lone request,
// or one followed by a longer gap, waits only max_wait_ms.
TEST(SchedulerTest, MaxWaitGathersABurstUpToItsCap) {
  SchedulerConfig cfg = knobs(8, 256, 64, /*wait_ms=*/10);
  cfg.max_burst_wait_ms = 30;
  Harness h(cfg, 64);
  ASSERT_TRUE(h.add(1, 8, 2).is_ok());
  h.clock.advance(milliseconds(8));
  ASSERT_TRUE(h.add(2, 8, 2).is_ok());  // within 10 ms of 1: the wait runs to 8 + 10
  EXPECT_EQ(h.step(), "idle");
  EXPECT_EQ(*h.sched.time_until_next_decision(), milliseconds(10));
  h.clock.advance(milliseconds(8));
  ASSERT_TRUE(h.add(3, 8, 2).is_ok());  // t = 16: to 26
  h.clock.advance(milliseconds(9));     // t = 25
  EXPECT_EQ(h.step(), "idle");
  EXPECT_EQ(*h.sched.time_until_next_decision(), milliseconds(1));
  ASSERT_TRUE(h.add(4, 8, 2).is_ok());  // t = 25: to 35, but the cap is 0 + 30
  EXPECT_EQ(*h.sched.time_until_next_decision(), milliseconds(5));
  h.clock.advance(milliseconds(4));
  EXPECT_EQ(h.step(), "idle");
  h.clock.advance(milliseconds(1));     // t = 30: the cap
  EXPECT_EQ(h.step(), "+1 +2 +3 +4 1:0+8s 2:0+8s 3:0+8s 4:0+8s");
  // A gap longer than max_wait_ms ends the burst: 5 waits 10 ms from its arrival; 6, arriving
  // 12 ms after 5, does not extend 5's wait.
  Harness g(cfg, 64);
  ASSERT_TRUE(g.add(5, 8, 2).is_ok());
  g.clock.advance(milliseconds(12));
  ASSERT_TRUE(g.add(6, 8, 2).is_ok());
  EXPECT_EQ(*g.sched.time_until_next_decision(), milliseconds(0));
  EXPECT_EQ(g.step(), "+5 +6 5:0+8s 6:0+8s");
  // And with max_burst_wait_ms <= max_wait_ms, the wait is max_wait_ms after the first.
  cfg.max_burst_wait_ms = 0;
  Harness f(cfg, 64);
  ASSERT_TRUE(f.add(7, 8, 2).is_ok());
  f.clock.advance(milliseconds(8));
  ASSERT_TRUE(f.add(8, 8, 2).is_ok());
  EXPECT_EQ(*f.sched.time_until_next_decision(), milliseconds(2));
  f.clock.advance(milliseconds(2));
  EXPECT_EQ(f.step(), "+7 +8 7:0+8s 8:0+8s");
  // The burst gap beyond max_wait_ms: wait 2, cap 50 -> gap 10. A companion at 1 ms starts the
  // burst; one 7 ms later (more than 2, less than 10) still extends it, to 8 + 10.
  cfg.max_wait_ms = 2;
  cfg.max_burst_wait_ms = 50;
  Harness e(cfg, 64);
  ASSERT_TRUE(e.add(9, 8, 2).is_ok());
  e.clock.advance(milliseconds(1));
  ASSERT_TRUE(e.add(10, 8, 2).is_ok());
  EXPECT_EQ(*e.sched.time_until_next_decision(), milliseconds(10));
  e.clock.advance(milliseconds(7));
  ASSERT_TRUE(e.add(11, 8, 2).is_ok());
  EXPECT_EQ(e.step(), "idle");
  EXPECT_EQ(*e.sched.time_until_next_decision(), milliseconds(10));
  e.clock.advance(milliseconds(10));
  EXPECT_EQ(e.step(), "+9 +10 +11 9:0+8s 10:0+8s 11:0+8s");
  // A lone request with that cap still goes after max_wait_ms.
  Harness d(cfg, 64);
  ASSERT_TRUE(d.add(12, 8, 2).is_ok());
  EXPECT_EQ(*d.sched.time_until_next_decision(), milliseconds(2));
}

TEST(SchedulerTest, MaxWaitReleasesWhenCompanionsFillTheBatch) {
  Harness h(knobs(3, 256, 64, 50), 32);
  ASSERT_TRUE(h.add(1, 8, 2).is_ok());
  EXPECT_EQ(h.step(), "idle");
  h.clock.advance(milliseconds(5));
  ASSERT_TRUE(h.add(2, 8, 2).is_ok());
  EXPECT_EQ(h.step(), "idle");
  ASSERT_TRUE(h.add(3, 8, 2).is_ok());  // three waiting for three slots: go now
  EXPECT_EQ(h.step(), "+1 +2 +3 1:0+8s 2:0+8s 3:0+8s");
}

TEST(SchedulerTest, MaxWaitReleasesWhenPromptsFillTheTokenBudget) {
  Harness h(knobs(8, 64, 64, 50), 32);
  ASSERT_TRUE(h.add(1, 30, 2).is_ok());
  EXPECT_EQ(h.step(), "idle");
  ASSERT_TRUE(h.add(2, 40, 2).is_ok());  // 70 prompt tokens >= 64 budget
  EXPECT_EQ(h.step(), "+1 +2 1:0+30s 2:0+34");
}

TEST(SchedulerTest, MaxWaitWhileDecodingThenJoin) {
  Harness h(knobs(4, 256, 16, 10), 32);
  ASSERT_TRUE(h.add(1, 40, 20).is_ok());
  h.clock.advance(milliseconds(10));
  EXPECT_EQ(h.step(), "+1 1:0+16");
  // A new arrival joins a step that prefills anyway, without waiting.
  ASSERT_TRUE(h.add(2, 4, 20).is_ok());
  EXPECT_EQ(h.step(), "+2 1:16+16 2:0+4s");
  EXPECT_EQ(h.step(), "2:4+1s 1:32+8s");  // decodes first
  // Now only decodes: a new arrival is held for up to 10 ms...
  ASSERT_TRUE(h.add(3, 4, 2).is_ok());
  EXPECT_EQ(h.step(), "1:40+1s 2:5+1s");
  h.clock.advance(milliseconds(4));
  EXPECT_EQ(h.step(), "1:41+1s 2:6+1s");
  h.clock.advance(milliseconds(6));
  // ... and admitted beside the decodes when its time is up.
  EXPECT_EQ(h.step(), "+3 1:42+1s 2:7+1s 3:0+4s");
}

// ---- latency bounds under load (issue 21): a prefill arriving during a full decode batch, a
// long prefill beside running decodes ---------------------------------------------------------

// The pieces of a step summary ("+5 1:32+1s 5:0+8s"): id -> (start, tokens).
std::map<uint64_t, std::pair<int64_t, int64_t>> pieces_of(const std::string& line) {
  std::map<uint64_t, std::pair<int64_t, int64_t>> out;
  std::istringstream in(line);
  std::string w;
  while (in >> w) {
    const size_t colon = w.find(':'), plus = w.find('+', 1);
    if (w[0] == '+' || colon == std::string::npos || plus == std::string::npos) continue;
    out[std::stoull(w.substr(0, colon))] = {std::stoll(w.substr(colon + 1, plus - colon - 1)),
                                            std::stoll(w.substr(plus + 1))};
  }
  return out;
}

TEST(SchedulerTest, InteractiveArrivalTakesASlotOfAFullBatchOfBatchWork) {
  // Four batch-class sequences fill max_batch and decode for a long time. An interactive
  // request arriving meanwhile is admitted in the first step after its max_wait_ms (its class's
  // bound), in the slot of the newest batch sequence; the other decoders keep their token in
  // that step, and the preempted one resumes first when a slot frees.
  Harness h(knobs(4, 256, 64, /*wait_ms=*/5), 64, 16, /*cache=*/false);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(h.add(id, 8, 40, /*priority=*/1).is_ok());
  h.clock.advance(milliseconds(5));
  EXPECT_EQ(h.step(), "+1 +2 +3 +4 1:0+8s 2:0+8s 3:0+8s 4:0+8s");
  for (int i = 0; i < 3; ++i) h.step();
  ASSERT_TRUE(h.add(5, 12, 3, /*priority=*/0).is_ok());
  // No companion can come (the batch is full), so the request does not wait for one.
  EXPECT_EQ(h.step(), "+5 1:11+1s 2:11+1s 3:11+1s 5:0+12s");
  EXPECT_EQ(h.sched.info(4)->state, SequenceState::kWaiting);
  EXPECT_EQ(h.sched.info(4)->preemptions, 1);
  EXPECT_EQ(h.sched.stats().preemptions, 1);
  // (A step lists its pieces in rank order: the interactive sequence first.)
  EXPECT_EQ(h.step(), "5:12+1s 1:12+1s 2:12+1s 3:12+1s");
  EXPECT_EQ(h.step(), "5:13+1s 1:13+1s 2:13+1s 3:13+1s");
  // 5 is done (3 tokens) and finished; 4 takes the free slot back first and recomputes.
  EXPECT_EQ(h.step(), "-5 1:14+1s 2:14+1s 3:14+1s 4:0+12sr");
  h.run();
  EXPECT_EQ(h.outputs[4].size(), 48u);
  EXPECT_EQ(h.pool.num_used(), 0);
}

TEST(SchedulerTest, FullBatchOfTheSameClassIsNotPreemptedForASlot) {
  Harness h(knobs(2, 256, 64), 64, 16, /*cache=*/false);
  ASSERT_TRUE(h.add(1, 8, 4).is_ok());
  ASSERT_TRUE(h.add(2, 8, 6).is_ok());
  EXPECT_EQ(h.step(), "+1 +2 1:0+8s 2:0+8s");
  ASSERT_TRUE(h.add(3, 8, 2).is_ok());
  EXPECT_EQ(h.step(), "1:8+1s 2:8+1s");
  EXPECT_EQ(h.step(), "1:9+1s 2:9+1s");
  EXPECT_EQ(h.step(), "1:10+1s 2:10+1s");
  // 1 finished: 3 starts in the slot it left.
  EXPECT_EQ(h.step(), "-1 +3 2:11+1s 3:0+8s");
  EXPECT_EQ(h.sched.stats().preemptions, 0);
}

TEST(SchedulerTest, LongPrefillDoesNotStallDecodesBeyondTheChunk) {
  // Six sequences decode; a 1000-token prompt arrives. Until its prefill is done, every step
  // carries every decoder's token and at most prefill_chunk tokens of the prompt, so each
  // decoder waits at most one chunk's compute per token.
  constexpr int64_t kChunk = 64;
  Harness h(knobs(8, 512, kChunk), 256, 16, /*cache=*/false);
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(h.add(id, 8, 200).is_ok());
  h.step();
  ASSERT_TRUE(h.add(7, 1000, 4).is_ok());
  int64_t prefilled = 0;
  int prefill_steps = 0;
  while (prefilled < 1000) {
    const auto pieces = pieces_of(h.step());
    ASSERT_TRUE(pieces.count(7)) << "the long prompt got no piece";
    EXPECT_LE(pieces.at(7).second, kChunk);
    EXPECT_EQ(pieces.at(7).first, prefilled);
    prefilled += pieces.at(7).second;
    for (uint64_t id = 1; id <= 6; ++id) {
      ASSERT_TRUE(pieces.count(id)) << "decoder " << id << " stalled in prefill step " << prefill_steps;
      EXPECT_EQ(pieces.at(id).second, 1);
    }
    ++prefill_steps;
  }
  EXPECT_EQ(prefill_steps, (1000 + kChunk - 1) / kChunk);
  // Several long prompts at once share the step's token budget: the decoders still run in
  // every step and each prompt's piece stays within the chunk.
  Harness g(knobs(8, 6 + 2 * kChunk, kChunk), 512, 16, /*cache=*/false);
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(g.add(id, 8, 300).is_ok());
  g.step();
  for (uint64_t id = 7; id <= 8; ++id) ASSERT_TRUE(g.add(id, 900, 2).is_ok());
  int steps_with_prompts = 0;
  for (int i = 0; i < 40; ++i) {
    const std::string line = g.step();
    const auto pieces = pieces_of(line);
    if (!pieces.count(7) && !pieces.count(8)) break;  // both prompts prefilled and answered
    ++steps_with_prompts;
    int64_t prefill = 0;
    for (const auto& [id, p] : pieces) {
      if (id >= 7) prefill += p.second;
      else EXPECT_EQ(p.second, 1) << "decoder " << id;
    }
    for (uint64_t id = 1; id <= 6; ++id) EXPECT_TRUE(pieces.count(id)) << "decoder " << id << " stalled: " << line;
    EXPECT_LE(prefill, 2 * kChunk) << line;
  }
  EXPECT_GE(steps_with_prompts, 900 / kChunk);
}

// mixed_prefill_tokens: a step that decodes carries at most that many prefill tokens (a new
// prompt's admission and running prefills together); a step with nothing to decode takes the
// prompts up to prefill_chunk / max_step_tokens as before.
TEST(SchedulerTest, MixedPrefillBudgetBoundsWhatDecodersWaitFor) {
  constexpr int32_t kBudget = 24, kChunk = 256;
  SchedulerConfig cfg = knobs(8, 1024, kChunk);
  cfg.mixed_prefill_tokens = kBudget;
  ASSERT_TRUE(validate_scheduler_config(cfg).is_ok());
  Harness h(cfg, 512, 16, /*cache=*/false);
  // Nothing decodes yet: two 300-token prompts take whole chunks.
  ASSERT_TRUE(h.add(1, 300, 200).is_ok());
  ASSERT_TRUE(h.add(2, 300, 200).is_ok());
  auto pieces = pieces_of(h.step());
  EXPECT_EQ(pieces.at(1).second, kChunk);
  EXPECT_EQ(pieces.at(2).second, kChunk);
  h.step();  // the prompts' last 44 tokens each (no decodes yet)
  pieces = pieces_of(h.step());
  ASSERT_EQ(pieces.at(1).second, 1) << "1 decodes";
  // Two prompts arrive while 1 and 2 decode: every step has both decoders and at most kBudget
  // tokens of the prompts, until both are prefilled.
  ASSERT_TRUE(h.add(3, 100, 4).is_ok());
  ASSERT_TRUE(h.add(4, 50, 4).is_ok());
  int64_t prefilled = 0;
  int steps = 0;
  while (prefilled < 150) {
    pieces = pieces_of(h.step());
    ++steps;
    ASSERT_TRUE(pieces.count(1) && pieces.count(2)) << "a decoder stalled in step " << steps;
    EXPECT_EQ(pieces.at(1).second, 1);
    int64_t prefill = 0;
    for (uint64_t id : {uint64_t{3}, uint64_t{4}})
      if (pieces.count(id) && pieces.at(id).first < (id == 3 ? 100 : 50)) prefill += pieces.at(id).second;
    EXPECT_LE(prefill, kBudget) << "step " << steps;
    EXPECT_GT(prefill, 0) << "the prompts made no progress in step " << steps;
    prefilled += prefill;
  }
  EXPECT_EQ(steps, (150 + kBudget - 1) / kBudget);
  // Negative budgets are refused by name.
  cfg.mixed_prefill_tokens = -1;
  const Status bad = validate_scheduler_config(cfg);
  EXPECT_NE(bad.message().find("mixed_prefill_tokens = -1"), std::string::npos) << bad.to_string();
  SchedulerConfig set;
  ASSERT_TRUE(set_scheduler_knob(set, "mixed-prefill-tokens", "32").is_ok());
  EXPECT_EQ(set.mixed_prefill_tokens, 32);
}

TEST(SchedulerTest, PreemptedSequencesDoNotWait) {
  Harness h(knobs(4, 256, 256, 1000), 3, 16, false);
  ASSERT_TRUE(h.add(1, 16, 18).is_ok());
  ASSERT_TRUE(h.add(2, 16, 18).is_ok());
  h.clock.advance(milliseconds(1000));
  h.run();
  EXPECT_EQ(h.outputs[2].size(), 34u);  // resumed without another wait: run() never idled
}

// ---- prefix cache ----------------------------------------------------------------------------

TEST(SchedulerTest, SharedPrefixStartsAtTheCachedPosition) {
  Harness h(knobs(4, 256, 256), 32);
  std::vector<int32_t> system = prompt_of(7000, 48);  // three full blocks
  auto with_tail = [&](int32_t base, int n) {
    std::vector<int32_t> p = system;
    for (int i = 0; i < n; ++i) p.push_back(base + i);
    return p;
  };
  ASSERT_TRUE(h.add(1, with_tail(100, 10), 3).is_ok());
  EXPECT_EQ(h.step(), "+1 1:0+58s");
  h.run();
  EXPECT_DOUBLE_EQ(h.pool.stats().prefix_hit_rate, 0.0);
  EXPECT_EQ(h.pool.num_cached(), 3);  // 60 positions computed: three full blocks
  ASSERT_TRUE(h.add(2, with_tail(200, 5), 3).is_ok());
  EXPECT_EQ(h.step(), "+2 2:48+5s");
  EXPECT_EQ(h.sched.info(2)->cached_prompt_tokens, 48);
  h.run();
  EXPECT_DOUBLE_EQ(h.pool.stats().prefix_hit_rate, 48.0 / (58 + 53));
  // Same output as without the cache.
  Harness cold(knobs(4, 256, 256), 32, 16, /*cache=*/false);
  ASSERT_TRUE(cold.add(2, with_tail(200, 5), 3).is_ok());
  cold.run();
  EXPECT_EQ(cold.outputs[2], h.outputs[2]);
  EXPECT_EQ(h.pool.num_used(), 0);
}

TEST(SchedulerTest, PromptLogprobRequestsComputeTheWholePromptButStillFeedTheCache) {
  Harness h(knobs(4, 256, 256), 32);
  const std::vector<int32_t> prompt = prompt_of(7000, 40);  // two full blocks and a tail
  ASSERT_TRUE(h.add(1, prompt, 3).is_ok());
  h.run();
  EXPECT_EQ(h.pool.num_cached(), 2);
  // Wants every prompt position's logits: starts at 0 although two blocks are cached.
  ASSERT_TRUE(h.add(2, prompt, 3, 0, /*reuse_cached_prefix=*/false).is_ok());
  EXPECT_EQ(h.step(), "+2 2:0+40s");
  EXPECT_EQ(h.sched.info(2)->cached_prompt_tokens, 0);
  h.run();
  EXPECT_EQ(h.outputs[2], h.outputs[1]);
  // An ordinary request after it still hits the cache.
  ASSERT_TRUE(h.add(3, prompt, 3).is_ok());
  EXPECT_EQ(h.step(), "+3 3:32+8s");
  h.run();
  EXPECT_EQ(h.pool.num_used(), 0);
}

// Sequences that share full prompt blocks and arrive together (the choices of an n > 1 request,
// a common system prompt): the first computes the blocks, the others wait a step for them in the
// prefix cache instead of computing them too; a sequence with another prompt is not held up.
TEST(SchedulerTest, SharedPrefixIsComputedOnceForSequencesArrivingTogether) {
  Harness h(knobs(8, 512, 512), 64);
  const std::vector<int32_t> prompt = prompt_of(7000, 40);  // two full blocks and a tail
  for (uint64_t id : {1, 2, 3}) ASSERT_TRUE(h.add(id, prompt, 3).is_ok());
  ASSERT_TRUE(h.add(4, 20, 3).is_ok());
  EXPECT_EQ(h.step(), "+1 +4 1:0+40s 4:0+20s");
  EXPECT_EQ(h.sched.stats().prefix_waits, 2);
  const std::string second = h.step();
  EXPECT_NE(second.find("2:32+8s"), std::string::npos) << second;
  EXPECT_NE(second.find("3:32+8s"), std::string::npos) << second;
  EXPECT_EQ(h.sched.info(2)->cached_prompt_tokens, 32);
  h.run();
  EXPECT_EQ(h.outputs[2], h.outputs[1]);
  EXPECT_EQ(h.outputs[3], h.outputs[1]);
  EXPECT_EQ(h.pool.num_used(), 0);
  // A prompt of whole blocks: the waiting ones recompute its last token into copies of the cached
  // last block, which makes nothing new for the others: they all go in the same step.
  Harness whole(knobs(8, 512, 512), 64);
  for (uint64_t id : {1, 2, 3, 4}) ASSERT_TRUE(whole.add(id, prompt_of(9000, 32), 3).is_ok());
  EXPECT_EQ(whole.step(), "+1 1:0+32s");
  const std::string copies = whole.step();
  for (const char* piece : {"2:31+1s", "3:31+1s", "4:31+1s"})
    EXPECT_NE(copies.find(piece), std::string::npos) << copies;
  EXPECT_EQ(whole.sched.stats().prefix_waits, 3);
  whole.run();
  EXPECT_EQ(whole.pool.num_used(), 0);
  // Without the prefix cache nothing waits.
  Harness cold(knobs(8, 512, 512), 64, 16, /*cache=*/false);
  for (uint64_t id : {1, 2}) ASSERT_TRUE(cold.add(id, prompt, 3).is_ok());
  EXPECT_EQ(cold.step(), "+1 +2 1:0+40s 2:0+40s");
}

TEST(SchedulerTest, FullyCachedPromptRecomputesTheLastTokenIntoACopy) {
  Harness h(knobs(4, 256, 256), 16);
  ASSERT_TRUE(h.add(1, prompt_of(5000, 32), 2).is_ok());
  EXPECT_EQ(h.step(), "+1 1:0+32s");
  // Running: 2 is admitted while 1 still holds the blocks: shared, so the last one is copied.
  ASSERT_TRUE(h.add(2, prompt_of(5000, 32), 2).is_ok());
  const std::string line = h.step();
  EXPECT_EQ(line, "+2 c1>3 1:32+1s 2:31+1s");
  EXPECT_EQ(h.sched.info(2)->cached_prompt_tokens, 31);
  h.run();
  EXPECT_EQ(h.outputs[1], h.outputs[2]);
  EXPECT_EQ(h.pool.num_used(), 0);
  // After both finished, a third identical prompt: the cached blocks are free, still copied.
  ASSERT_TRUE(h.add(3, prompt_of(5000, 32), 2).is_ok());
  const std::string third = h.step();
  EXPECT_NE(third.find("c1>"), std::string::npos) << third;
  EXPECT_NE(third.find("3:31+1s"), std::string::npos) << third;
  h.run();
  EXPECT_EQ(h.outputs[3], h.outputs[1]);
  EXPECT_EQ(h.pool.num_used(), 0);
}

TEST(SchedulerTest, PrefixCacheEvictsLeastRecentlyUsedPrefixes) {
  // 9 blocks of 16. Each request: 32 prompt tokens + 1 generated = 33 positions, 3 blocks, of
  // which the 2 prompt blocks are full and stay cached after it finishes.
  Harness h(knobs(4, 256, 256), 9);
  for (uint64_t id : {1, 2, 3}) {
    ASSERT_TRUE(h.add(id, prompt_of(static_cast<int32_t>(id) * 1000, 32), 2).is_ok());
    h.run();
  }
  EXPECT_EQ(h.pool.num_cached(), 6);
  EXPECT_EQ(h.pool.num_cached_free(), 6);
  EXPECT_EQ(h.pool.stats().evictions, 0) << "uncached free blocks are used first";
  // 4 needs 5 blocks (64 + 1 positions): the 3 uncached ones, then 2 evictions, which take
  // prefix 1 (the least recently released).
  ASSERT_TRUE(h.add(4, prompt_of(4000, 64), 2).is_ok());
  h.run();
  EXPECT_EQ(h.pool.stats().evictions, 2);
  ASSERT_TRUE(h.add(5, prompt_of(1000, 32), 2).is_ok());
  EXPECT_EQ(piece_of(h.step(), 5), "0+32s") << "prefix 1 was evicted";
  h.run();
  ASSERT_TRUE(h.add(6, prompt_of(3000, 32), 2).is_ok());
  const std::string line = h.step();
  EXPECT_NE(line.find("c"), std::string::npos) << line;
  EXPECT_EQ(piece_of(line, 6), "31+1s") << "prefix 3 survived: only its last token is recomputed";
  h.run();
  EXPECT_EQ(h.pool.num_used(), 0);
}

TEST(SchedulerTest, ResumeAfterPreemptionUsesItsCachedBlocks) {
  // With the prefix cache on, a preempted sequence's full blocks stay cached and it resumes
  // from the first uncached position, still with reset_blocks. 5 blocks of 16: 1 needs 4
  // blocks, 2 needs 4; 2 (newer) is preempted when 1 needs its third block.
  Harness h(knobs(4, 256, 256), 5, 16);
  ASSERT_TRUE(h.add(1, 16, 40).is_ok());
  ASSERT_TRUE(h.add(2, 32, 20).is_ok());
  std::vector<std::string> lines = h.run();
  EXPECT_EQ(h.sched.stats().preemptions, 1);
  std::string resume;
  for (const auto& l : lines) {
    const std::string p = piece_of(l, 2);
    if (!p.empty() && p.back() == 'r') resume = p;
  }
  // At preemption 2 had 49 tokens, 48 computed (3 full blocks, all cached on release, tail
  // first). 1 then evicted two of them for its positions 32 and 48, LRU first: 2's tail blocks.
  // 2's first block survives, so it recomputes [16, 49) and samples.
  EXPECT_EQ(resume, "16+33sr") << join(lines);
  Harness solo(knobs(4, 256, 256), 5, 16, false);
  ASSERT_TRUE(solo.add(2, 32, 20).is_ok());
  solo.run();
  EXPECT_EQ(solo.outputs[2], h.outputs[2]);
  EXPECT_EQ(h.pool.num_used(), 0);
}

// ---- requests that cannot run, stats ---------------------------------------------------------

TEST(SchedulerTest, RejectsRequestsThatCanNeverFitOrAreInvalid) {
  Harness h(knobs(4, 64, 64, 0, 2), 4, 16);
  struct Case {
    int prompt_len;
    int64_t max_tokens;
    int32_t priority;
    StatusCode code;
    const char* needle;
  };
  const Case cases[] = {
      {64, 1, 0, StatusCode::kOk, ""},
      {64, 2, 0, StatusCode::kResourceExhausted, "need 5 KV blocks"},
      {0, 4, 0, StatusCode::kInvalidArgument, "prompt is empty"},
      {8, 0, 0, StatusCode::kInvalidArgument, "max_tokens"},
      {8, 4, 2, StatusCode::kInvalidArgument, "priority is 2"},
      {8, 4, -1, StatusCode::kInvalidArgument, "priority"},
  };
  uint64_t id = 1;
  for (const Case& c : cases) {
    Status s = h.add(id++, c.prompt_len, c.max_tokens, c.priority);
    EXPECT_EQ(s.code(), c.code) << s.to_string();
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.to_string();
  }
  EXPECT_EQ(h.add(1, 8, 1).code(), StatusCode::kInvalidArgument) << "id 1 is live";
  EXPECT_EQ(h.add(99, std::vector<int32_t>{1, -2}, 1).code(), StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, ResultMismatchIsReported) {
  Harness h(knobs(4, 64, 64), 8);
  ASSERT_TRUE(h.add(1, 4, 3).is_ok());
  EXPECT_EQ(h.sched.on_result(StepResult{}).code(), StatusCode::kInternal) << "nothing in flight";
  auto plan = h.sched.schedule();
  ASSERT_TRUE(plan);
  StepResult r = h.shard.execute(*plan);
  r.tokens.push_back({77, 1, 0.0f, {}});
  Status s = h.sched.on_result(r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unexpected token for sequence 77"), std::string::npos) << s.to_string();
  EXPECT_EQ(h.sched.tokens(1).size(), 5u) << "the matching part is committed";
}

TEST(SchedulerTest, FailedStepReturnsItsSequences) {
  Harness h(knobs(4, 64, 64), 8);
  ASSERT_TRUE(h.add(1, 4, 3).is_ok());
  ASSERT_TRUE(h.add(2, 4, 3).is_ok());
  ASSERT_TRUE(h.sched.schedule());
  StepResult bad;
  bad.error = "rank 1: out of memory";
  EXPECT_FALSE(h.sched.on_result(bad).is_ok());
  EXPECT_FALSE(h.sched.in_flight());
  for (uint64_t id : {1, 2}) h.sched.abort(id);
  EXPECT_EQ(h.pool.num_used(), 0);
}

TEST(SchedulerTest, StatsCountWork) {
  Harness h(knobs(4, 64, 16), 16);
  ASSERT_TRUE(h.add(1, 40, 4).is_ok());
  ASSERT_TRUE(h.add(2, 8, 4).is_ok());
  h.step();
  SchedulerStats s = h.sched.stats();
  EXPECT_EQ(s.running, 2);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_EQ(s.last_batch_size, 2);
  EXPECT_EQ(s.last_step_tokens, 24);
  EXPECT_EQ(s.kv.used_blocks, 2);
  EXPECT_DOUBLE_EQ(s.kv.fragmentation, (32.0 - 24.0) / 32.0);
  h.run();
  s = h.sched.stats();
  EXPECT_EQ(s.prefill_tokens, 48);
  EXPECT_EQ(s.decode_tokens, 6);  // 3 + 3 after each first token
  EXPECT_EQ(s.recompute_tokens, 0);
  EXPECT_EQ(s.admitted, 2);
  EXPECT_EQ(s.finished, 2);
  EXPECT_EQ(s.kv.used_blocks, 0);
  EXPECT_EQ(s.kv.fragmentation, 0.0);
}

// ---- randomized stress -----------------------------------------------------------------------

TEST(SchedulerTest, RandomLoadKeepsTheContract) {
  // Random arrivals (some sharing prefixes), priorities, output lengths, aborts and clock
  // steps on a small pool: the simulated shard checks every plan; at the end every block is
  // free, and each completed request produced exactly what it produces alone.
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    SchedulerConfig cfg = knobs(6, 64, 24, /*wait_ms=*/3, /*classes=*/3, /*aging_ms=*/200);
    Harness h(cfg, 24, 16);
    std::map<uint64_t, std::pair<std::vector<int32_t>, int64_t>> requests;
    const std::vector<int32_t> shared = prompt_of(90000, 40);
    uint64_t next = 1;
    for (int step = 0; step < 1500; ++step) {
      if (step < 1200 && rng() % 3 == 0) {
        std::vector<int32_t> prompt;
        if (rng() % 2) prompt.assign(shared.begin(), shared.begin() + 16 + rng() % 25);
        const int extra = 1 + static_cast<int>(rng() % 70);
        for (int i = 0; i < extra; ++i) prompt.push_back(static_cast<int32_t>(rng() % 1000));
        const int64_t out = 1 + rng() % 40;
        const int32_t prio = static_cast<int32_t>(rng() % 3);
        const uint64_t id = next++;
        Status s = h.add(id, prompt, out, prio);
        if (s.is_ok()) requests[id] = {prompt, out};
        else EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
      }
      if (rng() % 40 == 0 && next > 1) h.sched.abort(1 + rng() % (next - 1));
      if (h.step() == "idle") h.clock.advance(*h.sched.time_until_next_decision());
      else h.clock.advance(milliseconds(rng() % 3));
      if (::testing::Test::HasFailure()) break;
    }
    h.run(5000);
    ASSERT_FALSE(h.sched.has_work()) << "seed " << seed;
    EXPECT_EQ(h.pool.num_used(), 0) << "seed " << seed;
    EXPECT_EQ(h.shard.live(), 0u);
    EXPECT_GT(h.sched.stats().preemptions, 0) << "seed " << seed << ": the pool should be under pressure";
    EXPECT_GT(h.pool.stats().prefix_hit_rate, 0.0);
    const SchedulerStats st = h.sched.stats();
    std::printf("seed %u: %zu completed, %lld aborted, %lld steps, %lld preemptions, hit rate %.3f, %lld evictions\n",
                seed, h.outputs.size(), static_cast<long long>(st.aborted), static_cast<long long>(st.steps),
                static_cast<long long>(st.preemptions), st.kv.prefix_hit_rate, static_cast<long long>(st.kv.evictions));
    // Spot-check outputs against solo runs.
    int checked = 0;
    for (const auto& [id, out] : h.outputs) {
      if (checked++ >= 10) break;
      Harness solo(cfg, 24, 16, /*cache=*/false);
      ASSERT_TRUE(solo.add(id, requests[id].first, requests[id].second).is_ok());
      solo.run();
      EXPECT_EQ(solo.outputs[id], out) << "seed " << seed << " request " << id;
    }
  }
}

// ---- window pool -----------------------------------------------------------------------------

TEST(SchedulerWindowPoolTest, ReleasesBlocksBehindTheWindow) {
  // A 200-token prompt and 40 new tokens with a 32-token window: the window table keeps only
  // the blocks the next query reads, while the block table covers the whole sequence.
  const SchedulerConfig cfg = knobs(2, 64, 32);
  Harness h(cfg, 40, 16, true, /*window=*/32);
  ASSERT_TRUE(h.add(1, 200, 40).is_ok());
  const int64_t bound = window_blocks_per_sequence(32, 16);  // 3: after every step
  int64_t most = 0, last_blocks = 0, last_window = 0;
  while (h.sched.has_work()) {
    h.step();
    ASSERT_FALSE(::testing::Test::HasFailure());
    if (auto i = h.sched.info(1)) {
      most = std::max(most, i->window_blocks);
      last_blocks = i->blocks;
      last_window = i->window_blocks;
    }
  }
  EXPECT_LE(most, bound);
  EXPECT_EQ(last_blocks, 15);  // 239 positions
  EXPECT_LE(last_window, 3);   // positions 208..238: slots 13 and 14
  EXPECT_EQ(h.wpool->num_used(), 0);
  EXPECT_EQ(h.pool.num_used(), 0);
  // Same tokens as without a window pool.
  Harness plain(cfg, 40, 16);
  ASSERT_TRUE(plain.add(1, 200, 40).is_ok());
  plain.run();
  EXPECT_EQ(plain.outputs[1], h.outputs[1]);
}

TEST(SchedulerWindowPoolTest, PrefixHitNeedsTheWindowBlocksItReads) {
  const SchedulerConfig cfg = knobs(1, 64, 32);
  Harness h(cfg, 100, 16, true, /*window=*/32);
  std::vector<int32_t> prefix = prompt_of(5000, 96);
  auto with_tail = [&](int32_t base) {
    std::vector<int32_t> p = prefix;
    for (int i = 0; i < 10; ++i) p.push_back(base + i);
    return p;
  };
  ASSERT_TRUE(h.add(1, prefix, 1).is_ok());
  h.run();
  // The window blocks of slots 4 and 5 (positions 64..95) are still cached: the hit is whole.
  ASSERT_TRUE(h.add(2, with_tail(100), 1).is_ok());
  const std::string first = h.step();
  EXPECT_EQ(piece_of(first, 2), "96+10s") << first;
  h.run();
  // An unrelated long prompt cycles the (9-block) window pool and evicts those window blocks;
  // the 100-block pool keeps the prefix. The hit is cut to what the window pool still has.
  ASSERT_TRUE(h.add(3, 400, 1).is_ok());
  h.run();
  ASSERT_TRUE(h.add(4, with_tail(200), 1).is_ok());
  const std::string again = h.step();
  const std::string piece = piece_of(again, 4);
  ASSERT_FALSE(piece.empty()) << again;
  EXPECT_LT(std::stoll(piece.substr(0, piece.find('+'))), 96) << again;
  h.run();
  EXPECT_FALSE(::testing::Test::HasFailure());
  EXPECT_GT(h.wpool->stats().evictions, 0);
  EXPECT_EQ(h.wpool->num_used(), 0);
}

TEST(SchedulerWindowPoolTest, RandomLoadKeepsTheContract) {
  // RandomLoadKeepsTheContract with a window pool of exactly window_pool_blocks blocks: the
  // simulated shard checks the window reads of every plan; the pool never runs out (add_piece
  // would abort), every block is free at the end, and outputs equal runs without a window pool.
  for (const int64_t window : {20, 33}) {
    for (uint32_t seed : {1u, 2u}) {
      std::mt19937 rng(seed);
      SchedulerConfig cfg = knobs(6, 64, 24, /*wait_ms=*/3, /*classes=*/3, /*aging_ms=*/200);
      Harness h(cfg, 30, 16, true, window);
      std::map<uint64_t, std::pair<std::vector<int32_t>, int64_t>> requests;
      const std::vector<int32_t> shared = prompt_of(90000, 60);
      uint64_t next = 1;
      int64_t released = 0;
      for (int step = 0; step < 1200; ++step) {
        if (step < 1000 && rng() % 3 == 0) {
          std::vector<int32_t> prompt;
          if (rng() % 2) prompt.assign(shared.begin(), shared.begin() + 16 + rng() % 45);
          const int extra = 1 + static_cast<int>(rng() % 90);
          for (int i = 0; i < extra; ++i) prompt.push_back(static_cast<int32_t>(rng() % 1000));
          const int64_t out = 1 + rng() % 60;
          const uint64_t id = next++;
          Status s = h.add(id, prompt, out, static_cast<int32_t>(rng() % 3));
          if (s.is_ok()) requests[id] = {prompt, out};
        }
        if (rng() % 40 == 0 && next > 1) h.sched.abort(1 + rng() % (next - 1));
        for (uint64_t id = 1; id < next; ++id)
          if (auto i = h.sched.info(id)) released = std::max(released, i->blocks - i->window_blocks);
        if (h.step() == "idle") h.clock.advance(*h.sched.time_until_next_decision());
        else h.clock.advance(milliseconds(rng() % 3));
        if (::testing::Test::HasFailure()) break;
      }
      h.run(5000);
      ASSERT_FALSE(h.sched.has_work()) << "window " << window << " seed " << seed;
      std::printf("window %lld seed %u: window pool of %lld blocks, at most %lld in use\n",
                  static_cast<long long>(window), seed, static_cast<long long>(h.wpool->num_blocks()),
                  static_cast<long long>(h.peak_window_used));
      EXPECT_EQ(h.pool.num_used(), 0);
      EXPECT_EQ(h.wpool->num_used(), 0);
      EXPECT_GT(released, 2) << "sequences should outgrow the window";
      EXPECT_GT(h.sched.stats().preemptions, 0);
      EXPECT_GT(h.pool.stats().prefix_hit_rate, 0.0);
      int checked = 0;
      for (const auto& [id, out] : h.outputs) {
        if (checked++ >= 8) break;
        Harness solo(cfg, 30, 16, /*cache=*/false);
        ASSERT_TRUE(solo.add(id, requests[id].first, requests[id].second).is_ok());
        solo.run();
        EXPECT_EQ(solo.outputs[id], out) << "window " << window << " seed " << seed << " request " << id;
      }
    }
  }
}

// ---- speculation -----------------------------------------------------------------------------

// Drafts whose first `good` tokens are what the shard will sample and the rest wrong.
std::function<std::vector<int32_t>(const std::vector<int32_t>&)> drafts_with(std::mt19937& rng, int most) {
  return [&rng, most](const std::vector<int32_t>& tokens) {
    const int k = static_cast<int>(rng() % static_cast<uint32_t>(most + 1));
    const int good = static_cast<int>(rng() % static_cast<uint32_t>(k + 1));
    std::vector<int32_t> d = SimShard::continuation(tokens, k);
    for (int i = good; i < k; ++i) d[static_cast<size_t>(i)] = 60000 + i;  // never sampled (tokens < 50000)
    return d;
  };
}

TEST(SchedulerSpeculationTest, DraftsRideOnTheDecodeAndRejectedOnesGiveTheirBlocksBack) {
  // Blocks of 16 tokens: a decode at position 13 with 6 drafts spans positions 13..19 (2
  // blocks); all drafts wrong: 1 token comes back, 14 positions are computed, and the table
  // shrinks to 1 block.
  Harness h(knobs(4, 64, 64), 32, 16);
  ASSERT_TRUE(h.add(1, 13, 20).is_ok());
  EXPECT_EQ(h.step(), "+1 1:0+13s");
  h.sched.set_draft(1, {60001, 60002, 60003, 60004, 60005, 60006});
  std::optional<StepPlan> plan = h.sched.schedule();
  ASSERT_TRUE(plan.has_value());
  ASSERT_EQ(plan->scheduled.size(), 1u);
  const ScheduledSequence& q = plan->scheduled[0];
  EXPECT_EQ(q.start_pos, 13);
  EXPECT_EQ(q.num_tokens, 7);
  EXPECT_TRUE(q.sample);
  EXPECT_EQ(q.draft_tokens, (std::vector<int32_t>{60001, 60002, 60003, 60004, 60005, 60006}));
  EXPECT_EQ(h.sched.info(1)->blocks, 2);
  StepResult r = h.shard.execute(*plan);
  ASSERT_EQ(r.tokens.size(), 1u);
  ASSERT_TRUE(h.sched.on_result(r).is_ok());
  EXPECT_EQ(h.sched.info(1)->computed_tokens, 14);
  EXPECT_EQ(h.sched.info(1)->blocks, 1);
  EXPECT_EQ(h.pool.num_used(), 1);
  EXPECT_TRUE(h.sched.check_invariants().is_ok());
  // Right drafts: all kept plus the token after them (5 tokens for 4 drafts).
  h.sched.set_draft(1, SimShard::continuation(h.sched.tokens(1), 4));
  plan = h.sched.schedule();
  ASSERT_TRUE(plan.has_value());
  r = h.shard.execute(*plan);
  EXPECT_EQ(r.tokens.size(), 5u);
  ASSERT_TRUE(h.sched.on_result(r).is_ok());
  EXPECT_EQ(h.sched.info(1)->generated_tokens, 7);
  EXPECT_EQ(h.sched.info(1)->computed_tokens, 19);
  EXPECT_EQ(*h.shard.tokens(1), h.sched.tokens(1));
  EXPECT_TRUE(h.sched.check_invariants().is_ok());
  // A draft set for one schedule() only: the next decode carries none.
  plan = h.sched.schedule();
  ASSERT_TRUE(plan.has_value());
  EXPECT_TRUE(plan->scheduled[0].draft_tokens.empty());
  EXPECT_EQ(plan->scheduled[0].num_tokens, 1);
  ASSERT_TRUE(h.sched.on_result(h.shard.execute(*plan)).is_ok());
}

TEST(SchedulerSpeculationTest, DraftsAreTrimmedToMaxTokensTheBudgetAndFreeBlocks) {
  // max_tokens: 3 tokens to go after the first leaves room for 2 drafts.
  {
    Harness h(knobs(4, 64, 64), 32, 16);
    ASSERT_TRUE(h.add(1, 5, 4).is_ok());
    h.step();
    h.sched.set_draft(1, std::vector<int32_t>(10, 60000));
    const std::optional<StepPlan> plan = h.sched.schedule();
    ASSERT_TRUE(plan.has_value());
    EXPECT_EQ(plan->scheduled[0].draft_tokens.size(), 2u);
    ASSERT_TRUE(h.sched.on_result(h.shard.execute(*plan)).is_ok());
  }
  // The step's token budget keeps one token for every other decode: 2 decoders, 6 tokens.
  {
    Harness h(knobs(2, 6, 6), 32, 16);
    ASSERT_TRUE(h.add(1, 3, 20).is_ok());
    ASSERT_TRUE(h.add(2, 3, 20).is_ok());
    h.step();
    h.sched.set_draft(1, std::vector<int32_t>(10, 60000));
    h.sched.set_draft(2, std::vector<int32_t>(10, 60000));
    const std::optional<StepPlan> plan = h.sched.schedule();
    ASSERT_TRUE(plan.has_value());
    ASSERT_EQ(plan->scheduled.size(), 2u);
    EXPECT_EQ(plan->scheduled[0].num_tokens + plan->scheduled[1].num_tokens, 6);
    EXPECT_EQ(plan->scheduled[0].draft_tokens.size(), 4u);
    EXPECT_EQ(plan->scheduled[1].draft_tokens.size(), 0u);
    ASSERT_TRUE(h.sched.on_result(h.shard.execute(*plan)).is_ok());
  }
  // Blocks: drafts take only free blocks, never a preemption. 4 blocks of 16: two sequences of
  // 31 prompt tokens hold 2 each; drafts that would need a third block are cut to the block.
  {
    Harness h(knobs(2, 64, 64), 4, 16);
    ASSERT_TRUE(h.add(1, 31, 20).is_ok());
    ASSERT_TRUE(h.add(2, 31, 20).is_ok());
    h.step();
    EXPECT_EQ(h.pool.num_free(), 0);
    h.sched.set_draft(1, std::vector<int32_t>(10, 60000));
    const std::optional<StepPlan> plan = h.sched.schedule();
    ASSERT_TRUE(plan.has_value());
    ASSERT_EQ(plan->scheduled.size(), 2u);
    EXPECT_EQ(plan->scheduled[0].draft_tokens.size(), 0u);  // position 31 ends its last block
    EXPECT_EQ(h.sched.stats().preemptions, 0);
    ASSERT_TRUE(h.sched.on_result(h.shard.execute(*plan)).is_ok());
  }
}

TEST(SchedulerSpeculationTest, RandomLoadWithDraftsKeepsTheContract) {
  // RandomLoadKeepsTheContract with drafts on every decode (0..6 of them, a random number of
  // them right): the simulated shard checks every plan and verifies the drafts; at the end no
  // block is used (many rejections gave theirs back), and every request produced what it
  // produces alone without drafts. With and without a window pool.
  for (const int64_t window : {0, 20}) {
    for (uint32_t seed : {1u, 2u}) {
      std::mt19937 rng(seed);
      SchedulerConfig cfg = knobs(6, 64, 24, /*wait_ms=*/3, /*classes=*/3, /*aging_ms=*/200);
      Harness h(cfg, 28, 16, true, window);
      std::mt19937 drng(seed + 100);
      h.drafter = drafts_with(drng, 6);
      std::map<uint64_t, std::pair<std::vector<int32_t>, int64_t>> requests;
      uint64_t next = 1;
      for (int step = 0; step < 1000; ++step) {
        if (step < 800 && rng() % 3 == 0) {
          std::vector<int32_t> prompt;
          const int len = 1 + static_cast<int>(rng() % 70);
          for (int i = 0; i < len; ++i) prompt.push_back(static_cast<int32_t>(rng() % 1000));
          const int64_t out = 1 + rng() % 50;
          const uint64_t id = next++;
          Status s = h.add(id, prompt, out, static_cast<int32_t>(rng() % 3));
          if (s.is_ok()) requests[id] = {prompt, out};
        }
        if (rng() % 50 == 0 && next > 1) h.sched.abort(1 + rng() % (next - 1));
        if (h.step() == "idle") h.clock.advance(*h.sched.time_until_next_decision());
        else h.clock.advance(milliseconds(rng() % 3));
        if (::testing::Test::HasFailure()) break;
      }
      h.run(5000);
      ASSERT_FALSE(h.sched.has_work()) << "seed " << seed;
      EXPECT_EQ(h.pool.num_used(), 0) << "seed " << seed;
      if (h.wpool) {
        EXPECT_EQ(h.wpool->num_used(), 0);
      }
      EXPECT_EQ(h.shard.live(), 0u);
      const SchedulerStats st = h.sched.stats();
      EXPECT_GT(st.draft_tokens, 0);
      EXPECT_GT(h.shard.kept(), 0);
      EXPECT_LT(h.shard.kept(), st.draft_tokens) << "some drafts must have been rejected";
      std::printf("window %lld seed %u: %zu completed, %lld steps, %lld drafts, %lld kept, %lld preemptions\n",
                  static_cast<long long>(window), seed, h.outputs.size(), static_cast<long long>(st.steps),
                  static_cast<long long>(st.draft_tokens), static_cast<long long>(h.shard.kept()),
                  static_cast<long long>(st.preemptions));
      int checked = 0;
      for (const auto& [id, out] : h.outputs) {
        if (checked++ >= 10) break;
        Harness solo(cfg, 28, 16, /*cache=*/false);
        ASSERT_TRUE(solo.add(id, requests[id].first, requests[id].second).is_ok());
        solo.run();
        EXPECT_EQ(solo.outputs[id], out) << "seed " << seed << " request " << id;
      }
    }
  }
}

// ---- config ----------------------------------------------------------------------------------

TEST(SchedulerConfigTest, ProfilesAndValidation) {
  auto i = scheduler_profile("interactive");
  auto o = scheduler_profile("offline");
  ASSERT_TRUE(i.is_ok() && o.is_ok());
  EXPECT_TRUE(validate_scheduler_config(*i).is_ok());
  EXPECT_TRUE(validate_scheduler_config(*o).is_ok());
  EXPECT_LT(i->max_wait_ms, o->max_wait_ms);
  EXPECT_LT(i->max_batch, o->max_batch);
  EXPECT_EQ(scheduler_profile("fast").status().code(), StatusCode::kNotFound);
  struct Case {
    const char* knob;
    const char* value;
    const char* needle;
  };
  const Case bad[] = {
      {"max_batch", "0", "max_batch"},          {"max_step_tokens", "8", "max_step_tokens"},
      {"prefill_chunk", "0", "prefill_chunk"},  {"max_wait_ms", "-1", "max_wait_ms"}, {"max_burst_wait_ms", "-3", "max_burst_wait_ms"},
      {"priority_classes", "17", "priority_classes"}, {"aging_ms", "0", "aging_ms"},
  };
  for (const Case& c : bad) {
    SchedulerConfig cfg = *i;
    ASSERT_TRUE(set_scheduler_knob(cfg, c.knob, c.value).is_ok()) << c.knob;
    Status s = validate_scheduler_config(cfg);
    EXPECT_FALSE(s.is_ok()) << c.knob;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.to_string();
  }
  SchedulerConfig cfg = *i;
  EXPECT_FALSE(set_scheduler_knob(cfg, "max_batch", "12x").is_ok());
  EXPECT_FALSE(set_scheduler_knob(cfg, "max_bach", "12").is_ok());
  EXPECT_TRUE(set_scheduler_knob(cfg, "max-wait-ms", "0.5").is_ok());
  EXPECT_DOUBLE_EQ(cfg.max_wait_ms, 0.5);
}

TEST(SchedulerConfigTest, FlagsAndFileLayerOverAProfile) {
  const std::string path = ::testing::TempDir() + "/tessera_scheduler_config_test.json";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(R"({"max_batch": 100, "profile": "offline", "prefill_chunk": "1024"})", f);
    std::fclose(f);
  }
  std::vector<std::string> rest;
  auto c = scheduler_config_from_flags({"--model", "m.gguf", "--scheduler-config", path, "--max-wait-ms=7"}, &rest);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->profile, "offline");
  EXPECT_EQ(c->max_batch, 100);           // file over profile
  EXPECT_EQ(c->prefill_chunk, 1024);      // file
  EXPECT_EQ(c->max_step_tokens, 8192);    // profile
  EXPECT_DOUBLE_EQ(c->max_wait_ms, 7.0);  // flag over file
  EXPECT_EQ(rest, (std::vector<std::string>{"--model", "m.gguf"}));
  // The command line's profile wins over the file's, the file's knobs still apply.
  c = scheduler_config_from_flags({"--scheduler-profile", "interactive", "--scheduler-config", path});
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->profile, "interactive");
  EXPECT_EQ(c->max_batch, 100);
  EXPECT_EQ(c->max_step_tokens, 2048);
  // Errors name the problem.
  EXPECT_NE(scheduler_config_from_flags({"--max-batch"}).status().message().find("needs a value"), std::string::npos);
  EXPECT_NE(scheduler_config_from_flags({"--max-batch", "0"}).status().message().find("max_batch"),
            std::string::npos);
  EXPECT_NE(scheduler_config_from_flags({"--bogus", "1"}).status().message().find("--bogus"), std::string::npos);
  EXPECT_EQ(scheduler_config_from_flags({"--scheduler-config", "/nonexistent/x.json"}).status().code(),
            StatusCode::kIoError);
  SchedulerConfig j;
  Status s = apply_scheduler_json(j, R"({"max_batch": 4, "typo_knob": 1})", "cfg.json");
  EXPECT_NE(s.message().find("typo_knob"), std::string::npos) << s.to_string();
  s = apply_scheduler_json(j, "{not json", "cfg.json");
  EXPECT_NE(s.message().find("cfg.json"), std::string::npos) << s.to_string();
  s = apply_scheduler_json(j, R"({"max_batch": [1]})", "cfg.json");
  EXPECT_NE(s.message().find("max_batch"), std::string::npos) << s.to_string();
  s = apply_scheduler_json(j, R"({"max_batch": 2.5})", "cfg.json");
  EXPECT_FALSE(s.is_ok());
  std::remove(path.c_str());
}

TEST(SchedulerConfigTest, LogLineAndPrometheusGauges) {
  SchedulerConfig c = *scheduler_profile("interactive");
  EXPECT_EQ(format_scheduler_config(c),
            "scheduler: profile=interactive max_batch=32 max_step_tokens=2048 max_wait_ms=2 max_burst_wait_ms=50 "
            "prefill_chunk=512 mixed_prefill_tokens=0 priority_classes=2 aging_ms=5000 jump_forward_tokens=64 "
            "speculation=auto spec_depth=4 "
            "spec_ngram_max=3 spec_ngram_min=1 spec_probe_interval=64 spec_probe_steps=4 spec_hysteresis=0.03 "
            "spec_draft_layers=0 spec_draft_vocab=16384");
  const std::string prom = scheduler_config_prometheus(c);
  EXPECT_NE(prom.find("tessera_scheduler_max_batch{profile=\"interactive\"} 32\n"), std::string::npos) << prom;
  EXPECT_NE(prom.find("# TYPE tessera_scheduler_max_wait_ms gauge\n"), std::string::npos) << prom;
  EXPECT_NE(prom.find("tessera_scheduler_max_wait_ms{profile=\"interactive\"} 2\n"), std::string::npos) << prom;
  EXPECT_NE(prom.find("tessera_scheduler_max_burst_wait_ms{profile=\"interactive\"} 50\n"), std::string::npos) << prom;
  c = *scheduler_profile("offline");
  c.max_wait_ms = 0.5;
  EXPECT_NE(scheduler_config_prometheus(c).find("tessera_scheduler_max_wait_ms{profile=\"offline\"} 0.5\n"),
            std::string::npos);
}

// Every row of engine/scheduler_knobs.h reaches every layer: a flag, a JSON key that round-trips
// through scheduler_config_json, a gauge, the log line, and its range check.
TEST(SchedulerConfigTest, EveryKnobOfTheTableIsSetShownAndChecked) {
  const SchedulerConfig base = *scheduler_profile("interactive");
  const std::string prom = scheduler_config_prometheus(base);
  const std::string line = format_scheduler_config(base);
  int knobs = 0;
  for (const SchedulerKnobInfo& k : scheduler_knob_infos()) {
    const std::string key(k.key);
    EXPECT_EQ(k.flag.substr(0, 2), "--") << key;
    EXPECT_FALSE(k.help.empty()) << key;
    if (key == "speculation") continue;
    ++knobs;
    EXPECT_NE(prom.find("tessera_scheduler_" + key + "{"), std::string::npos) << key;
    EXPECT_NE(line.find(" " + key + "="), std::string::npos) << key;
    // A value far below any range is refused by name; the flag's spelling sets the knob.
    SchedulerConfig c = base;
    ASSERT_TRUE(set_scheduler_knob(c, k.flag, "-1000").is_ok()) << key;
    Status s = validate_scheduler_config(c);
    EXPECT_FALSE(s.is_ok()) << key;
    EXPECT_NE(s.message().find(key), std::string::npos) << s.to_string();
  }
  EXPECT_GE(knobs, 16);
  // The JSON of a changed config reads back to the same config.
  SchedulerConfig c = *scheduler_profile("offline");
  c.max_burst_wait_ms = 7.5;
  c.mixed_prefill_tokens = 96;
  c.speculation.max_depth = 2;
  c.speculation.mode = SpecMode::kNgram;
  c.block_size = 64;
  const std::string json = scheduler_config_json(c, "a test");
  SchedulerConfig back;
  ASSERT_TRUE(apply_scheduler_json(back, json, "test.json").is_ok()) << json;
  EXPECT_EQ(format_scheduler_config(back), format_scheduler_config(c)) << json;
  // The layers: profile, then file, then flags; validated at the end.
  SchedulerConfig l;
  EXPECT_TRUE(apply_scheduler_layers(l, "offline", "", {{"max_batch", "12"}, {"aging_ms", ""}}).is_ok());
  EXPECT_EQ(l.max_batch, 12);
  EXPECT_DOUBLE_EQ(l.aging_ms, 30000);
  EXPECT_FALSE(apply_scheduler_layers(l, "", "", {{"spec_hysteresis", "0.5"}}).is_ok());
}

}  // namespace
}  // namespace tessera
