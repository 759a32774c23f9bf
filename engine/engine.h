// The engine (ARCHITECTURE.md): the one decode loop. It owns the Scheduler and the BlockPool, drives
// one StepExecutor (shard processes, or a shard in this process), turns sampled tokens into text
// (incremental detokenization, stop strings, EOS, length), and reports each job's progress
// through the job's event callback. `tessera serve` runs it on its own engine thread (start():
// HTTP threads hand it jobs and cancellations through a queue, submit / cancel, both
// thread-safe; callbacks run on the engine thread and must not block); `tessera generate`,
// tests and benchmarks run it on their own thread (run_until_idle()). Speculative decoding and
// every other decode strategy change this loop, and only this one.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/block_pool.h"
#include "engine/clock.h"
#include "engine/metrics.h"
#include "engine/scheduler.h"
#include "engine/speculation.h"
#include "engine/step_features.h"
#include "engine/step_executor.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

// One output sequence of a job (a prompt times n).
struct JobSequence {
  std::vector<int32_t> prompt;
  int32_t choice = 0;          // choice index in the response
};

// Progress of one choice, delivered on the engine thread.
struct JobEvent {
  int32_t choice = 0;
  std::string text;                       // new text (stop strings held back and cut)
  std::vector<int32_t> tokens;            // tokens that produced it
  std::vector<std::pair<int32_t, float>> token_logprobs;  // (id, logprob) per token, if asked
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;  // per token
  std::optional<std::string> finish_reason;  // "stop", "length", "abort", or "error"
  std::string error;                      // for finish_reason "error"
  int64_t prompt_tokens = 0;              // on the finishing event
  int64_t completion_tokens = 0;          // on the finishing event
  // Prompt logprobs (echo + logprobs): (position, token, logprob, top) of prompt tokens.
  std::vector<PromptLogprob> prompt_logprobs;
};

struct Job {
  std::vector<JobSequence> sequences;
  SamplingParams sampling;
  int64_t max_tokens = 16;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int64_t min_tokens = 0;
  int32_t priority = 0;
  bool want_logprobs = false;
  bool want_prompt_logprobs = false;
  // Speculative decoding for this request (engine/speculation.h); none: the scheduler
  // config's mode. kDraft needs a draft proposer, which this engine does not have yet.
  std::optional<SpecMode> speculation;
  // Structured outputs: every choice's tokens follow this grammar (compiled for the model's
  // vocabulary; grammar/grammar.h). Its sequences take no drafts.
  std::shared_ptr<const CompiledGrammar> grammar;
  std::function<void(const JobEvent&)> on_event;  // engine thread; called until each choice finishes
};

// Where a failed engine stands (the server's recovery, server/server.cpp; /health): none
// (healthy, or failed with nobody restarting it), its shards being restarted, or given up.
enum class RecoveryState : int { kNone = 0, kRestarting = 1, kFailed = 2 };

struct EngineOptions {
  SchedulerConfig scheduler;
  std::vector<int32_t> eos_ids;
  int64_t max_positions = 0;
  int64_t max_queued_sequences = 4096;  // beyond: submit() says busy (429)
  // The first sequence id this engine hands out (ids are the shards' keys: an engine that
  // follows another on the same shards starts past the ids the first one used).
  uint64_t first_seq_id = 1;
  // The window pool beside the block pool (engine/scheduler.h; none by default). Not
  // owned: it must outlive the engine.
  WindowPool window;
  // Called on the engine thread after every step that ran (not for a failed one) with what it
  // computed and how long it took (`serve --step-log`; the step-time model is fitted on these).
  // Must not block.
  std::function<void(const StepRecord&)> on_step;
};

class Engine {
 public:
  // Everything passed must outlive the engine. `tokenizer` may be null: events then carry
  // tokens and no text, and stop strings are refused. start() launches the engine thread.
  Engine(const EngineOptions& options, StepExecutor& executor, BlockPool& pool, const Tokenizer* tokenizer,
         MetricsRegistry& metrics);
  ~Engine();
  // start() launches the engine thread (again after stop()); stop() joins it, ending every job
  // still open with an error.
  void start();
  void stop();
  // After a failure and stop(): the shards of a new generation (their KV pools planned anew;
  // nothing of the old cache is kept) replace the old ones, and the engine is healthy again,
  // ready to start(). FailedPrecondition while the engine thread runs.
  Status restart(StepExecutor& executor, BlockPool& pool, WindowPool window);
  // Thread-safe: the recovery's state, for /health.
  void set_recovery(RecoveryState state) { recovery_ = static_cast<int>(state); }
  RecoveryState recovery() const { return static_cast<RecoveryState>(recovery_.load()); }
  // Thread-safe: a restart that did not come up; failure() says why (the engine stays unhealthy).
  void fail_restart(const std::string& error);
  // Without an engine thread: runs the loop on the calling thread until every job submitted so
  // far has finished (or the executor failed: those jobs finish with an error). Callbacks run
  // on this thread. Not together with start().
  void run_until_idle();

