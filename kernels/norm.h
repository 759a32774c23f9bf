// RMSNorm and the fused residual-add + RMSNorm. fp32; rows of `dim` contiguous elements.
#pragma once

#include <cstdint>

namespace tessera {

// y[i] = x[i] / sqrt(mean(x^2) + eps) * weight   for each of n rows. y may alias x.
void rms_norm(const float* x, const float* weight, float* y, int64_t n, int64_t dim, float eps);

// residual += delta; y = rms_norm(residual). For each of n rows.
void add_rms_norm(float* residual, const float* delta, const float* weight, float* y, int64_t n,
                  int64_t dim, float eps);

}  // namespace tessera
