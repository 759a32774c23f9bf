// CPU token sampling; the contract (order of operations, determinism) is in kernels/sampling.h.
//
// This file is compiled with -ffp-contract=off (kernels/CMakeLists.txt): the draw must not
// depend on whether the compiler fused a multiply-add, or the same seed would pick a different
// token on an FMA machine.
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#include "kernels/sampling.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include <fmt/format.h>

#include "common/check.h"
#include "common/thread_pool.h"
#include "kernels/cpu/vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TESSERA_SAMPLING_AVX512 __attribute__((target("avx512f,avx512dq")))
#endif

namespace tessera {
namespace {

// w[i] = float(sampling_exp((double(logits[i]) - max) / temperature)) for i in [0, n): the weights
// of the draw. The AVX-512 path runs sampling_exp's steps on 8 doubles at once - the same IEEE
// +, -, *, / in the same order (no contraction: this file is built with -ffp-contract=off), so
// every weight has the same bits as the scalar loop's.
#ifdef TESSERA_SAMPLING_AVX512
TESSERA_SAMPLING_AVX512 int64_t weights_avx512(const float* logits, int64_t n, double max, double temperature,
                                               float* w, double* lane) {
  using namespace sampling_exp_constants;
  __m512d sum = _mm512_setzero_pd();
  const __m512d vmax = _mm512_set1_pd(max), vt = _mm512_set1_pd(temperature);
  const __m512d log2e = _mm512_set1_pd(kLog2e), shifter = _mm512_set1_pd(kShifter);
  const __m512d ln2hi = _mm512_set1_pd(kLn2Hi), ln2lo = _mm512_set1_pd(kLn2Lo);
  const __m512d lo = _mm512_set1_pd(kLowest);
  const __m512i shifter_bits = _mm512_set1_epi64(std::bit_cast<int64_t>(kShifter));
  const __m512i bias = _mm512_set1_epi64(1023);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d x = _mm512_div_pd(_mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(logits + i)), vmax), vt);
    const __mmask8 underflow = _mm512_cmp_pd_mask(x, lo, _CMP_NGT_UQ);  // !(x > -700), NaN included
    const __m512d xc = _mm512_mask_blend_pd(underflow, x, lo);
    const __m512d t = _mm512_add_pd(_mm512_mul_pd(xc, log2e), shifter);
    const __m512d nn = _mm512_sub_pd(t, shifter);
    const __m512d r = _mm512_sub_pd(_mm512_sub_pd(xc, _mm512_mul_pd(nn, ln2hi)), _mm512_mul_pd(nn, ln2lo));
    __m512d p = _mm512_set1_pd(kTaylor[0]);
    for (size_t k = 1; k < std::size(kTaylor); ++k) p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(kTaylor[k]));
    const __m512i ni = _mm512_sub_epi64(_mm512_castpd_si512(t), shifter_bits);
    const __m512d scale = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(ni, bias), 52));
    const __m512d e = _mm512_maskz_mov_pd(static_cast<__mmask8>(~underflow), _mm512_mul_pd(p, scale));
    const __m256 wf = _mm512_cvtpd_ps(e);
    _mm256_storeu_ps(w + i, wf);
    sum = _mm512_add_pd(sum, _mm512_cvtps_pd(wf));  // lane j: the weights i = j (mod 8)
  }
  _mm512_storeu_pd(lane, sum);
  return i;
}
#endif

// The weights of one block of ids and its 8 lane sums: lane j adds the weights i = j (mod 8) of
// the block in increasing i.
void block_weights(const float* logits, int64_t n, double max, double temperature, float* w, double* lane) {
  for (int j = 0; j < 8; ++j) lane[j] = 0.0;
  int64_t i = 0;
#ifdef TESSERA_SAMPLING_AVX512
  if (cpu::active_isa() == cpu::Isa::kAvx512) i = weights_avx512(logits, n, max, temperature, w, lane);
#endif
  for (; i < n; ++i) {
    w[i] = static_cast<float>(sampling_exp((static_cast<double>(logits[i]) - max) / temperature));
    lane[i % 8] += static_cast<double>(w[i]);
  }
}

// Ids per block of the weight pass: a multiple of 8, and the unit of the pool's work.
constexpr int64_t kWeightBlock = 16384;

