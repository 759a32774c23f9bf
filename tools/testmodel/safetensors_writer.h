// Safetensors writer: one file, or a sharded checkpoint (N files plus
// `model.safetensors.index.json`, as Hugging Face writes large models).
//
// Layout: u64 header length, JSON header (tensor names sorted; each with "dtype", "shape",
// "data_offsets"; plus "__metadata__"), padded with spaces to a multiple of 8 bytes, then the
// tensors' bytes ordered by element size (largest first) then name, so each is aligned.
// Tensor bytes are produced one tensor at a time when the file is written
// (SafetensorsTensorFill), so a large model is never held in memory twice.
// Every file is written atomically (temp file + rename). Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace tessera {

// Fills `dst` (exactly the tensor's byte size, little-endian elements).
using SafetensorsTensorFill = std::function<Status(std::span<uint8_t> dst)>;

class SafetensorsWriter {
 public:
  // Adds a "__metadata__" entry (string to string), e.g. {"format": "pt"} (set by default).
  void set_metadata(std::string_view key, std::string_view value);

  // `type`: F32, F16, BF16, I8 or I32 (dtype strings "F32", "F16", "BF16", "I8", "I32").
  // `shape` outermost first; 0..8 dims, each >= 0. InvalidArgument errors name the tensor.
  Status add_tensor(std::string_view name, std::span<const int64_t> shape, QuantType type,
                    SafetensorsTensorFill fill);
  // Same with the bytes given now; their size must match the shape and type.
  Status add_tensor(std::string_view name, std::span<const int64_t> shape, QuantType type,
                    std::vector<uint8_t> bytes);
  size_t tensor_count() const { return tensors_.size(); }
  uint64_t total_bytes() const;

  // Writes one file at `path`. IoError names the path.
  Status write(const std::string& path) const;

  // Writes `n_shards` files "model-0000i-of-0000N.safetensors" into the existing directory `dir`
  // and "model.safetensors.index.json" ({"metadata": {"total_size": bytes}, "weight_map":
  // {name: file}}). Tensors go in name order, cut into runs of about equal bytes; every shard
  // holds at least one tensor (InvalidArgument if n_shards < 1 or > tensor_count()).
  Status write_sharded(const std::string& dir, int n_shards) const;

 private:
  struct Tensor {
    std::vector<int64_t> shape;
    QuantType type = QuantType::kF32;
    uint64_t nbytes = 0;
    SafetensorsTensorFill fill;
    std::vector<uint8_t> bytes;
  };
  using TensorMap = std::map<std::string, Tensor, std::less<>>;
  // Writes the tensors [first, last) of tensors_ (name order) as one file.
  Status write_file(const std::string& path, TensorMap::const_iterator first,
                    TensorMap::const_iterator last) const;

  std::map<std::string, std::string> metadata_{{"format", "pt"}};
  TensorMap tensors_;
};

// The dtype string of a safetensors header for `type`, or empty when safetensors has none.
std::string_view safetensors_dtype_name(QuantType type);

}  // namespace tessera
