// Token sampling on CPU: greedy, temperature, top-k, top-p, min-p, repetition / presence /
// frequency penalties, per-request seed, top-n logprobs.
//
// Order: penalties on the logits -> logprobs for the reply (log-softmax of the penalised
// logits, before temperature and truncation) -> temperature == 0: argmax (ties: lowest id)
// -> else divide by temperature, top-k, top-p, min-p, then draw from the renormalised
// distribution with the sequence's RNG. Same seed and same logits give the same token on any
// machine (the RNG is a fixed counter-based generator, not std::mt19937 distributions).
//
// Semantics in detail (p = softmax of the temperature-scaled penalised logits):
//  * repetition_penalty r (HF / vLLM): for every token id seen in the prompt or the output,
//    once regardless of its count: logit > 0 -> logit / r, else logit * r.
//  * presence / frequency (OpenAI), over output tokens only, after the repetition penalty:
//    logit -= presence * (count > 0) + frequency * count.
//  * top-k keeps the k largest logits, ties to lower ids. Weights w = exp((logit - max) / T)
//    are then ordered by w descending, ties by lower id; top-p keeps the smallest prefix of that
//    order whose mass (renormalised over the top-k set) is >= top_p, at least one token. min-p
//    keeps tokens with p >= min_p * p_max (p_max is unchanged by the truncations before it, so
//    min-p is a plain intersection).
//  * The draw: u = sampling_uniform(seed, n); the first candidate whose running sum of w
//    exceeds u * (sum of kept w), walking the kept candidates in the order above when top-k or
//    top-p is on, in id order otherwise.
//  * Cost for a vocabulary V: greedy O(V) without exp; sampling one exp pass plus O(V)
//    selection (no full sort for top-k; top-p sorts only the buckets that hold the nucleus).
//  * NaN logits count as -inf and +inf as the largest float; if every logit is -inf the
//    distribution is uniform (greedy returns id 0).
//  * Logprobs cost one exp pass over the vocabulary, so they are computed only when asked for
//    (return_logprob or n_logprobs > 0); otherwise SampledToken::logprob is 0. The greedy path
//    without logprobs is a single O(vocab) pass with no exp.
//
// Determinism (also the contract for tensor parallelism and any parallel version): the token
// depends only on the logits, the parameters, the seed and the sequence's output position —
// never on the thread count, batch composition or the machine. The uniform for the draw at
// output position n is sampling_uniform(seed, n); the weights use a fixed exp polynomial (not
// libm) in IEEE double without FMA contraction, rounded to float, and every sum adds them in
// double in the order stated above (the mass of the whole vocabulary, without top-k: per block
// of 16384 ids, 8 lane sums, lane j over the block's ids = j mod 8 in increasing order; each lane
// adds its blocks in order; the lanes combine as ((0+1)+(2+3))+((4+5)+(6+7)); the same on every
// ISA and thread count). So TP ranks that see the same full logits (or gather
// exact per-rank candidates and merge them by (logit desc, id asc)) draw the same token with no
// broadcast. A parallel implementation must reduce in a fixed order that does not depend on
// the thread count. Another backend (GPU) that sums in a different order can differ only when u
// falls within rounding error of a boundary between two tokens. Reported logprob values use
// libm log and may differ in the last bit across platforms.
//
// Memory: selection uses a thread-local scratch buffer (8 bytes per vocabulary entry per
// sampling thread, reused across calls and sequences) rather than per-sequence storage, so a
// thousand live sequences do not each hold a vocabulary-sized buffer.
//
// Thread-safety: a Sampler belongs to one sequence and is used by one thread at a time;
// different Samplers may be used concurrently from different threads.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/sampling_params.h"
#include "common/status.h"

