#include "common/kv_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/strings.h"

namespace tessera {

namespace {

// THE table of KV element types (common/kv_config.h): the stored ones first.
constexpr KvDtypeTraits kKvDtypes[] = {
    // dtype, name, aliases, elem bytes, row extra bytes, cpu, cuda
    {KvDtype::kF32, "fp32", "f32", 4, 0, true, true},
    {KvDtype::kF16, "fp16", "f16", 2, 0, true, true},
    {KvDtype::kInt8, "int8", "i8|q8", 1, 4, true, false},
    {KvDtype::kBF16, "bf16", "", 2, 0, false, false},
    {KvDtype::kFp8, "fp8", "f8|e4m3|fp8_e4m3", 1, 0, false, false},
};

constexpr bool kv_table_is_consistent() {  // one row per KvDtype value, 0..4
  for (int v = 0; v < static_cast<int>(std::size(kKvDtypes)); ++v) {
    int rows = 0;
    for (const KvDtypeTraits& t : kKvDtypes) rows += static_cast<int>(t.dtype) == v;
    if (rows != 1) return false;
  }
  return true;
}
static_assert(kv_table_is_consistent(), "common/kv_config.cpp: the KV dtype table needs one row per KvDtype");

bool stored_by(const KvDtypeTraits& t, KvBackend b) { return b == KvBackend::kCpu ? t.cpu : t.cuda; }

// "a, b or c" (last = " or ") of the names.
std::string join_names(const std::vector<std::string>& names, std::string_view last) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? std::string(last) : std::string(", ")) + names[i];
  return out;
}

}  // namespace

std::string_view kv_backend_name(KvBackend b) { return b == KvBackend::kCpu ? "CPU" : "CUDA"; }

std::span<const KvDtypeTraits> all_kv_dtypes() { return kKvDtypes; }

const KvDtypeTraits& kv_dtype_traits(KvDtype t) {
  for (const KvDtypeTraits& r : kKvDtypes)
    if (r.dtype == t) return r;
  TESSERA_CHECK(false, "bad KvDtype {}", static_cast<int>(t));
  return kKvDtypes[0];
}

Result<KvDtype> parse_kv_dtype(std::string_view name) {
  const std::string key = ascii_lower(name);
  for (const KvDtypeTraits& t : kKvDtypes) {
    if (key == t.name) return t.dtype;
    for (std::string_view rest = t.aliases; !rest.empty();) {
      const size_t bar = rest.find('|');
      if (key == rest.substr(0, bar)) return t.dtype;
      rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
    }
  }
  return Status::not_found(fmt::format("unknown KV dtype '{}': choose {}", name, join_names(kv_dtype_names(), " or ")));
}

int kv_dtype_bytes(KvDtype t) { return kv_dtype_traits(t).elem_bytes; }

uint64_t kv_row_bytes(KvDtype t, int64_t head_dim) {
  const KvDtypeTraits& tr = kv_dtype_traits(t);
  return static_cast<uint64_t>(head_dim * tr.elem_bytes + tr.row_extra_bytes);
}

std::string_view kv_dtype_name(KvDtype t) { return kv_dtype_traits(t).name; }

bool kv_dtype_stored(KvDtype t, KvBackend b) { return stored_by(kv_dtype_traits(t), b); }

std::string kv_dtypes_stored_text(KvBackend b, std::string_view last) {
  std::vector<std::string> names;
  for (const KvDtypeTraits& t : kKvDtypes)
    if (stored_by(t, b)) names.emplace_back(t.name);
  return join_names(names, last);
}

std::vector<std::string> kv_dtype_runtime_names() {
  std::vector<std::string> names;
  for (const KvDtypeTraits& t : kKvDtypes)
    if (t.cpu || t.cuda) names.emplace_back(t.name);
  return names;
}

std::vector<std::string> kv_dtype_names() {
  std::vector<std::string> names;
  for (const KvDtypeTraits& t : kKvDtypes) names.emplace_back(t.name);
  return names;
}

Status validate_block_size(int64_t block_size) {
  if (block_size >= kMinBlockSize && block_size <= kMaxBlockSize) return Status::ok();
  return Status::invalid_argument(
      fmt::format("block size must be in {}..{} tokens, got {}", kMinBlockSize, kMaxBlockSize, block_size));
}

int64_t window_blocks_per_sequence(int64_t window, int64_t block_size) {
  if (window <= 0 || block_size <= 0) return 0;
  return (window - 1 + block_size - 1) / block_size + 1;
}

KvPoolSplit split_kv_budget(uint64_t budget, uint64_t all_block_bytes, uint64_t window_block_bytes,
                            int64_t window_blocks) {
  KvPoolSplit s;
  s.block_bytes = all_block_bytes;
  s.num_blocks = all_block_bytes > 0 ? static_cast<int64_t>(budget / all_block_bytes) : 0;
  const uint64_t full_bytes = all_block_bytes - std::min(all_block_bytes, window_block_bytes);
  if (window_blocks <= 0 || window_block_bytes == 0 || full_bytes == 0 || window_blocks >= s.num_blocks) return s;
  s.num_window_blocks = window_blocks;
  s.window_block_bytes = window_block_bytes;
  s.block_bytes = full_bytes;
  s.num_blocks = static_cast<int64_t>((budget - static_cast<uint64_t>(window_blocks) * window_block_bytes) / full_bytes);
  return s;
}

int64_t window_pool_blocks(int64_t window, int64_t max_step_tokens, int64_t block_size, int64_t max_batch) {
  if (window <= 0 || block_size <= 0 || max_batch <= 0 || max_step_tokens <= 0) return 0;
  return max_batch * (window_blocks_per_sequence(window, block_size) + 2) + (max_step_tokens + block_size - 1) / block_size;
}

}  // namespace tessera
