#include "engine/engine.h"

#include <algorithm>
#include <random>
#include <thread>

#include "common/check.h"
#include "common/logging.h"
#include "engine/stop_checker.h"

namespace tessera {
namespace {

using WallClock = std::chrono::steady_clock;

double seconds_between(WallClock::time_point a, WallClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The label of a request's priority class in the by-class histograms.
std::string class_label(int32_t cls) { return fmt::format("class=\"{}\"", cls); }

// A pool's blocks by disjoint state: used + free + cached = the pool (free_blocks counts the
// idle cached ones too; cached_blocks counts used ones too).
void set_block_states(MetricsRegistry& m, const char* name, const BlockPoolStats& kv) {
  m.set_series(name, {{"state=\"used\"", static_cast<double>(kv.used_blocks)},
                      {"state=\"free\"", static_cast<double>(kv.free_blocks - kv.cached_free_blocks)},
                      {"state=\"cached\"", static_cast<double>(kv.cached_free_blocks)}});
}

// How many of `tokens`, from the first, the grammar accepts where the matcher is (stopping after a
// stop token); the matcher is left where it was.
size_t accepted_prefix(GrammarMatcher& matcher, std::span<const int32_t> tokens) {
  size_t ok = 0;
  while (ok < tokens.size() && !matcher.terminated() && matcher.accept(tokens[ok])) ++ok;
  if (ok > 0) matcher.rollback(static_cast<int>(ok));
  return ok;
}

}  // namespace

struct Engine::JobState {
  uint64_t id = 0;
  Job job;
  WallClock::time_point arrival;
  std::vector<uint64_t> seq_ids;
  int remaining = 0;
  bool cancelled = false;
};

struct Engine::SeqState {
  SeqState(const Tokenizer* t, std::vector<std::string> stops) : stop(std::move(stops)) {
    if (t != nullptr) decoder.emplace(*t, /*skip_special=*/true);
  }
  uint64_t seq_id = 0;
  std::shared_ptr<JobState> job;
  int32_t choice = 0;
  int64_t prompt_len = 0;
  std::optional<IncrementalDecoder> decoder;  // none without a tokenizer: no text
  StopChecker stop;
  int64_t generated = 0;
  bool scheduled_once = false;
  bool finished = false;
  bool prompt_only = false;             // echo with max_tokens 0: run the prompt for its logprobs only
  SpecMode spec = SpecMode::kOff;
  int32_t cls = 0;                      // traffic class for the speculation gate (its priority)
  int64_t next_prompt_logprob_pos = 1;  // prompt logprobs already passed on end here (recomputes repeat them)
  WallClock::time_point last_token;
  std::unique_ptr<GrammarMatcher> matcher;  // structured outputs: where the output is in its grammar
  bool forced_drafts = false;               // its drafts for the next step are jump-forward's
  std::vector<uint32_t> mask;               // the matcher's next mask (reused)
};

void declare_engine_metrics(MetricsRegistry& m) {
  m.declare_counter("tessera_requests_total", "Finished requests by outcome (ok, aborted, error)");
  m.declare_counter("tessera_prompt_tokens_total", "Prompt tokens of admitted sequences");
  m.declare_counter("tessera_generation_tokens_total", "Generated tokens");
  m.declare_counter("tessera_preemptions_total", "Sequences preempted (recomputed later) because KV blocks ran out");
  m.declare_counter("tessera_prefix_waits_total",
                    "Admissions put off a step while another sequence computed the same prompt blocks");
  m.declare_counter("tessera_steps_total", "Steps run on the shards");
  m.declare_gauge("tessera_running", "Sequences holding KV blocks");
  m.declare_counter("tessera_shard_restarts_total", "Shard groups restarted after a failure");
  m.declare_gauge("tessera_draining",
                  "1 while the server shuts down: no new requests, the ones taken finish within --shutdown-grace");
  m.declare_gauge("tessera_open_requests", "Requests taken and not finished (queued, waiting or running)");
  m.declare_gauge("tessera_waiting", "Sequences waiting to be scheduled");
  m.declare_gauge("tessera_batch_size", "Sequences in the last step");
  m.declare_gauge("tessera_step_tokens", "Tokens in the last step");
  m.declare_gauge("tessera_kv_usage", "Fraction of KV blocks in use");
  m.declare_gauge("tessera_kv_blocks",
                  "KV blocks by state, adding up to the pool: used (held by sequences), free (empty), cached (free, "
                  "holding a prefix-cache entry: evictable)");
  m.declare_gauge("tessera_kv_block_size", "Tokens per KV block");
  m.declare_gauge("tessera_kv_window_usage",
                  "Fraction of the window pool's blocks in use (the sliding-window layers' KV; only with a window pool)");
  m.declare_gauge("tessera_kv_window_blocks",
                  "Window-pool KV blocks by state, adding up to the pool (used, free, cached: as tessera_kv_blocks)");
  m.declare_gauge("tessera_kv_window_tokens", "Sliding window of the layers whose KV is in the window pool");
  m.declare_gauge("tessera_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens looked up");
  m.declare_gauge("tessera_kv_fragmentation", "Unused slots in the last blocks of sequences, as a fraction of used slots");
  m.declare_gauge("tessera_healthy", "1 while every shard answers");
  m.declare_counter("tessera_spec_proposed_tokens_total",
                    "Speculative drafts verified by the shards, by traffic class and proposer (ngram, draft)");
  m.declare_counter("tessera_spec_accepted_tokens_total", "Speculative drafts the shards kept, by traffic class and proposer");
  m.declare_gauge("tessera_spec_acceptance",
                  "Per-position draft acceptance the gate measures (decayed), by traffic class");
  m.declare_gauge("tessera_spec_enabled", "1 while the gate lets a traffic class speculate");
  m.declare_counter("tessera_spec_switches_total", "Times the gate switched a traffic class on or off");
  m.declare_gauge("tessera_spec_predicted_gain",
                  "The gate's predicted decode rate with drafts over the rate without, by traffic class");
  m.declare_gauge("tessera_sparse_attention_threshold_tokens",
                  "Context from which decodes of the global-attention layers attend sparsely (0: dense; "
                  "--sparse-attention auto measures it at start-up)");
  m.declare_counter("tessera_sparse_attention_decodes_total",
                    "Decode pieces x global-attention layers that attended to selected KV blocks only");
  m.declare_counter("tessera_dense_global_decodes_total",
                    "Decode pieces x global-attention layers that attended to every KV block");
  m.declare_counter("tessera_spec_draft_seconds_total",
                    "Time the shards' self-draft took (its rounds and, through every layer, the verification)");
  m.declare_gauge("tessera_spec_depth", "Drafts per sequence in the last step of a class that had any");
  m.declare_gauge("tessera_spec_time_saved_seconds",
                  "Decode time speculation saved so far (plain-step time for the tokens drawn minus the time taken; "
                  "negative when it cost)");
  m.declare_histogram("tessera_time_to_first_token_seconds", "Arrival to first token", latency_buckets_s());
  m.declare_histogram("tessera_inter_token_latency_seconds", "Time between consecutive tokens of a sequence",
                      latency_buckets_s());
  m.declare_histogram("tessera_e2e_latency_seconds", "Arrival to last token", latency_buckets_s());
  m.declare_histogram("tessera_queue_time_seconds", "Arrival to first scheduled step", latency_buckets_s());
  m.declare_histogram("tessera_class_time_to_first_token_seconds", "Arrival to first token, by priority class",
                      latency_buckets_s());
  m.declare_histogram("tessera_class_queue_time_seconds", "Arrival to first scheduled step, by priority class",
                      latency_buckets_s());
  m.declare_histogram("tessera_step_seconds", "Wall time of one step", latency_buckets_s());
  m.declare_counter("tessera_grammar_jump_forward_tokens_total",
                    "Structured outputs: tokens the grammar forced, taken as drafts masked to their one token");
  m.declare_counter("tessera_grammar_drafts_refused_total",
                    "Structured outputs: n-gram draft tokens dropped because the grammar refuses them");
  m.declare_histogram("tessera_grammar_mask_seconds",
                      "Structured outputs: time to compute one sequence's token mask for a step",
                      {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1});
  m.declare_histogram("tessera_prompt_length_tokens", "Prompt length", token_buckets());
  m.declare_histogram("tessera_output_length_tokens", "Output length", token_buckets());
}

Engine::Engine(const EngineOptions& options, StepExecutor& shards, BlockPool& pool, const Tokenizer* tokenizer,
               MetricsRegistry& metrics)
    : options_(options), shards_(&shards), pool_(&pool), tokenizer_(tokenizer), metrics_(metrics),
      spec_(options.scheduler.speculation, options.scheduler.priority_classes), next_seq_id_(options.first_seq_id) {
  scheduler_ = std::make_unique<Scheduler>(options_.scheduler, *pool_, clock_, options_.window);
  spec_reported_.assign(static_cast<size_t>(kProposals * spec_.num_classes()), {});
  metrics_.set("tessera_healthy", 1);
  metrics_.set("tessera_kv_block_size", pool_->block_size());
  if (options_.window.pool) metrics_.set("tessera_kv_window_tokens", static_cast<double>(options_.window.window));
}

Engine::~Engine() { stop(); }

void Engine::start() {
  stop_ = false;
  thread_ = std::thread([this] { run(); });
}

Status Engine::restart(StepExecutor& executor, BlockPool& pool, WindowPool window) {
  if (thread_.joinable())
    return Status::aborted("Engine::restart while the engine thread runs (stop() first)");
  // Every job of the failed generation has ended (fail_all at the failure and at stop()).
  jobs_.clear();
  seqs_.clear();
  speculating_ = 0;
  constrained_ = 0;
  stopping_ = false;
  shards_ = &executor;
  pool_ = &pool;
  options_.window = window;
  scheduler_ = std::make_unique<Scheduler>(options_.scheduler, *pool_, clock_, options_.window);
  {
    std::lock_guard<std::mutex> lock(mu_);
    failure_.clear();
  }
  healthy_ = true;
  metrics_.set("tessera_healthy", 1);
  metrics_.add("tessera_shard_restarts_total");
  update_gauges();  // the new generation's: nothing running, the new pool free
  return Status::ok();
}

void Engine::fail_restart(const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  failure_ = "restarting the shards failed: " + error;
}

void Engine::stop() {
  stop_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string Engine::failure() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(mu_));
  return failure_;
}

void Engine::drain() {
  draining_ = true;
  metrics_.set("tessera_draining", 1);
}

Result<uint64_t> Engine::submit(Job job) {
  if (!healthy_) return Status::unavailable("the engine is unhealthy: " + failure());
  if (draining_) return Status::unavailable("the server is shutting down: it takes no new requests");
  if (tokenizer_ == nullptr && !job.stop.empty())
    return Status::invalid_argument("stop strings need a tokenizer, and this model has none");
  if (job.speculation.value_or(options_.scheduler.speculation.mode) == SpecMode::kDraft && !spec_.has_drafter())
    return Status::invalid_argument(
        "speculation \"draft\" needs the shards' self-draft, and this server has none (start it with "
        "--spec-draft-layers N); use \"ngram\", \"auto\" or \"off\"");
  const auto n = static_cast<int64_t>(job.sequences.size());
  if (queued_.load() + n > options_.max_queued_sequences)
    return Status::resource_exhausted(
        fmt::format("the queue is full ({} sequences waiting); retry later", queued_.load()));
  auto state = std::make_shared<JobState>();
  state->id = next_job_id_++;
  state->job = std::move(job);
  state->arrival = WallClock::now();
  queued_ += n;
  ++open_jobs_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(state);
  }
  cv_.notify_all();
  return state->id;
}

