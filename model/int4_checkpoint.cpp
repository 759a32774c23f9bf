#include "model/int4_checkpoint.h"

#include <cstring>

#include <fmt/format.h>

#include "common/dtype.h"
#include "model/safetensors.h"

namespace tessera {
namespace {

struct Packed {
  const SafetensorsTensor* t = nullptr;
  std::string name;
};

Result<Packed> find(const SafetensorsCheckpoint& st, const std::string& name, bool required) {
  Packed p;
  p.name = name;
  p.t = st.find(name);
  if (!p.t && required) return Status::not_found(fmt::format("no tensor '{}' (needed by the quantized layer)", name));
  return p;
}

Status expect(const Packed& p, QuantType type, std::initializer_list<int64_t> shape, std::string_view what) {
  const TensorView& v = p.t->view;
  bool ok = v.data != nullptr && v.type == type && v.ndim == static_cast<int>(shape.size());
  int i = 0;
  for (int64_t d : shape) ok = ok && v.shape[static_cast<size_t>(i++)] == d;
  if (ok) return Status::ok();
  std::vector<int64_t> want(shape);
  return Status::invalid_argument(fmt::format("{}: tensor '{}' is {} {}, expected {} [{}] ({})", *p.t->file, p.name,
                                              p.t->dtype, v.shape_string(), quant_name(type),
                                              fmt::join(want, ", "), what));
}

int32_t word(const TensorView& v, int64_t r, int64_t c) {
  int32_t w;
  std::memcpy(&w, static_cast<const uint8_t*>(v.data) + (static_cast<size_t>(r * v.shape[1] + c)) * 4, 4);
  return w;
}

int nibble(int32_t w, int pos) { return static_cast<int>((static_cast<uint32_t>(w) >> (4 * pos)) & 0xF); }

// fp16 bits of scales[g, n] (F16 as is; F32 / BF16 rounded to fp16).
uint16_t scale_bits(const TensorView& v, int64_t g, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(v.data);
  const size_t i = static_cast<size_t>(g * v.shape[1] + n);
  uint16_t h;
  switch (v.type) {
    case QuantType::kF16: std::memcpy(&h, p + 2 * i, 2); return h;
    case QuantType::kBF16: std::memcpy(&h, p + 2 * i, 2); return f32_to_fp16(bf16_to_f32(h));
    default: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f32_to_fp16(f);
    }
  }
}

}  // namespace

Result<Int4Linear> convert_int4_linear(const SafetensorsCheckpoint& st, const std::string& prefix,
                                       const QuantizationConfig& q) {
  const bool awq = q.method == CheckpointQuant::kAwq;
  if (q.method == CheckpointQuant::kNone) return Status::invalid_argument(prefix + ": not a quantized checkpoint");
  TESSERA_ASSIGN_OR_RETURN(Packed qw, find(st, prefix + ".qweight", true));
  TESSERA_ASSIGN_OR_RETURN(Packed sc, find(st, prefix + ".scales", true));
  TESSERA_ASSIGN_OR_RETURN(Packed qz, find(st, prefix + ".qzeros", !(awq && q.sym)));
  TESSERA_ASSIGN_OR_RETURN(Packed gi, find(st, prefix + ".g_idx", false));
  const TensorView& w = qw.t->view;
  if (w.ndim != 2 || w.type != QuantType::kI32)
    return Status::invalid_argument(fmt::format("{}: tensor '{}' is {} {}, expected a 2-D I32 packed weight",
                                                *qw.t->file, qw.name, qw.t->dtype, w.shape_string()));
  Int4Linear out;
  out.in_features = awq ? w.shape[0] : w.shape[0] * 8;
  out.out_features = awq ? w.shape[1] * 8 : w.shape[1];
  const int64_t K = out.in_features, N = out.out_features, G = q.group_size;
  if (K % G != 0 || N % 8 != 0)
    return Status::invalid_argument(fmt::format(
        "{}: tensor '{}' {}: {} input features are not a multiple of the group size {} (or {} outputs of 8)",
        *qw.t->file, qw.name, w.shape_string(), K, G, N));
  const int64_t groups = K / G;
  const TensorView& s = sc.t->view;
  if (s.data == nullptr || s.ndim != 2 || s.shape[0] != groups || s.shape[1] != N ||
      !(s.type == QuantType::kF16 || s.type == QuantType::kBF16 || s.type == QuantType::kF32))
    return Status::invalid_argument(fmt::format("{}: tensor '{}' is {} {}, expected float [{}, {}]", *sc.t->file,
                                                sc.name, sc.t->dtype, s.shape_string(), groups, N));
  if (qz.t) TESSERA_RETURN_IF_ERROR(expect(qz, QuantType::kI32, {groups, N / 8}, "packed zeros"));
  if (gi.t) {
    TESSERA_RETURN_IF_ERROR(expect(gi, QuantType::kI32, {K}, "group index of each input"));
    for (int64_t k = 0; k < K; ++k) {
      int32_t g;
      std::memcpy(&g, static_cast<const uint8_t*>(gi.t->view.data) + 4 * k, 4);
      if (g != k / G)
        return Status::unimplemented(fmt::format(
            "{}: tensor '{}' maps input {} to group {} (expected {}): act-order (desc_act) GPTQ checkpoints "
            "are not supported; re-quantize without act-order",
            *gi.t->file, gi.name, k, g, k / G));
    }
  }
  const size_t rb = row_bytes(QuantType::kI4_G128, K);
  out.bytes.resize(rb * static_cast<size_t>(N));
  Int4Group grp;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < groups; ++g) {
      grp.scale_fp16 = scale_bits(s, g, n);
      int z = 8;
      if (qz.t) {
        const int32_t zw = word(qz.t->view, g, n / 8);
        if (awq) {
          z = nibble(zw, kAwqNibbleOfColumn[n % 8]);
        } else {
          z = nibble(zw, static_cast<int>(n % 8));
          if (!q.gptq_v2) z = (z + 1) & 0xF;
        }
      }
      grp.zero = static_cast<uint8_t>(z);
      for (int64_t j = 0; j < G; ++j) {
        const int64_t k = g * G + j;
        grp.levels[j] = static_cast<uint8_t>(awq ? nibble(word(w, k, n / 8), kAwqNibbleOfColumn[n % 8])
                                                 : nibble(word(w, k / 8, n), static_cast<int>(k % 8)));
      }
      write_int4_group(grp, out.bytes.data() + static_cast<size_t>(n) * rb + static_cast<size_t>(g) * 68);
    }
  }
  return out;
}

}  // namespace tessera
