// Fuzz target: a .safetensors file (header JSON, dtypes, shapes, offsets against the data).
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_input.h"
#include "model/safetensors.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::input_file(data, size, ".safetensors");
  auto ckpt = SafetensorsCheckpoint::open(path);
  if (!ckpt.is_ok()) return 0;
  for (const auto& [name, t] : (*ckpt)->tensors()) {
    if (t.view.data == nullptr) continue;
    const MappedFile& file = (*ckpt)->mapped_files().front();
    const auto* p = static_cast<const uint8_t*>(t.view.data);
    if (p < file.data() || p + t.view.nbytes() > file.data() + file.size()) __builtin_trap();
  }
  return 0;
}