void Engine::cancel(uint64_t job_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(job_id);
  }
  cv_.notify_all();
}

void Engine::admit(std::shared_ptr<JobState> job) {
  std::random_device rd;
  jobs_[job->id] = job;
  job->remaining = static_cast<int>(job->job.sequences.size());
  for (const JobSequence& js : job->job.sequences) {
    auto s = std::make_unique<SeqState>(tokenizer_, job->job.stop);
    s->seq_id = next_seq_id_++;
    s->job = job;
    s->choice = js.choice;
    s->prompt_len = static_cast<int64_t>(js.prompt.size());
    SchedulerRequest r;
    r.seq_id = s->seq_id;
    r.prompt = js.prompt;
    r.sampling = job->job.sampling;
    // Every rank samples with the same seed; choices of one request must differ.
    if (r.sampling.has_seed) {
      r.sampling.seed += static_cast<uint64_t>(js.choice);
    } else {
      r.sampling.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
      r.sampling.has_seed = true;
    }
    if (job->job.want_logprobs) r.sampling.return_logprob = true;
    r.max_tokens = std::max<int64_t>(1, job->job.max_tokens);
    // Prompt logprobs need every prompt position computed, not taken from the prefix cache.
    r.reuse_cached_prefix = !job->job.want_prompt_logprobs;
    r.priority = std::min(job->job.priority, options_.scheduler.priority_classes - 1);
    s->spec = job->job.speculation.value_or(options_.scheduler.speculation.mode);
    if (job->job.grammar) {
      s->matcher = job->job.grammar->matcher();
      s->mask.resize(static_cast<size_t>(job->job.grammar->mask_words()));
      ++constrained_;
    }
    s->cls = r.priority;
    if (s->spec != SpecMode::kOff) ++speculating_;
    r.arrival = job->arrival;
    job->seq_ids.push_back(s->seq_id);
    SeqState& ref = *s;
    seqs_[s->seq_id] = std::move(s);
    metrics_.observe("tessera_prompt_length_tokens", static_cast<double>(js.prompt.size()));
    if (job->job.max_tokens == 0) {  // nothing to generate (echo-only requests)
      if (!job->job.want_prompt_logprobs || js.prompt.size() < 2) {
        finish_seq(ref, "length");
        continue;
      }
      ref.prompt_only = true;  // one step over the prompt for its logprobs; its token is dropped
    }
    Status st = scheduler_->add(std::move(r));
    if (!st.is_ok()) finish_seq(ref, "error", st.message());
  }
}

