// Importance-weighted encoders (quantize_row_weighted, contract in kernels/quant.h).
//
// Every format decodes as x ~= scale * level (- min), so for fixed scales the best level of
// each element is its rounded value whatever its importance: the importance only moves the
// scales. Each encoder therefore searches scales:
//   - per (sub-)block, a fan of candidate scales around the absmax fit (the extreme element
//     mapped near either end of the level range, and shrunk versions that clip it; for
//     formats of few levels also the element of largest weighted square put exactly on each
//     level), levels by rounding, then the scale (and for affine formats the min) refitted by
//     weighted least squares; the candidate of least weighted error wins and a few
//     assign/refit rounds polish it;
//   - for K-quants, the super-block scale(s) that quantize the sub-block scales and mins are
//     fitted the same way with each sub-block weighted by its total importance, then each
//     sub-block's quantized scale (and min) is moved by -1..+1 if that lowers its true
//     weighted error, then the super-block scale(s) are refitted jointly by weighted least
//     squares over all 256 elements (kept if the error drops);
//   - ternary TQ1_0 / TQ2_0: for any scale the nonzero trits are the elements above half of
//     it, so the nonzero set is a prefix of the elements sorted by magnitude; every prefix is
//     tried with its weighted-optimal scale (exact optimum before fp16 rounding).
// The fans contain (a coarser version of) the candidates quantize_row tries, so under uniform
// importance the result is as good as round to nearest or better (tests/kernels/
// quant_weighted_test.cpp measures it). Comparing each block with quantize_row's would make
// that a guarantee, but cost half the time and changed no test row's error by 0.01%.
#include "kernels/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/check.h"
#include "kernels/cpu/quant_fit.h"

