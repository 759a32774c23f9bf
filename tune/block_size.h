// `--block-size auto`: the KV block size for an expected length mix, chosen by the step-time
// model (tune/step_model.h).
//
// A block size B trades two costs:
// * internal fragmentation: a sequence of L tokens holds ceil(L / B) blocks, and the unused slots
//   of its last block are KV memory nobody can use; when KV memory is what bounds the batch (the
//   case block size matters for), the sequences that fit shrink by the wasted share;
// * block overhead: attention walks ceil(context / B) table entries per sequence and layer
//   (StepTimeModel::per_block_s), and the scheduler allocates, hashes and sends more ids.
// For each candidate B: fragmentation = sum over the mix of (ceil(L/B) * B - L) / sum of
// ceil(L/B) * B (L = prompt + output); the step = a decode step of max_batch sequences at the
// mix's mean context (prompt + output / 2); score = (1 - fragmentation) / step time, the
// throughput of a KV-bound batch relative to the others. The largest score wins; within 0.5% of
// it, the smaller block (less memory held per sequence).
//
// Thread-safety: values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "tune/step_model.h"
#include "tune/trace.h"

namespace tessera {

struct BlockSizeRow {
  int64_t block_size = 0;
  double fragmentation = 0;    // share of allocated KV slots unused
  double blocks_per_sequence = 0;
  double step_s = 0;           // the model's decode step at max_batch and the mean context
  double block_share = 0;      // of step_s, the per-block term
  double score = 0;            // relative to the best (1.0)
};

struct BlockSizeChoice {
  int64_t block_size = 16;
  std::string reason;          // one line: the mix, fragmentation and step time of the choice
  std::vector<BlockSizeRow> rows;
};

// `mix`: the expected requests (lengths only are read). InvalidArgument for an empty mix or no
// candidate in 16..1024.
Result<BlockSizeChoice> choose_block_size(const std::vector<SimRequest>& mix, const StepTimeModel& cost,
                                          int64_t max_batch,
                                          const std::vector<int64_t>& candidates = {16, 32, 64, 128, 256, 512});

// The table of rows (markdown or plain).
std::string format_block_size_choice(const BlockSizeChoice& choice, bool markdown);

}  // namespace tessera
