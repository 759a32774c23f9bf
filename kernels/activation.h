// The elementwise parts of gated MLPs, fp32:
//   SwiGLU (Llama, Qwen): out[t, i] = silu(gate[t, i]) * up[t, i], silu(x) = x / (1 + exp(-x));
//   GeGLU (Gemma):        out[t, i] = gelu_tanh(gate[t, i]) * up[t, i],
//                         gelu_tanh(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))).
#pragma once

#include <cstdint>

namespace tessera {

// gate, up, out: fp32 [n_tokens, dim] (row strides equal dim). out may alias gate.
void silu_mul(const float* gate, const float* up, float* out, int64_t n_tokens, int64_t dim);

// gate, up, out: fp32 [n_tokens, dim] (row strides equal dim). out may alias gate or up.
// Each element in fp32, in this order (no contraction into fma), with std::tanh:
//   c = x * x * x;  t = tanh(0.7978845608f * (x + 0.044715f * c));  out = 0.5f * x * (1.0f + t) * up
// so any other implementation of the same steps (the fake CUDA backend) gives the same bits.
// |x| beyond ~7e12 makes c infinite: t = +-1 exactly, so out = x * up for x > 0 and a zero for
// x < 0 (the limits); NaN in, NaN out.
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n_tokens, int64_t dim);

}  // namespace tessera
