// Safetensors reader over memory-mapped files: one file, or a sharded checkpoint through
// `model.safetensors.index.json`. Supported dtypes: F32, F16, BF16 (plus I8/I32/U8 payloads of
// pre-quantized checkpoints, exposed as kI8/kI32 views). Header, offsets and shapes are fully
// validated; errors name the file and tensor.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/mapped_file.h"
#include "common/status.h"
#include "common/tensor.h"

namespace tessera {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // as written in the header: "F32", "BF16", ...
  std::vector<int64_t> shape;
  TensorView view;              // into the mapped file; data == nullptr when the dtype has no
                                // QuantType (F64, I64, ...), ndim > 4 or the tensor is empty
  const std::string* file = nullptr;  // path of the file that holds it
};

class SafetensorsCheckpoint {
 public:
  // `path` is a .safetensors file, a model.safetensors.index.json, or a directory holding
  // either (index preferred).
  static Result<std::unique_ptr<SafetensorsCheckpoint>> open(const std::string& path);

  const SafetensorsTensor* find(std::string_view name) const;
  const std::map<std::string, SafetensorsTensor, std::less<>>& tensors() const { return tensors_; }
  const std::vector<std::string>& files() const { return paths_; }
  // The mapped files, parallel to files(); every view lies inside the file named by its `file`.
  const std::vector<MappedFile>& mapped_files() const { return files_; }

 private:
  std::vector<std::string> paths_;
  std::vector<MappedFile> files_;
  std::map<std::string, SafetensorsTensor, std::less<>> tensors_;
  friend class SafetensorsParser;
};

}  // namespace tessera
