// The arithmetic of speculative decoding that the gate (engine/speculation.h) and the cost
// model (`tessera plan`) share. With per-position acceptance a (each draft kept with probability
// a while every draft before it was), a piece with k drafts yields 1 + a + a^2 + ... + a^k
// tokens; if it makes the step cost_ratio times as long as a plain step, it pays exactly when
// that sum exceeds cost_ratio.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tessera {

// Expected tokens of a piece with k drafts at per-position acceptance a (clamped to [0, 1]).
inline double expected_tokens(double acceptance, int64_t k) {
  const double a = std::clamp(acceptance, 0.0, 1.0);
  double e = 1, p = 1;
  for (int64_t i = 0; i < k; ++i) e += (p *= a);
  return e;
}

// The acceptance at which k drafts break even when they make the step cost_ratio times as long
// (1 when even perfect acceptance cannot pay: k + 1 < cost_ratio; 0 when the drafts are free).
inline double break_even_acceptance(int64_t k, double cost_ratio) {
  if (k <= 0 || expected_tokens(1.0, k) < cost_ratio) return 1.0;
  double lo = 0, hi = 1;
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (expected_tokens(mid, k) < cost_ratio ? lo : hi) = mid;
  }
  return hi;
}

}  // namespace tessera
