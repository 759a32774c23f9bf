#include "model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tessera {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The safetensors library refuses headers over 100 MB; so do we, before parsing anything.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr uint64_t kMaxElems = uint64_t{1} << 62;

struct DtypeInfo {
  const char* name;
  int elem_bytes;
  std::optional<QuantType> type;  // nullopt: listed but not usable by Tessera
};
const DtypeInfo kDtypes[] = {
    {"F32", 4, QuantType::kF32}, {"F16", 2, QuantType::kF16}, {"BF16", 2, QuantType::kBF16},
    {"I8", 1, QuantType::kI8},   {"U8", 1, QuantType::kI8},   {"I32", 4, QuantType::kI32},
    {"F64", 8, std::nullopt},    {"I64", 8, std::nullopt},    {"U64", 8, std::nullopt},
    {"U32", 4, std::nullopt},    {"I16", 2, std::nullopt},    {"U16", 2, std::nullopt},
    {"BOOL", 1, std::nullopt},   {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
    {"F8_E8M0", 1, std::nullopt},
};

const DtypeInfo* find_dtype(std::string_view s) {
  for (const auto& d : kDtypes)
    if (s == d.name) return &d;
  return nullptr;
}

bool json_u64(const Json& j, uint64_t* out) {
  if (!j.is_number_integer()) return false;
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  const auto v = j.get<int64_t>();
  if (v < 0) return false;
  *out = static_cast<uint64_t>(v);
  return true;
}

bool safe_relative_name(const std::string& name) {
  if (name.empty() || name.front() == '/') return false;
  for (const auto& part : fs::path(name))
    if (part == "..") return false;
  return true;
}

}  // namespace

