// The step-time model of the simulator (tune/simulator.h): how long the engine takes for one
// step, as a function of what the step computes (engine/step_features.h).
//
//   t = fixed + max(weight_floor, per_token * tokens) + per_token_over_knee * max(0, tokens - knee)
//       + per_sequence * sequences + per_context_token * context_tokens
//       + per_attention_pair * attention_pairs + per_block * blocks
//
// * max(weight_floor, per_token * tokens): the matrices. A step reads every weight once
//   (weight_floor: the memory floor) and multiplies them with every token (per_token: the
//   compute); the larger of the two bounds the step (the roofline). Collective bytes grow with
//   the tokens and are in per_token; collective and launch latencies are in fixed.
// * per_token_over_knee: what a token costs more once a step's activations outgrow the caches
//   (measured on a 2-core Xeon: steps of 1k+ tokens took 15% more per token than 512-token ones).
//   Fitted with the knee (token_knee) found by search; 0 for a prior.
// * per_sequence: a row of logits, sampling, the host's per-sequence work.
// * per_context_token: attention's key/value reads, once per piece (decode is bound by these).
// * per_attention_pair: attention's query-key products (long prefills are bound by these).
// * per_block: walking the block table, a piece's attention per block.
//
// Where it comes from:
// * Fitted (fit_step_model) on the steps the real engine measured (`serve --step-log`): weighted
//   least squares on relative error, each power-of-two bin of step sizes weighing the same (else
//   thousands of decode steps drown the few prefill steps that make latency tails), coefficients
//   kept >= 0, the roofline's knee and the cache knee found by a search over token counts,
//   outliers (> 4x the first fit) dropped once.
// * A prior (prior_step_model) from the planner's roofline (plan/planner.h) for a model,
//   precision, card and TP degree nobody measured (a 70B INT4 model on an A100): datasheet
//   bandwidth and FLOP/s times stated efficiencies, launch costs, ring all-reduces.
//
// Stored per model x card x TP in a JSON file (save_step_models / load_step_models): the
// default file for a model is "<model>.steps.json" beside it (step_model_path).
//
// Thread-safety: values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/step_features.h"
#include "plan/planner.h"

namespace tessera {

struct StepTimeModel {
  std::string model;    // the model's name or file name
  std::string card;     // "cpu", "A100-80GB", ...
  int tp = 1;
  std::string source;   // "fitted: 1234 steps of ..." or "prior: roofline of ..."
  double fixed_s = 0;
  double weight_floor_s = 0;
  double per_token_s = 0;
  double per_token_over_knee_s = 0;
  int64_t token_knee = 0;
  double per_sequence_s = 0;
  double per_context_token_s = 0;
  double per_attention_pair_s = 0;
  double per_block_s = 0;
  // A plan with no tokens (only `finished` ids for the shards to drop): the control plane's
  // round trip. Fitted: the median of such measured steps; prior: 100 us.
  double empty_step_s = 100e-6;
  // Step-to-step jitter: quantiles of measured / predicted time over the fitted steps, at
  // q = 0, 0.01, ..., 1 (101 values; empty for a prior), apart for small steps (fewer than
  // kLargeStepTokens tokens: decodes, whose relative jitter is largest) and large ones (prefill
  // pieces). The simulator draws each step's factor from them (inverse CDF), so tails that come
  // from jitter (a P99 inter-token latency on a busy host) are simulated too. Each ratio is
  // taken against the local level (the median ratio of the steps within kDriftWindowS of it):
  // a shared machine drifts between faster and slower phases that last seconds to minutes, and
  // drawing that drift independently for every step would give the simulated run the tails of
  // all phases at once, which no real run has. The drift itself is kept apart (drift_quantiles:
  // the local level at q = 0.1, 0.5, 0.9) and reported, not simulated: the simulator runs at
  // the median level.
  static constexpr double kDriftWindowS = 3.0;
  static constexpr int64_t kLargeStepTokens = 64;
  std::vector<double> jitter_quantiles;        // small steps
  std::vector<double> jitter_quantiles_large;  // large steps (empty: the small steps' quantiles)
  std::vector<double> drift_quantiles;         // the local level at q = 0.1, 0.5, 0.9 (empty: not measured)
  // What the block size does that the block term does not say (on a 2-core Xeon, prefill pieces
  // ran 20% slower at block 64 than the decodes beside them): per calibrated block size, the
  // median of measured / predicted against the local level, for its small and its large steps.
  // Empty: one block size (or a prior), factor 1.
  struct BlockLevel {
    int64_t block_size = 0;
    double small = 1.0;
    double large = 1.0;
  };
  std::vector<BlockLevel> block_levels;
  // How well it fits the steps it was fitted on (0 for a prior).
  int64_t fitted_steps = 0;
  double median_abs_rel_error = 0;
  double p90_abs_rel_error = 0;

