// A file that appears under its final name only once it is complete: bytes go to a temporary
// file in the same directory, commit() renames it over the target. If the AtomicFile is
// destroyed without commit() (an error on the way), the temporary file is removed and the
// target is left untouched. Used by the GGUF and safetensors writers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera {

class AtomicFile {
 public:
  ~AtomicFile();
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&& other) = delete;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // IoError names `path` ("io error: /ro/model.gguf: Permission denied").
  static Result<AtomicFile> create(const std::string& path);

  // Buffered append; errors name the final path.
  Status write(const void* data, size_t n);
  Status write_zeros(size_t n);
  uint64_t bytes_written() const { return written_; }
  // Flushes, closes and renames onto the final path.
  Status commit();

 private:
  AtomicFile() = default;
  Status flush_buffer();
  Status io_error(const char* what) const;

  int fd_ = -1;
  std::string path_;
  std::string temp_path_;
  std::vector<uint8_t> buffer_;
  uint64_t written_ = 0;
  bool committed_ = false;
};

}  // namespace tessera