namespace tessera {

class ThreadPool;

// SamplingParams and validate_sampling_params: common/sampling_params.h.

struct SampledToken {
  int32_t id = -1;
  float logprob = 0.0f;                               // of the chosen token (see above)
  std::vector<std::pair<int32_t, float>> top_logprobs; // n_logprobs best, descending
};

// The counter-based generator: 64 random bits for (seed, counter), a pure function (two
// splitmix64 finaliser rounds), usable from any backend to reproduce the CPU draws.
constexpr uint64_t sampling_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
constexpr uint64_t sampling_random_bits(uint64_t seed, uint64_t counter) {
  const uint64_t key = sampling_mix64(seed + 0x9e3779b97f4a7c15ULL);
  return sampling_mix64(key ^ (counter * 0xd1342543de82ef95ULL + 0x632be59bd9b4e019ULL));
}
// Uniform in [0, 1) with 53 random bits.
constexpr double sampling_uniform(uint64_t seed, uint64_t counter) {
  return static_cast<double>(sampling_random_bits(seed, counter) >> 11) * 0x1.0p-53;
}

// e^x for x <= 0 from +, -, * and bit operations only, so that it gives the same bits on every
// IEEE-754 machine (libm's exp may differ by an ulp between platforms): the sampler's weights.
// Relative error ~1e-13; values below e^-700 return 0 (negligible next to the maximum term,
// which is always 1). Bit-identical only where it is compiled without floating-point
// contraction (-ffp-contract=off: kernels/cpu/sampling.cpp, the fake CUDA backend; baseline
// x86-64 has no FMA anyway); sampling.cu has its own copy with explicit IEEE intrinsics.
// Its constants, shared with the vector copy of its steps (kernels/cpu/sampling.cpp).
namespace sampling_exp_constants {
inline constexpr double kLog2e = 1.4426950408889634;
inline constexpr double kLn2Hi = 0.6931471803691238;  // few mantissa bits: n * kLn2Hi is exact
inline constexpr double kLn2Lo = 1.9082149292705877e-10;
inline constexpr double kShifter = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
inline constexpr double kLowest = -700.0;               // below: 0
// Taylor series to degree 10, highest power first: truncation error < 3e-13 on |r| <= ln2 / 2.
inline constexpr double kTaylor[] = {1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0,
                                     1.0 / 720.0,     1.0 / 120.0,    1.0 / 24.0,    1.0 / 6.0,
                                     0.5,             1.0,            1.0};
}  // namespace sampling_exp_constants

inline double sampling_exp(double x) {
  using namespace sampling_exp_constants;
  const bool underflow = !(x > kLowest);
  const double xc = underflow ? kLowest : x;
  const double t = xc * kLog2e + kShifter;
  const double n = t - kShifter;
  const double r = (xc - n * kLn2Hi) - n * kLn2Lo;  // |r| <= ln2 / 2
  double p = kTaylor[0];
  for (size_t k = 1; k < std::size(kTaylor); ++k) p = p * r + kTaylor[k];
  // The low mantissa bits of t hold n; n in [-1010, 0] keeps 2^n a normal double.
  const int64_t ni = std::bit_cast<int64_t>(t) - std::bit_cast<int64_t>(kShifter);
  const double scale = std::bit_cast<double>(static_cast<uint64_t>(ni + 1023) << 52);
  return underflow ? 0.0 : p * scale;
}

// Structured outputs: sets to -inf every logit whose bit in `mask` is clear (bit b of word w is
// token 32w + b, set = allowed; proto/control_messages.h's ScheduledSequence::token_mask).
// Ids past the mask are left out too. Words that allow all 32 tokens are skipped.
void apply_token_mask(std::span<const uint32_t> mask, std::span<float> logits);

// Log-probability of `token` under log-softmax(logits) and the n_top most likely tokens
// (descending, ties by lower id): what prompt logprobs (`echo` with `logprobs`) report. Raw
// logits, no penalties or temperature. id of the result is `token`.
SampledToken token_logprobs(const float* logits, int64_t vocab, int32_t token, int32_t n_top);

// Per-sequence sampling state: the RNG and the token counts the penalties need.
class Sampler {
 public:
  // TESSERA_CHECKs validate_sampling_params(params).
  explicit Sampler(const SamplingParams& params);

  const SamplingParams& params() const { return params_; }
  // The effective seed: params.seed, or the random one drawn when has_seed is false (report it
  // so a user can replay the request).
  uint64_t seed() const { return seed_; }
  // Output tokens accepted so far; the next draw uses counter num_output_tokens().
  int64_t num_output_tokens() const { return num_output_tokens_; }

  // Tokens of the prompt (count for the repetition penalty only). Ids must be >= 0.
  void add_prompt_tokens(std::span<const int32_t> ids);
  // Samples from logits[0, vocab); `logits` is used as scratch and modified (on return it
  // holds the penalised logits, NaN/inf replaced as described above). vocab >= 1.
  // `pool` (optional) spreads the weight pass over its threads; the token and every value are
  // the same with any pool or none (the pass works in fixed blocks: kernels/cpu/sampling.cpp).
  SampledToken sample(float* logits, int64_t vocab, ThreadPool* pool = nullptr);
  // Records an output token (sample() calls this for the token it returns). id >= 0.
  void accept(int32_t id);

  // Applies the repetition / presence / frequency penalties in place; sample() starts with
  // this. Public so callers (and tests) can see the logits the distribution is built from.
  // Ids >= vocab are ignored.
  void apply_penalties(float* logits, int64_t vocab) const;
  // The token counts apply_penalties() reads (id -> count), for a backend that applies the
  // same penalties elsewhere (the CUDA backend's device sampling).
  const std::unordered_map<int32_t, int32_t>& prompt_counts() const { return prompt_counts_; }
  const std::unordered_map<int32_t, int32_t>& output_counts() const { return output_counts_; }

 private:
  double next_uniform();  // [0, 1)

  SamplingParams params_;
  uint64_t seed_ = 0;
  int64_t num_output_tokens_ = 0;
  std::unordered_map<int32_t, int32_t> prompt_counts_;
  std::unordered_map<int32_t, int32_t> output_counts_;
};

}  // namespace tessera
