#include "kernels/norm.h"

#include <cmath>

namespace tessera {
namespace {

// The sum of squares is accumulated in double: dim can be 8k+ and the norm scales every
// element, so its rounding error is worth avoiding at negligible cost.
inline float inv_rms(const float* x, int64_t dim, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float mean = static_cast<float>(ss / static_cast<double>(dim));
  return 1.0f / std::sqrt(mean + eps);
}

}  // namespace

void rms_norm(const float* x, const float* weight, float* y, int64_t n, int64_t dim, float eps) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    const float s = inv_rms(xr, dim, eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = weight[i] * (s * xr[i]);
  }
}

void add_rms_norm(float* residual, const float* delta, const float* weight, float* y, int64_t n,
                  int64_t dim, float eps) {
  for (int64_t r = 0; r < n; ++r) {
    float* res = residual + r * dim;
    const float* dr = delta + r * dim;
    for (int64_t i = 0; i < dim; ++i) res[i] += dr[i];
  }
  rms_norm(residual, weight, y, n, dim, eps);
}

}  // namespace tessera
