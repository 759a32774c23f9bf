// Speculative decoding's control (engine/README.md, speculation): the proposers
// that run in the coordinator and the gate that decides, step by step, which decoding sequences
// carry drafts and how many.
//
// A draft is verified by the shards in the same step as the sequence's next token (the step
// plan's draft_tokens, proto/control_messages.h): every row is sampled exactly as plain decoding
// would sample it, so the output is the same with or without speculation; only the time differs.
// A step with k drafts computes k more tokens and yields 1 + (drafts kept) tokens. Whether that
// pays depends on how often drafts are kept and on what the extra tokens cost on this model and
// machine, so the gate measures both as the engine runs:
//
//  * Acceptance: per verified position (a draft kept is a success; the first draft rejected is a
//    failure; drafts after it are never tried), per request and per traffic class (the request's
//    priority), as exponentially decayed counts: a request's per position, a class's per step
//    (a batch verifies many positions a step). A request's own estimate is shrunk toward its
//    class's until it has history; it sets the request's depth, the class's sets the switch.
//  * Cost: the wall time of steps by the number of tokens they compute (step_cost), interpolated
//    between the step sizes seen. Plain decode steps and steps with drafts are the samples;
//    steps with prefill pieces are not (their tokens need no LM-head rows, verified drafts do).
//  * Expected tokens of a piece with k drafts at per-position acceptance a: 1 + a + a^2 + ... + a^k.
//    A step with B decoders and K drafts in all yields B + sum(expected - 1) tokens in T(B + K);
//    drafts are added per sequence (highest acceptance first, depth chosen to maximise the rate)
//    while the rate tokens / T rises. With acceptance a and T(n + k) / T(n) = c, break-even is
//    where the expected tokens equal c.
//  * The class's switch: on while its predicted gain (best rate with drafts / rate without) is
//    above 1 - hysteresis; off below it; when off, re-probed every probe_interval steps (two of
//    its sequences send two drafts a step whatever the prediction, one for the self-draft,
//    until enough positions are verified to judge by; the interval is stretched where a probe
//    step costs more than a tenth of a plain step over it), back on when the gain is above
//    1 + hysteresis. A new engine starts
//    each class on, with a probe of at least probe_steps steps. Requests in "ngram" mode always
//    carry drafts (no gate).
//  * Proposers: the n-gram lookup here, and the shards' self-draft (shard/self_draft.h) where the
//    server has one (draft_layers > 0), asked for with kShardDraftToken drafts. Each has its own
//    gate per class. "auto" takes the n-gram drafts where the lookup finds some and its gate
//    lets it, else the self-draft's where that gate lets it; "ngram" and "draft" requests always
//    carry their proposer's drafts. A self-draft step costs the step without its drafts plus its
//    rounds: what it took beyond the step-size model's price for its other tokens is measured
//    per round, by the number of drafting sequences (draft_cost); only steps without self-drafts
//    feed the step-size model.
//
// Thread-safety: none; the engine thread owns it.
#pragma once

#include <cstdint>
#include <algorithm>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "proto/control_messages.h"
#include "common/speculation_math.h"
#include "common/status.h"
#include "engine/scheduler_knobs.h"

namespace tessera {

enum class SpecMode { kOff, kAuto, kNgram, kDraft };

// Where a piece's drafts come from: the coordinator's n-gram lookup, or the shards' self-draft
// (shard/self_draft.h: the model's first layers and a cheap head, run in the step itself).
enum class Proposal : uint8_t { kNgram = 0, kDraft = 1 };
inline constexpr int kProposals = 2;
std::string_view proposal_name(Proposal p);

// "off", "auto", "ngram", "draft"; InvalidArgument listing them otherwise.
Result<SpecMode> parse_spec_mode(std::string_view name);
std::string_view spec_mode_name(SpecMode mode);

// The speculation knobs (SchedulerConfig carries them; scheduler_config.h shows how they are set).
struct SpeculationConfig {
  SpecMode mode = SpecMode::kAuto;  // a request without a "speculation" field gets this
  // max_depth (most drafts per sequence per step), ngram_max / ngram_min (the suffixes the n-gram
  // proposer looks up), probe_interval / probe_steps (re-probing a class that is off),
  // hysteresis (off below 1 - h of plain speed, on above 1 + h), draft_layers (> 0: the shards'
  // self-draft over the model's first layers, the "draft" proposer; "auto" then uses it where the
  // n-gram lookup finds nothing), draft_vocab (its head's fixed rows: ids below it, plus each
  // context's ids). Rows of engine/scheduler_knobs.h: ranges, defaults and help there.
  TESSERA_SPECULATION_KNOBS(TESSERA_KNOB_FIELD)
};

// InvalidArgument naming the knob: a value outside its row's range (engine/scheduler_knobs.h)
// or ngram_max < ngram_min (the shards check draft_layers and draft_vocab against the model).
Status validate_speculation_config(const SpeculationConfig& config);

// What proposes drafts for a sequence. Proposals must be deterministic functions of what the
// proposer was given (verification keeps a draft exactly when the target's draw equals it).
// Proposers here run in the coordinator; the shards' drafters (shard/self_draft.h: the built-in
// self-draft, or a separate draft model file) implement the same contract on the shard side,
// asked for with kShardDraftToken drafts.
class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual std::string_view name() const = 0;
  // Up to k tokens that may follow `tokens` (the prompt and the output so far), into `out`
  // (cleared first; empty: no proposal).
  virtual void propose(std::span<const int32_t> tokens, int64_t k, std::vector<int32_t>& out) = 0;
};

