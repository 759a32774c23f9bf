// Importance of each input column of the linear weights, estimated from activations on real
// text (the calibration of `--quant` at low bits; llama.cpp calls its file an imatrix): for a
// weight W [rows, cols] applied as y = W x, column j's importance is the mean of x_j^2 over
// the calibration tokens. The quantizers (kernels/quant.h's quantize_row_weighted) then
// minimise sum_j imp_j (w_j - deq_j)^2 per row instead of the plain squared error, which is
// the error of y's expectation under those activations.
//
// The file is JSON: {"format": "tessera-importance-1", "model": <file name>, "model_sha256":
// <hash of the model file, or "">, "tokens": <calibration tokens>, "source": <where the text
// came from>, "tensors": {<HF weight name>: [cols floats], ...}}.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera {

struct ImportanceMatrix {
  std::string model;         // the model file it was measured on (a name, for messages)
  std::string model_sha256;  // its hash ("" when not recorded)
  std::string source;        // the calibration text's origin
  int64_t tokens = 0;        // tokens the means are over
  std::map<std::string, std::vector<float>> columns;  // HF weight name -> mean x^2 per column
};

// Errors name the file and the field: not JSON, another format, a tensor whose values are not
// finite non-negative numbers.
Result<ImportanceMatrix> load_importance(const std::string& path);
// Written whole or not at all (a temporary file renamed over `path`).
Status save_importance(const ImportanceMatrix& m, const std::string& path);

// Accumulates sum x_j^2 per column of each weight as activations pass; matrix() gives means.
class ImportanceAccumulator {
 public:
  // x: n_tokens rows of k values entering weight `name`.
  void add(const std::string& name, const float* x, int64_t n_tokens, int64_t k);
  int64_t tokens(const std::string& name) const;
  ImportanceMatrix matrix() const;

 private:
  struct Sums {
    std::vector<double> sq;
    int64_t tokens = 0;
  };
  std::map<std::string, Sums> sums_;
};

}  // namespace tessera
