#include "kernels/elementwise.h"

namespace tessera {

void scale_f32(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace tessera
