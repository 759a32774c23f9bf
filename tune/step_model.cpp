#include "tune/step_model.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tessera {
namespace {

using Json = nlohmann::json;
// fixed, matrices, matrices past the cache knee, sequences, context tokens, attention pairs, blocks
constexpr int kTerms = 7;

std::array<double, kTerms> design_row(const StepFeatures& f, double knee, double cache_knee) {
  const auto tokens = static_cast<double>(f.tokens);
  return {1.0,
          std::max(knee, tokens),
          cache_knee > 0 ? std::max(0.0, tokens - cache_knee) : 0.0,
          static_cast<double>(f.sequences),
          static_cast<double>(f.context_tokens),
          static_cast<double>(f.attention_pairs),
          static_cast<double>(f.blocks)};
}

// Solves the normal equations of the weighted problem restricted to `active` terms (the rest are
// 0). Columns are scaled to unit norm and a tiny ridge keeps collinear terms (blocks and context
// at one block size) from blowing up: they share the weight instead.
std::array<double, kTerms> solve_active(const std::vector<std::array<double, kTerms>>& rows,
                                        const std::vector<double>& y, const std::vector<double>& w,
                                        const std::array<bool, kTerms>& active) {
  std::vector<int> idx;
  for (int j = 0; j < kTerms; ++j)
    if (active[j]) idx.push_back(j);
  const size_t m = idx.size();
  std::array<double, kTerms> coef{};
  if (m == 0) return coef;
  std::vector<double> scale(m, 0.0);
  for (size_t a = 0; a < m; ++a) {
    double s = 0;
    for (size_t i = 0; i < rows.size(); ++i) s += std::pow(w[i] * rows[i][idx[a]], 2);
    scale[a] = s > 0 ? 1.0 / std::sqrt(s) : 0.0;
  }
  std::vector<double> ata(m * m, 0.0), atb(m, 0.0);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t a = 0; a < m; ++a) {
      const double xa = w[i] * rows[i][idx[a]] * scale[a];
      atb[a] += xa * w[i] * y[i];
      for (size_t b = 0; b < m; ++b) ata[a * m + b] += xa * w[i] * rows[i][idx[b]] * scale[b];
    }
  }
  for (size_t a = 0; a < m; ++a) ata[a * m + a] += 1e-9;
  // Gaussian elimination with partial pivoting.
  for (size_t c = 0; c < m; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < m; ++r)
      if (std::abs(ata[r * m + c]) > std::abs(ata[p * m + c])) p = r;
    if (p != c) {
      for (size_t k = 0; k < m; ++k) std::swap(ata[c * m + k], ata[p * m + k]);
      std::swap(atb[c], atb[p]);
    }
    const double d = ata[c * m + c];
    if (std::abs(d) < 1e-300) continue;
    for (size_t r = c + 1; r < m; ++r) {
      const double f = ata[r * m + c] / d;
      for (size_t k = c; k < m; ++k) ata[r * m + k] -= f * ata[c * m + k];
      atb[r] -= f * atb[c];
    }
  }
  std::vector<double> x(m, 0.0);
  for (size_t c = m; c-- > 0;) {
    double s = atb[c];
    for (size_t k = c + 1; k < m; ++k) s -= ata[c * m + k] * x[k];
    x[c] = std::abs(ata[c * m + c]) < 1e-300 ? 0.0 : s / ata[c * m + c];
  }
  for (size_t a = 0; a < m; ++a) coef[idx[a]] = x[a] * scale[a];
  return coef;
}

// Non-negative least squares by elimination: solve, drop the most negative term, solve again.
std::array<double, kTerms> solve_nonnegative(const std::vector<std::array<double, kTerms>>& rows,
                                             const std::vector<double>& y, const std::vector<double>& w) {
  std::array<bool, kTerms> active;
  active.fill(true);
  for (;;) {
    auto c = solve_active(rows, y, w, active);
    int worst = -1;
    for (int j = 0; j < kTerms; ++j)
      if (active[j] && c[j] < 0 && (worst < 0 || c[j] < c[worst])) worst = j;
    if (worst < 0) return c;
    active[worst] = false;
  }
}