void Engine::finish_seq(SeqState& s, const std::string& reason, const std::string& error) {
  if (s.finished) return;
  s.finished = true;
  if (s.spec != SpecMode::kOff) --speculating_;
  if (s.matcher) --constrained_;
  spec_.forget(s.seq_id);
  JobEvent ev;
  ev.choice = s.choice;
  if (reason != "error" && reason != "abort") {
    if (s.decoder) ev.text = s.stop.push(s.decoder->flush());
    ev.text += s.stop.flush();
  }
  ev.finish_reason = reason;
  ev.error = error;
  ev.prompt_tokens = s.prompt_len;
  ev.completion_tokens = s.generated;
  if (scheduler_->contains(s.seq_id)) {
    if (reason == "abort" || reason == "error") scheduler_->abort(s.seq_id);
    else scheduler_->finish(s.seq_id);
  }
  const auto now = WallClock::now();
  metrics_.observe("tessera_e2e_latency_seconds", seconds_between(s.job->arrival, now));
  metrics_.observe("tessera_output_length_tokens", static_cast<double>(s.generated));
  if (s.job->job.on_event) s.job->job.on_event(ev);
  JobState& job = *s.job;
  if (--job.remaining == 0) {
    const char* outcome = reason == "error" ? "error" : reason == "abort" ? "aborted" : "ok";
    metrics_.add("tessera_requests_total", 1, fmt::format("outcome=\"{}\"", outcome));
    jobs_.erase(job.id);
    --open_jobs_;
    for (uint64_t id : job.seq_ids) seqs_.erase(id);  // `s` is gone after this
  }
}

