#include "common/tensor.h"

#include "common/check.h"

namespace tessera {

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[static_cast<size_t>(i)]);
  }
  return s + "]";
}

TensorView make_view(const void* data, QuantType type, std::initializer_list<int64_t> shape) {
  TESSERA_CHECK(shape.size() <= kMaxDims, "too many dims: {}", shape.size());
  TensorView v;
  v.data = data;
  v.type = type;
  v.ndim = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t d : shape) v.shape[static_cast<size_t>(i++)] = d;
  return v;
}

}  // namespace tessera