// Parses safetensors headers into a SafetensorsCheckpoint. All checks happen here; views are
// only created for tensors whose every byte lies inside the mapped file.
class SafetensorsParser {
 public:
  static Result<std::unique_ptr<SafetensorsCheckpoint>> open(const std::string& path) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (ec || !fs::exists(st))
      return Status::not_found(fmt::format("{}: no such file or directory", path));
    if (fs::is_directory(st)) {
      const fs::path dir(path);
      if (fs::exists(dir / "model.safetensors.index.json", ec))
        return open_index((dir / "model.safetensors.index.json").string());
      if (fs::exists(dir / "model.safetensors", ec))
        return open_files({(dir / "model.safetensors").string()});
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().extension() == ".safetensors") found.push_back(e.path().string());
      if (found.empty())
        return Status::not_found(fmt::format(
            "{}: no model.safetensors.index.json, model.safetensors or *.safetensors file", path));
      std::sort(found.begin(), found.end());
      return open_files(found);
    }
    if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) return open_index(path);
    return open_files({path});
  }

 private:
  static Result<std::unique_ptr<SafetensorsCheckpoint>> open_files(std::vector<std::string> paths) {
    auto ck = std::unique_ptr<SafetensorsCheckpoint>(new SafetensorsCheckpoint());
    // paths_ is complete before any tensor takes a pointer into it.
    ck->paths_ = std::move(paths);
    for (size_t i = 0; i < ck->paths_.size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(MappedFile mf, MappedFile::open(ck->paths_[i]));
      ck->files_.push_back(std::move(mf));
    }
    for (size_t i = 0; i < ck->paths_.size(); ++i) TESSERA_RETURN_IF_ERROR(parse_file(ck.get(), i));
    return ck;
  }

  static Result<std::unique_ptr<SafetensorsCheckpoint>> open_index(const std::string& index_path) {
    TESSERA_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
    std::vector<std::pair<std::string, std::string>> weight_map;  // tensor -> file name
    try {
      Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object())
        return Status::corrupt(fmt::format("{}: not a JSON object", index_path));
      auto it = j.find("weight_map");
      if (it == j.end() || !it->is_object())
        return Status::corrupt(fmt::format("{}: missing object 'weight_map'", index_path));
      for (const auto& [name, file] : it->items()) {
        if (!file.is_string())
          return Status::corrupt(fmt::format("{}: weight_map entry for tensor '{}' is not a string",
                                             index_path, name));
        weight_map.emplace_back(name, file.get<std::string>());
      }
    } catch (const std::exception& e) {
      return Status::corrupt(fmt::format("{}: {}", index_path, e.what()));
    }
    if (weight_map.empty())
      return Status::corrupt(fmt::format("{}: 'weight_map' is empty", index_path));
    const fs::path dir = fs::path(index_path).parent_path();
    std::vector<std::string> names;
    std::set<std::string> seen;
    for (const auto& [tensor, file] : weight_map) {
      if (!safe_relative_name(file))
        return Status::corrupt(fmt::format("{}: tensor '{}' maps to file '{}', which is not a "
                                           "relative path inside the checkpoint directory",
                                           index_path, tensor, file));
      if (seen.insert(file).second) names.push_back(file);
    }
    std::sort(names.begin(), names.end());
    std::vector<std::string> paths;
    for (const auto& n : names) paths.push_back((dir / n).string());
    TESSERA_ASSIGN_OR_RETURN(auto ck, open_files(paths));
    for (const auto& [tensor, file] : weight_map) {
      const SafetensorsTensor* t = ck->find(tensor);
      const std::string expected = (dir / file).string();
      if (!t || *t->file != expected)
        return Status::corrupt(fmt::format("{}: tensor '{}' is mapped to '{}', which does not hold it",
                                           index_path, tensor, file));
    }
    return ck;
  }

  static Status parse_file(SafetensorsCheckpoint* ck, size_t index) {
    const MappedFile& mf = ck->files_[index];
    const std::string& path = ck->paths_[index];
    const uint64_t size = mf.size();
    if (size < 8)
      return Status::corrupt(fmt::format(
          "{}: truncated ({} bytes; a safetensors file starts with an 8-byte header length)", path,
          size));
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | mf.data()[i];
    if (header_len > size - 8)
      return Status::corrupt(fmt::format("{}: header length {} exceeds the file size {}", path,
                                         header_len, size));
    if (header_len > kMaxHeaderBytes)
      return Status::corrupt(fmt::format("{}: header length {} is over the 100 MB limit", path,
                                         header_len));
    const char* hb = reinterpret_cast<const char*>(mf.data() + 8);
    Json header;
    try {
      header = Json::parse(hb, hb + header_len, nullptr, /*allow_exceptions=*/false);
    } catch (const std::exception& e) {
      return Status::corrupt(fmt::format("{}: bad JSON header: {}", path, e.what()));
    }
    if (header.is_discarded() || !header.is_object())
      return Status::corrupt(fmt::format("{}: header is not a JSON object", path));
    const uint64_t data_start = 8 + header_len;
    const uint64_t data_size = size - data_start;
    try {
      for (const auto& [name, entry] : header.items()) {
        if (name == "__metadata__") continue;
        SafetensorsTensor t;
        t.name = name;
        t.file = &ck->paths_[index];
        TESSERA_RETURN_IF_ERROR(parse_entry(path, entry, data_start, data_size, mf.data(), &t));
        auto [it, inserted] = ck->tensors_.emplace(name, std::move(t));
        if (!inserted)
          return Status::corrupt(fmt::format("{}: tensor '{}' is also in {}", path, name,
                                             *it->second.file));
      }
    } catch (const std::exception& e) {
      // Every access checks types first; this guards against surprises inside the library.
      return Status::corrupt(fmt::format("{}: bad header: {}", path, e.what()));
    }
    return Status::ok();
  }

  static Status parse_entry(const std::string& path, const Json& e, uint64_t data_start,
                            uint64_t data_size, const uint8_t* base, SafetensorsTensor* t) {
    const std::string& name = t->name;
    auto bad = [&](std::string_view what) {
      return Status::corrupt(fmt::format("{}: tensor '{}': {}", path, name, what));
    };
    if (!e.is_object()) return bad("header entry is not an object");
    auto dt = e.find("dtype");
    if (dt == e.end() || !dt->is_string()) return bad("missing string 'dtype'");
    t->dtype = dt->get<std::string>();
    const DtypeInfo* info = find_dtype(t->dtype);
    if (!info) return bad(fmt::format("unknown dtype '{}'", t->dtype));

    auto sh = e.find("shape");
    if (sh == e.end() || !sh->is_array()) return bad("missing array 'shape'");
    if (sh->size() > 64) return bad(fmt::format("{} dimensions", sh->size()));
    uint64_t numel = 1;
    for (const Json& d : *sh) {
      uint64_t v = 0;
      if (!json_u64(d, &v) || v > kMaxElems) return bad(fmt::format("invalid dimension {}", d.dump()));
      if (__builtin_mul_overflow(numel, v, &numel) || numel > kMaxElems)
        return bad("element count overflows");
      t->shape.push_back(static_cast<int64_t>(v));
    }

    auto offs = e.find("data_offsets");
    uint64_t begin = 0, end = 0;
    if (offs == e.end() || !offs->is_array() || offs->size() != 2 || !json_u64((*offs)[0], &begin) ||
        !json_u64((*offs)[1], &end))
      return bad("'data_offsets' must be two non-negative integers");
    if (begin > end || end > data_size)
      return bad(fmt::format("data_offsets [{}, {}) lie outside the data section (size {})", begin,
                             end, data_size));
    if (numel > kMaxElems / 8) return bad("element count overflows");
    const uint64_t expect = numel * static_cast<uint64_t>(info->elem_bytes);
    if (end - begin != expect)
      return bad(fmt::format("data_offsets [{}, {}) hold {} bytes, but shape {} of {} needs {}",
                             begin, end, end - begin, sh->dump(), t->dtype, expect));

    // Tensors Tessera cannot use stay listed with view.data == nullptr.
    if (!info->type || t->shape.size() > static_cast<size_t>(kMaxDims) || numel == 0)
      return Status::ok();
    const uint64_t abs = data_start + begin;
    if (abs % static_cast<uint64_t>(info->elem_bytes) != 0)
      return Status::unimplemented(fmt::format(
          "{}: tensor '{}' data at offset {} is not aligned to {} bytes (unpadded header)", path,
          name, abs, info->elem_bytes));
    t->view.data = base + abs;
    t->view.type = *info->type;
    t->view.ndim = static_cast<int>(t->shape.size());
    for (size_t d = 0; d < t->shape.size(); ++d) t->view.shape[d] = t->shape[d];
    return Status::ok();
  }
};

Result<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::open(const std::string& path) {
  return SafetensorsParser::open(path);
}

const SafetensorsTensor* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace tessera