struct Fit {
  StepTimeModel model;
  double loss = 0;
};

StepTimeModel from_coefficients(const std::array<double, kTerms>& c, double knee, double cache_knee) {
  StepTimeModel m;
  m.fixed_s = c[0];
  m.per_token_s = c[1];
  m.weight_floor_s = c[1] * knee;
  m.per_token_over_knee_s = c[2];
  m.token_knee = c[2] > 0 ? static_cast<int64_t>(cache_knee) : 0;
  m.per_sequence_s = c[3];
  m.per_context_token_s = c[4];
  m.per_attention_pair_s = c[5];
  m.per_block_s = c[6];
  return m;
}

// Weights: relative error (1 / time), each power-of-two bin of step sizes weighing the same in
// all (a bin of n steps: 1 / sqrt(n) on the residual, 1 / n on its square).
std::vector<double> fit_weights(const std::vector<const StepRecord*>& steps) {
  auto bin = [](const StepRecord* s) { return std::bit_width(static_cast<uint64_t>(std::max<int64_t>(s->features.tokens, 1))); };
  std::array<int64_t, 65> count{};
  for (const StepRecord* s : steps) ++count[bin(s)];
  std::vector<double> w;
  w.reserve(steps.size());
  for (const StepRecord* s : steps)
    w.push_back(1.0 / std::max(s->total_s(), 1e-6) / std::sqrt(static_cast<double>(count[bin(s)])));
  return w;
}

// per_block >= 0: the block term is that (measured apart), not fitted.
Fit fit_once(const std::vector<const StepRecord*>& steps, double per_block) {
  static constexpr double kKnees[] = {0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128};
  // 0: no cache knee. A knee needs steps past it: one no step reaches fits like none.
  static constexpr double kCacheKnees[] = {0, 256, 512, 1024};
  const bool pinned = per_block >= 0;
  std::vector<double> y;  // what the fitted terms explain
  for (const StepRecord* s : steps)
    y.push_back(s->total_s() - (pinned ? per_block * static_cast<double>(s->features.blocks) : 0.0));
  const std::vector<double> w = fit_weights(steps);
  Fit best;
  best.loss = INFINITY;
  for (double cache_knee : kCacheKnees) {
    for (double knee : kKnees) {
      std::vector<std::array<double, kTerms>> rows;
      rows.reserve(steps.size());
      for (const StepRecord* s : steps) {
        rows.push_back(design_row(s->features, knee, cache_knee));
        if (pinned) rows.back()[kTerms - 1] = 0.0;  // an all-zero column gets coefficient 0
      }
      StepTimeModel m = from_coefficients(solve_nonnegative(rows, y, w), knee, cache_knee);
      if (pinned) m.per_block_s = per_block;
      double loss = 0;
      for (size_t i = 0; i < steps.size(); ++i)
        loss += std::pow((m.predict_s(steps[i]->features) - steps[i]->total_s()) * w[i], 2);
      if (loss < best.loss) best = {m, loss};
    }
  }
  return best;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double r = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(r));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (r - static_cast<double>(lo));
}

// Per block size (when the steps have more than one), the median ratio of its small and its large
// steps (too few large ones: the small ones' median).
std::vector<StepTimeModel::BlockLevel> fit_block_levels(const std::vector<const StepRecord*>& steps,
                                                        const std::vector<double>& ratio) {
  std::vector<int64_t> sizes;
  for (const StepRecord* s : steps) sizes.push_back(s->block_size);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::vector<StepTimeModel::BlockLevel> out;
  if (sizes.size() < 2) return out;
  for (int64_t b : sizes) {
    std::vector<double> small, large;
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i]->block_size == b)
        (steps[i]->features.tokens >= StepTimeModel::kLargeStepTokens ? large : small).push_back(ratio[i]);
    if (small.empty() && large.empty()) continue;
    StepTimeModel::BlockLevel level{b, 1.0, 1.0};
    level.small = quantile(small.empty() ? large : small, 0.5);
    level.large = large.size() >= 20 ? quantile(large, 0.5) : level.small;
    out.push_back(level);
  }
  return out;
}