void Engine::fail_all(const std::string& error) {
  std::vector<uint64_t> ids;
  for (auto& [id, s] : seqs_) ids.push_back(id);
  for (uint64_t id : ids) {
    auto it = seqs_.find(id);
    if (it != seqs_.end()) finish_seq(*it->second, "error", error);
  }
}

void Engine::drain_inbox() {
  std::deque<std::shared_ptr<JobState>> inbox;
  std::vector<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (auto& job : inbox) {
    queued_ -= static_cast<int64_t>(job->job.sequences.size());
    if (!healthy_ || stopping_) {
      job->remaining = 0;
      for (const JobSequence& js : job->job.sequences) {
        JobEvent ev;
        ev.choice = js.choice;
        ev.finish_reason = "error";
        ev.error = stopping_ ? "the server is shutting down" : "the engine is unhealthy: " + failure();
        if (job->job.on_event) job->job.on_event(ev);
      }
      --open_jobs_;
      continue;
    }
    admit(job);
  }
  for (uint64_t job_id : cancels) {
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) continue;
    std::shared_ptr<JobState> job = it->second;
    job->cancelled = true;
    for (uint64_t id : std::vector<uint64_t>(job->seq_ids)) {
      auto s = seqs_.find(id);
      if (s != seqs_.end()) finish_seq(*s->second, "abort");
    }
  }
  // Arrivals and aborts change the queue while no step runs (a request held by max_wait_ms, an
  // idle engine): /metrics must show them now, not after the next step.
  if (!inbox.empty() || !cancels.empty()) update_gauges();
}

void Engine::handle_tokens(const StepPlan& plan, const StepResult& result) {
  const auto now = WallClock::now();
  // Prompt logprobs first: they precede the first generated token of their sequence.
  std::unordered_map<uint64_t, std::vector<PromptLogprob>> prompt_lps;
  for (const PromptLogprob& p : result.prompt_logprobs) prompt_lps[p.seq_id].push_back(p);
  for (auto& [seq_id, lps] : prompt_lps) {
    auto it = seqs_.find(seq_id);
    if (it == seqs_.end() || it->second->finished) continue;
    // A sequence preempted in the middle of its prompt recomputes it: pass each position on once.
    SeqState& s = *it->second;
    std::erase_if(lps, [&](const PromptLogprob& p) { return p.position < s.next_prompt_logprob_pos; });
    if (lps.empty()) continue;
    s.next_prompt_logprob_pos = lps.back().position + 1;
    JobEvent ev;
    ev.choice = it->second->choice;
    ev.prompt_logprobs = std::move(lps);
    if (it->second->job->job.on_event) it->second->job->job.on_event(ev);
  }
  for (const StepToken& t : result.tokens) {
    auto it = seqs_.find(t.seq_id);
    if (it == seqs_.end() || it->second->finished) continue;
    SeqState& s = *it->second;
    if (s.prompt_only) {
      finish_seq(s, "length");
      continue;
    }
    const Job& job = s.job->job;
    if (s.matcher && !s.matcher->accept(t.token)) {
      finish_seq(s, "error", fmt::format("the model produced token {}, which the request's {} does not allow here",
                                         t.token, grammar_kind_name(job.grammar->spec().kind)));
      continue;
    }
    ++s.generated;
    metrics_.add("tessera_generation_tokens_total");
    if (s.generated == 1) {
      const double ttft = seconds_between(s.job->arrival, now);
      metrics_.observe("tessera_time_to_first_token_seconds", ttft);
      metrics_.observe("tessera_class_time_to_first_token_seconds", ttft, class_label(s.cls));
    } else {
      metrics_.observe("tessera_inter_token_latency_seconds", seconds_between(s.last_token, now));
    }
    s.last_token = now;
    JobEvent ev;
    ev.choice = s.choice;
    ev.tokens.push_back(t.token);
    if (job.want_logprobs) {
      ev.token_logprobs.emplace_back(t.token, t.logprob);
      ev.top_logprobs.push_back(t.top_logprobs);
    }
    const bool can_stop = s.generated >= job.min_tokens;
    const bool eos = std::find(options_.eos_ids.begin(), options_.eos_ids.end(), t.token) != options_.eos_ids.end();
    std::optional<std::string> reason;
    if (s.matcher && s.matcher->terminated()) {
      reason = "stop";  // the grammar is complete and took its stop token (also with ignore_eos)
    } else if (eos && !job.ignore_eos && can_stop) {
      reason = "stop";
    } else {
      if (s.decoder) ev.text = s.stop.push(s.decoder->push(t.token));
      if (s.stop.stopped() && can_stop) reason = "stop";
    }
    if (!reason && (s.generated >= job.max_tokens ||
                    (options_.max_positions > 0 && s.prompt_len + s.generated >= options_.max_positions)))
      reason = "length";
    if (reason) {
      // The final event carries this token's text too.
      JobEvent tail = ev;
      const uint64_t id = s.seq_id;
      if (!tail.text.empty() || !tail.tokens.empty()) {
        tail.finish_reason.reset();
        if (job.on_event) job.on_event(tail);
      }
      auto again = seqs_.find(id);
      if (again != seqs_.end()) finish_seq(*again->second, *reason);
    } else if (job.on_event) {
      job.on_event(ev);
    }
  }
  (void)plan;
}

