#include "model/architecture.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/check.h"
#include "model/gguf.h"

namespace tessera {
namespace {

bool names_contain(const ArchitectureNames& names, std::string_view name) {
  return !name.empty() && std::find(names.begin(), names.end(), name) != names.end();
}

const ArchitectureTraits* find_in_column(ArchitectureNames ArchitectureTraits::*column, std::string_view name) {
  for (const ArchitectureTraits& r : kArchitectureTable)
    if (names_contain(r.*column, name)) return &r;
  return nullptr;
}

}  // namespace

const ArchitectureTraits& architecture_traits(Architecture a) {
  const auto i = static_cast<size_t>(a);
  TESSERA_CHECK(i < std::size(kArchitectureTable), "architecture {} has no row", i);
  return kArchitectureTable[i];
}

const ArchitectureTraits* find_architecture_by_hf_class(std::string_view name) {
  return find_in_column(&ArchitectureTraits::hf_classes, name);
}

const ArchitectureTraits* find_architecture_by_model_type(std::string_view name) {
  return find_in_column(&ArchitectureTraits::hf_model_types, name);
}

const ArchitectureTraits* find_architecture_by_gguf(std::string_view name, const GgufFile& gguf) {
  const ArchitectureTraits* unmarked = nullptr;
  for (const ArchitectureTraits& r : kArchitectureTable) {
    if (!names_contain(r.gguf_names, name)) continue;
    if (r.gguf_marker_key.empty()) {
      if (unmarked == nullptr) unmarked = &r;
    } else if (gguf.has(fmt::format("{}.{}", name, r.gguf_marker_key))) {
      return &r;
    }
  }
  return unmarked;
}

std::string architecture_names_list(ArchitectureNames ArchitectureTraits::*column) {
  std::vector<std::string_view> names;
  for (const ArchitectureTraits& r : kArchitectureTable)
    for (std::string_view n : r.*column)
      if (!n.empty() && std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace tessera