// The local level of each step's ratio (measured / predicted): the median ratio of the steps of
// the same run within `window_s` of it. Runs are told apart by their clocks restarting (the step
// logs of several servers, one after another).
std::vector<double> local_levels(const std::vector<const StepRecord*>& steps, const std::vector<double>& ratio,
                                 double window_s) {
  std::vector<double> level(steps.size(), 1.0);
  size_t run_begin = 0;
  std::vector<double> scratch;
  for (size_t end = 1; end <= steps.size(); ++end) {
    if (end < steps.size() && steps[end]->start_s >= steps[end - 1]->start_s) continue;
    // [run_begin, end) is one run, in time order.
    size_t lo = run_begin, hi = run_begin;
    for (size_t i = run_begin; i < end; ++i) {
      const double t = steps[i]->start_s;
      while (steps[lo]->start_s < t - window_s) ++lo;
      while (hi < end && steps[hi]->start_s <= t + window_s) ++hi;
      scratch.assign(ratio.begin() + static_cast<ptrdiff_t>(lo), ratio.begin() + static_cast<ptrdiff_t>(hi));
      auto mid = scratch.begin() + static_cast<ptrdiff_t>(scratch.size() / 2);
      std::nth_element(scratch.begin(), mid, scratch.end());
      level[i] = *mid;
    }
    run_begin = end;
  }
  return level;
}


Json block_levels_json(const StepTimeModel& m) {
  Json a = Json::array();
  for (const StepTimeModel::BlockLevel& b : m.block_levels)
    a.push_back({{"block_size", b.block_size}, {"small", b.small}, {"large", b.large}});
  return a;
}

Json to_json(const StepTimeModel& m) {
  return Json{{"model", m.model},
              {"card", m.card},
              {"tp", m.tp},
              {"source", m.source},
              {"fixed_s", m.fixed_s},
              {"weight_floor_s", m.weight_floor_s},
              {"per_token_s", m.per_token_s},
              {"per_token_over_knee_s", m.per_token_over_knee_s},
              {"token_knee", m.token_knee},
              {"per_sequence_s", m.per_sequence_s},
              {"per_context_token_s", m.per_context_token_s},
              {"per_attention_pair_s", m.per_attention_pair_s},
              {"per_block_s", m.per_block_s},
              {"empty_step_s", m.empty_step_s},
              {"jitter_quantiles", m.jitter_quantiles},
              {"jitter_quantiles_large", m.jitter_quantiles_large},
              {"drift_quantiles", m.drift_quantiles},
              {"block_levels", block_levels_json(m)},
              {"fitted_steps", m.fitted_steps},
              {"median_abs_rel_error", m.median_abs_rel_error},
              {"p90_abs_rel_error", m.p90_abs_rel_error}};
}