void Engine::update_gauges() {
  const SchedulerStats st = scheduler_->stats();
  metrics_.set("tessera_running", static_cast<double>(st.running));
  metrics_.set("tessera_open_requests", static_cast<double>(open_jobs_.load()));
  metrics_.set("tessera_draining", draining_ ? 1.0 : 0.0);
  metrics_.set("tessera_waiting", static_cast<double>(st.waiting + queued_.load()));
  metrics_.set("tessera_batch_size", static_cast<double>(st.last_batch_size));
  metrics_.set("tessera_step_tokens", static_cast<double>(st.last_step_tokens));
  metrics_.set("tessera_preemptions_total", static_cast<double>(st.preemptions));
  metrics_.set("tessera_prefix_waits_total", static_cast<double>(st.prefix_waits));
  metrics_.set("tessera_kv_usage", st.kv.usage);
  set_block_states(metrics_, "tessera_kv_blocks", st.kv);
  metrics_.set("tessera_prefix_cache_hit_rate", st.kv.prefix_hit_rate);
  metrics_.set("tessera_kv_fragmentation", st.kv.fragmentation);
  for (int p = 0; p < (spec_.has_drafter() ? kProposals : 1); ++p) {
    const auto proposal = static_cast<Proposal>(p);
    for (int32_t c = 0; c < spec_.num_classes(); ++c) {
      const SpeculationController::ClassStats& cs = spec_.class_stats(c, proposal);
      const std::string label = fmt::format("class=\"{}\",proposer=\"{}\"", c, proposal_name(proposal));
      // Counters: what this engine added (a registry may outlive several engines).
      SpecReported& seen = spec_reported_[static_cast<size_t>(p * spec_.num_classes() + c)];
      metrics_.add("tessera_spec_proposed_tokens_total", static_cast<double>(cs.proposed - seen.proposed), label);
      metrics_.add("tessera_spec_accepted_tokens_total", static_cast<double>(cs.accepted - seen.accepted), label);
      metrics_.add("tessera_spec_switches_total", static_cast<double>(cs.switches - seen.switches), label);
      metrics_.set("tessera_spec_acceptance", cs.acceptance, label);
      metrics_.set("tessera_spec_enabled", cs.on ? 1 : 0, label);
      metrics_.set("tessera_spec_predicted_gain", cs.predicted_gain, label);
      metrics_.set("tessera_spec_depth", static_cast<double>(cs.depth), label);
      if (cs.switches != seen.switches) {
        TESSERA_LOG_INFO("speculation ({} drafts) for class {} switched {}: acceptance {:.3f} over {:.0f} recent "
                         "positions, predicted gain {:.3f} ({} drafts proposed, {} kept so far)",
                         proposal_name(proposal), c, cs.on ? "on" : "off", cs.acceptance, cs.trials,
                         cs.predicted_gain, cs.proposed, cs.accepted);
      }
      seen = {cs.proposed, cs.accepted, cs.switches};
    }
  }
  metrics_.add("tessera_spec_time_saved_seconds", spec_.time_saved_seconds() - spec_saved_reported_);
  spec_saved_reported_ = spec_.time_saved_seconds();
  if (options_.window.pool) {
    metrics_.set("tessera_kv_window_usage", st.kv_window.usage);
    set_block_states(metrics_, "tessera_kv_window_blocks", st.kv_window);
  }
}

