// GGUF version 3 writer: metadata of every value type, tensors in any QuantType (ggml byte
// layout, the caller supplies the bytes), data section aligned to `general.alignment` (32).
//
// Tensors are declared first and their bytes produced when the file is written, one tensor at a
// time, so a multi-gigabyte model never sits in memory at once (see GgufTensorFill).
// write() is atomic: the file appears under its final name only when complete (temp file in the
// same directory + rename). Not thread-safe; one writer per file.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "model/gguf.h"

namespace tessera {

// Fills `dst` (exactly the tensor's byte size) with the tensor's data. Called once, from
// GgufWriter::write(), in declaration order; an error aborts the write.
using GgufTensorFill = std::function<Status(std::span<uint8_t> dst)>;

class GgufWriter {
 public:
  // `alignment` (bytes, a power of two) is stored as `general.alignment`.
  explicit GgufWriter(uint32_t alignment = 32);

  // ---- metadata: setting a key again replaces its value (keeping its first position) ----
  void set_u8(std::string_view key, uint8_t v);
  void set_i8(std::string_view key, int8_t v);
  void set_u16(std::string_view key, uint16_t v);
  void set_i16(std::string_view key, int16_t v);
  void set_u32(std::string_view key, uint32_t v);
  void set_i32(std::string_view key, int32_t v);
  void set_u64(std::string_view key, uint64_t v);
  void set_i64(std::string_view key, int64_t v);
  void set_f32(std::string_view key, float v);
  void set_f64(std::string_view key, double v);
  void set_bool(std::string_view key, bool v);
  void set_string(std::string_view key, std::string_view v);
  void set_u8_array(std::string_view key, std::span<const uint8_t> v);
  void set_i32_array(std::string_view key, std::span<const int32_t> v);
  void set_u32_array(std::string_view key, std::span<const uint32_t> v);
  void set_i64_array(std::string_view key, std::span<const int64_t> v);
  void set_f32_array(std::string_view key, std::span<const float> v);
  void set_f64_array(std::string_view key, std::span<const double> v);
  void set_bool_array(std::string_view key, std::span<const bool> v);
  void set_string_array(std::string_view key, std::span<const std::string> v);
  // Copies a value read by GgufFile, in its original (un-widened) type. InvalidArgument when the
  // value does not fit that type or is inconsistent (e.g. an array of arrays).
  Status set_value(std::string_view key, const GgufValue& value);
  bool has_key(std::string_view key) const;

  // ---- tensors ----
  // `shape` is row-major, outermost first (as TensorView); GGUF stores it reversed (ne[0] is the
  // innermost dimension). 1..4 dims, each > 0, the innermost a multiple of the type's block size.
  // Errors (InvalidArgument) name the tensor: duplicate name, bad shape, unsupported type.
  Status add_tensor(std::string_view name, std::span<const int64_t> shape, QuantType type,
                    GgufTensorFill fill);
  // Same, with the bytes given now (moved in); their size must be the tensor's byte size.
  Status add_tensor(std::string_view name, std::span<const int64_t> shape, QuantType type,
                    std::vector<uint8_t> bytes);
  // A tensor of any ggml type id, bytes taken as they are (for tests of readers with types
  // Tessera does not support). `shape` outermost first.
  Status add_raw_tensor(std::string_view name, std::span<const int64_t> shape, int ggml_type,
                        std::vector<uint8_t> bytes);
  size_t tensor_count() const { return tensors_.size(); }

  // Writes the file. IoError names the path; fill errors pass through with the tensor's name.
  // The writer may be written again (e.g. to a second path); fills are called again.
  Status write(const std::string& path) const;

 private:
  struct Kv {
    std::string key;
    std::vector<uint8_t> encoded;  // value type (u32) + payload, as in the file
  };
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;  // outermost first
    int ggml_type = 0;
    uint64_t nbytes = 0;
    GgufTensorFill fill;          // or empty: `bytes` holds the data
    std::vector<uint8_t> bytes;
  };
  void put_kv(std::string_view key, std::vector<uint8_t> encoded);
  Status check_new_tensor(std::string_view name, std::span<const int64_t> shape) const;

  uint32_t alignment_;
  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace tessera