int64_t weight_blocks(int64_t n) { return (n + kWeightBlock - 1) / kWeightBlock; }
bool runs_parallel(const ThreadPool* pool, int64_t n_blocks) {
  return pool != nullptr && pool->size() > 1 && n_blocks > 1;
}
// fn(first block, end block, thread) over the weight blocks of n ids: on the pool when that pays.
void for_weight_blocks(int64_t n, ThreadPool* pool, const std::function<void(int64_t, int64_t, int)>& fn) {
  const int64_t n_blocks = weight_blocks(n);
  if (runs_parallel(pool, n_blocks))
    pool->parallel_for(n_blocks, 1, fn);
  else
    fn(0, n_blocks, 0);
}

// Returns the weights' sum in double in one fixed order whatever the ISA and the thread count
// (kernels/sampling.h): blocks of kWeightBlock ids each give 8 lane sums (block_weights); lane j
// adds its blocks' sums in block order; then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
// Free of the 4-cycle dependency chain of one running sum; the blocks run on `pool` when given.
double compute_weights(const float* logits, int64_t n, double max, double temperature, float* w, ThreadPool* pool) {
  const int64_t n_blocks = weight_blocks(n);
  thread_local std::vector<double> partial;  // the workers reach it through `part`
  partial.assign(static_cast<size_t>(n_blocks) * 8, 0.0);
  double* part = partial.data();
  for_weight_blocks(n, pool, [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t at = b * kWeightBlock;
      block_weights(logits + at, std::min(kWeightBlock, n - at), max, temperature, w + at, part + 8 * b);
    }
  });
  double lane[8] = {};
  for (int64_t b = 0; b < n_blocks; ++b)
    for (int j = 0; j < 8; ++j) lane[j] += part[8 * b + j];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// The maximum and its first index when no value is NaN or +inf (then returns true; -inf, the
// logit of a banned or masked token, is an ordinary value here); false as soon as one is (the
// caller's scalar pass handles those).
#ifdef TESSERA_SAMPLING_AVX512
// The maximum of v[0, 16 * (n / 16)); false when one of them is NaN or +inf.
TESSERA_SAMPLING_AVX512 bool finite_max_avx512(const float* v, int64_t n, float* mx) {
  __m512 vm = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  __mmask16 bad = 0;
  for (int64_t i = 0; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(v + i);
    bad |= static_cast<__mmask16>(_mm512_cmp_ps_mask(x, inf, _CMP_NLT_UQ));  // +inf or NaN
    vm = _mm512_max_ps(vm, x);
  }
  *mx = _mm512_reduce_max_ps(vm);
  return bad == 0;
}

// The first index of v[0, n) holding `mx` (n when none): 16 compares at a time.
TESSERA_SAMPLING_AVX512 int64_t first_equal_avx512(const float* v, int64_t n, float mx) {
  const __m512 m = _mm512_set1_ps(mx);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(v + i), m, _CMP_EQ_OQ);
    if (eq != 0) return i + std::countr_zero(static_cast<uint32_t>(eq));
  }
  for (; i < n; ++i)
    if (v[i] == mx) return i;
  return n;
}
#endif

bool finite_argmax(const float* v, int64_t n, float* max_out, int64_t* arg_out) {
  float mx = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#ifdef TESSERA_SAMPLING_AVX512
  if (cpu::active_isa() == cpu::Isa::kAvx512 && n >= 16) {
    if (!finite_max_avx512(v, n, &mx)) return false;
    i = n / 16 * 16;
  }
#endif
  for (; i < n; ++i) {
    if (std::isnan(v[i]) || v[i] == std::numeric_limits<float>::infinity()) return false;
    mx = std::max(mx, v[i]);
  }
  int64_t arg = 0;  // the first maximum
#ifdef TESSERA_SAMPLING_AVX512
  if (cpu::active_isa() == cpu::Isa::kAvx512) {
    arg = first_equal_avx512(v, n, mx);
  } else
#endif
  {
    while (arg < n && v[arg] != mx) ++arg;
  }
  *max_out = mx;
  *arg_out = arg;
  return true;
}

// (key, id): key is a logit or a weight. Candidates are ordered by key descending, then id
// ascending, so every selection below is a total order and independent of the algorithm used.
using Candidate = std::pair<float, int32_t>;

struct Before {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  }
};

// Up to this k, selection is one scan with a small sorted window (no writes for most
// elements); above it, nth_element over the whole scratch.
constexpr int64_t kSmallSelect = 64;