// The token masks of the step's constrained pieces (marked mask_follows), computed on the engine
// thread after the plan went out, while the ranks run the forward pass (StepExecutor::run_step
// sends them after the plan; spreading them over threads measured no gain on two cores:
// bench/results/structured-outputs.md). Jump-forward pieces carry their forced tokens as forced
// drafts (no logits for their rows) and one mask: the grammar's after them.
std::vector<SequenceMask> Engine::compute_masks(const std::vector<std::pair<ScheduledSequence*, SeqState*>>& masked) {
  std::vector<SequenceMask> out;
  out.reserve(masked.size());
  for (const auto& [piece, seq] : masked) {
    const ScheduledSequence& q = *piece;
    SeqState& s = *seq;
    const auto m0 = WallClock::now();
    SequenceMask& m = out.emplace_back(SequenceMask{q.seq_id, {}});
    if (q.forced_drafts) {
      size_t accepted = 0;
      while (accepted < q.draft_tokens.size() && s.matcher->accept(q.draft_tokens[accepted])) ++accepted;
      // (Drafts are what jump_forward found the matcher accepts; were one refused, the row after
      // them would allow everything and the token check in handle_tokens would end the sequence.)
      if (accepted == q.draft_tokens.size() && s.matcher->fill_mask(s.mask)) m.token_mask = s.mask;
      if (accepted > 0) s.matcher->rollback(static_cast<int>(accepted));
    } else if (!q.draft_tokens.empty()) {
      // Verified drafts: k + 1 rows, row i the mask after drafts 0 .. i - 1 (all accepted:
      // propose_drafts kept only what the grammar takes). A row without restriction allows all.
      const size_t words = s.mask.size(), k = q.draft_tokens.size();
      m.token_mask.assign((k + 1) * words, ~0u);
      size_t accepted = 0;
      bool restricted = false;
      for (size_t i = 0; i <= k; ++i) {
        const std::span<uint32_t> row(m.token_mask.data() + i * words, words);
        if (s.matcher->fill_mask(row)) restricted = true;
        else std::fill(row.begin(), row.end(), ~0u);
        if (i == k || !s.matcher->accept(q.draft_tokens[i])) break;
        ++accepted;
        if (s.matcher->terminated()) break;  // a stop token: the rows after it are never used
      }
      // A draft the grammar refused (it cannot: they were checked) leaves its later rows allowing
      // everything; the token check in handle_tokens would end the sequence.
      if (accepted > 0) s.matcher->rollback(static_cast<int>(accepted));
      if (!restricted) m.token_mask.clear();
    } else if (s.matcher->fill_mask(s.mask)) {
      m.token_mask = s.mask;
    }
    metrics_.observe("tessera_grammar_mask_seconds", seconds_between(m0, WallClock::now()));
    if (q.forced_drafts)
      metrics_.add("tessera_grammar_jump_forward_tokens_total", static_cast<double>(q.draft_tokens.size()));
  }
  return out;
}

// Jump-forward: where a constrained sequence's grammar allows exactly one continuation (a JSON
// key, the punctuation around it), that text's tokens become the sequence's drafts for the next
// step, each row masked to its one token, so they are taken at the cost of one step. Only the
// prefix of the spelling the grammar accepts is used.
void Engine::jump_forward() {
  if (options_.scheduler.jump_forward_tokens <= 0) return;
  for (uint64_t id : scheduler_->decoders()) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;
    SeqState& s = *it->second;
    s.forced_drafts = false;  // whatever drafts it has now are n-gram ones (or none)
    const Job& job = s.job->job;
    if (!s.matcher || s.finished || s.generated < job.min_tokens) continue;
    const std::string forced = s.matcher->forced_string();
    if (forced.empty()) continue;
    std::vector<int32_t> tokens = job.grammar->spell(forced);
    int64_t most = std::min<int64_t>(job.max_tokens - s.generated - 1, options_.scheduler.jump_forward_tokens);
    if (options_.max_positions > 0)
      most = std::min<int64_t>(most, options_.max_positions - (s.prompt_len + s.generated) - 1);
    if (most <= 0) continue;
    if (static_cast<int64_t>(tokens.size()) > most) tokens.resize(static_cast<size_t>(most));
    tokens.resize(accepted_prefix(*s.matcher, tokens));
    if (tokens.empty()) continue;
    scheduler_->set_draft(id, std::move(tokens));  // in place of any n-gram drafts
    s.forced_drafts = true;
  }
}

