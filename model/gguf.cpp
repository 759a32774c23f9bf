#include "model/gguf.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tessera {
namespace {

constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxAlignment = 1u << 16;
constexpr int kMaxArrayDepth = 8;
constexpr size_t kMetadataWindowBytes = size_t{64} << 10;  // open_metadata's read size

// pread(2) until `n` bytes at offset `at` are in `dst` (retrying EINTR): the bytes read, fewer
// than n at the end of the file, or -1 with errno set.
ssize_t pread_full(int fd, void* dst, size_t n, uint64_t at) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, static_cast<uint8_t*>(dst) + got, n - got, static_cast<off_t>(at + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(got);
}

const char* value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8: return "uint8";
    case GgufValueType::kInt8: return "int8";
    case GgufValueType::kUint16: return "uint16";
    case GgufValueType::kInt16: return "int16";
    case GgufValueType::kUint32: return "uint32";
    case GgufValueType::kInt32: return "int32";
    case GgufValueType::kFloat32: return "float32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "uint64";
    case GgufValueType::kInt64: return "int64";
    case GgufValueType::kFloat64: return "float64";
  }
  return "unknown";
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

// Smallest encoding of one value of type t (bounds array counts before anything is allocated).
size_t min_value_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32: return 4;
    case GgufValueType::kString:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64: return 8;
    case GgufValueType::kArray: return 12;
  }
  return 1;
}

std::string describe_type(const GgufValue& v) {
  if (v.type == GgufValueType::kArray)
    return fmt::format("array of {}", value_type_name(v.array_type));
  return value_type_name(v.type);
}

}  // namespace

// Reads a whole GGUF file into a GgufFile. Every read goes through a bounds-checked cursor;
// `ctx_` names what is being read so that errors say where the file went wrong.
class GgufParser {
 public:
  // Over the mapped file.
  explicit GgufParser(GgufFile* f) : f_(f), data_(f->file_.data()), size_(f->file_.size()) {}
  // Over an open descriptor of a file of `size` bytes, read through a window (open_metadata).
  GgufParser(GgufFile* f, int fd, size_t size) : f_(f), data_(nullptr), size_(size), fd_(fd) {}

  Status parse() {
    ctx_ = "header";
    char magic[4] = {};
    TESSERA_RETURN_IF_ERROR(read_bytes(magic, 4));
    if (std::memcmp(magic, "GGUF", 4) != 0)
      return Status::corrupt(fmt::format("{}: not a GGUF file (bad magic)", path()));
    uint32_t version = 0;
    TESSERA_RETURN_IF_ERROR(read(&version));
    if (version == 1)
      return Status::unimplemented(fmt::format("{}: GGUF version 1 is not supported", path()));
    if (version != 2 && version != 3) {
      if ((version & 0xffffu) == 0 && version != 0)
        return Status::unimplemented(
            fmt::format("{}: big-endian GGUF files are not supported", path()));
      return Status::corrupt(fmt::format("{}: unknown GGUF version {}", path(), version));
    }
    f_->version_ = version;
    uint64_t n_tensors = 0, n_kv = 0;
    TESSERA_RETURN_IF_ERROR(read(&n_tensors));
    TESSERA_RETURN_IF_ERROR(read(&n_kv));
    // Counts are not checked against the file size up front: a loop over them stops at the
    // first read past the end, which names the key or tensor, and nothing is sized from them.
    for (uint64_t i = 0; i < n_kv; ++i) TESSERA_RETURN_IF_ERROR(parse_kv(i));
    TESSERA_RETURN_IF_ERROR(parse_alignment());
    f_->tensors_.reserve(static_cast<size_t>(std::min<uint64_t>(n_tensors, remaining() / 32)));
    for (uint64_t i = 0; i < n_tensors; ++i) TESSERA_RETURN_IF_ERROR(parse_tensor_info(i));
    return place_tensors();
  }

 private:
  const std::string& path() const { return f_->path_; }
  size_t remaining() const { return size_ - pos_; }

  Status truncated() const {
    return Status::corrupt(fmt::format("{}: truncated in {}", path(), ctx_));
  }