Result<StepTimeModel> from_json(const Json& j, std::string_view source) {
  StepTimeModel m;
  try {
    m.model = j.at("model").get<std::string>();
    m.card = j.at("card").get<std::string>();
    m.tp = j.at("tp").get<int>();
    m.source = j.value("source", std::string());
    const std::pair<const char*, double*> fields[] = {
        {"fixed_s", &m.fixed_s},
        {"weight_floor_s", &m.weight_floor_s},
        {"per_token_s", &m.per_token_s},
        {"per_sequence_s", &m.per_sequence_s},
        {"per_context_token_s", &m.per_context_token_s},
        {"per_attention_pair_s", &m.per_attention_pair_s},
        {"per_block_s", &m.per_block_s}};
    for (const auto& [name, dst] : fields) {
      *dst = j.at(name).get<double>();
      if (!std::isfinite(*dst) || *dst < 0)
        return Status::invalid_argument(fmt::format("{}: step model field '{}' is {}, expected a finite value >= 0",
                                                    source, name, *dst));
    }
    // Optional (stores written before the cache knee have neither).
    m.per_token_over_knee_s = j.value("per_token_over_knee_s", 0.0);
    m.token_knee = j.value("token_knee", int64_t{0});
    if (!std::isfinite(m.per_token_over_knee_s) || m.per_token_over_knee_s < 0 || m.token_knee < 0)
      return Status::invalid_argument(fmt::format("{}: step model per_token_over_knee_s {} / token_knee {}: expected values >= 0",
                                                  source, m.per_token_over_knee_s, m.token_knee));
    m.fitted_steps = j.value("fitted_steps", int64_t{0});
    m.empty_step_s = j.value("empty_step_s", m.empty_step_s);
    if (!std::isfinite(m.empty_step_s) || m.empty_step_s < 0)
      return Status::invalid_argument(fmt::format("{}: step model empty_step_s {} < 0", source, m.empty_step_s));
    for (auto [name, dst] : {std::pair{"jitter_quantiles", &m.jitter_quantiles},
                             std::pair{"jitter_quantiles_large", &m.jitter_quantiles_large},
                             std::pair{"drift_quantiles", &m.drift_quantiles}}) {
      if (!j.contains(name)) continue;
      *dst = j[name].get<std::vector<double>>();
      const std::vector<double>& q = *dst;
      for (size_t i = 0; i < q.size(); ++i)
        if (!std::isfinite(q[i]) || q[i] <= 0 || (i > 0 && q[i] < q[i - 1]))
          return Status::invalid_argument(fmt::format(
              "{}: step model {}[{}] = {}: expected positive, non-decreasing factors", source, name, i, q[i]));
    }
    if (j.contains("block_levels")) {
      for (const Json& b : j["block_levels"]) {
        StepTimeModel::BlockLevel level{b.at("block_size").get<int64_t>(), b.at("small").get<double>(),
                                        b.at("large").get<double>()};
        if (level.block_size < 1 || !(level.small > 0) || !(level.large > 0) || !std::isfinite(level.small) ||
            !std::isfinite(level.large))
          return Status::invalid_argument(fmt::format("{}: step model block_levels: block {} with factors {} / {}: "
                                                      "expected a block size >= 1 and factors > 0",
                                                      source, level.block_size, level.small, level.large));
        m.block_levels.push_back(level);
      }
    }
    m.median_abs_rel_error = j.value("median_abs_rel_error", 0.0);
    m.p90_abs_rel_error = j.value("p90_abs_rel_error", 0.0);
  } catch (const Json::exception& e) {
    return Status::invalid_argument(fmt::format("{}: step model: {}", source, e.what()));
  }
  if (m.tp < 1) return Status::invalid_argument(fmt::format("{}: step model tp {} < 1", source, m.tp));
  return m;
}

}  // namespace

double StepTimeModel::predict_s(const StepFeatures& f) const {
  const auto over_knee = token_knee > 0 ? static_cast<double>(std::max<int64_t>(0, f.tokens - token_knee)) : 0.0;
  return fixed_s + std::max(weight_floor_s, per_token_s * static_cast<double>(f.tokens)) +
         per_token_over_knee_s * over_knee + per_sequence_s * static_cast<double>(f.sequences) +
         per_context_token_s * static_cast<double>(f.context_tokens) +
         per_attention_pair_s * static_cast<double>(f.attention_pairs) + per_block_s * static_cast<double>(f.blocks);
}

