// A read-only memory-mapped file. Move-only; unmaps on destruction.
// Views into it (TensorView::data) stay valid as long as the MappedFile lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace tessera {

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Errors name the path: "io error: /x/model.gguf: No such file or directory".
  static Result<MappedFile> open(const std::string& path);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Drops this process's resident pages of [p, p + n) when the range lies inside a live
// MappedFile (mapped read-only and never written, so a later access re-reads the pages from the
// file): for tensors copied elsewhere at load (the CPU forward pass's re-laid matrices), whose
// file pages would otherwise stay resident beside the copy. Pages shared with neighbouring
// data are dropped too (they fault back in when read). Returns the bytes released, 0 when the
// range is not inside a mapping. Thread-safe.
size_t release_mapped_range(const void* p, size_t n);

// Reads a whole (small) file into a string; errors name the path.
Result<std::string> read_text_file(const std::string& path);

// open(2) of a regular file for reading (O_CLOEXEC) and its size: IoError naming the path, or
// InvalidArgument for a directory. The caller closes the descriptor.
Result<int> open_file_for_reading(const std::string& path, size_t* size);

}  // namespace tessera
