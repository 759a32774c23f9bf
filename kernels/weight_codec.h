// The CPU kernels' WeightCodec (common/weight_codec.h): what the loaders' callers (shard/,
// local/, launch/, tools/, eval/, bench/, tests) pass in WeightLoadOptions::codec so that
// bind_model_weights can dequantize and quantize rows at load.
#pragma once

#include "common/weight_codec.h"

namespace tessera {

// kernels/quant.h's reference conversions; a static object, valid for the whole process.
const WeightCodec& cpu_weight_codec();

}  // namespace tessera
