// GGUF (version 2 and 3) reader over a memory-mapped file, or over the header alone
// (GgufFile::open_metadata) for readers that need no weights.
//
// Every offset and length read from the file is bounds-checked; a truncated or corrupted file
// gives a kCorrupt Status naming the file and the key or tensor, never a crash.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/mapped_file.h"
#include "common/status.h"
#include "common/tensor.h"

namespace tessera {

enum class GgufValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};

// One metadata value. Arrays of numbers are widened (ints to int64, floats to double);
// arrays of strings stay strings.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint32;
  GgufValueType array_type = GgufValueType::kUint32;  // element type when type == kArray
  std::variant<int64_t, uint64_t, double, bool, std::string, std::vector<int64_t>,
               std::vector<double>, std::vector<std::string>>
      value;
};

struct GgufTensorInfo {
  std::string name;
  int ggml_type = 0;
  std::vector<int64_t> shape;  // row-major, outermost first (GGUF's ne[] reversed)
  uint64_t offset = 0;         // relative to the data section
  TensorView view;             // into the mapped file; type set when the ggml type is supported
                               // (data nullptr when opened with open_metadata)
  bool supported = false;      // false: a ggml type Tessera has no QuantType for
};

// "Q4_K", "IQ2_XXS", ... for any ggml type id known to exist (also those Tessera cannot compute
// with), "unknown" otherwise.
std::string_view ggml_type_name(int ggml_type);

class GgufFile {
 public:
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);
  // The header only: metadata and tensor infos, read through a 64 KiB window with pread, never
  // mapped; the tensor data is not read (at most the window's tail past the header). Tensors are
  // bounds-checked against the file size as open() does, but their views have data == nullptr
  // and file_data() is nullptr: for configs, tokenizers and chat templates (the coordinator).
  static Result<std::unique_ptr<GgufFile>> open_metadata(const std::string& path);

  const std::string& path() const { return path_; }
  // Copies the first `bytes` bytes of a supported tensor's data into dst (bytes <= its size):
  // from the mapping, or with one read of the file after open_metadata. For the few small
  // tensors that are configuration (rope_freqs.weight).
  Status read_tensor_data(const GgufTensorInfo& t, void* dst, size_t bytes) const;
  // The mapped file (nullptr / 0 after open_metadata); every tensor view lies inside
  // [file_data(), file_data() + file_size()).
  const uint8_t* file_data() const { return file_.data(); }
  size_t file_size() const { return file_.size(); }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  // Typed metadata access; NotFound or InvalidArgument (wrong type) errors name the key.
  bool has(std::string_view key) const { return metadata_.count(std::string(key)) != 0; }
  Result<int64_t> get_int(std::string_view key) const;      // any integer type (uint64 must fit)
  Result<double> get_float(std::string_view key) const;     // float32/64 or integer
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string> get_string(std::string_view key) const;
  Result<std::vector<std::string>> get_string_array(std::string_view key) const;
  Result<std::vector<int64_t>> get_int_array(std::string_view key) const;
  Result<std::vector<double>> get_float_array(std::string_view key) const;

 private:
  std::string path_;
  MappedFile file_;             // empty after open_metadata
  uint64_t data_offset_ = 0;    // where the tensor data section starts in the file
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;  // name -> index in tensors_
  friend class GgufParser;
};

}  // namespace tessera