// Prompt lookup: the longest suffix of the token list (ngram_max .. ngram_min tokens) that
// occurred earlier in it, at its most recent earlier occurrence; the tokens that followed it
// there are the proposal. No second model.
class NgramProposer final : public Proposer {
 public:
  NgramProposer(int32_t ngram_max, int32_t ngram_min);
  std::string_view name() const override { return "ngram"; }
  void propose(std::span<const int32_t> tokens, int64_t k, std::vector<int32_t>& out) override;

 private:
  int32_t max_n_, min_n_;
};

// Mean step wall time by the number of tokens the step computes (exponentially weighted per
// size), interpolated linearly between the sizes seen and extrapolated from the nearest two;
// never below the mean of a smaller size seen (more tokens never cost less).
class StepCostModel {
 public:
  void observe(int64_t tokens, double seconds);
  // Seconds for a step of `tokens`; nullopt until two sizes were seen (or `tokens` itself was).
  std::optional<double> predict(int64_t tokens) const;
  size_t sizes() const { return by_tokens_.size(); }

 private:
  std::optional<double> interpolate(int64_t tokens) const;
  struct Mean {
    double value = 0;
    int64_t n = 0;
  };
  std::map<int64_t, Mean> by_tokens_;
};


class SpeculationController {
 public:
  SpeculationController(const SpeculationConfig& config, int32_t classes);

  // A sequence that decodes in the next step, with what the gate needs to know about it.
  struct Candidate {
    uint64_t seq_id = 0;
    int32_t cls = 0;
    SpecMode mode = SpecMode::kOff;
    std::span<const int32_t> tokens;  // prompt and output so far
    int64_t max_drafts = 0;           // max_tokens / max_positions left (the scheduler trims further)
  };
  // True when the shards have a self-draft (config().draft_layers > 0).
  bool has_drafter() const { return config_.draft_layers > 0; }
  // The drafts for the next step (seq id, tokens; kShardDraftToken throughout for the shards'
  // self-draft), decided as the file's comment says. `decoders`: sequences decoding in that
  // step, candidates or not.
  void plan(std::span<const Candidate> candidates, int64_t decoders,
            std::vector<std::pair<uint64_t, std::vector<int32_t>>>& drafts);
  // The step that ran: its plan (drafts as sent), result (tokens drawn) and wall time.
  void on_step(const StepPlan& plan, const StepResult& result, double seconds);
  void forget(uint64_t seq_id);

  struct ClassStats {
    int64_t proposed = 0;       // drafts sent
    int64_t accepted = 0;       // drafts kept
    double acceptance = 0;      // decayed per-position estimate (successes / trials)
    double trials = 0;          // decayed trials behind it
    bool on = true;             // the gate's switch
    int64_t switches = 0;
    double predicted_gain = 0;  // last prediction: best rate with drafts / rate without (0: none yet)
    int64_t depth = 0;          // drafts per sequence in the last step that had any
  };
  // A class's gate for one proposer (each has its own acceptance, switch and probes).
  const ClassStats& class_stats(int32_t cls, Proposal p = Proposal::kNgram) const {
    return classes_.at(index(cls, p));
  }
  int32_t num_classes() const { return classes_n_; }
  double time_saved_seconds() const { return time_saved_; }
  const StepCostModel& cost() const { return cost_; }
  // The self-draft's time per draft round by the number of sequences drafting in it.
  const StepCostModel& draft_cost() const { return draft_cost_; }
  const SpeculationConfig& config() const { return config_; }

 private:
  struct SeqStats {
    int32_t cls = 0;
    double succ[kProposals] = {0, 0}, trials[kProposals] = {0, 0};  // decayed, per proposer
  };
  struct ClassState {
    ClassStats stats;
    double succ = 0;
    int64_t steps_off = 0;    // decode steps with candidates since it went off / its last probe
    int64_t probe_left = 0;   // steps of the current probe
    int64_t probe_done = 0;   // steps it has run
    int64_t probe_trials = 0; // positions it has verified
  };
  size_t index(int32_t cls, Proposal p) const {
    return static_cast<size_t>(static_cast<int>(p) * classes_n_ + std::clamp<int32_t>(cls, 0, classes_n_ - 1));
  }
  double acceptance_of(const SeqStats* s, const ClassState& c, Proposal p) const;
  // Predicted seconds of a step of `tokens` tokens (self-drafts not counted) whose self-draft runs
  // `rounds` rounds over `drafting` sequences (0 rounds: none); nullopt where a cost is unmeasured.
  std::optional<double> step_time(int64_t tokens, int64_t rounds, int64_t drafting) const;
  void update_switch(ClassState& c, Proposal p, int64_t decoders);

  SpeculationConfig config_;
  NgramProposer ngram_;
  int32_t classes_n_;
  std::vector<ClassState> class_state_;  // [proposer][class]
  std::vector<ClassStats> classes_;  // snapshots for readers
  std::unordered_map<uint64_t, SeqStats> seqs_;
  StepCostModel cost_;        // by step tokens, from steps without self-drafts
  StepCostModel draft_cost_;  // per self-draft round, by drafting sequences
  double time_saved_ = 0;
  int64_t last_decoders_ = 1;
  std::vector<int32_t> scratch_;
};

}  // namespace tessera