// Drafts for the sequences that decode in the next step, as the gate decides.
void Engine::propose_drafts() {
  const std::vector<uint64_t> decoders = scheduler_->decoders();
  spec_candidates_.clear();
  for (uint64_t id : decoders) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;
    const SeqState& s = *it->second;
    const Job& job = s.job->job;
    // Until min_tokens, EOS is banned at this step only: no drafts (their rows would need it too).
    if (s.finished || s.spec == SpecMode::kOff || s.prompt_only || s.generated < job.min_tokens) continue;
    const std::vector<int32_t>& tokens = scheduler_->tokens(id);
    int64_t most = job.max_tokens - s.generated - 1;
    if (options_.max_positions > 0)
      most = std::min<int64_t>(most, options_.max_positions - static_cast<int64_t>(tokens.size()) - 1);
    if (most <= 0) continue;
    // A constrained sequence's drafts are checked against its grammar here, so they come from the
    // n-gram lookup (the shards' self-draft proposes inside the step, past any check).
    spec_candidates_.push_back({id, s.cls, s.matcher ? SpecMode::kNgram : s.spec, tokens, most});
  }
  spec_.plan(spec_candidates_, static_cast<int64_t>(decoders.size()), spec_drafts_);
  for (auto& [id, draft] : spec_drafts_) {
    SeqState& s = *seqs_.at(id);
    if (s.matcher) {
      // Only the prefix the grammar accepts: a draft it refuses could never be sampled.
      const size_t ok = accepted_prefix(*s.matcher, draft);
      metrics_.add("tessera_grammar_drafts_refused_total", static_cast<double>(draft.size() - ok));
      draft.resize(ok);
      if (draft.empty()) continue;
    }
    scheduler_->set_draft(id, std::move(draft));
  }
}

void Engine::step() {
  const auto t_schedule = WallClock::now();
  if (speculating_ > 0) propose_drafts();
  if (constrained_ > 0) jump_forward();
  std::optional<StepPlan> plan = scheduler_->schedule();
  if (!plan) return;
  const auto now = WallClock::now();
  std::vector<std::pair<ScheduledSequence*, SeqState*>> masked;  // the step's constrained pieces
  for (ScheduledSequence& q : plan->scheduled) {
    auto it = seqs_.find(q.seq_id);
    if (it == seqs_.end()) continue;
    SeqState& s = *it->second;
    if (!s.scheduled_once) {
      s.scheduled_once = true;
      const double queued = seconds_between(s.job->arrival, now);
      metrics_.observe("tessera_queue_time_seconds", queued);
      metrics_.observe("tessera_class_queue_time_seconds", queued, class_label(s.cls));
      metrics_.add("tessera_prompt_tokens_total", static_cast<double>(s.prompt_len));
    }
    if (s.job->job.want_prompt_logprobs && s.generated == 0 && q.start_pos < s.prompt_len) q.prompt_logprobs = true;
    // min_tokens: EOS cannot be sampled before the request has that many output tokens.
    if (q.sample && !s.job->job.ignore_eos && s.generated < s.job->job.min_tokens) q.banned_tokens = options_.eos_ids;
    if (q.sample && s.matcher) {
      q.mask_follows = true;
      // Jump-forward's drafts are taken without verification; n-gram drafts (the grammar accepted
      // them) are verified, each row under its own mask.
      q.forced_drafts = s.forced_drafts && !q.draft_tokens.empty();
      masked.push_back({&q, &s});
    }
    s.forced_drafts = false;
  }
  const auto t0 = WallClock::now();
  auto result = masked.empty() ? shards_->run_step(*plan)
                               : shards_->run_step(*plan, [&] { return compute_masks(masked); });
  const double step_seconds = seconds_between(t0, WallClock::now());
  metrics_.observe("tessera_step_seconds", step_seconds);
  metrics_.add("tessera_steps_total");
  if (!result.is_ok()) {
    const std::vector<uint64_t> ids = scheduler_->on_step_failed();
    const std::string error = result.status().message();
    if (!shards_->healthy()) {
      TESSERA_LOG_ERROR("shards failed: {}", error);
      mark_unhealthy(error);
      return;
    }
    for (uint64_t id : ids) {
      auto it = seqs_.find(id);
      if (it != seqs_.end()) finish_seq(*it->second, "error", error);
    }
    return;
  }
  Status s = scheduler_->on_result(*result);
  if (!s.is_ok()) TESSERA_LOG_WARN("step result: {}", s.to_string());
  spec_.on_step(*plan, *result, step_seconds);
  if (result->draft_micros > 0)
    metrics_.add("tessera_spec_draft_seconds_total", static_cast<double>(result->draft_micros) * 1e-6);
  metrics_.set("tessera_sparse_attention_threshold_tokens", static_cast<double>(result->sparse_threshold_tokens));
  if (result->sparse_decodes > 0)
    metrics_.add("tessera_sparse_attention_decodes_total", static_cast<double>(result->sparse_decodes));
  if (result->dense_global_decodes > 0)
    metrics_.add("tessera_dense_global_decodes_total", static_cast<double>(result->dense_global_decodes));
  handle_tokens(*plan, *result);
  update_gauges();
  if (options_.on_step) {
    const auto t_end = WallClock::now();
    StepRecord r;
    r.step_id = plan->step_id;
    r.start_s = seconds_between(started_, t0);
    r.schedule_s = seconds_between(t_schedule, t0);
    r.run_s = step_seconds;
    r.commit_s = std::max(0.0, seconds_between(t0, t_end) - step_seconds);
    r.block_size = pool_->block_size();
    const SchedulerStats st = scheduler_->stats();
    r.running = st.running;
    r.waiting = st.waiting;
    r.preemptions = st.preemptions;
    r.features = step_features(*plan, pool_->block_size());
    options_.on_step(r);
  }
}

