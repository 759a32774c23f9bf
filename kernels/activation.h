// SwiGLU: out[t, i] = silu(gate[t, i]) * up[t, i], silu(x) = x / (1 + exp(-x)).
#pragma once

#include <cstdint>

namespace tessera {

// gate, up, out: fp32 [n_tokens, dim] (row strides equal dim). out may alias gate.
void silu_mul(const float* gate, const float* up, float* out, int64_t n_tokens, int64_t dim);

}  // namespace tessera
