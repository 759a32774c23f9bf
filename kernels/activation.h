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

// GeGLU with gelu_tanh evaluated on the fp16 grid, as llama.cpp's CPU backend computes it (its
// GGML_GELU_FP16 table), so both engines feed the same activations to the next quantized matmul
// (one ulp there moves int8 activation levels, and those flips compound over the layers):
//   x <= -10: out = 0;  x >= 10: out = x * up;  NaN: NaN;
//   otherwise out = fp16_to_f32(G[f32_to_fp16(x)]) * up, where G[h] = f32_to_fp16(gelu_tanh(h))
//   is a 65,536-entry table computed once with gelu_tanh_mul's steps above.
// Against the exact function the relative error is below 2^-10 (x and gelu each rounded to
// fp16 once), finer than the bf16 Gemma was trained in. The CPU forward pass uses this one.
void gelu_tanh_mul_fp16_grid(const float* gate, const float* up, float* out, int64_t n_tokens, int64_t dim);

}  // namespace tessera