double StepTimeModel::jitter(double u, int64_t tokens) const {
  const std::vector<double>& q =
      tokens >= kLargeStepTokens && jitter_quantiles_large.size() >= 2 ? jitter_quantiles_large : jitter_quantiles;
  if (q.size() < 2) return 1.0;
  const double r = std::clamp(u, 0.0, 1.0) * static_cast<double>(q.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(r));
  const size_t hi = std::min(lo + 1, q.size() - 1);
  return q[lo] + (q[hi] - q[lo]) * (r - static_cast<double>(lo));
}

double StepTimeModel::block_factor(int64_t block_size, int64_t tokens) const {
  const BlockLevel* best = nullptr;
  double best_d = INFINITY;
  for (const BlockLevel& b : block_levels) {
    const double d = std::abs(std::log2(static_cast<double>(b.block_size)) - std::log2(static_cast<double>(std::max<int64_t>(block_size, 1))));
    if (d < best_d) best = &b, best_d = d;
  }
  if (best == nullptr) return 1.0;
  return tokens >= kLargeStepTokens ? best->large : best->small;
}

std::string StepTimeModel::key() const { return fmt::format("{}|{}|{}", model, card, tp); }

Result<StepTimeModel> fit_step_model(const std::vector<StepRecord>& steps, std::string model, std::string card,
                                     int tp, std::optional<double> per_block_s) {
  if (per_block_s && !(*per_block_s >= 0.0 && std::isfinite(*per_block_s)))
    return Status::invalid_argument(fmt::format("step model: a measured per-block cost of {} s", *per_block_s));
  const double per_block = per_block_s ? *per_block_s : -1.0;
  std::vector<const StepRecord*> use;
  for (const StepRecord& s : steps)
    if (s.features.tokens > 0 && s.total_s() > 0 && std::isfinite(s.total_s())) use.push_back(&s);
  if (use.size() < 8)
    return Status::invalid_argument(
        fmt::format("step model: {} steps with tokens, need at least 8 (run a load against `serve --step-log`)",
                    use.size()));
  auto varies = [&](auto get) {
    const auto [lo, hi] = std::minmax_element(use.begin(), use.end(),
                                              [&](const StepRecord* a, const StepRecord* b) { return get(*a) < get(*b); });
    return get(**lo) != get(**hi);
  };
  if (!varies([](const StepRecord& s) { return s.features.tokens; }))
    return Status::invalid_argument("step model: every step computed the same number of tokens; the fit needs "
                                    "steps of different sizes (mix prompt lengths and concurrency)");
  Fit fit = fit_once(use, per_block);
  // Drop steps that took far longer than the first fit says (a preempted process, a page-in), once.
  std::vector<const StepRecord*> kept;
  for (const StepRecord* s : use)
    if (s->total_s() <= 4.0 * fit.model.predict_s(s->features)) kept.push_back(s);
  if (kept.size() >= 8 && kept.size() < use.size()) fit = fit_once(kept, per_block);
  else kept = use;
  StepTimeModel m = fit.model;
  std::vector<double> empty;
  for (const StepRecord& s : steps)
    if (s.features.tokens == 0 && s.total_s() > 0 && std::isfinite(s.total_s())) empty.push_back(s.total_s());
  if (!empty.empty()) m.empty_step_s = quantile(empty, 0.5);
  m.model = std::move(model);
  m.card = std::move(card);
  m.tp = tp;
  m.fitted_steps = static_cast<int64_t>(kept.size());
  std::vector<double> err;
  for (const StepRecord* s : kept) err.push_back(std::abs(m.predict_s(s->features) - s->total_s()) / s->total_s());
  m.median_abs_rel_error = quantile(err, 0.5);
  m.p90_abs_rel_error = quantile(err, 0.9);
  std::vector<double> ratio;
  for (const StepRecord* s : kept) ratio.push_back(s->total_s() / m.predict_s(s->features));
  // The local level first (the calibration runs one server per block size: a block size's own
  // speed and the machine's phase during its run cannot be told apart, so both count as drift);
  // then, against it, what a block size does to small and large steps; the rest is jitter.
  const std::vector<double> level = local_levels(kept, ratio, StepTimeModel::kDriftWindowS);
  for (double q : {0.1, 0.5, 0.9}) m.drift_quantiles.push_back(quantile(level, q));
  for (size_t i = 0; i < kept.size(); ++i) ratio[i] /= level[i];
  m.block_levels = fit_block_levels(kept, ratio);
  std::vector<double> small, large;
  for (size_t i = 0; i < kept.size(); ++i)
    (kept[i]->features.tokens >= StepTimeModel::kLargeStepTokens ? large : small)
        .push_back(ratio[i] / m.block_factor(kept[i]->block_size, kept[i]->features.tokens));
  // Too few large steps to tell their tail: they share the small steps' quantiles.
  if (small.empty() || large.size() < 20) small.insert(small.end(), large.begin(), large.end());
  for (int q = 0; q <= 100; ++q) m.jitter_quantiles.push_back(quantile(small, q / 100.0));
  if (large.size() >= 20)
    for (int q = 0; q <= 100; ++q) m.jitter_quantiles_large.push_back(quantile(large, q / 100.0));
  std::vector<int64_t> sizes;
  for (const StepRecord* s : kept) sizes.push_back(s->block_size);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  m.source = fmt::format("fitted: {} measured steps ({} dropped as outliers), block sizes {}{}", kept.size(),
                         use.size() - kept.size(), fmt::join(sizes, "/"),
                         per_block_s ? fmt::format("; per block {:.1f} ns measured apart", *per_block_s * 1e9) : "");
  return m;
}

