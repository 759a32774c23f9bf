// CudaForward's outputs: the LM head (enqueue_lm_head: gather the logit rows, the GEMM, then the
// TP all-gather, the device greedy argmax or device sampling), their downloads to the host
// (logits, greedy ids, sampled tokens), and device sampling's rows and checks.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "comm/device_comm.h"
#include "kernels/sampling.h"
#include "shard/cuda_forward_internal.h"

namespace tessera {

using cuda_forward_detail::micros_since;

Status CudaForward::enqueue_lm_head(int64_t row0, int64_t count, Output kind) {
  // The final-normed rows out_rows[row0 .. row0 + count) -> proj_ -> f16 -> LM head; count <=
  // max_logit_rows. Then, by output kind:
  //  * logits: the all-gather at TP > 1;
  //  * greedy: each row's argmax over this rank's vocabulary slice with its value, gathered from
  //    every rank (8 bytes a row);
  //  * sampled: the full logits (unsharded from the all-gather at TP > 1) sampled on the device
  //    with the parameters of rows row0 .. row0 + count.
  const MetaLayout& meta = meta_at_;
  const int64_t hidden = config_.hidden;
  TESSERA_CUDA_LAUNCH(api_->gather_rows_f32(h_, meta_ + meta.out_rows + row0, proj_, count, hidden, stream_),
                      "gather rows");
  TESSERA_CUDA_LAUNCH(api_->convert_f32_to_f16(proj_, act16_, count * hidden, stream_), "f32 -> f16");
  TESSERA_RETURN_IF_ERROR(gemm(*lm_head_, act16_, logits_, count));  // [count, local] packed
  if (kind == Output::kGreedy) {
    const int64_t first_id = std::min<int64_t>(config_.vocab, layout_.vocab_per_rank * layout_.tp_rank);
    auto* values = reinterpret_cast<float*>(greedy_ + count);  // [ids | values] of this rank
    TESSERA_CUDA_LAUNCH(api_->argmax_value_f32(logits_, count, lm_head_->rows, static_cast<int32_t>(first_id), greedy_,
                                               values, stream_),
                        "greedy argmax");
    if (layout_.tp_size > 1) {
      ++last_step_.launches;
      TESSERA_RETURN_IF_ERROR(comm_->all_gather(greedy_, greedy_gathered_, count * 8));
    }
    return Status::ok();
  }
  if (layout_.tp_size > 1) {
    ++last_step_.launches;
    TESSERA_RETURN_IF_ERROR(comm_->all_gather(logits_, gathered_, count * layout_.vocab_per_rank * 4));
  }
  if (kind == Output::kSampled) {
    float* full = logits_;
    if (layout_.tp_size > 1) {
      full = full_logits_;
      TESSERA_CUDA_LAUNCH(api_->unshard_logits_f32(gathered_, count, config_.vocab, layout_.vocab_per_rank,
                                                   layout_.tp_size, full, stream_),
                          "unshard logits");
    }
    const int64_t R = options_.max_logit_rows;
    TesseraCudaSampleArgs a{};
    a.logits = full;
    a.scratch = sample_scratch_;
    a.rows = sample_rows_ + row0;
    a.penalties = penalties_;
    a.n_rows = count;
    a.vocab = config_.vocab;
    a.ids = sampled_;
    a.logprobs = reinterpret_cast<float*>(sampled_ + R);
    a.top_ids = sampled_ + 2 * R;
    a.top_logprobs = reinterpret_cast<float*>(sampled_ + 2 * R + R * TESSERA_CUDA_MAX_TOP_LOGPROBS);
    TESSERA_CUDA_LAUNCH(api_->sample_f32(&a, stream_), "sampling");
  }
  return Status::ok();
}

Status CudaForward::download_logits(int64_t n_rows, int64_t n_real, float* out) {
  // n_rows logit rows were computed (a graphed step's padded bucket); the first n_real go to
  // out [n_real, vocab].
  const int64_t vocab = config_.vocab;
  if (layout_.tp_size == 1) {
    ++last_step_.launches;
    TESSERA_CUDA_TRY(api_->device_memcpy_async(out, logits_, n_real * vocab * 4, stream_), "copy logits");
    last_step_.host_micros = micros_since(step_start_);
    TESSERA_CUDA_TRY(api_->stream_synchronize(stream_), "forward step");
    return Status::ok();
  }
  // Each rank's chunk of n_rows * per floats holds its [n_rows, count_r] logits packed at the
  // front (count_r <= per; the rest is unused), gathered as [rank][chunk].
  const int64_t per = layout_.vocab_per_rank;
  h_gathered_.resize(static_cast<size_t>(layout_.tp_size * n_rows * per));
  ++last_step_.launches;
  TESSERA_CUDA_TRY(
      api_->device_memcpy_async(h_gathered_.data(), gathered_, layout_.tp_size * n_rows * per * 4, stream_),
      "copy gathered logits");
  last_step_.host_micros = micros_since(step_start_);
  TESSERA_CUDA_TRY(api_->stream_synchronize(stream_), "forward step");
  for (int r = 0; r < layout_.tp_size; ++r) {
    const int64_t begin = std::min<int64_t>(vocab, per * r);
    const int64_t count = std::min<int64_t>(vocab, begin + per) - begin;
    const float* chunk = &h_gathered_[static_cast<size_t>(r * n_rows * per)];
    for (int64_t t = 0; t < n_real; ++t) std::copy_n(chunk + t * count, count, out + t * vocab + begin);
  }
  return Status::ok();
}

Status CudaForward::download_greedy(int64_t n_rows, int64_t n_real, int32_t* out) {
  // Per rank [ids (n_rows) | values (n_rows)]; the larger value wins, then the lower id (the
  // single-device argmax's choice; ranks hold increasing id ranges).
  const int64_t ranks = layout_.tp_size;
  const int32_t* src = ranks > 1 ? greedy_gathered_ : greedy_;
  h_greedy_.resize(static_cast<size_t>(ranks * 2 * n_rows));
  ++last_step_.launches;
  TESSERA_CUDA_TRY(api_->device_memcpy_async(h_greedy_.data(), src, ranks * 2 * n_rows * 4, stream_), "copy token ids");
  last_step_.host_micros = micros_since(step_start_);
  TESSERA_CUDA_TRY(api_->stream_synchronize(stream_), "forward step");
  for (int64_t t = 0; t < n_real; ++t) {
    int32_t best_id = h_greedy_[static_cast<size_t>(t)];
    float best_v = 0.0f;
    std::memcpy(&best_v, &h_greedy_[static_cast<size_t>(n_rows + t)], 4);
    for (int64_t r = 1; r < ranks; ++r) {
      const int32_t id = h_greedy_[static_cast<size_t>(r * 2 * n_rows + t)];
      float v = 0.0f;
      std::memcpy(&v, &h_greedy_[static_cast<size_t>(r * 2 * n_rows + n_rows + t)], 4);
      if (v > best_v || (v == best_v && id < best_id)) {
        best_v = v;
        best_id = id;
      }
    }
    out[t] = best_id;
  }
  return Status::ok();
}

Status CudaForward::download_sampled(int64_t n_real, std::span<const TesseraCudaSampleRow> rows, SampledToken* out) {
  // sampled_ = [ids (R) | logprobs (R) | top ids (R x MAX) | top logprobs (R x MAX)]; the first
  // n_real rows of each part come back (the top parts only when a row asked for them).
  const int64_t R = options_.max_logit_rows, top = TESSERA_CUDA_MAX_TOP_LOGPROBS;
  bool tops = false;
  for (int64_t t = 0; t < n_real; ++t) tops = tops || rows[static_cast<size_t>(t)].n_logprobs > 0;
  h_sampled_.resize(static_cast<size_t>(2 * R + 2 * R * top));
  ++last_step_.launches;
  TESSERA_CUDA_TRY(api_->device_memcpy_async(h_sampled_.data(), sampled_, (R + n_real) * 4, stream_),
                   "copy sampled tokens");
  if (tops) {
    ++last_step_.launches;
    TESSERA_CUDA_TRY(
        api_->device_memcpy_async(h_sampled_.data() + 2 * R, sampled_ + 2 * R, (R * top + n_real * top) * 4, stream_),
        "copy top logprobs");
  }
  last_step_.host_micros = micros_since(step_start_);
  TESSERA_CUDA_TRY(api_->stream_synchronize(stream_), "forward step");
  auto as_float = [](int32_t bits) {
    float f = 0.0f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  for (int64_t t = 0; t < n_real; ++t) {
    SampledToken& o = out[t];
    const TesseraCudaSampleRow& row = rows[static_cast<size_t>(t)];
    o.id = h_sampled_[static_cast<size_t>(t)];
    o.logprob = as_float(h_sampled_[static_cast<size_t>(R + t)]);
    o.top_logprobs.clear();
    const int64_t n_top = std::clamp<int64_t>(std::min<int64_t>(row.n_logprobs, config_.vocab), 0, top);
    for (int64_t j = 0; j < n_top; ++j)
      o.top_logprobs.emplace_back(h_sampled_[static_cast<size_t>(2 * R + t * top + j)],
                                  as_float(h_sampled_[static_cast<size_t>(2 * R + R * top + t * top + j)]));
  }
  return Status::ok();
}

Status CudaForward::upload_sampling(int64_t n_rows, std::span<const TesseraCudaPenalty> penalties) {
  // Pageable host memory: staged before the call returns (as the metadata uploads).
  TESSERA_CUDA_LAUNCH(api_->device_memcpy_async(sample_rows_, h_sample_rows_.data(),
                                                n_rows * static_cast<int64_t>(sizeof(TesseraCudaSampleRow)), stream_),
                      "upload sampling parameters");
  if (!penalties.empty())
    TESSERA_CUDA_LAUNCH(
        api_->device_memcpy_async(penalties_, penalties.data(), static_cast<int64_t>(penalties.size_bytes()), stream_),
        "upload penalty entries");
  return Status::ok();
}

TesseraCudaSampleRow device_sample_row(const Sampler& sampler, std::span<const int32_t> banned,
                                       std::vector<TesseraCudaPenalty>& penalties) {
  const SamplingParams& p = sampler.params();
  TesseraCudaSampleRow row{};
  row.u = sampling_uniform(sampler.seed(), static_cast<uint64_t>(sampler.num_output_tokens()));
  row.temperature = p.temperature;
  row.top_p = p.top_p;
  row.min_p = p.min_p;
  row.top_k = p.top_k;
  row.repetition_penalty = p.repetition_penalty;
  row.presence_penalty = p.presence_penalty;
  row.frequency_penalty = p.frequency_penalty;
  row.n_logprobs = p.n_logprobs;
  row.want_logprob = p.return_logprob ? 1 : 0;
  row.penalty_begin = static_cast<int32_t>(penalties.size());
  std::unordered_map<int32_t, size_t> index;  // id -> its entry
  auto entry = [&](int32_t id) -> TesseraCudaPenalty& {
    auto [at, added] = index.try_emplace(id, penalties.size());
    if (added) penalties.push_back(TesseraCudaPenalty{id, 0, 0, 0});
    return penalties[at->second];
  };
  const bool repetition = p.repetition_penalty != 1.0f;
  if (repetition)
    for (const auto& [id, count] : sampler.prompt_counts()) entry(id).in_prompt = 1;
  if (repetition || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
    for (const auto& [id, count] : sampler.output_counts()) entry(id).out_count = count;
  for (const int32_t id : banned) entry(id).banned = 1;
  row.penalty_end = static_cast<int32_t>(penalties.size());
  return row;
}

Status CudaForward::can_sample(std::span<const TesseraCudaSampleRow> rows,
                               std::span<const TesseraCudaPenalty> penalties) const {
  if (config_.vocab > (int64_t{1} << 20))
    return Status::invalid_argument(
        fmt::format("device sampling takes vocabularies of at most 2^20 ids, this model has {}", config_.vocab));
  if (static_cast<int64_t>(rows.size()) > std::max(options_.max_seqs_per_step, options_.max_logit_rows))
    return Status::invalid_argument(fmt::format("{} sampled rows, at most {} a step", rows.size(),
                                                std::max(options_.max_seqs_per_step, options_.max_logit_rows)));
  if (static_cast<int64_t>(penalties.size()) > options_.max_penalty_entries)
    return Status::invalid_argument(fmt::format("{} penalty entries, at most {} a step (max_penalty_entries)",
                                                penalties.size(), options_.max_penalty_entries));
  for (size_t i = 0; i < rows.size(); ++i) {
    const TesseraCudaSampleRow& r = rows[i];
    if (r.n_logprobs < 0 || r.n_logprobs > TESSERA_CUDA_MAX_TOP_LOGPROBS)
      return Status::invalid_argument(fmt::format("row {}: n_logprobs {}, the device returns 0 .. {}", i, r.n_logprobs,
                                                  static_cast<int>(TESSERA_CUDA_MAX_TOP_LOGPROBS)));
    if (r.penalty_begin < 0 || r.penalty_begin > r.penalty_end ||
        r.penalty_end > static_cast<int64_t>(penalties.size()))
      return Status::invalid_argument(fmt::format("row {}: penalty entries [{}, {}) outside the {} given", i,
                                                  r.penalty_begin, r.penalty_end, penalties.size()));
    if (!(r.u >= 0.0 && r.u < 1.0) || !std::isfinite(r.temperature) || r.temperature < 0.0f)
      return Status::invalid_argument(fmt::format("row {}: u {} / temperature {} out of range", i, r.u, r.temperature));
  }
  return Status::ok();
}

}  // namespace tessera
