// Small elementwise ops on fp32 vectors.
#pragma once

#include <cstdint>

namespace tessera {

// x[i] *= s for i < n, in place: one IEEE fp32 multiply per element, so every implementation gives
// the same bits (e.g. Gemma's scaling of the embeddings by sqrt(hidden_size)).
void scale_f32(float* x, float s, int64_t n);

}  // namespace tessera