// One buffer per sampling thread, grown to the largest vocabulary seen, reused by every
// sequence: per-sequence vocabulary-sized buffers would cost gigabytes with many sequences.
std::vector<Candidate>& thread_scratch(int64_t vocab) {
  thread_local std::vector<Candidate> scratch;
  if (static_cast<int64_t>(scratch.size()) < vocab) scratch.resize(static_cast<size_t>(vocab));
  return scratch;
}

std::vector<float>& thread_weights(int64_t vocab) {
  thread_local std::vector<float> weights;
  if (static_cast<int64_t>(weights.size()) < vocab) weights.resize(static_cast<size_t>(vocab));
  return weights;
}

// Writes the k best of v[0, n) (by Before on (v[i], i)) to out[0, k), sorted. out holds n.
void select_top(const float* v, int64_t n, int64_t k, Candidate* out) {
  if (k <= kSmallSelect && k < n) {
    int64_t size = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float x = v[i];
      // Ids arrive in increasing order, so a tie with the window's last never displaces it.
      if (size == k && !(x > out[k - 1].first)) continue;
      int64_t pos = size < k ? size++ : k - 1;
      const Candidate c{x, static_cast<int32_t>(i)};
      while (pos > 0 && Before{}(c, out[pos - 1])) {
        out[pos] = out[pos - 1];
        --pos;
      }
      out[pos] = c;
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = {v[i], static_cast<int32_t>(i)};
  if (k < n) std::nth_element(out, out + k, out + n, Before{});
  std::sort(out, out + k, Before{});
}

// Weights in [0, 1] as float bits are ordered like the values; >> 19 keeps exponent and 4
// mantissa bits: 16 buckets per octave, 2033 in all.
constexpr int kBucketShift = 19;
constexpr int kBuckets = (0x3f800000 >> kBucketShift) + 1;
inline int weight_bucket(float w) { return static_cast<int>(std::bit_cast<uint32_t>(w) >> kBucketShift); }

// The lowest bucket such that the buckets from it up hold more than `target` (with a margin for
// summation order), from `sets` arrays of kBuckets partial bucket masses; 0 when only the whole
// range does (no bound).
int lowest_nucleus_bucket(const double* mass, int sets, double target) {
  const double bound = target * (1.0 + 1e-9);
  double cumulative = 0.0;
  for (int b = kBuckets - 1; b > 0; --b) {
    for (int s = 0; s < sets; ++s) cumulative += mass[static_cast<size_t>(s) * kBuckets + static_cast<size_t>(b)];
    if (cumulative >= bound) return b;
  }
  return 0;
}

// How many leading candidates of cand[0, size) (in Before order) it takes for their mass, summed
// in that order, to reach `target`; 0 when they never do.
int64_t prefix_reaching(const Candidate* cand, int64_t size, double target) {
  double cumulative = 0.0;
  for (int64_t j = 0; j < size; ++j) {
    cumulative += cand[j].first;
    if (cumulative >= target) return j + 1;
  }
  return 0;
}

// Moves to the front of cand[0, size) the candidates of the heaviest buckets that together
// hold more than `target` (with a margin for summation order); returns how many. The nucleus is
// a prefix of them, so only they need sorting — one O(size) pass instead of repeated selection.
int64_t nucleus_bound(Candidate* cand, int64_t size, double target) {
  // Four interleaved sets of bucket sums (shorter dependency chains on the few hot buckets);
  // a bound only, so the summation order is free (the margin covers it).
  std::array<double, 4 * kBuckets> part{};
  int64_t i = 0;
  for (; i + 4 <= size; i += 4)
    for (int k = 0; k < 4; ++k) part[static_cast<size_t>(k) * kBuckets + weight_bucket(cand[i + k].first)] += cand[i + k].first;
  for (; i < size; ++i) part[weight_bucket(cand[i].first)] += cand[i].first;
  const int lowest = lowest_nucleus_bucket(part.data(), 4, target);
  if (lowest == 0) return size;
  return std::partition(cand, cand + size,
                        [&](const Candidate& c) { return weight_bucket(c.first) >= lowest; }) -
         cand;
}

// Number of leading candidates, in Before order of their weights, whose mass (summed in that
// order) first reaches `target`; `size` if it is never reached. cand[0, size) is already in
// that order when `sorted`; otherwise only the part that can hold the nucleus is sorted.
int64_t top_p_cut(Candidate* cand, int64_t size, bool sorted, double target) {
  const int64_t bound = sorted ? size : nucleus_bound(cand, size, target);
  if (!sorted) std::sort(cand, cand + bound, Before{});
  if (const int64_t cut = prefix_reaching(cand, bound, target); cut > 0) return cut;
  // Never taken in practice: the bound already holds more than the target.
  std::sort(cand + bound, cand + size, Before{});
  const int64_t cut = prefix_reaching(cand, size, target);
  return cut > 0 ? cut : size;
}

#ifdef TESSERA_SAMPLING_AVX512
// Appends to `out` the candidates (w[i], first + i) of w[0, n) with w[i] >= tau, in increasing i:
// 16 compares at a time, nearly every mask empty.
TESSERA_SAMPLING_AVX512 int64_t gather_at_least_avx512(const float* w, int64_t n, float tau, int32_t first,
                                                       std::vector<Candidate>& out) {
  const __m512 t = _mm512_set1_ps(tau);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint32_t m = _mm512_cmp_ps_mask(_mm512_loadu_ps(w + i), t, _CMP_GE_OQ);
    for (; m != 0; m &= m - 1) {
      const int j = std::countr_zero(m);
      out.emplace_back(w[i + j], first + static_cast<int32_t>(i + j));
    }
  }
  return i;
}
#endif

