#include "tune/block_size.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "common/kv_config.h"

namespace tessera {

Result<BlockSizeChoice> choose_block_size(const std::vector<SimRequest>& mix, const StepTimeModel& cost,
                                          int64_t max_batch, const std::vector<int64_t>& candidates) {
  if (mix.empty()) return Status::invalid_argument("--block-size auto: the expected length mix has no requests");
  if (max_batch < 1) return Status::invalid_argument(fmt::format("--block-size auto: max_batch {}", max_batch));
  double mean_context = 0, mean_len = 0;
  for (const SimRequest& r : mix) {
    mean_context += static_cast<double>(r.prompt_tokens) + 0.5 * static_cast<double>(r.output_tokens);
    mean_len += static_cast<double>(r.prompt_tokens + r.output_tokens);
  }
  mean_context /= static_cast<double>(mix.size());
  mean_len /= static_cast<double>(mix.size());
  BlockSizeChoice out;
  for (int64_t b : candidates) {
    if (!validate_block_size(b).is_ok()) continue;
    double slots = 0, used = 0;
    for (const SimRequest& r : mix) {
      const int64_t l = r.prompt_tokens + r.output_tokens;
      slots += static_cast<double>((l + b - 1) / b * b);
      used += static_cast<double>(l);
    }
    BlockSizeRow row;
    row.block_size = b;
    row.fragmentation = slots > 0 ? (slots - used) / slots : 0;
    row.blocks_per_sequence = slots / static_cast<double>(b) / static_cast<double>(mix.size());
    const auto ctx = static_cast<int64_t>(std::llround(mean_context));
    StepFeatures f;
    f.tokens = max_batch;
    f.sequences = max_batch;
    f.decode_seqs = max_batch;
    f.context_tokens = max_batch * ctx;
    f.attention_pairs = max_batch * ctx;
    f.blocks = max_batch * ((ctx + b - 1) / b);
    row.step_s = cost.predict_s(f);
    row.block_share = row.step_s > 0 ? cost.per_block_s * static_cast<double>(f.blocks) / row.step_s : 0;
    row.score = row.step_s > 0 ? (1.0 - row.fragmentation) / row.step_s : 0;
    out.rows.push_back(row);
  }
  if (out.rows.empty()) return Status::invalid_argument("--block-size auto: no candidate block size in 16..1024");
  double best = 0;
  for (const BlockSizeRow& r : out.rows) best = std::max(best, r.score);
  const BlockSizeRow* pick = nullptr;
  for (BlockSizeRow& r : out.rows) {
    r.score = best > 0 ? r.score / best : 0;
    if (!pick && r.score >= 0.995) pick = &r;  // rows are in increasing block size: the smallest near-best
  }
  if (!pick) pick = &out.rows.front();
  out.block_size = pick->block_size;
  out.reason = fmt::format(
      "block size {} for a mix of mean {:.0f} tokens (decode context {:.0f}): {:.1f}% of KV slots unused, "
      "block walk {:.2f}% of a {:.1f} ms step at batch {} ({})",
      pick->block_size, mean_len, mean_context, 100 * pick->fragmentation, 100 * pick->block_share, pick->step_s * 1e3,
      max_batch, cost.source);
  return out;
}

std::string format_block_size_choice(const BlockSizeChoice& c, bool md) {
  std::string out;
  if (md) out += "| block | KV slots unused | blocks / sequence | step ms | block walk | score |\n|---|---|---|---|---|---|\n";
  else out += fmt::format("{:>6} {:>16} {:>18} {:>9} {:>11} {:>7}\n", "block", "KV slots unused", "blocks / sequence",
                          "step ms", "block walk", "score");
  for (const BlockSizeRow& r : c.rows) {
    const std::string mark = r.block_size == c.block_size ? " <- chosen" : "";
    if (md)
      out += fmt::format("| {}{} | {:.2f}% | {:.1f} | {:.3f} | {:.2f}% | {:.4f} |\n", r.block_size,
                         r.block_size == c.block_size ? " (chosen)" : "", 100 * r.fragmentation, r.blocks_per_sequence,
                         r.step_s * 1e3, 100 * r.block_share, r.score);
    else
      out += fmt::format("{:>6} {:>15.2f}% {:>18.1f} {:>9.3f} {:>10.2f}% {:>7.4f}{}\n", r.block_size,
                         100 * r.fragmentation, r.blocks_per_sequence, r.step_s * 1e3, 100 * r.block_share, r.score, mark);
  }
  return out;
}

}  // namespace tessera
