// Non-owning views of tensors. A view never frees memory; the owner (a memory-mapped file,
// a weight arena, a KV pool) outlives every view of it.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "common/dtype.h"

namespace tessera {

constexpr int kMaxDims = 4;

// A dense row-major tensor of any QuantType. For block formats the last dimension counts
// elements (not blocks) and must be a multiple of block_elems.
struct TensorView {
  const void* data = nullptr;
  QuantType type = QuantType::kF32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};  // shape[0] is the outermost dimension

  int64_t dim(int i) const { return shape[static_cast<size_t>(i)]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[static_cast<size_t>(i)];
    return n;
  }
  // Rows = product of all but the last dimension.
  int64_t rows() const { return ndim == 0 ? 1 : numel() / shape[static_cast<size_t>(ndim - 1)]; }
  int64_t cols() const { return ndim == 0 ? 1 : shape[static_cast<size_t>(ndim - 1)]; }
  size_t row_stride_bytes() const { return row_bytes(type, cols()); }
  size_t nbytes() const { return static_cast<size_t>(rows()) * row_stride_bytes(); }
  const uint8_t* row_ptr(int64_t r) const {
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(r) * row_stride_bytes();
  }
  std::string shape_string() const;  // "[64, 172]"
};

TensorView make_view(const void* data, QuantType type, std::initializer_list<int64_t> shape);

}  // namespace tessera
