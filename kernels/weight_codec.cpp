#include "kernels/weight_codec.h"

#include "kernels/quant.h"

namespace tessera {

const WeightCodec& cpu_weight_codec() {
  static constexpr WeightCodec kCodec{
      .dequantize_row = &dequantize_row,
      .quantize_row = &quantize_row,
      .quantize_row_int4 = &quantize_row_int4,
      .quantize_row_weighted = &quantize_row_weighted,
      .can_quantize_weighted = &can_quantize_weighted,
  };
  return kCodec;
}

}  // namespace tessera
