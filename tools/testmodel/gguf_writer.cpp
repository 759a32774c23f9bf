#include "tools/testmodel/gguf_writer.h"

#include <bit>
#include <cstring>
#include <limits>
#include <unordered_set>

#include <fmt/format.h>

#include "common/check.h"
#include "tools/testmodel/atomic_file.h"

namespace tessera {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF is little-endian; so is this writer");

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kGgufVersion = 3;
constexpr size_t kMaxTensorName = 63;        // ggml's GGML_MAX_NAME is 64 with the NUL

class Encoder {
 public:
  template <typename T>
  void pod(T v) {
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
  }
  void str(std::string_view s) {
    pod<uint64_t>(s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
  void type(GgufValueType t) { pod<uint32_t>(static_cast<uint32_t>(t)); }
  std::vector<uint8_t> out;
};

template <typename T>
std::vector<uint8_t> encode_scalar(GgufValueType t, T v) {
  Encoder e;
  e.type(t);
  e.pod(v);
  return std::move(e.out);
}

template <typename T>
std::vector<uint8_t> encode_array(GgufValueType elem, std::span<const T> v) {
  Encoder e;
  e.type(GgufValueType::kArray);
  e.type(elem);
  e.pod<uint64_t>(v.size());
  for (const T& x : v) e.pod(x);
  return std::move(e.out);
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

std::string shape_str(std::span<const int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Encodes one scalar of `t` taken from a widened GgufValue payload.
Status encode_widened(Encoder& e, GgufValueType t, int64_t i, uint64_t u, double d, bool is_unsigned,
                      std::string_view key) {
  auto fits = [&](int64_t lo, uint64_t hi) {
    if (is_unsigned) return u <= hi;
    return i >= lo && (i < 0 || static_cast<uint64_t>(i) <= hi);
  };
  auto bad = [&]() {
    return Status::invalid_argument(fmt::format("GGUF key '{}': value does not fit its type {}", key,
                                                static_cast<uint32_t>(t)));
  };
  const int64_t sv = is_unsigned ? static_cast<int64_t>(u) : i;
  switch (t) {
    case GgufValueType::kUint8: if (!fits(0, 0xff)) return bad(); e.pod<uint8_t>(static_cast<uint8_t>(sv)); break;
    case GgufValueType::kInt8: if (!fits(-128, 127)) return bad(); e.pod<int8_t>(static_cast<int8_t>(sv)); break;
    case GgufValueType::kUint16: if (!fits(0, 0xffff)) return bad(); e.pod<uint16_t>(static_cast<uint16_t>(sv)); break;
    case GgufValueType::kInt16: if (!fits(-32768, 32767)) return bad(); e.pod<int16_t>(static_cast<int16_t>(sv)); break;
    case GgufValueType::kUint32: if (!fits(0, 0xffffffffu)) return bad(); e.pod<uint32_t>(static_cast<uint32_t>(sv)); break;
    case GgufValueType::kInt32: if (!fits(INT32_MIN, INT32_MAX)) return bad(); e.pod<int32_t>(static_cast<int32_t>(sv)); break;
    case GgufValueType::kUint64:
      if (!is_unsigned && i < 0) return bad();
      e.pod<uint64_t>(is_unsigned ? u : static_cast<uint64_t>(i));
      break;
    case GgufValueType::kInt64:
      if (is_unsigned && u > static_cast<uint64_t>(INT64_MAX)) return bad();
      e.pod<int64_t>(sv);
      break;
    case GgufValueType::kFloat32: e.pod<float>(static_cast<float>(d)); break;
    case GgufValueType::kFloat64: e.pod<double>(d); break;
    case GgufValueType::kBool: e.pod<uint8_t>(is_unsigned ? (u != 0) : (i != 0)); break;
    default: return bad();
  }
  return Status::ok();
}

bool is_float_type(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  TESSERA_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0, "alignment {} not a power of two",
                alignment);
  set_u32("general.alignment", alignment);
}

void GgufWriter::put_kv(std::string_view key, std::vector<uint8_t> encoded) {
  for (Kv& kv : kvs_) {
    if (kv.key == key) {
      kv.encoded = std::move(encoded);
      return;
    }
  }
  kvs_.push_back({std::string(key), std::move(encoded)});
}

bool GgufWriter::has_key(std::string_view key) const {
  for (const Kv& kv : kvs_)
    if (kv.key == key) return true;
  return false;
}

void GgufWriter::set_u8(std::string_view k, uint8_t v) { put_kv(k, encode_scalar(GgufValueType::kUint8, v)); }
void GgufWriter::set_i8(std::string_view k, int8_t v) { put_kv(k, encode_scalar(GgufValueType::kInt8, v)); }
void GgufWriter::set_u16(std::string_view k, uint16_t v) { put_kv(k, encode_scalar(GgufValueType::kUint16, v)); }
void GgufWriter::set_i16(std::string_view k, int16_t v) { put_kv(k, encode_scalar(GgufValueType::kInt16, v)); }
void GgufWriter::set_u32(std::string_view k, uint32_t v) { put_kv(k, encode_scalar(GgufValueType::kUint32, v)); }
void GgufWriter::set_i32(std::string_view k, int32_t v) { put_kv(k, encode_scalar(GgufValueType::kInt32, v)); }
void GgufWriter::set_u64(std::string_view k, uint64_t v) { put_kv(k, encode_scalar(GgufValueType::kUint64, v)); }
void GgufWriter::set_i64(std::string_view k, int64_t v) { put_kv(k, encode_scalar(GgufValueType::kInt64, v)); }
void GgufWriter::set_f32(std::string_view k, float v) { put_kv(k, encode_scalar(GgufValueType::kFloat32, v)); }
void GgufWriter::set_f64(std::string_view k, double v) { put_kv(k, encode_scalar(GgufValueType::kFloat64, v)); }
void GgufWriter::set_bool(std::string_view k, bool v) {
  put_kv(k, encode_scalar<uint8_t>(GgufValueType::kBool, v ? 1 : 0));
}
void GgufWriter::set_string(std::string_view k, std::string_view v) {
  Encoder e;
  e.type(GgufValueType::kString);
  e.str(v);
  put_kv(k, std::move(e.out));
}
void GgufWriter::set_u8_array(std::string_view k, std::span<const uint8_t> v) {
  put_kv(k, encode_array(GgufValueType::kUint8, v));
}
void GgufWriter::set_i32_array(std::string_view k, std::span<const int32_t> v) {
  put_kv(k, encode_array(GgufValueType::kInt32, v));
}
void GgufWriter::set_u32_array(std::string_view k, std::span<const uint32_t> v) {
  put_kv(k, encode_array(GgufValueType::kUint32, v));
}
void GgufWriter::set_i64_array(std::string_view k, std::span<const int64_t> v) {
  put_kv(k, encode_array(GgufValueType::kInt64, v));
}
void GgufWriter::set_f32_array(std::string_view k, std::span<const float> v) {
  put_kv(k, encode_array(GgufValueType::kFloat32, v));
}
void GgufWriter::set_f64_array(std::string_view k, std::span<const double> v) {
  put_kv(k, encode_array(GgufValueType::kFloat64, v));
}
void GgufWriter::set_bool_array(std::string_view k, std::span<const bool> v) {
  Encoder e;
  e.type(GgufValueType::kArray);
  e.type(GgufValueType::kBool);
  e.pod<uint64_t>(v.size());
  for (bool b : v) e.pod<uint8_t>(b ? 1 : 0);
  put_kv(k, std::move(e.out));
}
void GgufWriter::set_string_array(std::string_view k, std::span<const std::string> v) {
  Encoder e;
  e.type(GgufValueType::kArray);
  e.type(GgufValueType::kString);
  e.pod<uint64_t>(v.size());
  for (const std::string& s : v) e.str(s);
  put_kv(k, std::move(e.out));
}

Status GgufWriter::set_value(std::string_view key, const GgufValue& value) {
  Encoder e;
  auto bad = [&](const char* why) {
    return Status::invalid_argument(fmt::format("GGUF key '{}': {}", key, why));
  };
  if (value.type == GgufValueType::kString) {
    const auto* s = std::get_if<std::string>(&value.value);
    if (!s) return bad("string type without a string value");
    e.type(GgufValueType::kString);
    e.str(*s);
  } else if (value.type == GgufValueType::kArray) {
    e.type(GgufValueType::kArray);
    e.type(value.array_type);
    if (value.array_type == GgufValueType::kString) {
      const auto* v = std::get_if<std::vector<std::string>>(&value.value);
      if (!v) return bad("string array without strings");
      e.pod<uint64_t>(v->size());
      for (const auto& s : *v) e.str(s);
    } else if (is_float_type(value.array_type)) {
      const auto* v = std::get_if<std::vector<double>>(&value.value);
      if (!v) return bad("float array without floats");
      e.pod<uint64_t>(v->size());
      for (double d : *v) TESSERA_RETURN_IF_ERROR(encode_widened(e, value.array_type, 0, 0, d, false, key));
    } else if (value.array_type == GgufValueType::kArray) {
      return bad("arrays of arrays are not supported");
    } else {
      const auto* v = std::get_if<std::vector<int64_t>>(&value.value);
      if (!v) return bad("integer array without integers");
      e.pod<uint64_t>(v->size());
      for (int64_t i : *v) TESSERA_RETURN_IF_ERROR(encode_widened(e, value.array_type, i, 0, 0, false, key));
    }
  } else {
    e.type(value.type);
    if (const auto* i = std::get_if<int64_t>(&value.value)) {
      TESSERA_RETURN_IF_ERROR(encode_widened(e, value.type, *i, 0, static_cast<double>(*i), false, key));
    } else if (const auto* u = std::get_if<uint64_t>(&value.value)) {
      TESSERA_RETURN_IF_ERROR(encode_widened(e, value.type, 0, *u, static_cast<double>(*u), true, key));
    } else if (const auto* d = std::get_if<double>(&value.value)) {
      if (!is_float_type(value.type)) return bad("integer type with a float value");
      TESSERA_RETURN_IF_ERROR(encode_widened(e, value.type, 0, 0, *d, false, key));
    } else if (const auto* b = std::get_if<bool>(&value.value)) {
      TESSERA_RETURN_IF_ERROR(encode_widened(e, value.type, *b ? 1 : 0, 0, *b ? 1.0 : 0.0, false, key));
    } else {
      return bad("scalar type with an array or string value");
    }
  }
  put_kv(key, std::move(e.out));
  return Status::ok();
}

Status GgufWriter::check_new_tensor(std::string_view name, std::span<const int64_t> shape) const {
  if (name.empty()) return Status::invalid_argument("GGUF tensor with an empty name");
  if (name.size() > kMaxTensorName)
    return Status::invalid_argument(fmt::format("GGUF tensor '{}': name longer than {} bytes", name, kMaxTensorName));
  for (const Tensor& t : tensors_)
    if (t.name == name) return Status::invalid_argument(fmt::format("GGUF tensor '{}' added twice", name));
  if (shape.empty() || shape.size() > 4)
    return Status::invalid_argument(fmt::format("GGUF tensor '{}': {} dimensions, expected 1..4", name, shape.size()));
  for (int64_t d : shape)
    if (d <= 0) return Status::invalid_argument(fmt::format("GGUF tensor '{}': bad shape {}", name, shape_str(shape)));
  return Status::ok();
}

Status GgufWriter::add_tensor(std::string_view name, std::span<const int64_t> shape, QuantType type,
                              GgufTensorFill fill) {
  TESSERA_RETURN_IF_ERROR(check_new_tensor(name, shape));
  const QuantTraits& tr = quant_traits(type);
  if (tr.ggml_type < 0)
    return Status::invalid_argument(fmt::format("GGUF tensor '{}': type {} has no ggml type id", name, tr.name));
  const int64_t cols = shape.back();
  if (cols % tr.block_elems != 0)
    return Status::invalid_argument(fmt::format("GGUF tensor '{}': shape {} innermost dimension is not a multiple of "
                                                "{} (block size of {})", name, shape_str(shape), tr.block_elems, tr.name));
  uint64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= static_cast<uint64_t>(shape[i]);
  Tensor t;
  t.name = std::string(name);
  t.shape.assign(shape.begin(), shape.end());
  t.ggml_type = tr.ggml_type;
  t.nbytes = rows * row_bytes(type, cols);
  t.fill = std::move(fill);
  tensors_.push_back(std::move(t));
  return Status::ok();
}

Status GgufWriter::add_tensor(std::string_view name, std::span<const int64_t> shape, QuantType type,
                              std::vector<uint8_t> bytes) {
  TESSERA_RETURN_IF_ERROR(add_tensor(name, shape, type, GgufTensorFill()));
  Tensor& t = tensors_.back();
  if (bytes.size() != t.nbytes) {
    const uint64_t expected = t.nbytes;
    tensors_.pop_back();
    return Status::invalid_argument(fmt::format("GGUF tensor '{}': {} bytes given, shape {} of {} needs {}", name,
                                                bytes.size(), shape_str(shape), quant_name(type), expected));
  }
  t.bytes = std::move(bytes);
  return Status::ok();
}

Status GgufWriter::add_raw_tensor(std::string_view name, std::span<const int64_t> shape, int ggml_type,
                                  std::vector<uint8_t> bytes) {
  TESSERA_RETURN_IF_ERROR(check_new_tensor(name, shape));
  if (ggml_type < 0) return Status::invalid_argument(fmt::format("GGUF tensor '{}': negative ggml type", name));
  Tensor t;
  t.name = std::string(name);
  t.shape.assign(shape.begin(), shape.end());
  t.ggml_type = ggml_type;
  t.nbytes = bytes.size();
  t.bytes = std::move(bytes);
  tensors_.push_back(std::move(t));
  return Status::ok();
}

Status GgufWriter::write(const std::string& path) const {
  Encoder head;
  head.pod<uint32_t>(kGgufMagic);
  head.pod<uint32_t>(kGgufVersion);
  head.pod<uint64_t>(tensors_.size());
  head.pod<uint64_t>(kvs_.size());
  for (const Kv& kv : kvs_) {
    head.str(kv.key);
    head.out.insert(head.out.end(), kv.encoded.begin(), kv.encoded.end());
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    head.str(t.name);
    head.pod<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) head.pod<uint64_t>(static_cast<uint64_t>(*it));
    head.pod<uint32_t>(static_cast<uint32_t>(t.ggml_type));
    head.pod<uint64_t>(offset);
    offset = align_up(offset + t.nbytes, alignment_);
  }

  TESSERA_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::create(path));
  TESSERA_RETURN_IF_ERROR(file.write(head.out.data(), head.out.size()));
  TESSERA_RETURN_IF_ERROR(file.write_zeros(align_up(head.out.size(), alignment_) - head.out.size()));
  std::vector<uint8_t> buffer;
  for (const Tensor& t : tensors_) {
    if (t.fill) {
      buffer.assign(t.nbytes, 0);
      Status s = t.fill(std::span<uint8_t>(buffer.data(), buffer.size()));
      if (!s.is_ok()) return s.with_context(fmt::format("{}: tensor '{}'", path, t.name));
      TESSERA_RETURN_IF_ERROR(file.write(buffer.data(), buffer.size()));
    } else {
      TESSERA_RETURN_IF_ERROR(file.write(t.bytes.data(), t.bytes.size()));
    }
    TESSERA_RETURN_IF_ERROR(file.write_zeros(align_up(t.nbytes, alignment_) - t.nbytes));
  }
  // Release the largest tensor's buffer before the rename; nothing else needs it.
  std::vector<uint8_t>().swap(buffer);
  return file.commit();
}

}  // namespace tessera
