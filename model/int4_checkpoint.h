// Pre-quantized 4-bit checkpoints (AWQ and GPTQ, safetensors) converted to Tessera's I4_G128
// layout at load. Formats, for a linear layer with in_features K, out_features N, group 128:
//
//   AWQ (GEMM version): qweight I32 [K, N / 8]: word [k, j] holds output columns 8j .. 8j + 7 of
//     input k, column 8j + c in nibble AWQ_POS[c] (bits 4 * pos), where the nibbles hold the
//     columns in the interleaved order 0, 2, 4, 6, 1, 3, 5, 7 (so AWQ_POS = 0, 4, 1, 5, 2, 6, 3, 7).
//     qzeros I32 [K / 128, N / 8], packed the same way; scales F16 [K / 128, N].
//     w[n, k] = (q - z) * s. Zeros are stored as they are.
//   GPTQ: qweight I32 [K / 8, N]: word [i, n] holds inputs 8i .. 8i + 7 of output n, input
//     8i + c in nibble c (sequential). qzeros I32 [K / 128, N / 8]: output 8j + c in nibble c.
//     scales F16 [K / 128, N]; g_idx I32 [K] (group of each input). The common (v1, AutoGPTQ)
//     convention stores zero - 1: the zero used is (stored + 1) mod 16. quantization_config
//     checkpoint_format "gptq_v2" stores the zero itself. Only the trivial g_idx (k / 128, which
//     act-order checkpoints do not have) is accepted: anything else is refused, naming the tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/model_config.h"

namespace tessera {

class SafetensorsCheckpoint;

struct Int4Linear {
  int64_t out_features = 0;  // rows
  int64_t in_features = 0;   // cols
  std::vector<uint8_t> bytes;  // rows * row_bytes(kI4_G128, cols)
};

// Converts the layer `prefix` ("model.layers.0.self_attn.q_proj": reads prefix.qweight,
// .qzeros, .scales and, for GPTQ, .g_idx when present). Errors name the file and tensor.
Result<Int4Linear> convert_int4_linear(const SafetensorsCheckpoint& st, const std::string& prefix,
                                       const QuantizationConfig& q);

// AWQ nibble position of column c (0..7) within a packed word.
constexpr int kAwqNibbleOfColumn[8] = {0, 4, 1, 5, 2, 6, 3, 7};

}  // namespace tessera
