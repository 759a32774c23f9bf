#include "engine/speculation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

namespace tessera {
namespace {

// A class's estimate decays per step that verified drafts (a batch of 16 verifies many positions
// a step: a per-position decay would forget everything but the last step); a request's per
// position.
constexpr double kClassDecay = 0.85;  // per step: a class remembers ~7 steps
constexpr double kSeqDecay = 0.85;    // a request ~7
constexpr double kSeqPrior = 4.0;     // a request's estimate counts its class as this many positions
constexpr double kPriorAcceptance = 0.5;
constexpr int64_t kMinProbeTrials = 4;  // verified positions a probe wants before it decides
constexpr int64_t kProbeSequences = 2;  // sequences of a class that is off that probe in one step

void decay_add(double& succ, double& trials, double s, double t, double decay) {
  const double f = std::pow(decay, t);
  succ = succ * f + s;
  trials = trials * f + t;
}

}  // namespace

Result<SpecMode> parse_spec_mode(std::string_view name) {
  if (name == "off") return SpecMode::kOff;
  if (name == "auto") return SpecMode::kAuto;
  if (name == "ngram") return SpecMode::kNgram;
  if (name == "draft") return SpecMode::kDraft;
  return Status::invalid_argument(fmt::format("speculation '{}' is not one of off, auto, ngram, draft", name));
}

std::string_view spec_mode_name(SpecMode mode) {
  switch (mode) {
    case SpecMode::kOff: return "off";
    case SpecMode::kAuto: return "auto";
    case SpecMode::kNgram: return "ngram";
    case SpecMode::kDraft: return "draft";
  }
  return "?";
}

// ---- n-gram proposer --------------------------------------------------------------------------

NgramProposer::NgramProposer(int32_t ngram_max, int32_t ngram_min) : max_n_(ngram_max), min_n_(ngram_min) {}

void NgramProposer::propose(std::span<const int32_t> t, int64_t k, std::vector<int32_t>& out) {
  out.clear();
  const auto len = static_cast<int64_t>(t.size());
  if (k <= 0) return;
  for (int64_t n = std::min<int64_t>(max_n_, len - 1); n >= min_n_; --n) {
    const int32_t* key = t.data() + (len - n);
    // The most recent earlier occurrence: start j < len - n, so at least one token follows it.
    for (int64_t j = len - n - 1; j >= 0; --j) {
      if (t[static_cast<size_t>(j)] != key[0] || !std::equal(key, key + n, t.data() + j)) continue;
      const int64_t from = j + n, to = std::min(len, from + k);
      out.assign(t.begin() + from, t.begin() + to);
      return;
    }
  }
}

// ---- step cost ---------------------------------------------------------------------------------

void StepCostModel::observe(int64_t tokens, double seconds) {
  if (tokens <= 0 || !(seconds >= 0)) return;
  Mean& m = by_tokens_[tokens];
  ++m.n;
  const double w = std::max(1.0 / static_cast<double>(m.n), 0.1);
  m.value += w * (seconds - m.value);
}

std::optional<double> StepCostModel::predict(int64_t tokens) const {
  std::optional<double> t = interpolate(tokens);
  if (!t) return t;
  // A step with more tokens never costs less: noisy means (a size seen in a quiet moment) must
  // not make drafts look free.
  for (auto it = by_tokens_.begin(); it != by_tokens_.end() && it->first <= tokens; ++it) t = std::max(*t, it->second.value);
  return t;
}

std::optional<double> StepCostModel::interpolate(int64_t tokens) const {
  if (by_tokens_.empty()) return std::nullopt;
  if (auto it = by_tokens_.find(tokens); it != by_tokens_.end()) return it->second.value;
  auto hi = by_tokens_.upper_bound(tokens);
  const bool has_hi = hi != by_tokens_.end(), has_lo = hi != by_tokens_.begin();
  auto line = [&](auto a, auto b) {
    const double slope = std::max(0.0, (b->second.value - a->second.value) / static_cast<double>(b->first - a->first));
    return std::max(0.0, a->second.value + slope * static_cast<double>(tokens - a->first));
  };
  if (has_hi && has_lo) return line(std::prev(hi), hi);
  if (has_lo) {  // beyond the largest size seen: the last two
    auto b = std::prev(hi);
    if (b == by_tokens_.begin()) return std::nullopt;
    return line(std::prev(b), b);
  }
  auto n = std::next(hi);  // below the smallest
  if (n == by_tokens_.end()) return std::nullopt;
  return line(hi, n);
}

// ---- the gate ----------------------------------------------------------------------------------

std::string_view proposal_name(Proposal p) { return p == Proposal::kDraft ? "draft" : "ngram"; }

SpeculationController::SpeculationController(const SpeculationConfig& config, int32_t classes)
    : config_(config), ngram_(config.ngram_max, config.ngram_min), classes_n_(std::max(1, classes)),
      class_state_(static_cast<size_t>(kProposals * classes_n_)), classes_(class_state_.size()) {
  // A new engine knows nothing yet: every class starts on, measuring.
  for (ClassState& c : class_state_) c.probe_left = 4 * config_.probe_steps;
}

double SpeculationController::acceptance_of(const SeqStats* s, const ClassState& c, Proposal p) const {
  const double cls = c.stats.trials > 0 ? c.succ / c.stats.trials : kPriorAcceptance;
  if (s == nullptr) return cls;
  const auto i = static_cast<size_t>(p);
  return (s->succ[i] + kSeqPrior * cls) / (s->trials[i] + kSeqPrior);
}

std::optional<double> SpeculationController::step_time(int64_t tokens, int64_t rounds, int64_t drafting) const {
  // tokens: the step's tokens other than self-drafts; the self-draft's rounds are priced apart.
  const std::optional<double> t = cost_.predict(tokens);
  if (!t || rounds == 0) return t;
  const std::optional<double> d = draft_cost_.predict(std::max<int64_t>(1, drafting));
  if (!d) return std::nullopt;
  return *t + static_cast<double>(rounds) * *d;
}

void SpeculationController::plan(std::span<const Candidate> candidates, int64_t decoders,
                                 std::vector<std::pair<uint64_t, std::vector<int32_t>>>& drafts) {
  drafts.clear();
  const int64_t b = std::max<int64_t>(1, decoders);
  last_decoders_ = b;
  if (config_.max_depth == 0) return;
  // Without a plain step of this size measured, this one is plain: it is the baseline.
  const std::optional<double> t0 = cost_.predict(b);
  struct Pick {
    const Candidate* c;
    double acceptance;  // the n-gram's for auto and ngram, the self-draft's for draft
  };
  std::vector<Pick> picks;
  for (const Candidate& c : candidates) {
    if (c.mode == SpecMode::kOff || (c.mode == SpecMode::kDraft && !has_drafter())) continue;
    const Proposal p = c.mode == SpecMode::kDraft ? Proposal::kDraft : Proposal::kNgram;
    auto it = seqs_.find(c.seq_id);
    if (it == seqs_.end())
      it = seqs_.emplace(c.seq_id, SeqStats{std::clamp<int32_t>(c.cls, 0, classes_n_ - 1)}).first;
    picks.push_back({&c, acceptance_of(&it->second, class_state_[index(c.cls, p)], p)});
  }
  std::stable_sort(picks.begin(), picks.end(), [](const Pick& x, const Pick& y) { return x.acceptance > y.acceptance; });
  double tokens = static_cast<double>(b);  // expected tokens of the step
  int64_t extra = 0;                       // n-gram drafts in it (verified in the step's tokens)
  int64_t rounds = 0, drafting = 0;        // its self-draft: rounds (the deepest), sequences
  std::vector<int64_t> probed(class_state_.size(), 0);  // sequences probing per gate this step
  for (const Pick& pk : picks) {
    const Candidate& c = *pk.c;
    const int64_t most = std::min<int64_t>(config_.max_depth, c.max_drafts);
    if (most <= 0) continue;
    // The proposers this candidate may use, in order: auto tries the n-gram lookup first.
    const Proposal order[2] = {c.mode == SpecMode::kDraft ? Proposal::kDraft : Proposal::kNgram, Proposal::kDraft};
    const int n_order = c.mode == SpecMode::kAuto && has_drafter() ? 2 : 1;
    for (int o = 0; o < n_order; ++o) {
      const Proposal p = order[o];
      const size_t gi = index(c.cls, p);
      ClassState& cs = class_state_[gi];
      const bool forced = c.mode != SpecMode::kAuto;
      const bool probing = cs.probe_left > 0;
      if (!forced && !cs.stats.on && !probing) continue;
      if (!forced && !t0) continue;
      // A class that is off probes with a few of its sequences (kProbeSequences), not a batch.
      const bool off_probe = !forced && !cs.stats.on;
      if (off_probe && probed[gi] >= kProbeSequences) continue;
      // A probe of a class that is off only measures acceptance: two drafts a step are enough
      // and cost little when they are rejected.
      // The self-draft's probes take one (each of its drafts costs a round through the trunk).
      const int64_t want = off_probe ? std::min<int64_t>(most, p == Proposal::kDraft ? 1 : 2) : most;
      if (p == Proposal::kNgram) {
        ngram_.propose(c.tokens, want, scratch_);
      } else {
        scratch_.assign(static_cast<size_t>(want), kShardDraftToken);
      }
      if (scratch_.empty()) continue;
      const double acc = o == 0 ? pk.acceptance : acceptance_of(&seqs_.at(c.seq_id), cs, p);
      const bool self = p == Proposal::kDraft;
      auto k = static_cast<int64_t>(scratch_.size());
      if (!forced && !probing) {
        // The gate is on (its switch decides whether drafts pay): the depth that maximises the
        // step's rate at this request's acceptance, at least one draft so that the acceptance
        // stays measured.
        int64_t best = 1;
        double best_rate = 0;
        for (int64_t d = 1; d <= k; ++d) {
          const std::optional<double> t = self ? step_time(b + extra, std::max(rounds, d), drafting + 1)
                                               : step_time(b + extra + d, rounds, drafting);
          if (!t || *t <= 0) {  // no measurement that far: take the depth as a probe
            best = d;
            break;
          }
          const double rate = (tokens + expected_tokens(acc, d) - 1) / *t;
          if (rate > best_rate * 1.001) {
            best = d;
            best_rate = rate;
          }
        }
        k = best;
      }
      if (off_probe) ++probed[gi];
      scratch_.resize(static_cast<size_t>(k));
      tokens += expected_tokens(acc, k) - 1;
      if (!self) extra += k;
      if (self) {
        rounds = std::max(rounds, k);
        ++drafting;
      }
      cs.stats.depth = k;
      drafts.emplace_back(c.seq_id, scratch_);
      break;
    }
  }
}

void SpeculationController::update_switch(ClassState& c, Proposal p, int64_t per_class) {
  const double a = c.stats.trials > 0 ? c.succ / c.stats.trials : kPriorAcceptance;
  const int64_t b = last_decoders_;
  const std::optional<double> t0 = cost_.predict(b);
  std::optional<double> gain;
  if (t0 && *t0 > 0) {
    const int64_t n = std::max<int64_t>(1, per_class);
    for (int64_t k = 1; k <= config_.max_depth; ++k) {
      const std::optional<double> t =
          p == Proposal::kDraft ? step_time(b, k, n) : step_time(b + n * k, 0, 0);
      if (!t || *t <= 0) break;
      const double g = (static_cast<double>(b) + static_cast<double>(n) * (expected_tokens(a, k) - 1)) / *t /
                       (static_cast<double>(b) / *t0);
      gain = std::max(gain.value_or(0.0), g);
    }
  }
  if (gain) c.stats.predicted_gain = *gain;
  // No switch on less evidence than a probe wants (a class whose requests found no drafts yet).
  if (c.stats.trials < static_cast<double>(kMinProbeTrials)) gain.reset();
  if (c.probe_left > 0) {
    // A probe runs until it has verified enough positions to judge by (and the costs it needs
    // are measured): at least probe_steps steps for the first probe of a class that is on, as
    // few as one for a class that is off (its probes are what it pays while off), at most
    // 4 x probe_steps.
    ++c.probe_done;
    --c.probe_left;
    const bool enough = c.probe_trials >= kMinProbeTrials && gain &&
                        c.probe_done >= (c.stats.on ? config_.probe_steps : 1);
    if (!enough && c.probe_left > 0) return;
    c.probe_left = 0;
    c.probe_done = 0;
    c.probe_trials = 0;
    if (!gain) return;
    // A probe ends: on if drafts pay, else off until the next one.
    const bool on = c.stats.on ? *gain >= 1 - config_.hysteresis : *gain > 1 + config_.hysteresis;
    if (on != c.stats.on) ++c.stats.switches;
    c.stats.on = on;
    c.steps_off = 0;
    return;
  }
  if (c.stats.on) {
    if (gain && *gain < 1 - config_.hysteresis) {
      c.stats.on = false;
      ++c.stats.switches;
      c.steps_off = 0;
    }
    return;
  }
  // Probes are paid while off: a gate whose probe step costs more than a tenth of a plain step
  // over plain (the self-draft's rounds) waits proportionally longer, so that probing costs
  // about the same fraction of the time whatever the proposer.
  double interval = config_.probe_interval;
  if (t0 && *t0 > 0) {
    const std::optional<double> probe = p == Proposal::kDraft ? step_time(b, 1, 1) : step_time(b + 2, 0, 0);
    if (probe) interval *= std::max(1.0, (*probe - *t0) / (0.1 * *t0));
  }
  if (++c.steps_off >= interval) {
    c.probe_left = 4 * config_.probe_steps;
    c.steps_off = 0;
  }
}

void SpeculationController::on_step(const StepPlan& plan, const StepResult& result, double seconds) {
  int64_t step_tokens = 0, drafts = 0, decoders = 0, drawn_by_decoders = 0, rounds = 0, drafting = 0,
          self_drafts = 0;
  std::unordered_map<uint64_t, int64_t> drawn;
  for (const StepToken& t : result.tokens) ++drawn[t.seq_id];
  const size_t gates = class_state_.size();
  std::vector<int64_t> per_class(gates, 0);  // by gate: the decoders of its class (the proposer's gates share them)
  std::vector<std::pair<double, double>> step_counts(gates, {0.0, 0.0});  // successes, trials
  bool decode_only = true;  // every token a logits row: one decoded token or a verified piece each
  for (const ScheduledSequence& q : plan.scheduled) {
    step_tokens += q.num_tokens;
    const auto k = static_cast<int64_t>(q.draft_tokens.size());
    if (!q.sample || q.num_tokens - k != 1) decode_only = false;
    if (q.sample && q.num_tokens - k == 1) {
      ++decoders;
      auto d = drawn.find(q.seq_id);
      drawn_by_decoders += d == drawn.end() ? 0 : d->second;
    }
    auto s = seqs_.find(q.seq_id);
    if (s != seqs_.end())
      for (int p = 0; p < kProposals; ++p) ++per_class[index(s->second.cls, static_cast<Proposal>(p))];
    if (k == 0) continue;
    const Proposal p = q.draft_tokens.front() == kShardDraftToken ? Proposal::kDraft : Proposal::kNgram;
    if (p == Proposal::kDraft) {
      rounds = std::max(rounds, k);
      ++drafting;
      self_drafts += k;
    }
    // Forced drafts (structured outputs' jump-forward) are certain, not proposals: nothing to learn.
    if (s == seqs_.end() || q.forced_drafts) continue;
    drafts += k;
    auto d = drawn.find(q.seq_id);
    const int64_t m = d == drawn.end() ? 0 : d->second;
    if (m == 0) continue;  // no result for it (finished meanwhile): nothing learned
    const int64_t kept = std::min(k, m - 1);
    const int64_t trials = kept + (kept < k ? 1 : 0);
    const size_t gi = index(s->second.cls, p);
    ClassState& c = class_state_[gi];
    c.stats.proposed += k;
    c.stats.accepted += kept;
    if (c.probe_left > 0) c.probe_trials += trials;
    step_counts[gi].first += static_cast<double>(kept);
    step_counts[gi].second += static_cast<double>(trials);
    const auto pi = static_cast<size_t>(p);
    decay_add(s->second.succ[pi], s->second.trials[pi], static_cast<double>(kept), static_cast<double>(trials),
              kSeqDecay);
  }
  if (drafts > 0 && decoders > 0) {
    // What plain steps would have taken for the decoders' tokens, minus what this one took.
    if (const auto plain = cost_.predict(step_tokens - drafts))
      time_saved_ += static_cast<double>(drawn_by_decoders) / static_cast<double>(decoders) * *plain - seconds;
  }
  // A step with self-drafts: what it took beyond the step without them (the step-size model's
  // price for its other tokens) is the self-draft's, per round (its rounds run one token per
  // drafting sequence; the verification of their rows is part of it). Only steps without
  // self-drafts price step sizes.
  // Steps with prefill pieces are not priced: a prefill token costs no LM-head row, a verified
  // draft costs a full one (on a large vocabulary the head is most of a decode token's cost),
  // so prefill chunks would make verification look cheap.
  if (decode_only && rounds > 0) {
    if (const auto rest = cost_.predict(step_tokens - self_drafts))
      draft_cost_.observe(drafting, std::max(0.0, seconds - *rest) / static_cast<double>(rounds));
  } else if (decode_only) {
    cost_.observe(step_tokens, seconds);
  }
  for (size_t i = 0; i < gates; ++i) {
    ClassState& c = class_state_[i];
    if (step_counts[i].second > 0) {
      c.succ = c.succ * kClassDecay + step_counts[i].first;
      c.stats.trials = c.stats.trials * kClassDecay + step_counts[i].second;
    }
    // A proposer's gate moves only where the server has that proposer.
    const auto p = static_cast<Proposal>(static_cast<int>(i) / classes_n_);
    if (per_class[i] > 0 && (p == Proposal::kNgram || has_drafter())) update_switch(c, p, per_class[i]);
    c.stats.acceptance = c.stats.trials > 0 ? c.succ / c.stats.trials : 0;
    classes_[i] = c.stats;
  }
}

void SpeculationController::forget(uint64_t seq_id) { seqs_.erase(seq_id); }

}  // namespace tessera
