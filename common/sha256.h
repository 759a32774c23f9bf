// SHA-256 (FIPS 180-4) of bytes and of files: the key of a model file in `tessera eval`'s
// report (eval/report.h), so a report is only ever applied to the file it measured.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tessera {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::array<uint8_t, 32> finish();  // once; the object is spent after
  static std::string hex(const std::array<uint8_t, 32>& digest);

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view bytes);
// The file's hash, read in 1 MiB pieces; NotFound naming the file when it cannot be read.
Result<std::string> sha256_file(const std::string& path);

}  // namespace tessera