namespace tessera {
namespace {

using quant_fit::clamp_round;
using quant_fit::kQk;
using quant_fit::kQkK;
using quant_fit::signed_absmax;
using quant_fit::store_f16;

// Relative floor of the importance (times its row mean), see quant.h.
constexpr double kImportanceFloor = 1e-2;

// Shrink factors of the clipping candidates: the extreme element is mapped to r * (end level).
constexpr float kClipRatios[] = {0.6f, 0.7f, 0.8f, 0.9f};
// The fan around the absmax fit: the extreme element mapped to (end level) +- kFanStep * i,
// |i| <= kFanSteps (the assign / refit rounds after the fan refine the winner).
constexpr int kFanSteps = 4;
constexpr float kFanStep = 0.2f;
// Formats with at most this many levels (qmax - qmin) also try the anchor candidates below.
constexpr int kMaxLevelsForAnchor = 16;

// ---------------------------------------------------------------- symmetric: x ~= scale * q

// Weighted error of x ~= scale * q with q = clamp(rne(x / scale)); levels to L (may be null).
double eval_symmetric(const float* x, const float* w, int n, float scale, int qmin, int qmax, int* L) {
  const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
  double err = 0;
  for (int i = 0; i < n; ++i) {
    const int q = clamp_round(x[i] * inv, qmin, qmax);
    if (L != nullptr) L[i] = q;
    const double e = static_cast<double>(scale) * q - x[i];
    err += w[i] * e * e;
  }
  return err;
}

// For levels assigned with inv (q = clamp(rne(x * inv))): the weighted least-squares scale
// and its error sum w x^2 - (sum w q x)^2 / sum w q^2. Returns false when every q is 0.
bool refit_symmetric(const float* x, const float* w, int n, float inv, int qmin, int qmax, double swxx,
                     float* scale, double* err) {
  // Four independent partial sums (n % 4 == 0): the loop is bound by their add latency.
  double sqx4[4] = {}, sqq4[4] = {};
  for (int i = 0; i < n; i += 4) {
    for (int l = 0; l < 4; ++l) {
      const int q = clamp_round(x[i + l] * inv, qmin, qmax);
      const double wq = static_cast<double>(w[i + l]) * q;
      sqx4[l] += wq * x[i + l];
      sqq4[l] += wq * q;
    }
  }
  const double sqx = (sqx4[0] + sqx4[1]) + (sqx4[2] + sqx4[3]);
  const double sqq = (sqq4[0] + sqq4[1]) + (sqq4[2] + sqq4[3]);
  if (!(sqq > 0)) return false;
  *scale = static_cast<float>(sqx / sqq);
  *err = swxx - sqx * sqx / sqq;
  return true;
}

// The weighted-best scale of x ~= scale * q, q in [qmin, qmax] (qmin <= 0 < qmax).
float fit_symmetric_weighted(const float* x, const float* w, int n, int qmin, int qmax) {
  const float v = signed_absmax(x, n);
  if (v == 0.0f) return 0.0f;
  double swxx = 0;
  for (int i = 0; i < n; ++i) swxx += static_cast<double>(w[i]) * x[i] * x[i];
  float best_scale = v / static_cast<float>(v < 0 && qmin < 0 ? qmin : qmax);
  double best_err = INFINITY;
  auto consider = [&](float levels) {
    float scale;
    double err;
    if (refit_symmetric(x, w, n, levels / v, qmin, qmax, swxx, &scale, &err) && err < best_err) {
      best_err = err;
      best_scale = scale;
    }
  };
  for (const int end : {qmin, qmax}) {
    if (end == 0) continue;
    const float e = static_cast<float>(end);
    for (int step = -kFanSteps; step <= kFanSteps; ++step) consider(e + kFanStep * static_cast<float>(step));
    for (const float r : kClipRatios) consider(e * r);
  }
  // With few levels, the element of largest weighted square may sit far inside the range:
  // candidates that put it exactly on each level of its sign.
  if (qmax - qmin <= kMaxLevelsForAnchor) {
    int top = 0;
    for (int i = 1; i < n; ++i)
      if (w[i] * x[i] * x[i] > w[top] * x[top] * x[top]) top = i;
    if (x[top] != 0.0f) {
      for (int l = x[top] > 0 ? 1 : qmin; l <= (x[top] > 0 ? qmax : -1); ++l) {
        float scale;
        double err;
        if (refit_symmetric(x, w, n, static_cast<float>(l) / x[top], qmin, qmax, swxx, &scale, &err) &&
            err < best_err) {
          best_err = err;
          best_scale = scale;
        }
      }
    }
  }
  for (int iter = 0; iter < 4 && best_scale != 0.0f; ++iter) {  // assign / refit rounds
    float scale;
    double err;
    if (!refit_symmetric(x, w, n, 1.0f / best_scale, qmin, qmax, swxx, &scale, &err) || !(err < best_err)) break;
    best_err = err;
    best_scale = scale;
  }
  return best_scale;
}

// ---------------------------------------------------------------- affine: x ~= scale * q - min

struct AffineFit {
  float scale = 0.0f;  // >= 0
  float min = 0.0f;    // >= 0
};

// Weighted error of x ~= scale * q - min with q = clamp(rne((x + min) / scale), 0, nmax);
// levels to L (may be null).
double eval_affine(const float* x, const float* w, int n, float scale, float min, int nmax, int* L) {
  const float inv = scale > 0 ? 1.0f / scale : 0.0f;
  double err = 0;
  for (int i = 0; i < n; ++i) {
    const int q = clamp_round((x[i] + min) * inv, 0, nmax);
    if (L != nullptr) L[i] = q;
    const double e = static_cast<double>(scale) * q - min - x[i];
    err += w[i] * e * e;
  }
  return err;
}

// Weighted least squares x ~= a * q + b for the levels of (scale, min), with b <= 0 and a > 0
// (else b = 0 and a alone); returns the refitted fit and its error. sw = sum w, sx = sum w x.
double refit_affine_weighted(const float* x, const float* w, int n, int nmax, double sw, double sx,
                             AffineFit* fit) {
  int q[kQkK];
  const float inv = fit->scale > 0 ? 1.0f / fit->scale : 0.0f;
  double sq2[2] = {}, sqq2[2] = {}, sqx2[2] = {};  // two partial sums (n even), as above
  for (int i = 0; i < n; i += 2) {
    for (int l = 0; l < 2; ++l) {
      q[i + l] = clamp_round((x[i + l] + fit->min) * inv, 0, nmax);
      const double wq = static_cast<double>(w[i + l]) * q[i + l];
      sq2[l] += wq;
      sqq2[l] += wq * q[i + l];
      sqx2[l] += wq * x[i + l];
    }
  }
  const double sq = sq2[0] + sq2[1], sqq = sqq2[0] + sqq2[1], sqx = sqx2[0] + sqx2[1];
  const double det = sw * sqq - sq * sq;
  double a = 0, b = 0;
  if (det > 0) {
    a = (sw * sqx - sq * sx) / det;
    b = (sqq * sx - sq * sqx) / det;
  }
  if (!(det > 0) || b > 0 || a <= 0) {
    b = 0;
    a = sqq > 0 ? std::max(0.0, sqx / sqq) : 0;
  }
  double err = 0;
  for (int i = 0; i < n; ++i) {
    const double e = a * q[i] + b - x[i];
    err += w[i] * e * e;
  }
  fit->scale = static_cast<float>(a);
  fit->min = static_cast<float>(-b);
  return err;
}

AffineFit fit_affine_weighted(const float* x, const float* w, int n, int nmax) {
  float lo = 0.0f, hi = x[0];
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  double sw = 0, sx = 0;
  for (int i = 0; i < n; ++i) {
    sw += w[i];
    sx += static_cast<double>(w[i]) * x[i];
  }
  AffineFit best;
  best.min = -lo;
  if (!(hi > lo)) return best;  // constant non-positive sub-block
  best.scale = (hi - lo) / static_cast<float>(nmax);
  double best_err = INFINITY;
  auto consider = [&](float levels) {
    AffineFit f{(hi - lo) / levels, -lo};
    const double err = refit_affine_weighted(x, w, n, nmax, sw, sx, &f);
    if (err < best_err && f.scale > 0) {
      best_err = err;
      best = f;
    }
  };
  const auto top = static_cast<float>(nmax);
  for (int step = -kFanSteps; step <= kFanSteps; ++step) consider(top + kFanStep * static_cast<float>(step));
  for (const float r : kClipRatios) consider(top * r);
  for (int iter = 0; iter < 4; ++iter) {
    AffineFit f = best;
    const double err = refit_affine_weighted(x, w, n, nmax, sw, sx, &f);
    if (!(err < best_err) || !(f.scale > 0)) break;
    best_err = err;
    best = f;
  }
  return best;
}

// ---------------------------------------------------------------- K-quant super-blocks

// Sub-block geometry of a K-quant super-block.
struct SuperBlockShape {
  int sub_blocks;  // 8 or 16
  int sub_len;     // 32 or 16
  int qmin, qmax;  // element levels (affine formats: 0..nmax)
  int smin, smax;  // quantized sub-block scale (and min) range
};

// The total importance of each sub-block: the weights of the super-block scale fits.
void sub_block_weights(const float* w, const SuperBlockShape& shape, float* weights) {
  for (int s = 0; s < shape.sub_blocks; ++s) {
    double t = 0;
    for (int i = 0; i < shape.sub_len; ++i) t += w[s * shape.sub_len + i];
    weights[s] = static_cast<float>(t);
  }
}

// The value the decoder sees for f stored as fp16.
inline float fp16_rounded(float f) { return fp16_to_f32(f32_to_fp16(f)); }

// Rounds of the joint refit of the super-block scales below.
constexpr int kSuperRefits = 1;

// Affine K-quant sub-blocks for given super-block scales d, dmin: each sub-block's quantized
// scale sc and min m from -1..+1 around (center_sc, center_m) with the least weighted error,
// its levels to L; returns the total weighted error.
double choose_affine_sub_scales(const float* x, const float* w, const SuperBlockShape& shape, float d, float dmin,
                                const int* center_sc, const int* center_m, int* sc, int* m, int* L) {
  double total = 0;
  for (int s = 0; s < shape.sub_blocks; ++s) {
    const int o = s * shape.sub_len;
    double best_err = INFINITY;
    for (int a = std::max(0, center_sc[s] - 1); a <= std::min(shape.smax, center_sc[s] + 1); ++a) {
      for (int b = std::max(0, center_m[s] - 1); b <= std::min(shape.smax, center_m[s] + 1); ++b) {
        const float eff_scale = d * static_cast<float>(a), eff_min = dmin * static_cast<float>(b);
        const double err = eval_affine(x + o, w + o, shape.sub_len, eff_scale, eff_min, shape.qmax, nullptr);
        if (err < best_err) {
          best_err = err;
          sc[s] = a;
          m[s] = b;
        }
      }
    }
    total += eval_affine(x + o, w + o, shape.sub_len, d * static_cast<float>(sc[s]), dmin * static_cast<float>(m[s]),
                         shape.qmax, L + o);
  }
  return total;
}

// Affine K-quants (Q4_K, Q5_K, Q2_K): the stored d and dmin (fp16 at d_ptr, dmin_ptr), the
// quantized sub-block scales sc and mins m, and the levels L[256]. With sc, m and the levels
// fixed, x ~= d * (sc * L) - dmin * m is linear in (d, dmin): a weighted least-squares refit
// of the pair, then the sub-block choice again, is kept while it lowers the error.
void quant_affine_super(const float* x, const float* w, const SuperBlockShape& shape, uint8_t* d_ptr,
                        uint8_t* dmin_ptr, int* sc, int* m, int* L) {
  float scales[16], mins[16], weights[16];
  for (int s = 0; s < shape.sub_blocks; ++s) {
    const int o = s * shape.sub_len;
    const AffineFit f = fit_affine_weighted(x + o, w + o, shape.sub_len, shape.qmax);
    scales[s] = f.scale;
    mins[s] = f.min;
  }
  sub_block_weights(w, shape, weights);
  float d = fp16_rounded(fit_symmetric_weighted(scales, weights, shape.sub_blocks, 0, shape.smax));
  float dmin = fp16_rounded(fit_symmetric_weighted(mins, weights, shape.sub_blocks, 0, shape.smax));
  int center_sc[16], center_m[16];
  for (int s = 0; s < shape.sub_blocks; ++s) {
    center_sc[s] = d > 0 ? clamp_round(scales[s] / d, 0, shape.smax) : 0;
    center_m[s] = dmin > 0 ? clamp_round(mins[s] / dmin, 0, shape.smax) : 0;
  }
  double err = choose_affine_sub_scales(x, w, shape, d, dmin, center_sc, center_m, sc, m, L);
  for (int round = 0; round < kSuperRefits; ++round) {
    double saa = 0, sab = 0, sbb = 0, sax = 0, sbx = 0;  // a = sc * L, b = m
    for (int e = 0; e < shape.sub_blocks * shape.sub_len; ++e) {
      const int s = e / shape.sub_len;
      const double a = static_cast<double>(sc[s]) * L[e], b = m[s], we = w[e];
      saa += we * a * a;
      sab += we * a * b;
      sbb += we * b * b;
      sax += we * a * x[e];
      sbx += we * b * x[e];
    }
    // Minimise sum w (d a - dmin b - x)^2: d saa - dmin sab = sax, d sab - dmin sbb = sbx.
    const double det = sab * sab - saa * sbb;
    if (!(std::fabs(det) > 1e-12 * saa * sbb)) break;
    const float new_d = fp16_rounded(static_cast<float>((sab * sbx - sbb * sax) / det));
    const float new_dmin = fp16_rounded(static_cast<float>((saa * sbx - sab * sax) / det));
    if (!(new_d > 0) || !(new_dmin >= 0)) break;
    int new_sc[16], new_m[16], new_L[kQkK];
    const double new_err =
        choose_affine_sub_scales(x, w, shape, new_d, new_dmin, sc, m, new_sc, new_m, new_L);
    if (!(new_err < err)) break;
    err = new_err;
    d = new_d;
    dmin = new_dmin;
    std::memcpy(sc, new_sc, sizeof(int) * shape.sub_blocks);
    std::memcpy(m, new_m, sizeof(int) * shape.sub_blocks);
    std::memcpy(L, new_L, sizeof(new_L));
  }
  store_f16(d_ptr, d);
  store_f16(dmin_ptr, dmin);
}

// Symmetric K-quant sub-blocks for a given super-block scale d: each sub-block's signed
// quantized scale q from -1..+1 around center[s], its levels to L; returns the total error.
double choose_symmetric_sub_scales(const float* x, const float* w, const SuperBlockShape& shape, float d,
                                   const int* center, int* q, int* L) {
  double total = 0;
  for (int s = 0; s < shape.sub_blocks; ++s) {
    const int o = s * shape.sub_len;
    double best_err = INFINITY;
    for (int a = std::max(shape.smin, center[s] - 1); a <= std::min(shape.smax, center[s] + 1); ++a) {
      const double err =
          eval_symmetric(x + o, w + o, shape.sub_len, d * static_cast<float>(a), shape.qmin, shape.qmax, nullptr);
      if (err < best_err) {
        best_err = err;
        q[s] = a;
      }
    }
    total += eval_symmetric(x + o, w + o, shape.sub_len, d * static_cast<float>(q[s]), shape.qmin, shape.qmax, L + o);
  }
  return total;
}

// Symmetric K-quants (Q3_K, Q6_K): the stored d (fp16 at d_ptr), the signed sub-block scales
// q and the levels L[256] (signed, qmin..qmax); d refitted as in quant_affine_super.
void quant_symmetric_super(const float* x, const float* w, const SuperBlockShape& shape, uint8_t* d_ptr, int* q,
                           int* L) {
  float scales[16], weights[16];
  for (int s = 0; s < shape.sub_blocks; ++s) {
    const int o = s * shape.sub_len;
    scales[s] = fit_symmetric_weighted(x + o, w + o, shape.sub_len, shape.qmin, shape.qmax);
  }
  sub_block_weights(w, shape, weights);
  float d = fp16_rounded(fit_symmetric_weighted(scales, weights, shape.sub_blocks, shape.smin, shape.smax));
  int center[16];
  for (int s = 0; s < shape.sub_blocks; ++s)
    center[s] = d != 0.0f ? clamp_round(scales[s] / d, shape.smin, shape.smax) : 0;
  double err = choose_symmetric_sub_scales(x, w, shape, d, center, q, L);
  for (int round = 0; round < kSuperRefits; ++round) {
    double saa = 0, sax = 0;  // a = q * L
    for (int e = 0; e < shape.sub_blocks * shape.sub_len; ++e) {
      const double a = static_cast<double>(q[e / shape.sub_len]) * L[e];
      saa += w[e] * a * a;
      sax += w[e] * a * x[e];
    }
    if (!(saa > 0)) break;
    const float new_d = fp16_rounded(static_cast<float>(sax / saa));
    int new_q[16], new_L[kQkK];
    const double new_err = choose_symmetric_sub_scales(x, w, shape, new_d, q, new_q, new_L);
    if (!(new_err < err)) break;
    err = new_err;
    d = new_d;
    std::memcpy(q, new_q, sizeof(int) * shape.sub_blocks);
    std::memcpy(L, new_L, sizeof(new_L));
  }
  store_f16(d_ptr, d);
}

// ---------------------------------------------------------------- block encoders

// Encodes one block (32 or 256 elements per the format) of x with element weights w.
using BlockEncoder = void (*)(const float* x, const float* w, uint8_t* dst);

// The 32-blocks: d = the weighted scale fit, levels by rounding with the stored d.
template <int kQmin, int kQmax>
float encode_symmetric32(const float* x, const float* w, uint8_t* d_ptr, int* L) {
  const float d = store_f16(d_ptr, fit_symmetric_weighted(x, w, kQk, kQmin, kQmax));
  eval_symmetric(x, w, kQk, d, kQmin, kQmax, L);
  return d;
}

void encode_q8_0(const float* x, const float* w, uint8_t* dst) {
  int L[kQk];
  encode_symmetric32<-127, 127>(x, w, dst, L);
  for (int j = 0; j < kQk; ++j) dst[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(L[j]));
}

void encode_q4_0(const float* x, const float* w, uint8_t* dst) {
  int L[kQk];
  encode_symmetric32<-8, 7>(x, w, dst, L);
  for (int& l : L) l += 8;
  quant_fit::pack_q4_0_levels(L, dst + 2);
}

void encode_q5_0(const float* x, const float* w, uint8_t* dst) {
  int L[kQk];
  encode_symmetric32<-16, 15>(x, w, dst, L);
  for (int& l : L) l += 16;
  quant_fit::pack_q5_0_levels(L, dst + 2, dst + 6);
}

void encode_q4_k(const float* x, const float* w, uint8_t* dst) {
  int sc[8], m[8], L[kQkK];
  quant_affine_super(x, w, {8, 32, 0, 15, 0, 63}, dst, dst + 2, sc, m, L);
  quant_fit::pack_scale_min(dst + 4, sc, m);
  quant_fit::pack_q4_k_levels(L, dst + 16);
}

void encode_q5_k(const float* x, const float* w, uint8_t* dst) {
  int sc[8], m[8], L[kQkK];
  quant_affine_super(x, w, {8, 32, 0, 31, 0, 63}, dst, dst + 2, sc, m, L);
  quant_fit::pack_scale_min(dst + 4, sc, m);
  quant_fit::pack_q5_k_levels(L, dst + 16, dst + 48);
}

void encode_q2_k(const float* x, const float* w, uint8_t* dst) {
  int sc[16], m[16], L[kQkK];
  quant_affine_super(x, w, {16, 16, 0, 3, 0, 15}, dst + 80, dst + 82, sc, m, L);
  for (int i = 0; i < 16; ++i) dst[i] = static_cast<uint8_t>(sc[i] | (m[i] << 4));
  std::memset(dst + 16, 0, 64);
  for (int e = 0; e < kQkK; ++e) quant_fit::set_plane2(dst + 16, e, L[e]);
}

void encode_q3_k(const float* x, const float* w, uint8_t* dst) {
  int q[16], L[kQkK];
  quant_symmetric_super(x, w, {16, 16, -4, 3, -32, 31}, dst + 108, q, L);
  for (int& l : L) l += 4;
  quant_fit::pack_q3_k(q, L, dst);
}

void encode_q6_k(const float* x, const float* w, uint8_t* dst) {
  int q[16], L[kQkK];
  quant_symmetric_super(x, w, {16, 16, -32, 31, -128, 127}, dst + 208, q, L);
  for (int s = 0; s < 16; ++s) dst[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(q[s]));
  for (int& l : L) l += 32;
  quant_fit::pack_q6_k_levels(L, dst);
}

// Ternary x ~= d * t: for a nonzero set S, d = sum_S w|x| / sum_S w removes
// (sum_S w|x|)^2 / sum_S w of weighted error; S is a prefix of the magnitude order (see the
// file comment). Stores d at d_ptr and the trits (rounding with the stored d) in t[256].
void fit_ternary_weighted(const float* x, const float* w, uint8_t* d_ptr, int* t) {
  int order[kQkK];
  std::iota(order, order + kQkK, 0);
  std::stable_sort(order, order + kQkK, [x](int a, int b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  double swx = 0, sw = 0, best_gain = 0, best_d = 0;
  for (int n = 0; n < kQkK; ++n) {
    const int i = order[n];
    swx += static_cast<double>(w[i]) * std::fabs(x[i]);
    sw += w[i];
    if (sw > 0 && swx * swx / sw > best_gain) {
      best_gain = swx * swx / sw;
      best_d = swx / sw;
    }
  }
  const float d = store_f16(d_ptr, static_cast<float>(best_d));
  const float inv = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < kQkK; ++i) t[i] = clamp_round(x[i] * inv, -1, 1);
}

void encode_tq2_0(const float* x, const float* w, uint8_t* dst) {
  int t[kQkK];
  fit_ternary_weighted(x, w, dst + 64, t);
  quant_fit::pack_tq2_0(t, dst);
}

void encode_tq1_0(const float* x, const float* w, uint8_t* dst) {
  int t[kQkK];
  fit_ternary_weighted(x, w, dst + 52, t);
  quant_fit::pack_tq1_0(t, dst);
}

BlockEncoder weighted_encoder(QuantType type) {
  switch (type) {
    case QuantType::kQ8_0: return encode_q8_0;
    case QuantType::kQ4_0: return encode_q4_0;
    case QuantType::kQ5_0: return encode_q5_0;
    case QuantType::kQ4_K: return encode_q4_k;
    case QuantType::kQ5_K: return encode_q5_k;
    case QuantType::kQ6_K: return encode_q6_k;
    case QuantType::kQ2_K: return encode_q2_k;
    case QuantType::kQ3_K: return encode_q3_k;
    case QuantType::kTQ1_0: return encode_tq1_0;
    case QuantType::kTQ2_0: return encode_tq2_0;
    default: return nullptr;
  }
}

}  // namespace

bool can_quantize_weighted(QuantType type) {
  return quant_traits(type).is_float || weighted_encoder(type) != nullptr;
}

void quantize_row_weighted(QuantType type, const float* src, const float* importance, void* dst, int64_t k) {
  if (importance == nullptr || quant_traits(type).is_float) return quantize_row(type, src, dst, k);
  const QuantTraits& tr = quant_traits(type);
  TESSERA_CHECK(k >= 0 && k % tr.block_elems == 0, "{} row of {} elements: not a multiple of {}", tr.name, k,
                tr.block_elems);
  const BlockEncoder encode = weighted_encoder(type);
  TESSERA_CHECK(encode != nullptr, "quantize_row_weighted: {} has no importance-weighted encoder", tr.name);
  double sum = 0;
  for (int64_t j = 0; j < k; ++j) {
    TESSERA_CHECK(importance[j] >= 0.0f && std::isfinite(importance[j]),
                  "quantize_row_weighted: importance[{}] = {} (must be finite and >= 0)", j, importance[j]);
    sum += importance[j];
  }
  const double mean = k > 0 ? sum / static_cast<double>(k) : 0.0;
  const float floor = static_cast<float>(kImportanceFloor * mean);
  const int be = tr.block_elems;
  float w[kQkK];
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < k / be; ++b) {
    for (int i = 0; i < be; ++i) w[i] = mean > 0 ? importance[b * be + i] + floor : 1.0f;
    encode(src + b * be, w, out + b * tr.block_bytes);
  }
}

}  // namespace tessera