// Appends the candidates of w[0, n) (ids first + i) whose weight is at least tau, in increasing i.
void gather_at_least(const float* w, int64_t n, float tau, int32_t first, std::vector<Candidate>& out) {
  int64_t i = 0;
#ifdef TESSERA_SAMPLING_AVX512
  if (cpu::active_isa() == cpu::Isa::kAvx512) i = gather_at_least_avx512(w, n, tau, first, out);
#endif
  for (; i < n; ++i)
    if (w[i] >= tau) out.emplace_back(w[i], first + static_cast<int32_t>(i));
}

// Top-p over the whole vocabulary without min-p, the common sampled case, without building a
// candidate per id: the weights (compute_weights), then only the ids whose weight is at least
// tau = (mass - target) / (2 n). The ids left out weigh less than tau each, under
// (mass - target) / 2 together, so the gathered ones - a prefix of the Before order, as every one
// of them outweighs every one left out - hold more than the target: the nucleus is a prefix of
// them. Among those, the heaviest buckets that hold the target (nucleus_bound) are sorted and cut
// where the running mass first reaches top_p * mass: the same set, order and cut as the general
// path (nucleus_bound + top_p_cut over every candidate). Writes the nucleus to cand and the mass
// to *mass_out; returns its size, or 0 when the gathered ids fall short of the target (never
// expected; then the caller takes the general path).
int64_t nucleus_fast(const float* logits, int64_t n, double max, double temperature, float top_p, Candidate* cand,
                     double* mass_out, ThreadPool* pool) {
  std::vector<float>& wv = thread_weights(n);
  const float* w = wv.data();
  const double mass = compute_weights(logits, n, max, temperature, wv.data(), pool);
  *mass_out = mass;
  const double target = static_cast<double>(top_p) * mass;
  const float tau = static_cast<float>((mass - target) / (2.0 * static_cast<double>(n)));
  if (!(tau > 0.0f)) return 0;  // top_p so close to 1 that every id may be in the nucleus
  const int64_t n_blocks = weight_blocks(n);
  // The gathered ids, block by block, concatenated in block order (the workers reach the calling
  // thread's scratch through per_block).
  thread_local std::vector<std::vector<Candidate>> block_scratch;
  if (static_cast<int64_t>(block_scratch.size()) < n_blocks) block_scratch.resize(static_cast<size_t>(n_blocks));
  std::vector<Candidate>* const per_block = block_scratch.data();
  for_weight_blocks(n, pool, [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t at = b * kWeightBlock;
      per_block[b].clear();
      gather_at_least(w + at, std::min(kWeightBlock, n - at), tau, static_cast<int32_t>(at), per_block[b]);
    }
  });
  int64_t size = 0;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const std::vector<Candidate>& in = per_block[b];
    std::copy(in.begin(), in.end(), cand + size);
    size += static_cast<int64_t>(in.size());
  }
  const int64_t bound = nucleus_bound(cand, size, target);
  std::sort(cand, cand + bound, Before{});
  return prefix_reaching(cand, bound, target);
}