  Status read_bytes(void* dst, size_t n) {
    if (n > remaining()) return truncated();
    if (n) TESSERA_RETURN_IF_ERROR(copy_out(dst, n));
    pos_ += n;
    return Status::ok();
  }
  // Bytes [pos_, pos_ + n), inside the file: from the mapping or through the read window.
  Status copy_out(void* dst, size_t n) {
    if (fd_ < 0) {
      std::memcpy(dst, data_ + pos_, n);
      return Status::ok();
    }
    auto* out = static_cast<uint8_t*>(dst);
    size_t at = pos_;
    while (n > 0) {
      if (at < window_start_ || at >= window_start_ + window_.size()) TESSERA_RETURN_IF_ERROR(fill_window(at));
      const size_t k = std::min(n, window_start_ + window_.size() - at);
      std::memcpy(out, window_.data() + (at - window_start_), k);
      out += k;
      at += k;
      n -= k;
    }
    return Status::ok();
  }
  Status fill_window(size_t at) {
    window_.resize(std::min(kMetadataWindowBytes, size_ - at));
    window_start_ = at;
    const ssize_t r = pread_full(fd_, window_.data(), window_.size(), at);
    if (r == static_cast<ssize_t>(window_.size())) return Status::ok();
    const int e = errno;
    window_.clear();
    if (r >= 0) return Status::corrupt(fmt::format("{}: file shrank while reading {}", path(), ctx_));
    return Status::io_error(fmt::format("{}: read failed in {}: {}", path(), ctx_, std::strerror(e)));
  }
  Status skip(size_t n) {
    if (n > remaining()) return truncated();
    pos_ += n;
    return Status::ok();
  }
  template <typename T>
  Status read(T* v) {
    return read_bytes(v, sizeof(T));
  }

  Status read_string(std::string* s) {
    uint64_t len = 0;
    TESSERA_RETURN_IF_ERROR(read(&len));
    if (len > remaining()) {
      if (len > size_)
        return Status::corrupt(fmt::format("{}: string length {} in {} exceeds the file size {}",
                                           path(), len, ctx_, size_));
      return truncated();
    }
    s->resize(static_cast<size_t>(len));
    return read_bytes(s->data(), static_cast<size_t>(len));
  }

  // Reads one scalar of type t, widened into int64 / uint64 / double / bool.
  template <typename T, typename Wide>
  Status read_widened(Wide* out) {
    T v{};
    TESSERA_RETURN_IF_ERROR(read(&v));
    *out = static_cast<Wide>(v);
    return Status::ok();
  }

  Status read_scalar(GgufValueType t, GgufValue* out) {
    switch (t) {
      case GgufValueType::kUint8: return read_unsigned<uint8_t>(out);
      case GgufValueType::kUint16: return read_unsigned<uint16_t>(out);
      case GgufValueType::kUint32: return read_unsigned<uint32_t>(out);
      case GgufValueType::kUint64: return read_unsigned<uint64_t>(out);
      case GgufValueType::kInt8: return read_signed<int8_t>(out);
      case GgufValueType::kInt16: return read_signed<int16_t>(out);
      case GgufValueType::kInt32: return read_signed<int32_t>(out);
      case GgufValueType::kInt64: return read_signed<int64_t>(out);
      case GgufValueType::kFloat32: {
        float x = 0;
        TESSERA_RETURN_IF_ERROR(read(&x));
        out->value = static_cast<double>(x);
        return Status::ok();
      }
      case GgufValueType::kFloat64: {
        double x = 0;
        TESSERA_RETURN_IF_ERROR(read(&x));
        out->value = x;
        return Status::ok();
      }
      case GgufValueType::kBool: {
        uint8_t b = 0;  // read as a byte: any value other than 0/1 in a bool object is UB
        TESSERA_RETURN_IF_ERROR(read(&b));
        out->value = b != 0;
        return Status::ok();
      }
      case GgufValueType::kString: {
        std::string s;
        TESSERA_RETURN_IF_ERROR(read_string(&s));
        out->value = std::move(s);
        return Status::ok();
      }
      case GgufValueType::kArray: break;
    }
    return Status::internal("read_scalar on an array");
  }
  template <typename T>
  Status read_unsigned(GgufValue* out) {
    uint64_t v = 0;
    TESSERA_RETURN_IF_ERROR((read_widened<T, uint64_t>(&v)));
    out->value = v;
    return Status::ok();
  }
  template <typename T>
  Status read_signed(GgufValue* out) {
    int64_t v = 0;
    TESSERA_RETURN_IF_ERROR((read_widened<T, int64_t>(&v)));
    out->value = v;
    return Status::ok();
  }

