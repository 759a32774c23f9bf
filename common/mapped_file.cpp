#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

namespace tessera {
namespace {

// The live mappings, for release_mapped_range.
std::mutex g_mappings_mu;
std::vector<std::pair<const uint8_t*, size_t>>& mappings() {
  static std::vector<std::pair<const uint8_t*, size_t>> m;
  return m;
}

void unmap(const uint8_t* data, size_t size) {
  if (!data || !size) return;
  {
    std::lock_guard<std::mutex> lock(g_mappings_mu);
    auto& m = mappings();
    m.erase(std::remove(m.begin(), m.end(), std::make_pair(data, size)), m.end());
  }
  ::munmap(const_cast<uint8_t*>(data), size);
}

}  // namespace

size_t release_mapped_range(const void* p, size_t n) {
  const auto* begin = static_cast<const uint8_t*>(p);
  if (!begin || n == 0) return 0;
  std::lock_guard<std::mutex> lock(g_mappings_mu);
  for (const auto& [data, size] : mappings()) {
    if (begin < data || begin + n > data + size) continue;
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t first = reinterpret_cast<uintptr_t>(begin) / page * page;
    const uintptr_t last = std::min((reinterpret_cast<uintptr_t>(begin + n) + page - 1) / page * page,
                                    (reinterpret_cast<uintptr_t>(data + size) + page - 1) / page * page);
    if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) return 0;
    return last - first;
  }
  return 0;
}

MappedFile::~MappedFile() { unmap(data_, size_); }

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), path_(std::move(o.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    unmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    path_ = std::move(o.path_);
  }
  return *this;
}

Result<int> open_file_for_reading(const std::string& path, size_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::io_error(path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return Status::io_error(path + ": " + std::strerror(e));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Status::invalid_argument(path + ": is a directory, expected a file");
  }
  *size = static_cast<size_t>(st.st_size);
  return fd;
}

Result<MappedFile> MappedFile::open(const std::string& path) {
  size_t size = 0;
  TESSERA_ASSIGN_OR_RETURN(const int fd, open_file_for_reading(path, &size));
  MappedFile f;
  f.path_ = path;
  f.size_ = size;
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return Status::io_error(path + ": mmap failed: " + std::strerror(e));
    }
    f.data_ = static_cast<const uint8_t*>(p);
    std::lock_guard<std::mutex> lock(g_mappings_mu);
    mappings().emplace_back(f.data_, f.size_);
  }
  ::close(fd);
  return f;
}

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::not_found(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::io_error(path + ": read failed");
  return ss.str();
}

}  // namespace tessera