uint64_t random_seed() {
  // Drawn once per process; each Sampler then takes the next counter value, so samplers
  // created in the same microsecond still differ.
  static const uint64_t base = [] {
    try {
      std::random_device device;
      return (static_cast<uint64_t>(device()) << 32) ^ device();
    } catch (...) {  // no entropy source: the clock is still better than a constant
      return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    }
  }();
  static std::atomic<uint64_t> next{0};
  return sampling_random_bits(base, next.fetch_add(1, std::memory_order_relaxed));
}

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  const Status status = validate_sampling_params(params);
  TESSERA_CHECK(status.is_ok(), "{} (validate requests with validate_sampling_params)",
                status.message());
  seed_ = params.has_seed ? params.seed : random_seed();
}

void Sampler::add_prompt_tokens(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    TESSERA_CHECK(id >= 0, "prompt token id {}", id);
    ++prompt_counts_[id];
  }
}

void Sampler::accept(int32_t id) {
  TESSERA_CHECK(id >= 0, "output token id {}", id);
  ++output_counts_[id];
  ++num_output_tokens_;
}

double Sampler::next_uniform() { return sampling_uniform(seed_, static_cast<uint64_t>(num_output_tokens_)); }

void Sampler::apply_penalties(float* logits, int64_t vocab) const {
  const float r = params_.repetition_penalty;
  if (r != 1.0f) {
    auto penalise = [&](int32_t id) {
      float& x = logits[id];
      x = x > 0.0f ? x / r : x * r;
    };
    for (const auto& [id, count] : prompt_counts_) {
      if (id < vocab) penalise(id);
    }
    for (const auto& [id, count] : output_counts_) {
      if (id < vocab && !prompt_counts_.contains(id)) penalise(id);
    }
  }
  const float presence = params_.presence_penalty;
  const float frequency = params_.frequency_penalty;
  if (presence != 0.0f || frequency != 0.0f) {
    for (const auto& [id, count] : output_counts_) {
      if (id >= vocab || count <= 0) continue;
      const float penalty = presence + frequency * static_cast<float>(count);
      logits[id] -= penalty;
    }
  }
  for (const auto& [id, bias] : params_.logit_bias)
    if (id < vocab) logits[id] += bias;
}