  Status read_value_type(GgufValueType* t) {
    uint32_t raw = 0;
    TESSERA_RETURN_IF_ERROR(read(&raw));
    if (!valid_value_type(raw))
      return Status::corrupt(fmt::format("{}: unknown value type {} in {}", path(), raw, ctx_));
    *t = static_cast<GgufValueType>(raw);
    return Status::ok();
  }

  // Arrays of arrays are parsed (and bounds-checked) but not kept: no key Tessera reads has them.
  Status read_array(int depth, GgufValue* out) {
    if (depth > kMaxArrayDepth)
      return Status::corrupt(fmt::format("{}: arrays nested too deeply in {}", path(), ctx_));
    GgufValueType et = GgufValueType::kUint8;  // read_value_type sets it or fails
    TESSERA_RETURN_IF_ERROR(read_value_type(&et));
    uint64_t count = 0;
    TESSERA_RETURN_IF_ERROR(read(&count));
    if (count > remaining() / min_value_bytes(et)) {
      if (count > size_)
        return Status::corrupt(fmt::format("{}: array length {} in {} exceeds the file size {}",
                                           path(), count, ctx_, size_));
      return truncated();
    }
    const auto n = static_cast<size_t>(count);
    out->type = GgufValueType::kArray;
    out->array_type = et;
    switch (et) {
      case GgufValueType::kString: {
        std::vector<std::string> v(n);
        for (auto& s : v) TESSERA_RETURN_IF_ERROR(read_string(&s));
        out->value = std::move(v);
        return Status::ok();
      }
      case GgufValueType::kFloat32:
      case GgufValueType::kFloat64: {
        std::vector<double> v(n);
        GgufValue tmp;
        for (auto& x : v) {
          TESSERA_RETURN_IF_ERROR(read_scalar(et, &tmp));
          x = std::get<double>(tmp.value);
        }
        out->value = std::move(v);
        return Status::ok();
      }
      case GgufValueType::kArray: {
        GgufValue tmp;
        for (size_t i = 0; i < n; ++i) TESSERA_RETURN_IF_ERROR(read_array(depth + 1, &tmp));
        out->value = std::vector<int64_t>{};
        return Status::ok();
      }
      default: {
        // Integers and bools. uint64 values above INT64_MAX wrap; no key Tessera reads has them.
        std::vector<int64_t> v(n);
        GgufValue tmp;
        for (auto& x : v) {
          TESSERA_RETURN_IF_ERROR(read_scalar(et, &tmp));
          if (auto* u = std::get_if<uint64_t>(&tmp.value)) x = static_cast<int64_t>(*u);
          else if (auto* s = std::get_if<int64_t>(&tmp.value)) x = *s;
          else x = std::get<bool>(tmp.value) ? 1 : 0;
        }
        out->value = std::move(v);
        return Status::ok();
      }
    }
  }

  Status parse_kv(uint64_t index) {
    ctx_ = fmt::format("metadata key #{}", index);
    std::string key;
    TESSERA_RETURN_IF_ERROR(read_string(&key));
    ctx_ = fmt::format("metadata key '{}'", key);
    GgufValue v;
    TESSERA_RETURN_IF_ERROR(read_value_type(&v.type));
    if (v.type == GgufValueType::kArray) {
      TESSERA_RETURN_IF_ERROR(read_array(0, &v));
    } else {
      TESSERA_RETURN_IF_ERROR(read_scalar(v.type, &v));
    }
    if (!f_->metadata_.emplace(key, std::move(v)).second)
      return Status::corrupt(fmt::format("{}: duplicate metadata key '{}'", path(), key));
    return Status::ok();
  }

  Status parse_alignment() {
    alignment_ = kDefaultAlignment;
    if (!f_->has("general.alignment")) return Status::ok();
    TESSERA_ASSIGN_OR_RETURN(int64_t a, f_->get_int("general.alignment"));
    if (a <= 0 || a > kMaxAlignment || (a & (a - 1)) != 0)
      return Status::corrupt(fmt::format(
          "{}: general.alignment is {}, expected a power of two up to {}", path(), a, kMaxAlignment));
    alignment_ = static_cast<uint32_t>(a);
    return Status::ok();
  }

