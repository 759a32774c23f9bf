// Rotary position embedding in Hugging Face's rotate-half layout: for each head, element i and
// element i + head_dim/2 form one rotating pair with frequency inv_freq[i].
// (GGUF's adjacent-pair Q/K rows are permuted to this layout at load.)
#pragma once

#include <cstdint>

namespace tessera {

// x: fp32 [n_tokens, n_heads, head_dim], rotated in place; positions: [n_tokens];
// inv_freq: [head_dim / 2] (scaling already applied).
void rope_apply(float* x, const int32_t* positions, int64_t n_tokens, int64_t n_heads,
                int64_t head_dim, const float* inv_freq);

}  // namespace tessera