  // Thread-safe. Returns the job id, or ResourceExhausted when the queue is full and
  // Unavailable when the shards are unhealthy.
  Result<uint64_t> submit(Job job);
  // Thread-safe: aborts a job (client gone); its remaining choices finish with "abort".
  void cancel(uint64_t job_id);

  // Thread-safe. Draining (a server shutting down): submit() refuses new jobs with Unavailable
  // while the jobs already taken run on; stop() then ends what is left with an error event.
  void drain();
  bool draining() const { return draining_.load(); }
  // Jobs taken by submit() and not finished yet (queued, waiting or running). Thread-safe.
  int64_t open_jobs() const { return open_jobs_.load(); }

  bool healthy() const { return healthy_.load(); }
  std::string failure() const;
  int64_t queued() const { return queued_.load(); }
  const SchedulerConfig& scheduler_config() const { return options_.scheduler; }
  // The speculation gate's state (engine thread, or after run_until_idle returned).
  const SpeculationController& speculation() const { return spec_; }

 private:
  struct JobState;
  struct SeqState;
  void run();
  void drain_inbox();
  void admit(std::shared_ptr<JobState> job);
  void step();
  void handle_tokens(const StepPlan& plan, const StepResult& result);
  void finish_seq(SeqState& s, const std::string& reason, const std::string& error = "");
  void fail_all(const std::string& error);
  void update_gauges();
  void propose_drafts();
  void jump_forward();
  std::vector<SequenceMask> compute_masks(const std::vector<std::pair<ScheduledSequence*, SeqState*>>& masked);

  void mark_unhealthy(const std::string& error);

  EngineOptions options_;
  StepExecutor* shards_;
  BlockPool* pool_;
  const Tokenizer* tokenizer_;
  MetricsRegistry& metrics_;
  SteadyClock clock_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::unique_ptr<Scheduler> scheduler_;
  SpeculationController spec_;
  int64_t speculating_ = 0;  // live sequences whose mode is not off
  int64_t constrained_ = 0;  // live sequences with a grammar
  struct SpecReported {
    int64_t proposed = 0, accepted = 0, switches = 0;
  };
  std::vector<SpecReported> spec_reported_;  // per proposer and class: what /metrics has of it
  double spec_saved_reported_ = 0;
  std::vector<SpeculationController::Candidate> spec_candidates_;
  std::vector<std::pair<uint64_t, std::vector<int32_t>>> spec_drafts_;

  std::mutex mu_;  // guards inbox_, cancels_, failure_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<JobState>> inbox_;
  std::vector<uint64_t> cancels_;
  std::string failure_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> healthy_{true};
  std::atomic<int64_t> queued_{0};
  std::atomic<bool> draining_{false};
  std::atomic<int> recovery_{0};
  std::atomic<int64_t> open_jobs_{0};
  bool stopping_ = false;  // engine thread: run() is ending; jobs still in the inbox fail
  std::atomic<uint64_t> next_job_id_{1};
  std::thread thread_;

  // Engine-thread state.
  uint64_t next_seq_id_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<JobState>> jobs_;
  std::unordered_map<uint64_t, std::unique_ptr<SeqState>> seqs_;  // by seq id
};

// Declares every metric the engine exports.
void declare_engine_metrics(MetricsRegistry& metrics);

// One request through a new engine on the calling thread (`tessera generate`, with or without
// --tp): admitted at once (no batching wait), its prompt prefilled in pieces of prefill_chunk
// tokens (0: the whole prompt in one step), then one decode token per step.
struct SingleRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 16;
  bool ignore_eos = false;
  int64_t prefill_chunk = 0;
  std::vector<int32_t> eos_ids;
  int64_t max_positions = 0;
  uint64_t seq_id = 1;  // the shards' key: unique among the sequences `executor` has seen
  SpeculationConfig speculation;  // drafts (n-gram, gated by default) and the gate's knobs
};
// Events as Job::on_event. Returns the "stop" / "length" finish reason; an error or abort finish
// is an Internal error with its message.
Result<std::string> run_single_request(StepExecutor& executor, BlockPool& pool, WindowPool window, MetricsRegistry& metrics,
                                       const SingleRequest& request,
                                       const std::function<void(const JobEvent&)>& on_event);

}  // namespace tessera