  Status parse_tensor_info(uint64_t index) {
    ctx_ = fmt::format("tensor info #{}", index);
    GgufTensorInfo t;
    TESSERA_RETURN_IF_ERROR(read_string(&t.name));
    ctx_ = fmt::format("tensor info '{}'", t.name);
    uint32_t n_dims = 0;
    TESSERA_RETURN_IF_ERROR(read(&n_dims));
    if (n_dims == 0 || n_dims > static_cast<uint32_t>(kMaxDims))
      return Status::corrupt(fmt::format("{}: tensor '{}' has {} dimensions, expected 1 to {}",
                                         path(), t.name, n_dims, kMaxDims));
    std::array<uint64_t, kMaxDims> ne{};
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      TESSERA_RETURN_IF_ERROR(read(&ne[d]));
      if (ne[d] == 0 || ne[d] > (uint64_t{1} << 62) || __builtin_mul_overflow(numel, ne[d], &numel) ||
          numel > (uint64_t{1} << 62))
        return Status::corrupt(fmt::format("{}: tensor '{}' has invalid dimension {} = {}", path(),
                                           t.name, d, ne[d]));
    }
    uint32_t type = 0;
    TESSERA_RETURN_IF_ERROR(read(&type));
    TESSERA_RETURN_IF_ERROR(read(&t.offset));
    t.ggml_type = static_cast<int>(type);
    if (type > static_cast<uint32_t>(std::numeric_limits<int>::max()))
      return Status::corrupt(fmt::format("{}: tensor '{}' has ggml type {}", path(), t.name, type));
    // ne[0] is the innermost (contiguous) dimension; Tessera's shapes list outermost first.
    for (uint32_t d = 0; d < n_dims; ++d) t.shape.push_back(static_cast<int64_t>(ne[n_dims - 1 - d]));
    if (f_->tensor_index_.count(t.name))
      return Status::corrupt(fmt::format("{}: duplicate tensor '{}'", path(), t.name));
    f_->tensor_index_.emplace(t.name, f_->tensors_.size());
    f_->tensors_.push_back(std::move(t));
    return Status::ok();
  }

  Status place_tensors() {
    ctx_ = "tensor data";
    const uint64_t data_start = (uint64_t{pos_} + alignment_ - 1) / alignment_ * alignment_;
    if (!f_->tensors_.empty() && data_start > size_)
      return Status::corrupt(fmt::format("{}: truncated before the tensor data section", path()));
    f_->data_offset_ = data_start;
    std::vector<TensorExtent> extents;  // (offset, bytes or ~0 for an unknown type, index)
    extents.reserve(f_->tensors_.size());
    for (GgufTensorInfo& t : f_->tensors_) {
      extents.push_back({t.offset, ~uint64_t{0}, static_cast<size_t>(&t - f_->tensors_.data())});
      if (t.offset % alignment_ != 0)
        return Status::corrupt(fmt::format("{}: tensor '{}' offset {} is not a multiple of the "
                                           "alignment {}",
                                           path(), t.name, t.offset, alignment_));
      // Sizes of every known ggml type, computable or not (common/dtype.h).
      const std::optional<GgmlTypeInfo> ts = ggml_type_info(t.ggml_type);
      if (!ts) continue;  // unknown type: listed as unsupported, size unknown
      const auto row_elems = static_cast<uint64_t>(t.shape.back());
      if (row_elems % static_cast<uint64_t>(ts->block_elems) != 0)
        return Status::corrupt(fmt::format(
            "{}: tensor '{}' has {} elements per row, not a multiple of the {} block size {}",
            path(), t.name, row_elems, ts->name, ts->block_elems));
      uint64_t rows = 1;
      for (size_t d = 0; d + 1 < t.shape.size(); ++d) rows *= static_cast<uint64_t>(t.shape[d]);
      uint64_t nbytes = 0, end = 0, abs = 0;
      const uint64_t row_size = row_elems / static_cast<uint64_t>(ts->block_elems) *
                                static_cast<uint64_t>(ts->block_bytes);
      const bool overflow = __builtin_mul_overflow(rows, row_size, &nbytes) ||
                            __builtin_add_overflow(data_start, t.offset, &abs) ||
                            __builtin_add_overflow(abs, nbytes, &end);
      if (overflow || end > size_) {
        if (overflow)
          return Status::corrupt(fmt::format("{}: tensor '{}' offset {} or size overflows",
                                             path(), t.name, t.offset));
        return Status::corrupt(fmt::format(
            "{}: tensor '{}' data [{}, {}) lies outside the file (size {})", path(), t.name, abs,
            end, size_));
      }
      extents.back().bytes = nbytes;
      const std::optional<QuantType> qt = ts->type;
      if (!qt) continue;
      // Views are read through typed pointers: the start must be aligned for the element type
      // (only a file with general.alignment < 4 can break this).
      const size_t need = quant_traits(*qt).block_elems == 1
                              ? static_cast<size_t>(quant_traits(*qt).block_bytes)
                              : 2;
      if (abs % need != 0)
        return Status::corrupt(fmt::format("{}: tensor '{}' data at offset {} is not aligned to {} "
                                           "bytes",
                                           path(), t.name, abs, need));
      t.supported = true;
      t.view.data = data_ ? data_ + abs : nullptr;
      t.view.type = *qt;
      t.view.ndim = static_cast<int>(t.shape.size());
      for (size_t d = 0; d < t.shape.size(); ++d) t.view.shape[d] = t.shape[d];
    }
    return check_packing(extents, data_start);
  }

  struct TensorExtent {
    uint64_t offset, bytes;
    size_t index;
  };

  // Writers lay the tensors' data end to end, each padded to the alignment. A tensor whose type
  // or shape was changed in its header no longer spans its data: it overlaps the next tensor,
  // or leaves a gap before it (or before the end of the file) longer than the padding.
  Status check_packing(std::vector<TensorExtent>& extents, uint64_t data_start) const {
    std::sort(extents.begin(), extents.end(),
              [](const TensorExtent& a, const TensorExtent& b) { return a.offset < b.offset; });
    const uint64_t unknown = ~uint64_t{0};
    for (size_t i = 0; i < extents.size(); ++i) {
      const TensorExtent& e = extents[i];
      if (e.bytes == unknown) continue;
      const uint64_t end = e.offset + e.bytes;  // place_tensors checked it fits the file
      const uint64_t padded = (end + alignment_ - 1) / alignment_ * alignment_;
      const bool last = i + 1 == extents.size();
      const uint64_t next = last ? size_ - data_start : extents[i + 1].offset;
      if (next >= end && (next < padded || next - padded < (last ? alignment_ : 1))) continue;
      const GgufTensorInfo& t = f_->tensors_[e.index];
      const std::string what = fmt::format("{}: tensor '{}' ({} [{}]) takes {} bytes from data offset {}", path(),
                                           t.name, ggml_type_info(t.ggml_type)->name, fmt::join(t.shape, ", "),
                                           e.bytes, e.offset);
      if (last)
        return Status::corrupt(fmt::format(
            "{}, but {} bytes of data follow it to the end of the file: its type or shape does not match its data",
            what, next - end));
      return Status::corrupt(fmt::format("{}, but the next tensor '{}' starts at {}: its type or shape does not "
                                         "match its data ({} by {} bytes)",
                                         what, f_->tensors_[extents[i + 1].index].name, next,
                                         next < end ? "overlapping it" : "a gap", next < end ? end - next : next - end));
    }
    return Status::ok();
  }

  GgufFile* f_;
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  std::string ctx_;
  int fd_ = -1;                  // open_metadata: the file, read through window_
  std::vector<uint8_t> window_;  // bytes [window_start_, window_start_ + window_.size())
  size_t window_start_ = 0;
};

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(MappedFile mf, MappedFile::open(path));
  auto f = std::make_unique<GgufFile>();
  f->path_ = path;
  f->file_ = std::move(mf);
  GgufParser parser(f.get());
  TESSERA_RETURN_IF_ERROR(parser.parse());
  return f;
}

