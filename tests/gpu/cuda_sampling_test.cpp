// The device sampler (tessera_cuda_sample_f32) against the CPU Sampler (kernels/sampling.h) on
// the same logits, parameters, token history and draw position: the same token, the same
// penalised / sanitised logits (bit for bit), logprobs within 1e-4. Grids of vocabulary sizes,
// parameter sets and kinds of rows (random, flat, groups of ties, NaN / inf, all -inf, peaked),
// many seeds and output positions; plus the unshard reorder, a CUDA graph replay and bad
// arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/sampling.h"
#include "shard/cuda_forward.h"
#include "tests/gpu/gpu_test_util.h"

namespace tessera {
namespace {

using gpu_test::gaussian;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int kMaxTop = TESSERA_CUDA_MAX_TOP_LOGPROBS;
constexpr int32_t kUntouched = -7;  // top_ids past n_logprobs must keep it

// One row: logits, parameters and the sequence's history.
struct Case {
  std::vector<float> logits;
  SamplingParams params;
  std::vector<int32_t> prompt, output, banned;
  std::string what;
};

// What the CPU Sampler gives for a case.
struct Expected {
  SampledToken token;
  std::vector<float> logits;  // after sample(): penalised and sanitised
  double u = 0.0;
};

// A sampler in the case's state: its prompt seen, its output accepted.
Sampler case_sampler(const Case& c) {
  Sampler sampler(c.params);
  sampler.add_prompt_tokens(c.prompt);
  for (int32_t id : c.output) sampler.accept(id);
  return sampler;
}

Expected cpu_sample(const Case& c) {
  Sampler sampler = case_sampler(c);
  Expected e;
  e.u = sampling_uniform(sampler.seed(), static_cast<uint64_t>(sampler.num_output_tokens()));
  e.logits = c.logits;
  for (int32_t id : c.banned) e.logits[static_cast<size_t>(id)] = -kInf;
  e.token = sampler.sample(e.logits.data(), static_cast<int64_t>(e.logits.size()));
  return e;
}

// The case's row and penalty entries as the shard builds them (device_sample_row): the same
// uniform, penalties and bans the CPU sampler applies.
TesseraCudaSampleRow device_row(const Case& c, std::vector<TesseraCudaPenalty>& penalties) {
  return device_sample_row(case_sampler(c), c.banned, penalties);
}

// A row of `p` that draws the uniform u, without penalty entries.
TesseraCudaSampleRow device_row(const SamplingParams& p, double u) {
  std::vector<TesseraCudaPenalty> none;
  TesseraCudaSampleRow row = device_sample_row(Sampler(p), {}, none);
  row.u = u;
  return row;
}

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

// Logprobs: equal when not finite (-inf for masked tokens), else within 1e-4 (the device sums
// e^(x - max) in another order and uses its own log).
void expect_logprob(float got, float want, const std::string& what) {
  if (!std::isfinite(want) || !std::isfinite(got)) {
    EXPECT_EQ(got, want) << what;
  } else {
    EXPECT_NEAR(got, want, 1e-4 + 1e-6 * std::fabs(want)) << what;
  }
}

class CudaSampling : public gpu_test::GpuTest {
 protected:
  // Samples every case (all of one vocabulary) in one launch and compares with the CPU.
  void check(const std::vector<Case>& cases, int64_t vocab) {
    const auto n = static_cast<int64_t>(cases.size());
    std::vector<float> logits;
    std::vector<TesseraCudaSampleRow> rows;
    std::vector<TesseraCudaPenalty> penalties;
    std::vector<Expected> want;
    for (const Case& c : cases) {
      ASSERT_EQ(static_cast<int64_t>(c.logits.size()), vocab) << c.what;
      want.push_back(cpu_sample(c));
      logits.insert(logits.end(), c.logits.begin(), c.logits.end());
      rows.push_back(device_row(c, penalties));
    }
    if (penalties.empty()) penalties.push_back(TesseraCudaPenalty{-1, 0, 0, 0});  // a valid pointer
    float* d_logits = to_device(logits);
    TesseraCudaSampleArgs args{};
    args.logits = d_logits;
    args.scratch = alloc<float>(n * vocab);
    args.rows = to_device(rows);
    args.penalties = to_device(penalties);
    args.n_rows = n;
    args.vocab = vocab;
    args.ids = alloc<int32_t>(n);
    args.logprobs = alloc<float>(n);
    args.top_ids = to_device(std::vector<int32_t>(static_cast<size_t>(n * kMaxTop), kUntouched));
    args.top_logprobs = alloc<float>(n * kMaxTop);
    ASSERT_EQ(api_->sample_f32(&args, nullptr), 0) << api_->last_error();
    const std::vector<int32_t> ids = to_host(args.ids, n), top_ids = to_host(args.top_ids, n * kMaxTop);
    const std::vector<float> lps = to_host(args.logprobs, n), top_lps = to_host(args.top_logprobs, n * kMaxTop);
    const std::vector<float> out_logits = to_host(d_logits, n * vocab);
    for (int64_t r = 0; r < n; ++r) {
      const Case& c = cases[static_cast<size_t>(r)];
      const Expected& e = want[static_cast<size_t>(r)];
      const std::string what = c.what + " vocab=" + std::to_string(vocab) + " u=" + std::to_string(e.u);
      ASSERT_EQ(ids[static_cast<size_t>(r)], e.token.id) << what;
      for (int64_t i = 0; i < vocab; ++i)
        ASSERT_EQ(bits(out_logits[static_cast<size_t>(r * vocab + i)]), bits(e.logits[static_cast<size_t>(i)]))
            << what << " logit " << i;
      const bool want_logprobs = c.params.return_logprob || c.params.n_logprobs > 0;
      if (want_logprobs) {
        expect_logprob(lps[static_cast<size_t>(r)], e.token.logprob, what + " logprob");
      } else {
        EXPECT_EQ(lps[static_cast<size_t>(r)], 0.0f) << what;
      }
      const auto n_top = static_cast<int64_t>(e.token.top_logprobs.size());
      for (int64_t j = 0; j < kMaxTop; ++j) {
        const size_t at = static_cast<size_t>(r * kMaxTop + j);
        if (j >= n_top) {
          ASSERT_EQ(top_ids[at], kUntouched) << what << " top " << j;
          continue;
        }
        ASSERT_EQ(top_ids[at], e.token.top_logprobs[static_cast<size_t>(j)].first) << what << " top " << j;
        expect_logprob(top_lps[at], e.token.top_logprobs[static_cast<size_t>(j)].second,
                       what + " top " + std::to_string(j));
      }
    }
  }
};

SamplingParams params(float temperature, int32_t top_k = 0, float top_p = 1.0f, float min_p = 0.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.has_seed = true;
  return p;
}
SamplingParams with_penalties(SamplingParams p) {
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  return p;
}
SamplingParams with_logprobs(SamplingParams p, int32_t n) {
  p.n_logprobs = n;
  p.return_logprob = true;
  return p;
}

// The parameter sets of the grid, for a vocabulary.
std::vector<std::pair<std::string, SamplingParams>> param_grid(int32_t vocab) {
  return {
      {"greedy", params(0.0f)},
      {"greedy+penalties+lp5", with_logprobs(with_penalties(params(0.0f)), 5)},
      {"T1", params(1.0f)},
      {"T0.5", params(0.5f)},
      {"T1.7+lp0", with_logprobs(params(1.7f), 0)},
      {"k1", params(1.0f, 1)},
      {"k5", params(1.0f, 5)},
      {"k40", params(0.8f, 40)},
      {"k=vocab-1", params(1.0f, vocab - 1)},
      {"k=vocab+3", params(1.0f, vocab + 3)},
      {"p1e-6", params(1.0f, 0, 1e-6f)},
      {"p0.5", params(1.0f, 0, 0.5f)},
      {"p0.9", params(1.2f, 0, 0.9f)},
      {"minp0.05", params(1.0f, 0, 1.0f, 0.05f)},
      {"minp0.3", params(1.0f, 0, 1.0f, 0.3f)},
      {"minp1", params(1.0f, 0, 1.0f, 1.0f)},
      {"k40+p0.9+minp0.05", params(0.7f, 40, 0.9f, 0.05f)},
      {"k5+p0.5+lp1", with_logprobs(params(1.0f, 5, 0.5f), 1)},
      {"minp0.3+p0.9", params(1.5f, 0, 0.9f, 0.3f)},
      {"k40+penalties", with_penalties(params(1.0f, 40))},
      {"penalties+lp20", with_logprobs(with_penalties(params(1.0f)), 20)},
      {"p0.9+lp20", with_logprobs(params(1.0f, 0, 0.9f), 20)},
      {"k=vocab-1+p0.5+lp5", with_logprobs(params(1.0f, vocab - 1, 0.5f), 5)},
      {"k40+minp0.3+T1.7", params(1.7f, 40, 1.0f, 0.3f)},
      {"minp0.05+penalties+lp1", with_logprobs(with_penalties(params(0.5f, 0, 1.0f, 0.05f)), 1)},
  };
}

constexpr int kKinds = 7;
const char* const kKindNames[kKinds] = {"gauss2", "gauss4", "flat", "tie-groups", "nan-inf", "all-inf", "peaked"};

std::vector<float> make_logits(int kind, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> any(0, vocab - 1);
  std::vector<float> x;
  switch (kind) {
    case 0:
      return gaussian(vocab, seed, 2.0f);
    case 1:
      return gaussian(vocab, seed, 4.0f);
    case 2:
      return std::vector<float>(static_cast<size_t>(vocab), 1.25f);
    case 3:  // 5 values, each shared by a fifth of the ids in a scattered pattern
      x.resize(static_cast<size_t>(vocab));
      for (int64_t i = 0; i < vocab; ++i) x[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 5) * 0.75f - 1.0f;
      return x;
    case 4:  // NaN and -inf here and there; on odd seeds also two +inf (a tie at the top)
      x = gaussian(vocab, seed, 3.0f);
      for (int k = 0; k < 4; ++k) x[static_cast<size_t>(any(rng))] = kNaN;
      for (int k = 0; k < 4; ++k) x[static_cast<size_t>(any(rng))] = -kInf;
      if (seed % 2) {
        x[static_cast<size_t>(any(rng))] = kInf;
        x[static_cast<size_t>(any(rng))] = kInf;
      }
      return x;
    case 5:  // all -inf (and NaN): the uniform distribution
      x.assign(static_cast<size_t>(vocab), -kInf);
      x[static_cast<size_t>(any(rng))] = kNaN;
      return x;
    default:  // one token far ahead of the rest
      x = gaussian(vocab, seed, 1.0f);
      x[static_cast<size_t>(any(rng))] = 25.0f;
      return x;
  }
}

// reps rows per (parameter set, kind), each with its own seed, history and draw position.
void build_grid(int64_t vocab, int reps, std::vector<std::vector<Case>>* batches) {
  const auto grid = param_grid(static_cast<int32_t>(vocab));
  for (size_t g = 0; g < grid.size(); ++g) {
    std::vector<Case> batch;
    for (int kind = 0; kind < kKinds; ++kind)
      for (int rep = 0; rep < reps; ++rep) {
        const uint32_t seed = static_cast<uint32_t>(vocab * 7919 + g * 1000003 + kind * 7777 + rep * 31 + 1);
        std::mt19937 rng(seed);
        std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(vocab - 1));
        Case c;
        c.logits = make_logits(kind, vocab, seed);
        c.params = grid[g].second;
        c.params.seed = seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(rep);
        const int n_prompt = 3 + rep % 5, n_output = rep % 7;
        for (int k = 0; k < n_prompt; ++k) c.prompt.push_back(any(rng));
        if (rep % 4 == 1) c.prompt.push_back(static_cast<int32_t>(vocab + 3));  // ignored: outside the vocabulary
        for (int k = 0; k < n_output; ++k) c.output.push_back(k > 0 && k % 3 == 0 ? c.output[0] : any(rng));
        if (rep % 3 == 2) {
          c.banned.push_back(any(rng));
          const int32_t b = any(rng);
          if (b != c.banned[0]) c.banned.push_back(b);
        }
        c.what = grid[g].first + " " + kKindNames[kind] + " rep " + std::to_string(rep);
        batch.push_back(std::move(c));
      }
    batches->push_back(std::move(batch));
  }
}

TEST_F(CudaSampling, MatchesCpuSamplerSmallVocabularies) {
  for (int64_t vocab : {1, 7, 1000}) {
    std::vector<std::vector<Case>> batches;
    build_grid(vocab, vocab == 1 ? 4 : 50, &batches);
    for (const auto& batch : batches) {
      check(batch, vocab);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(CudaSampling, MatchesCpuSamplerLargeVocabularies) {
  for (int64_t vocab : {32000, 128256}) {
    std::vector<std::vector<Case>> batches;
    build_grid(vocab, vocab == 32000 ? 2 : 1, &batches);
    for (const auto& batch : batches) {
      check(batch, vocab);
      if (HasFatalFailure()) return;
    }
  }
}

// Many draws on one row of exact ties (weights 1 or e^-1/T...): the draw's tie order and the
// top-k / top-p cuts inside a tie group must agree with the CPU for every u.
TEST_F(CudaSampling, TieGroupsManyDraws) {
  const int64_t vocab = 300;
  std::vector<Case> batch;
  const std::pair<std::string, SamplingParams> sets[] = {
      {"flat-k7", params(1.0f, 7)}, {"flat-p0.37", params(1.0f, 0, 0.37f)},   {"k50+p0.6", params(0.9f, 50, 0.6f)},
      {"plain", params(1.3f)},      {"minp0.5", params(1.0f, 0, 1.0f, 0.5f)},
  };
  for (const auto& [name, p] : sets)
    for (int kind : {2, 3})
      for (int rep = 0; rep < 200; ++rep) {
        Case c;
        c.logits = make_logits(kind, vocab, 1);
        c.params = p;
        c.params.seed = 1234 + static_cast<uint64_t>(rep) * 977;
        for (int k = 0; k < rep % 3; ++k) c.output.push_back(0);  // no penalties: only the counter moves
        c.what = name + " " + kKindNames[kind] + " rep " + std::to_string(rep);
        batch.push_back(std::move(c));
      }
  check(batch, vocab);
}

// A captured launch replays with the same results as the eager one (fresh logits each time: the
// sampler modifies them).
TEST_F(CudaSampling, GraphReplayMatchesEager) {
  const int64_t vocab = 5000, n = 4;
  std::vector<float> logits = gaussian(n * vocab, 21, 3.0f);
  std::vector<TesseraCudaSampleRow> rows;
  for (int64_t r = 0; r < n; ++r) {
    SamplingParams p = with_logprobs(params(1.0f, r == 1 ? 40 : 0, r == 2 ? 0.9f : 1.0f), 3);
    rows.push_back(device_row(p, sampling_uniform(99, static_cast<uint64_t>(r))));
  }
  float* d_logits = to_device(logits);
  TesseraCudaSampleArgs args{};
  args.logits = d_logits;
  args.scratch = alloc<float>(n * vocab);
  args.rows = to_device(rows);
  args.n_rows = n;
  args.vocab = vocab;
  args.ids = alloc<int32_t>(n);
  args.logprobs = alloc<float>(n);
  args.top_ids = alloc<int32_t>(n * kMaxTop);
  args.top_logprobs = alloc<float>(n * kMaxTop);
  ASSERT_EQ(api_->sample_f32(&args, nullptr), 0) << api_->last_error();
  const std::vector<int32_t> ids = to_host(args.ids, n), top_ids = to_host(args.top_ids, n * kMaxTop);
  const std::vector<float> lps = to_host(args.logprobs, n);

  void* stream = nullptr;
  ASSERT_EQ(api_->stream_create(&stream), 0) << api_->last_error();
  void* graph = nullptr;
  ASSERT_EQ(api_->graph_begin_capture(stream), 0) << api_->last_error();
  ASSERT_EQ(api_->sample_f32(&args, stream), 0) << api_->last_error();
  ASSERT_EQ(api_->graph_end_capture(stream, &graph), 0) << api_->last_error();
  for (int replay = 0; replay < 2; ++replay) {
    ASSERT_EQ(api_->device_memcpy(d_logits, logits.data(), n * vocab * static_cast<int64_t>(sizeof(float))), 0);
    ASSERT_EQ(api_->device_memset(args.ids, 0xff, n * static_cast<int64_t>(sizeof(int32_t))), 0);
    ASSERT_EQ(api_->graph_launch(graph, stream), 0) << api_->last_error();
    ASSERT_EQ(api_->stream_synchronize(stream), 0) << api_->last_error();
    EXPECT_EQ(to_host(args.ids, n), ids) << "replay " << replay;
    EXPECT_EQ(to_host(args.top_ids, n * kMaxTop), top_ids) << "replay " << replay;
    EXPECT_EQ(to_host(args.logprobs, n), lps) << "replay " << replay;
  }
  EXPECT_EQ(api_->graph_destroy(graph), 0);
  EXPECT_EQ(api_->stream_destroy(stream), 0);
}

TEST_F(CudaSampling, BadArgumentsFailWithAMessage) {
  const int64_t vocab = 16;
  TesseraCudaSampleArgs good{};
  good.logits = alloc<float>(2 * vocab);
  good.scratch = alloc<float>(2 * vocab);
  good.rows = to_device(std::vector<TesseraCudaSampleRow>(2, device_row(params(1.0f), 0.5)));
  good.n_rows = 2;
  good.vocab = vocab;
  good.ids = alloc<int32_t>(2);
  good.logprobs = alloc<float>(2);
  good.top_ids = alloc<int32_t>(2 * kMaxTop);
  good.top_logprobs = alloc<float>(2 * kMaxTop);
  auto expect_fails = [&](TesseraCudaSampleArgs a, const char* word, const char* what) {
    EXPECT_NE(api_->sample_f32(&a, nullptr), 0) << what;
    const std::string message = api_->last_error();
    EXPECT_NE(message.find("tessera_cuda_sample_f32"), std::string::npos) << what << ": " << message;
    EXPECT_NE(message.find(word), std::string::npos) << what << ": " << message;
  };
  TesseraCudaSampleArgs a = good;
  a.vocab = 0;
  expect_fails(a, "vocab", "vocab 0");
  a.vocab = (int64_t{1} << 20) + 1;
  expect_fails(a, "vocab", "vocab 2^20 + 1");
  a = good;
  a.n_rows = -1;
  expect_fails(a, "n_rows", "n_rows -1");
  a = good;
  a.rows = nullptr;
  expect_fails(a, "rows", "null rows");
  a = good;
  a.scratch = nullptr;
  expect_fails(a, "scratch", "null scratch");
  EXPECT_NE(api_->sample_f32(nullptr, nullptr), 0);
  a = good;
  a.n_rows = 0;
  EXPECT_EQ(api_->sample_f32(&a, nullptr), 0) << api_->last_error();
  EXPECT_EQ(api_->sample_f32(&good, nullptr), 0) << api_->last_error();
  EXPECT_EQ(api_->device_synchronize(), 0) << api_->last_error();

  float* out = alloc<float>(vocab);
  EXPECT_NE(api_->unshard_logits_f32(good.logits, 1, vocab, 5, 3, out, nullptr), 0);  // 5 * 3 < 16
  EXPECT_NE(std::string(api_->last_error()).find("tessera_cuda_unshard_logits_f32"), std::string::npos);
  EXPECT_NE(api_->unshard_logits_f32(good.logits, 1, vocab, 16, 0, out, nullptr), 0);
  EXPECT_NE(api_->unshard_logits_f32(good.logits, 1, 0, 16, 1, out, nullptr), 0);
}

// Rank r's chunk holds its count_r columns of every row packed at the chunk's front; the rest of
// the chunk is padding (NaN here) that must not reach the output.
TEST_F(CudaSampling, UnshardLogits) {
  for (int64_t tp : {1, 2, 3})
    for (int64_t vocab : {1, 10, 1001, 32003}) {
      const int64_t n_rows = 3, per_rank = (vocab + tp - 1) / tp;
      const std::vector<float> full = gaussian(n_rows * vocab, static_cast<uint32_t>(vocab + tp));
      std::vector<float> gathered(static_cast<size_t>(tp * n_rows * per_rank), kNaN);
      for (int64_t r = 0; r < tp; ++r) {
        const int64_t begin = std::min(vocab, r * per_rank), count = std::min(vocab, (r + 1) * per_rank) - begin;
        for (int64_t t = 0; t < n_rows; ++t)
          for (int64_t i = 0; i < count; ++i)
            gathered[static_cast<size_t>(r * n_rows * per_rank + t * count + i)] =
                full[static_cast<size_t>(t * vocab + begin + i)];
      }
      const float* d_gathered = to_device(gathered);
      float* d_out = alloc<float>(n_rows * vocab);
      ASSERT_EQ(api_->unshard_logits_f32(d_gathered, n_rows, vocab, per_rank, tp, d_out, nullptr), 0)
          << api_->last_error();
      EXPECT_EQ(to_host(d_out, n_rows * vocab), full) << "tp=" << tp << " vocab=" << vocab;
    }
}

}  // namespace
}  // namespace tessera
