// Helpers of the fuzz targets (fuzz/*_fuzz.cpp): the parsers that read files get the input
// through a file in /dev/shm, one per process, rewritten for every input.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace tessera::fuzz {

// Writes the input to /dev/shm/tessera-fuzz-<pid><suffix> (tmpfs: no disk I/O) and returns
// its path. The suffix matters to parsers that choose the format by extension.
inline std::string input_file(const uint8_t* data, size_t size, std::string_view suffix) {
  const std::string path = "/dev/shm/tessera-fuzz-" + std::to_string(::getpid()) + std::string(suffix);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();  // the harness itself is broken: say so loudly
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// Splits the input in two at the first "\n\x00\n" (a second document for the target; e.g. a
// tokenizer's config beside its tokenizer.json). No separator: all of it is the first part.
inline std::pair<std::string_view, std::string_view> split_input(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t at = all.find(std::string_view("\n\0\n", 3));
  if (at == std::string_view::npos) return {all, {}};
  return {all.substr(0, at), all.substr(at + 3)};
}

}  // namespace tessera::fuzz