namespace {

// Closes the descriptor on every return path.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

Result<std::unique_ptr<GgufFile>> GgufFile::open_metadata(const std::string& path) {
  size_t size = 0;
  TESSERA_ASSIGN_OR_RETURN(const int fd, open_file_for_reading(path, &size));
  FdCloser closer{fd};
  auto f = std::make_unique<GgufFile>();
  f->path_ = path;
  GgufParser parser(f.get(), fd, size);
  TESSERA_RETURN_IF_ERROR(parser.parse());
  return f;
}

Status GgufFile::read_tensor_data(const GgufTensorInfo& t, void* dst, size_t bytes) const {
  if (!t.supported)
    return Status::unimplemented(fmt::format("{}: tensor '{}' has ggml type {} ({}), which Tessera does not read",
                                             path(), t.name, t.ggml_type, ggml_type_name(t.ggml_type)));
  if (bytes > t.view.nbytes())
    return Status::invalid_argument(
        fmt::format("{}: {} bytes asked of tensor '{}', which holds {}", path(), bytes, t.name, t.view.nbytes()));
  if (bytes == 0) return Status::ok();
  if (t.view.data) {
    std::memcpy(dst, t.view.data, bytes);
    return Status::ok();
  }
  size_t size = 0;
  TESSERA_ASSIGN_OR_RETURN(const int fd, open_file_for_reading(path(), &size));
  FdCloser closer{fd};
  const ssize_t r = pread_full(fd, dst, bytes, data_offset_ + t.offset);
  if (r == static_cast<ssize_t>(bytes)) return Status::ok();
  if (r >= 0) return Status::corrupt(fmt::format("{}: tensor '{}' lies past the end of the file", path(), t.name));
  return Status::io_error(fmt::format("{}: reading tensor '{}': {}", path(), t.name, std::strerror(errno)));
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::string_view ggml_type_name(int ggml_type) {
  const std::optional<GgmlTypeInfo> t = ggml_type_info(ggml_type);
  return t ? t->name : "unknown";
}

namespace {

Result<const GgufValue*> lookup(const GgufFile& f, std::string_view key) {
  auto it = f.metadata().find(std::string(key));
  if (it == f.metadata().end())
    return Status::not_found(fmt::format("{}: no metadata key '{}'", f.path(), key));
  return &it->second;
}

Status wrong_type(const GgufFile& f, std::string_view key, const GgufValue& v,
                  std::string_view expected) {
  return Status::invalid_argument(fmt::format("{}: metadata key '{}' has type {}, expected {}",
                                              f.path(), key, describe_type(v), expected));
}

}  // namespace

Result<int64_t> GgufFile::get_int(std::string_view key) const {
  TESSERA_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type != GgufValueType::kArray) {
    if (auto* s = std::get_if<int64_t>(&v->value)) return *s;
    if (auto* u = std::get_if<uint64_t>(&v->value)) {
      if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return Status::out_of_range(
            fmt::format("{}: metadata key '{}' value {} does not fit in int64", path(), key, *u));
      return static_cast<int64_t>(*u);
    }
  }
  return wrong_type(*this, key, *v, "an integer");
}

Result<double> GgufFile::get_float(std::string_view key) const {
  TESSERA_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type != GgufValueType::kArray) {
    if (auto* d = std::get_if<double>(&v->value)) return *d;
    if (auto* s = std::get_if<int64_t>(&v->value)) return static_cast<double>(*s);
    if (auto* u = std::get_if<uint64_t>(&v->value)) return static_cast<double>(*u);
  }
  return wrong_type(*this, key, *v, "a number");
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  TESSERA_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type == GgufValueType::kBool) return std::get<bool>(v->value);
  return wrong_type(*this, key, *v, "bool");
}

