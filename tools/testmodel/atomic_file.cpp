#include "tools/testmodel/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace tessera {
namespace {
// Large writes bypass the buffer; small header fields are gathered into 1 MiB chunks.
constexpr size_t kBufferBytes = size_t{1} << 20;
}  // namespace

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      temp_path_(std::exchange(other.temp_path_, std::string())),
      buffer_(std::move(other.buffer_)),
      written_(other.written_),
      committed_(other.committed_) {}

Status AtomicFile::io_error(const char* what) const {
  return Status::io_error(path_ + ": " + what + ": " + std::strerror(errno));
}

Result<AtomicFile> AtomicFile::create(const std::string& path) {
  AtomicFile f;
  f.path_ = path;
  std::string templ = path + ".tmp-XXXXXX";
  f.fd_ = ::mkstemp(templ.data());
  if (f.fd_ < 0) return Status::io_error(path + ": " + std::strerror(errno));
  f.temp_path_ = templ;
  // mkstemp creates 0600; a model file should be readable like any other file the user writes.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(f.fd_, 0666 & ~mask);
  f.buffer_.reserve(kBufferBytes);
  return f;
}

Status AtomicFile::flush_buffer() {
  const uint8_t* p = buffer_.data();
  size_t left = buffer_.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error("write");
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  buffer_.clear();
  return Status::ok();
}

Status AtomicFile::write(const void* data, size_t n) {
  if (fd_ < 0) return Status::internal(path_ + ": write after commit");
  const auto* p = static_cast<const uint8_t*>(data);
  written_ += n;
  if (buffer_.size() + n <= kBufferBytes) {
    buffer_.insert(buffer_.end(), p, p + n);
    return Status::ok();
  }
  TESSERA_RETURN_IF_ERROR(flush_buffer());
  if (n < kBufferBytes) {
    buffer_.insert(buffer_.end(), p, p + n);
    return Status::ok();
  }
  while (n > 0) {
    const ssize_t k = ::write(fd_, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return io_error("write");
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status::ok();
}

Status AtomicFile::write_zeros(size_t n) {
  static const uint8_t kZeros[256] = {};
  while (n > 0) {
    const size_t k = n < sizeof(kZeros) ? n : sizeof(kZeros);
    TESSERA_RETURN_IF_ERROR(write(kZeros, k));
    n -= k;
  }
  return Status::ok();
}

Status AtomicFile::commit() {
  if (fd_ < 0) return Status::internal(path_ + ": commit twice");
  TESSERA_RETURN_IF_ERROR(flush_buffer());
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) return io_error("close");
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) return io_error("rename");
  committed_ = true;
  return Status::ok();
}

}  // namespace tessera
