#include "kernels/rope.h"

#include <cmath>
#include <vector>

#include "common/check.h"

namespace tessera {

// The angle is (float)pos * inv_freq[i] in fp32 with cosf/sinf, as common fp32 reference
// implementations (llama2.c, HF in fp32) compute it, so logits match them closely.
void rope_apply(float* x, const int32_t* positions, int64_t n_tokens, int64_t n_heads,
                int64_t head_dim, const float* inv_freq) {
  TESSERA_CHECK(head_dim % 2 == 0, "rope: odd head_dim {}", head_dim);
  const int64_t half = head_dim / 2;
  // Per-thread tables, grown once (no allocation per decode step).
  thread_local std::vector<float> cos_t, sin_t;
  if (static_cast<int64_t>(cos_t.size()) < half) {
    cos_t.resize(static_cast<size_t>(half));
    sin_t.resize(static_cast<size_t>(half));
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[i];
      cos_t[static_cast<size_t>(i)] = std::cos(angle);
      sin_t[static_cast<size_t>(i)] = std::sin(angle);
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float c = cos_t[static_cast<size_t>(i)], s = sin_t[static_cast<size_t>(i)];
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = a * s + b * c;
      }
    }
  }
}

}  // namespace tessera