  double predict_s(const StepFeatures& f) const;
  // The jitter factor at uniform draw u in [0, 1] for a step of `tokens` (1.0 without quantiles).
  double jitter(double u, int64_t tokens = 1) const;
  // The block_levels factor for a step of `tokens` at `block_size` (the nearest calibrated block
  // size, in log scale; 1.0 without block levels).
  double block_factor(int64_t block_size, int64_t tokens) const;
  // Identity for the store: "model|card|tp".
  std::string key() const;
};

// Least-squares fit on measured steps (StepRecord::total_s). InvalidArgument when there are
// fewer than 8 steps or the steps do not vary enough to tell the terms apart (then the message
// says which feature was constant), or per_block_s is negative.
// per_block_s: the block term measured apart (`tune calibrate` times decode steps of one context
// at two block sizes, interleaved), used as it is; the other terms are fitted to the rest. The
// step logs cannot tell it well: a calibration runs one server per block size, minutes apart, and
// a shared machine's drift between those runs lands in the block term (on a 2-core Xeon the fit
// gave 11 us a block, 37% of a 16k-token step at block 16, where direct timing showed none).
Result<StepTimeModel> fit_step_model(const std::vector<StepRecord>& steps, std::string model, std::string card, int tp,
                                     std::optional<double> per_block_s = std::nullopt);

// The median of measured / predicted (block factor included) over the steps that computed tokens: how fast the machine
// ran a logged run against the model (1.15: 15% slower). InvalidArgument without such steps.
Result<double> step_level(const StepTimeModel& model, const std::vector<StepRecord>& steps);

// Parses a `--step-log` JSONL file (source names it in errors, "FILE:LINE: ...").
Result<std::vector<StepRecord>> parse_step_log(std::string_view jsonl, std::string_view source);
Result<std::vector<StepRecord>> load_step_log(const std::string& path);

struct PriorEfficiency {
  double bandwidth = 0.80;  // fraction of the datasheet bandwidth a decode step sustains
  double compute = 0.60;    // fraction of the datasheet FLOP/s a prefill GEMM sustains
};
// The roofline prior for `plan` (its model, precision, KV dtype, card and TP): see the top.
StepTimeModel prior_step_model(const Plan& plan, const PriorEfficiency& efficiency = {});

// The store: a JSON object {"models": [ {model fields}, ... ]}. save replaces the entry with the
// same key and keeps the others.
Result<std::vector<StepTimeModel>> load_step_models(const std::string& path);
Status save_step_model(const std::string& path, const StepTimeModel& model);
// "<model path>.steps.json".
std::string step_model_path(const std::string& model_path);
// The entry for (card, tp) in the models of one store, if any (the model name is not compared:
// a store belongs to one model file).
const StepTimeModel* find_step_model(const std::vector<StepTimeModel>& models, std::string_view card, int tp);

std::string step_model_to_json(const StepTimeModel& model);
Result<StepTimeModel> step_model_from_json(std::string_view json, std::string_view source);
// A few lines: the coefficients in us / ns and the fit's error.
std::string format_step_model(const StepTimeModel& model);

}  // namespace tessera