SampledToken Sampler::sample(float* logits, int64_t vocab, ThreadPool* pool) {
  TESSERA_CHECK(vocab >= 1 && vocab <= std::numeric_limits<int32_t>::max(), "vocab {}", vocab);
  apply_penalties(logits, vocab);

  // Sanitise NaN and +inf and find the argmax (first maximum: lowest id): a vector pass when
  // there are none (the common case, token masks' -inf included), else the scalar pass below.
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float max_logit = kNegInf;
  int64_t argmax = 0;
  const bool finite = finite_argmax(logits, vocab, &max_logit, &argmax);
  for (int64_t i = 0; !finite && i < vocab; ++i) {
    float x = logits[i];
    if (std::isnan(x)) {
      x = kNegInf;
      logits[i] = x;
    } else if (x == std::numeric_limits<float>::infinity()) {
      x = std::numeric_limits<float>::max();
      logits[i] = x;
    }
    if (x > max_logit) {
      max_logit = x;
      argmax = i;
    }
  }
  if (max_logit == kNegInf) {  // everything masked: the uniform distribution, the limit of equal logits
    std::fill(logits, logits + vocab, 0.0f);
    max_logit = 0.0f;
  }

  SampledToken result;
  const int64_t n_logprobs = std::min<int64_t>(params_.n_logprobs, vocab);
  const bool want_logprobs = params_.return_logprob || n_logprobs > 0;
  double log_sum_exp = 0.0;
  std::vector<Candidate>& scratch = thread_scratch(vocab);
  Candidate* cand = scratch.data();
  if (want_logprobs) {
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) sum += sampling_exp(static_cast<double>(logits[i]) - max_logit);
    log_sum_exp = max_logit + std::log(sum);
    if (n_logprobs > 0) {
      select_top(logits, vocab, n_logprobs, cand);
      result.top_logprobs.reserve(static_cast<size_t>(n_logprobs));
      for (int64_t j = 0; j < n_logprobs; ++j) {
        result.top_logprobs.emplace_back(
            cand[j].second, static_cast<float>(static_cast<double>(cand[j].first) - log_sum_exp));
      }
    }
  }

  if (params_.temperature == 0.0f) {
    result.id = static_cast<int32_t>(argmax);
  } else {
    // Weights w = exp((logit - max) / T) in (0, 1], the maximum exactly 1, so min-p compares
    // w with min_p directly. Stored as float; every sum adds those floats in double in a fixed
    // order, which is what makes the draw reproducible.
    const double temperature = params_.temperature;
    auto weight = [&](float logit) {
      return static_cast<float>(sampling_exp((static_cast<double>(logit) - max_logit) / temperature));
    };
    const bool use_top_k = params_.top_k > 0 && params_.top_k < vocab;
    bool nucleus_done = false;
    int64_t size = 0;
    double mass = 0.0;  // of the top-k set (the whole vocabulary without top-k)
    if (use_top_k) {
      size = params_.top_k;
      select_top(logits, vocab, size, cand);
      for (int64_t j = 0; j < size; ++j) {
        cand[j].first = weight(cand[j].first);
        mass += cand[j].first;
      }
      // Distinct logits can round to equal weights; re-sorting makes the draw order (weight
      // desc, id asc) the same as on the path without top-k. Nearly sorted already: cheap.
      std::sort(cand, cand + size, Before{});
    } else if (params_.min_p == 0.0f && params_.top_p < 1.0f &&
               (size = nucleus_fast(logits, vocab, max_logit, temperature, params_.top_p, cand, &mass, pool)) > 0) {
      nucleus_done = true;  // cand[0, size): the top-p nucleus, in draw order
    } else {
      size = vocab;
      // The weights in place of the logits (the logits are scratch here), then the candidates.
      std::vector<float>& w = thread_weights(vocab);
      mass = compute_weights(logits, vocab, max_logit, temperature, w.data(), pool);
      for (int64_t i = 0; i < vocab; ++i) cand[i] = {w[static_cast<size_t>(i)], static_cast<int32_t>(i)};
    }
    // min-p before top-p: it removes only tokens lighter than every one it keeps, i.e. a
    // suffix of the sorted order, so the top-p prefix sums (over `mass`) are unchanged.
    if (params_.min_p > 0.0f) {
      const float min_p = params_.min_p;
      if (use_top_k) {
        size = std::partition_point(cand, cand + size,
                                    [&](const Candidate& c) { return c.first >= min_p; }) -
               cand;
      } else {
        size = std::remove_if(cand, cand + size,
                              [&](const Candidate& c) { return !(c.first >= min_p); }) -
               cand;
      }
    }
    if (params_.top_p < 1.0f && !nucleus_done) {
      size = top_p_cut(cand, size, use_top_k, static_cast<double>(params_.top_p) * mass);
    }
    double kept = 0.0;
    for (int64_t j = 0; j < size; ++j) kept += cand[j].first;
    const double target = next_uniform() * kept;
    double cumulative = 0.0;
    int32_t chosen = cand[0].second;
    for (int64_t j = 0; j < size; ++j) {
      if (cand[j].first <= 0.0f) continue;
      chosen = cand[j].second;  // the last positive one if rounding runs past the end
      cumulative += cand[j].first;
      if (cumulative > target) break;
    }
    result.id = chosen;
  }

  if (want_logprobs) {
    result.logprob = static_cast<float>(static_cast<double>(logits[result.id]) - log_sum_exp);
  }
  accept(result.id);
  return result;
}

SampledToken token_logprobs(const float* logits, int64_t vocab, int32_t token, int32_t n_top) {
  double max = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i)
    if (logits[i] > max) max = logits[i];
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  const double log_z = max + std::log(sum);
  SampledToken t;
  t.id = token;
  t.logprob = static_cast<float>(static_cast<double>(logits[token]) - log_z);
  if (n_top > 0) {
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    const auto n = static_cast<size_t>(std::min<int64_t>(n_top, vocab));
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (size_t i = 0; i < n; ++i)
      t.top_logprobs.emplace_back(order[i], static_cast<float>(static_cast<double>(logits[order[i]]) - log_z));
  }
  return t;
}

void apply_token_mask(std::span<const uint32_t> mask, std::span<float> logits) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  for (size_t w = 0; w < mask.size() && w * 32 < n; ++w) {
    const uint32_t bits = mask[w];
    if (bits == 0xffffffffu) continue;
    const size_t end = std::min(n, w * 32 + 32);
    for (size_t i = w * 32; i < end; ++i)
      if (!((bits >> (i - w * 32)) & 1u)) logits[i] = kNegInf;
  }
  for (size_t i = mask.size() * 32; i < n; ++i) logits[i] = kNegInf;
}

}  // namespace tessera
