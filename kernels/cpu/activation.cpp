#include "kernels/activation.h"

#include <cmath>

namespace tessera {

void silu_mul(const float* gate, const float* up, float* out, int64_t n_tokens, int64_t dim) {
  const int64_t n = n_tokens * dim;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g * (1.0f / (1.0f + std::exp(-g))) * up[i];
  }
}

}  // namespace tessera