Result<std::string> GgufFile::get_string(std::string_view key) const {
  TESSERA_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type == GgufValueType::kString) return std::get<std::string>(v->value);
  return wrong_type(*this, key, *v, "string");
}

Result<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  TESSERA_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type == GgufValueType::kArray && v->array_type == GgufValueType::kString)
    return std::get<std::vector<std::string>>(v->value);
  return wrong_type(*this, key, *v, "array of string");
}

Result<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  TESSERA_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type == GgufValueType::kArray) {
    if (auto* a = std::get_if<std::vector<int64_t>>(&v->value);
        a && v->array_type != GgufValueType::kArray && v->array_type != GgufValueType::kBool)
      return *a;
  }
  return wrong_type(*this, key, *v, "array of integers");
}

Result<std::vector<double>> GgufFile::get_float_array(std::string_view key) const {
  TESSERA_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type == GgufValueType::kArray) {
    if (auto* d = std::get_if<std::vector<double>>(&v->value)) return *d;
    if (auto* a = std::get_if<std::vector<int64_t>>(&v->value);
        a && v->array_type != GgufValueType::kArray && v->array_type != GgufValueType::kBool)
      return std::vector<double>(a->begin(), a->end());
  }
  return wrong_type(*this, key, *v, "array of numbers");
}

}  // namespace tessera