Result<std::string> run_single_request(StepExecutor& executor, BlockPool& pool, WindowPool window, MetricsRegistry& metrics,
                                       const SingleRequest& r, const std::function<void(const JobEvent&)>& on_event) {
  EngineOptions eo;
  eo.scheduler.profile = "single request";
  eo.scheduler.max_batch = 1;
  eo.scheduler.max_wait_ms = 0.0;
  eo.scheduler.prefill_chunk =
      static_cast<int32_t>(r.prefill_chunk > 0 ? r.prefill_chunk : std::max<size_t>(1, r.prompt.size()));
  eo.scheduler.max_step_tokens = eo.scheduler.prefill_chunk;
  eo.scheduler.priority_classes = 1;
  eo.scheduler.speculation = r.speculation;
  eo.eos_ids = r.eos_ids;
  eo.max_positions = r.max_positions;
  eo.first_seq_id = r.seq_id;
  eo.window = window;
  Engine engine(eo, executor, pool, nullptr, metrics);
  std::optional<std::string> finish;
  std::string error;
  Job job;
  job.sequences.push_back(JobSequence{r.prompt, 0});
  job.sampling = r.sampling;
  job.max_tokens = r.max_tokens;
  job.ignore_eos = r.ignore_eos;
  job.want_logprobs = r.sampling.return_logprob || r.sampling.n_logprobs > 0;
  job.on_event = [&](const JobEvent& ev) {
    if (on_event) on_event(ev);
    if (!ev.finish_reason) return;
    finish = *ev.finish_reason;
    error = ev.error.empty() ? *ev.finish_reason : ev.error;
  };
  TESSERA_RETURN_IF_ERROR(engine.submit(std::move(job)).status());
  engine.run_until_idle();
  if (!finish) return Status::internal("the engine stopped before the request finished");
  if (*finish == "error" || *finish == "abort") return Status::internal(error);
  return *finish;
}

void Engine::mark_unhealthy(const std::string& error) {
  healthy_ = false;
  metrics_.set("tessera_healthy", 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = error;
  }
  fail_all(error);
  update_gauges();
}

void Engine::run() {
  set_log_role("coordinator");
  while (!stop_) {
    drain_inbox();
    if (healthy_ && scheduler_->has_work()) {
      const uint64_t before = shards_->steps_run();
      step();
      if (shards_->steps_run() != before) continue;  // a step ran: look for more work at once
    }
    // Idle (or everything held by max_wait_ms): keep the shards alive and wait for arrivals.
    if (healthy_) {
      Status alive = shards_->keep_alive();
      if (!alive.is_ok()) mark_unhealthy(alive.message());
    }
    auto wait = std::chrono::milliseconds(20);
    if (auto next = scheduler_->time_until_next_decision())
      wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(*next) + std::chrono::milliseconds(1));
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, wait, [this] { return stop_.load() || !inbox_.empty() || !cancels_.empty(); });
  }
  // Every job taken ends with an event: those still in the inbox and those running.
  stopping_ = true;
  drain_inbox();
  fail_all("the server is shutting down");
}

void Engine::run_until_idle() {
  for (;;) {
    drain_inbox();
    if (jobs_.empty()) return;
    if (!healthy_) {
      fail_all(failure());
      continue;
    }
    if (scheduler_->has_work()) {
      const uint64_t before = shards_->steps_run();
      step();
      if (shards_->steps_run() != before) continue;
    }
    // No step ran: a request held by max_wait_ms waits for its decision; anything else can
    // never be placed (nothing else runs here to free blocks).
    const auto next = scheduler_->time_until_next_decision();
    if (!next) {
      fail_all("the scheduler cannot place the waiting requests (not enough KV blocks?)");
      continue;
    }
    Status alive = shards_->keep_alive();
    if (!alive.is_ok()) {
      mark_unhealthy(alive.message());
      continue;
    }
    std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::microseconds>(*next) +
                                std::chrono::microseconds(100));
  }
}

}  // namespace tessera
