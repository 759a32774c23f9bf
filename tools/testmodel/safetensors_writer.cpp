#include "tools/testmodel/safetensors_writer.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tools/testmodel/atomic_file.h"

namespace tessera {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian");

constexpr size_t kMaxDims = 8;

std::string shape_str(std::span<const int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// nlohmann::json throws on invalid UTF-8 in dump(); this file is its only user here.
Result<std::string> dump_json(const nlohmann::json& j, int indent, std::string_view what) {
  try {
    return j.dump(indent);
  } catch (const std::exception& e) {
    return Status::invalid_argument(fmt::format("{}: cannot encode JSON: {}", what, e.what()));
  }
}

Status write_text_atomically(const std::string& path, const std::string& text) {
  TESSERA_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::create(path));
  TESSERA_RETURN_IF_ERROR(file.write(text.data(), text.size()));
  return file.commit();
}

}  // namespace

std::string_view safetensors_dtype_name(QuantType type) {
  switch (type) {
    case QuantType::kF32: return "F32";
    case QuantType::kF16: return "F16";
    case QuantType::kBF16: return "BF16";
    case QuantType::kI8: return "I8";
    case QuantType::kI32: return "I32";
    default: return {};
  }
}

void SafetensorsWriter::set_metadata(std::string_view key, std::string_view value) {
  metadata_[std::string(key)] = std::string(value);
}

uint64_t SafetensorsWriter::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.nbytes;
  return n;
}

Status SafetensorsWriter::add_tensor(std::string_view name, std::span<const int64_t> shape, QuantType type,
                                     SafetensorsTensorFill fill) {
  if (name.empty()) return Status::invalid_argument("safetensors tensor with an empty name");
  if (name == "__metadata__") return Status::invalid_argument("safetensors tensor may not be named '__metadata__'");
  if (tensors_.find(name) != tensors_.end())
    return Status::invalid_argument(fmt::format("safetensors tensor '{}' added twice", name));
  if (safetensors_dtype_name(type).empty())
    return Status::invalid_argument(fmt::format("safetensors tensor '{}': type {} cannot be stored in safetensors "
                                                "(F32, F16, BF16, I8, I32 only)", name, quant_name(type)));
  if (shape.size() > kMaxDims)
    return Status::invalid_argument(fmt::format("safetensors tensor '{}': {} dimensions", name, shape.size()));
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) return Status::invalid_argument(fmt::format("safetensors tensor '{}': bad shape {}", name, shape_str(shape)));
    numel *= static_cast<uint64_t>(d);
  }
  Tensor t;
  t.shape.assign(shape.begin(), shape.end());
  t.type = type;
  t.nbytes = numel * static_cast<uint64_t>(quant_traits(type).block_bytes);
  t.fill = std::move(fill);
  tensors_.emplace(std::string(name), std::move(t));
  return Status::ok();
}

Status SafetensorsWriter::add_tensor(std::string_view name, std::span<const int64_t> shape, QuantType type,
                                     std::vector<uint8_t> bytes) {
  TESSERA_RETURN_IF_ERROR(add_tensor(name, shape, type, SafetensorsTensorFill()));
  auto it = tensors_.find(name);
  if (bytes.size() != it->second.nbytes) {
    const uint64_t expected = it->second.nbytes;
    tensors_.erase(it);
    return Status::invalid_argument(fmt::format("safetensors tensor '{}': {} bytes given, shape {} of {} needs {}",
                                                name, bytes.size(), shape_str(shape), quant_name(type), expected));
  }
  it->second.bytes = std::move(bytes);
  return Status::ok();
}

Status SafetensorsWriter::write_file(const std::string& path, TensorMap::const_iterator first,
                                     TensorMap::const_iterator last) const {
  // Data goes in order of element size (largest first), then name, as the reference writer
  // does: every tensor then starts aligned to its element size.
  std::vector<TensorMap::const_iterator> order;
  for (auto it = first; it != last; ++it) order.push_back(it);
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return quant_traits(a->second.type).block_bytes > quant_traits(b->second.type).block_bytes;
  });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const auto& it : order) {
    const Tensor& t = it->second;
    header[it->first] = {{"dtype", safetensors_dtype_name(t.type)},
                         {"shape", t.shape},
                         {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  TESSERA_ASSIGN_OR_RETURN(std::string text, dump_json(header, -1, path));
  // The data section starts 8-aligned so that mapped F32 tensors are aligned too.
  text.append((8 - text.size() % 8) % 8, ' ');

  TESSERA_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::create(path));
  const uint64_t header_len = text.size();
  TESSERA_RETURN_IF_ERROR(file.write(&header_len, sizeof(header_len)));
  TESSERA_RETURN_IF_ERROR(file.write(text.data(), text.size()));
  std::vector<uint8_t> buffer;
  for (const auto& it : order) {
    const Tensor& t = it->second;
    if (t.fill) {
      buffer.assign(t.nbytes, 0);
      Status s = t.fill(std::span<uint8_t>(buffer.data(), buffer.size()));
      if (!s.is_ok()) return s.with_context(fmt::format("{}: tensor '{}'", path, it->first));
      TESSERA_RETURN_IF_ERROR(file.write(buffer.data(), buffer.size()));
    } else {
      TESSERA_RETURN_IF_ERROR(file.write(t.bytes.data(), t.bytes.size()));
    }
  }
  std::vector<uint8_t>().swap(buffer);
  return file.commit();
}

Status SafetensorsWriter::write(const std::string& path) const {
  return write_file(path, tensors_.begin(), tensors_.end());
}

Status SafetensorsWriter::write_sharded(const std::string& dir, int n_shards) const {
  if (n_shards < 1 || static_cast<size_t>(n_shards) > tensors_.size())
    return Status::invalid_argument(fmt::format("{}: cannot split {} tensors into {} shards", dir, tensors_.size(),
                                                n_shards));
  const uint64_t total = total_bytes();
  // Cut points: shard k ends once the running total reaches (k+1)/n of the bytes, while leaving
  // at least one tensor for every later shard.
  std::vector<TensorMap::const_iterator> cuts{tensors_.begin()};
  uint64_t running = 0;
  size_t index = 0;
  for (auto it = tensors_.begin(); it != tensors_.end(); ++it, ++index) {
    running += it->second.nbytes;
    const int shard = static_cast<int>(cuts.size()) - 1;
    if (shard == n_shards - 1) break;
    const size_t tensors_left = tensors_.size() - index - 1;
    const size_t shards_left = static_cast<size_t>(n_shards - shard - 1);
    const bool reached = running * static_cast<uint64_t>(n_shards) >= total * static_cast<uint64_t>(shard + 1);
    if (reached || tensors_left == shards_left) cuts.push_back(std::next(it));
  }
  cuts.push_back(tensors_.end());

  nlohmann::json weight_map = nlohmann::json::object();
  for (int s = 0; s < n_shards; ++s) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, n_shards);
    TESSERA_RETURN_IF_ERROR(write_file(dir + "/" + file, cuts[static_cast<size_t>(s)],
                                       cuts[static_cast<size_t>(s) + 1]));
    for (auto it = cuts[static_cast<size_t>(s)]; it != cuts[static_cast<size_t>(s) + 1]; ++it)
      weight_map[it->first] = file;
  }
  nlohmann::json index_json = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const std::string index_path = dir + "/model.safetensors.index.json";
  TESSERA_ASSIGN_OR_RETURN(std::string text, dump_json(index_json, 2, index_path));
  return write_text_atomically(index_path, text + "\n");
}

}  // namespace tessera