Result<double> step_level(const StepTimeModel& model, const std::vector<StepRecord>& steps) {
  std::vector<double> ratio;
  for (const StepRecord& s : steps) {
    if (s.features.tokens <= 0 || !(s.total_s() > 0)) continue;
    const double p = model.predict_s(s.features) * model.block_factor(s.block_size, s.features.tokens);
    if (p > 0) ratio.push_back(s.total_s() / p);
  }
  if (ratio.empty()) return Status::invalid_argument("step level: the log has no step that computed tokens");
  return quantile(std::move(ratio), 0.5);
}

Result<std::vector<StepRecord>> parse_step_log(std::string_view jsonl, std::string_view source) {
  std::vector<StepRecord> out;
  std::istringstream in{std::string(jsonl)};
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const Json j = Json::parse(line);
      StepRecord r;
      r.step_id = j.value("step", uint64_t{0});
      r.start_s = j.value("start_s", 0.0);
      r.schedule_s = j.value("schedule_s", 0.0);
      r.run_s = j.at("run_s").get<double>();
      r.commit_s = j.value("commit_s", 0.0);
      r.block_size = j.at("block_size").get<int64_t>();
      r.running = j.value("running", int64_t{0});
      r.waiting = j.value("waiting", int64_t{0});
      r.preemptions = j.value("preemptions", int64_t{0});
      StepFeatures& f = r.features;
      f.tokens = j.at("tokens").get<int64_t>();
      f.sequences = j.at("sequences").get<int64_t>();
      f.decode_seqs = j.value("decode_seqs", int64_t{0});
      f.prefill_tokens = j.value("prefill_tokens", f.tokens - f.decode_seqs);
      f.context_tokens = j.at("context_tokens").get<int64_t>();
      f.attention_pairs = j.at("attention_pairs").get<int64_t>();
      f.blocks = j.at("blocks").get<int64_t>();
      if (r.run_s < 0 || r.block_size < 1 || f.tokens < 0)
        return Status::invalid_argument(fmt::format("{}:{}: negative time or count", source, n));
      out.push_back(r);
    } catch (const Json::exception& e) {
      return Status::invalid_argument(fmt::format("{}:{}: not a step record: {}", source, n, e.what()));
    }
  }
  return out;
}

Result<std::vector<StepRecord>> load_step_log(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::io_error(fmt::format("{}: cannot read the step log", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_step_log(ss.str(), path);
}

StepTimeModel prior_step_model(const Plan& plan, const PriorEfficiency& eff) {
  const PlanInput& in = plan.input;
  const CardSpec& card = in.card;
  const MemoryBill& mem = plan.memory;
  const TimeBill& t = plan.time;
  const double bw = card.memory_bandwidth * eff.bandwidth;
  const double peak = card.peak_flops * eff.compute;
  StepTimeModel m;
  m.model = in.model_name;
  m.card = card.name;
  m.tp = in.tp;
  m.weight_floor_s = static_cast<double>(t.weight_bytes_read) / bw;
  // The LM head multiplies only the rows that sample (one per sequence), the layers every token.
  const double head_params = static_cast<double>(mem.vocab_per_rank) * static_cast<double>(in.model.hidden);
  const double layer_params = std::max(0.0, static_cast<double>(mem.matrix_params_per_rank) - head_params);
  m.per_token_s = 2.0 * layer_params / peak;
  m.per_context_token_s = static_cast<double>(mem.kv_bytes_per_token) / bw;
  m.per_attention_pair_s =
      4.0 * static_cast<double>(mem.q_heads_per_rank * in.model.head_dim * in.model.n_layers) / peak;
  // Collectives: the hop latencies per step are fixed, the bytes grow with the tokens.
  const LinkSpec& link = plan.link;
  const uint64_t token_bytes = static_cast<uint64_t>(in.model.hidden) * static_cast<uint64_t>(card.activation_bytes);
  const double ar0 = ring_all_reduce_s(0, in.tp, link);
  const double ar1 = ring_all_reduce_s(token_bytes, in.tp, link);
  m.fixed_s = t.launch_graph_s + t.all_reduces_per_step * ar0 + ring_all_gather_s(0, in.tp, link);
  m.per_token_s += t.all_reduces_per_step * (ar1 - ar0);
  // A sequence's logits: written and read once (fp32), gathered across ranks for sampling.
  const double gather1 = ring_all_gather_s(static_cast<uint64_t>(mem.vocab_per_rank) * 4, in.tp, link) -
                         ring_all_gather_s(0, in.tp, link);
  m.per_sequence_s = 2.0 * head_params / peak + 2.0 * static_cast<double>(mem.vocab_per_rank) * 4.0 / bw + gather1;
  // A block: one 128-byte transaction per layer and KV head for its table entry and the
  // misaligned tail of its keys and values.
  m.per_block_s = static_cast<double>(in.model.n_layers * mem.kv_heads_per_rank) * 128.0 / bw;
  m.source = fmt::format("prior: roofline of {} {} on {} x{} (bandwidth x{:.2f}, FLOP/s x{:.2f})", in.model_name,
                         in.weights.name, card.name, in.tp, eff.bandwidth, eff.compute);
  return m;
}

std::string step_model_to_json(const StepTimeModel& m) { return to_json(m).dump(2); }

Result<StepTimeModel> step_model_from_json(std::string_view json, std::string_view source) {
  try {
    return from_json(Json::parse(json), source);
  } catch (const Json::exception& e) {
    return Status::invalid_argument(fmt::format("{}: not JSON: {}", source, e.what()));
  }
}

Result<std::vector<StepTimeModel>> load_step_models(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::not_found(fmt::format("{}: no step models (run `tessera tune calibrate`)", path));
  std::vector<StepTimeModel> out;
  try {
    const Json j = Json::parse(in);
    for (const Json& e : j.at("models")) {
      auto m = from_json(e, path);
      if (!m.is_ok()) return m.status();
      out.push_back(std::move(*m));
    }
  } catch (const Json::exception& e) {
    return Status::invalid_argument(fmt::format("{}: not a step-model store: {}", path, e.what()));
  }
  return out;
}

Status save_step_model(const std::string& path, const StepTimeModel& model) {
  std::vector<StepTimeModel> all;
  if (std::ifstream probe(path); probe) {
    auto existing = load_step_models(path);
    if (!existing.is_ok()) return existing.status();
    all = std::move(*existing);
  }
  std::erase_if(all, [&](const StepTimeModel& m) { return m.card == model.card && m.tp == model.tp; });
  all.push_back(model);
  Json j{{"models", Json::array()}};
  for (const StepTimeModel& m : all) j["models"].push_back(to_json(m));
  std::ofstream out(path, std::ios::trunc);
  if (!out) return Status::io_error(fmt::format("{}: cannot write the step models", path));
  out << j.dump(2) << "\n";
  if (!out) return Status::io_error(fmt::format("{}: write failed", path));
  return Status::ok();
}

std::string step_model_path(const std::string& model_path) { return model_path + ".steps.json"; }

const StepTimeModel* find_step_model(const std::vector<StepTimeModel>& models, std::string_view card, int tp) {
  for (const StepTimeModel& m : models)
    if (m.card == card && m.tp == tp) return &m;
  return nullptr;
}

std::string format_step_model(const StepTimeModel& m) {
  std::string out = fmt::format("step model {} | {} | TP {}  ({})\n", m.model, m.card, m.tp, m.source);
  out += fmt::format("  fixed {:.1f} us, weights floor {:.1f} us, per token {:.2f} us, per sequence {:.2f} us\n",
                     m.fixed_s * 1e6, m.weight_floor_s * 1e6, m.per_token_s * 1e6, m.per_sequence_s * 1e6);
  if (m.token_knee > 0)
    out += fmt::format("  per token past {} tokens in a step: +{:.2f} us\n", m.token_knee, m.per_token_over_knee_s * 1e6);
  out += fmt::format("  per context token {:.3f} ns, per attention pair {:.4f} ns, per block {:.1f} ns, empty step {:.1f} us\n",
                     m.per_context_token_s * 1e9, m.per_attention_pair_s * 1e9, m.per_block_s * 1e9, m.empty_step_s * 1e6);
  if (m.fitted_steps > 0)
    out += fmt::format("  fit: {} steps, |relative error| median {:.1f}%, p90 {:.1f}%\n", m.fitted_steps,
                       100 * m.median_abs_rel_error, 100 * m.p90_abs_rel_error);
  if (m.jitter_quantiles.size() > 2)
    out += fmt::format("  jitter (measured / predicted, against the local level), small steps: p10 {:.2f}, p50 {:.2f}, p90 {:.2f}, p99 {:.2f}\n",
                       m.jitter(0.1), m.jitter(0.5), m.jitter(0.9), m.jitter(0.99));
  if (!m.block_levels.empty()) {
    out += "  block size factors (small / large steps):";
    for (const StepTimeModel::BlockLevel& b : m.block_levels)
      out += fmt::format(" {}: {:.2f} / {:.2f};", b.block_size, b.small, b.large);
    out.back() = '\n';
  }
  if (m.drift_quantiles.size() == 3)
    out += fmt::format("  machine drift (local level of measured / predicted over +-{:g} s, not simulated): p10 {:.2f}, p50 {:.2f}, p90 {:.2f}\n",
                       StepTimeModel::kDriftWindowS, m.drift_quantiles[0], m.drift_quantiles[1], m.drift_quantiles[2]);
  if (m.jitter_quantiles_large.size() > 2) {
    const int64_t t = StepTimeModel::kLargeStepTokens;
    out += fmt::format("  jitter, steps of {}+ tokens: p10 {:.2f}, p50 {:.2f}, p90 {:.2f}, p99 {:.2f}\n", t,
                       m.jitter(0.1, t), m.jitter(0.5, t), m.jitter(0.9, t), m.jitter(0.99, t));
  }
  return out;
}

}  // namespace tessera
