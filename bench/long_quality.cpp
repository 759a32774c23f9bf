// tessera-bench-long-quality: what sparse decode attention (kernels/sparse_attention.h) costs in
// quality on long real text, against dense attention on the same cache, one model file, CPU.
//
// Two measurements, both at each context length of --lengths:
//  * Teacher-forced KL. The first L - K tokens of each --kl-text document are prefilled (dense:
//    prefill never goes sparse), then its next K tokens are fed one per decode step, once with
//    dense and once with sparse decode attention; per position the KL divergence
//    KL(p_dense || p_sparse) of the next-token distributions, whether their top-1 tokens agree,
//    and both models' log-loss on the document's real next token.
//  * Needle in a haystack. A sentence "The secret passcode of the <colour> door is <5 digits>."
//    is placed at --depths evenly spaced depths (0% .. 100% of the haystack) of the --haystack
//    text, a question asking for it ends the prompt, and the answer is decoded greedily. Two
//    ways: "engine" (the whole prompt prefilled, as `serve` runs it, then the answer's tokens
//    decoded sparse: its first token comes from the dense prefill) and "strict" (the question's
//    tokens are decode steps too, so every query that reads the needle attends sparsely). Dense
//    runs the same steps with dense decode attention. A run passes when the answer's first 16
//    characters hold the digits.
// The prefix of a document or haystack is prefilled once per file and shared, block by block,
// by every run that starts with it (insertion points and teacher-forced windows sit on KV block
// boundaries), so each run prefills only what follows its own insertion point.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/flags.h"
#include "common/check.h"
#include "kernels/cpu/cpu_info.h"
#include "local/local_model.h"
#include "tokenizer/tokenizer.h"

namespace tessera {
namespace {

constexpr int64_t kDenseThreshold = int64_t{1} << 40;  // sparse on, never reached: dense, summaries kept

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK(f.good(), "cannot read {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// log-softmax of one row of logits into out.
void log_softmax(const float* x, int64_t n, std::vector<double>& out) {
  out.resize(static_cast<size_t>(n));
  const float mx = *std::max_element(x, x + n);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i] - mx));
  const double lse = static_cast<double>(mx) + std::log(s);
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<double>(x[i]) - lse;
}

class Runner {
 public:
  Runner(LocalModel& model, SparseSelectOptions select) : model_(model), select_(select) {}

  // top_blocks < 0: dense; else sparse with that many scored blocks.
  void set_sparse(int64_t top_blocks) {
    SparseAttentionConfig c;
    c.enabled = true;
    c.threshold_tokens = top_blocks >= 0 ? 1 : kDenseThreshold;
    c.select = select_;
    if (top_blocks >= 0) c.select.top_blocks = top_blocks;
    const Status s = model_.forward().set_sparse_attention(c);
    TESSERA_CHECK(s.is_ok(), "set_sparse_attention: {}", s.to_string());
  }

  // A table whose first `shared_blocks` entries are `prefix`'s and the rest fresh blocks, covering
  // n_tokens positions.
  std::vector<int32_t> fork(const std::vector<int32_t>& prefix, int64_t shared_blocks, int64_t n_tokens) {
    std::vector<int32_t> fresh;
    const int64_t bs = model_.block_size();
    TESSERA_CHECK(model_.ensure_blocks(fresh, n_tokens - shared_blocks * bs), "KV blocks for {} tokens", n_tokens);
    std::vector<int32_t> table(prefix.begin(), prefix.begin() + shared_blocks);
    table.insert(table.end(), fresh.begin(), fresh.end());
    return table;
  }
  // Gives back the blocks of `table` past the shared ones.
  void release_fresh(std::vector<int32_t>& table, int64_t shared_blocks) {
    std::vector<int32_t> fresh(table.begin() + shared_blocks, table.end());
    model_.release_blocks(fresh);
    table.clear();
  }

  // Prefills ids[start, end) at positions start.. in chunks; returns the last position's logits.
  const std::vector<float>& prefill(const std::vector<int32_t>& ids, int64_t start, int64_t end,
                                    const std::vector<int32_t>& table) {
    constexpr int64_t kChunk = 2048;
    for (int64_t p = start; p < end; p += kChunk) {
      const int64_t n = std::min(kChunk, end - p);
      SequenceInput in;
      in.tokens = std::span<const int32_t>(ids.data() + p, static_cast<size_t>(n));
      in.start_pos = p;
      in.block_table = std::span<const int32_t>(table.data(), table.size());
      in.want_logits = p + n == end;
      const Status s = model_.forward().run(std::span<const SequenceInput>(&in, 1), logits_);
      TESSERA_CHECK(s.is_ok(), "prefill at {}: {}", p, s.to_string());
    }
    return logits_;
  }
  // One decode step of token `id` at `pos`.
  const std::vector<float>& step(int32_t id, int64_t pos, const std::vector<int32_t>& table) {
    SequenceInput in;
    in.tokens = std::span<const int32_t>(&id, 1);
    in.start_pos = pos;
    in.block_table = std::span<const int32_t>(table.data(), table.size());
    const Status s = model_.forward().run(std::span<const SequenceInput>(&in, 1), logits_);
    TESSERA_CHECK(s.is_ok(), "decode at {}: {}", pos, s.to_string());
    return logits_;
  }

 private:
  LocalModel& model_;
  SparseSelectOptions select_;
  std::vector<float> logits_;
};

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

struct Doc {
  std::string path;
  std::vector<int32_t> ids;     // BOS + the text's tokens
  std::vector<int32_t> prefix;  // its prefilled blocks (the longest length's L - K tokens)
};

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using namespace tessera;
  CLI::App app{"tessera-bench-long-quality: sparse against dense decode attention on long real text (KL, needle)"};
  std::string model_path, haystack_path, json_path, lengths_s = "8192,16384,32704", tops_s = "16";
  std::vector<std::string> kl_paths;
  int threads = 0, depths = 10;
  int64_t kl_tokens = 128, answer_tokens = 8;
  SparseSelectOptions select;
  app.add_option("--model", model_path, "GGUF file or HF directory")->required();
  app.add_option("--haystack", haystack_path, "long text the needle is hidden in (empty: no needle runs)");
  app.add_option("--kl-text", kl_paths, "long documents for the teacher-forced KL (repeatable)");
  app.add_option("--lengths", lengths_s, "comma-separated context lengths in tokens (multiples of the block size)");
  app.add_option("--depths", depths, "needle depths per length, evenly spaced from 0% to 100%");
  app.add_option("--kl-tokens", kl_tokens, "teacher-forced decode steps at the end of each length");
  app.add_option("--answer-tokens", answer_tokens, "greedy tokens decoded for each needle answer");
  app.add_option("--threads", threads, "CPU threads (0: all)");
  app.add_option("--sparse-top-blocks", tops_s, "comma-separated blocks chosen by score per decode step (one sparse run each)");
  app.add_option("--sparse-sink-blocks", select.sink_blocks, "first blocks always attended");
  app.add_option("--sparse-recent-blocks", select.recent_blocks, "last blocks always attended");
  app.add_option("--json", json_path, "write the results as JSON here");
  cli::KvDtypeFlag kv_dtype;
  cli::add_kv_dtype_flag(app, kv_dtype, cli::KvDtypeUse::kRuntime);
  CLI11_PARSE(app, argc, argv);

  auto parse_list = [](const std::string& list) {
    std::vector<int64_t> v;
    std::stringstream ss(list);
    for (std::string t; std::getline(ss, t, ',');) v.push_back(std::stoll(t));
    return v;
  };
  std::vector<int64_t> lengths = parse_list(lengths_s);
  const std::vector<int64_t> tops = parse_list(tops_s);
  TESSERA_CHECK(!tops.empty(), "--sparse-top-blocks is empty");
  TESSERA_CHECK(!lengths.empty(), "--lengths is empty");
  std::sort(lengths.begin(), lengths.end());
  const int64_t max_len = lengths.back();

  auto tok = load_tokenizer_for_model(model_path);
  TESSERA_CHECK(tok.is_ok(), "{}", tok.status().to_string());
  const Tokenizer& tk = **tok;
  auto encode_doc = [&](const std::string& path) {
    std::vector<int32_t> ids;
    if (tk.bos_id() >= 0) ids.push_back(tk.bos_id());
    const std::vector<int32_t> body = tk.encode(read_file(path), false);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  };

  LocalModelOptions opts;
  opts.path = model_path;
  opts.runtime.threads = threads;
  opts.runtime.kv_dtype = kv_dtype.runtime();
  opts.runtime.sparse.enabled = true;  // the cache keeps key summaries
  opts.runtime.sparse.threshold_tokens = kDenseThreshold;
  opts.runtime.sparse.select = select;
  // A shared prefix of max_len plus one run's own blocks (a run never outgrows max_len).
  opts.kv_tokens = 2 * max_len + 256;
  auto loaded = LocalModel::load(opts);
  TESSERA_CHECK(loaded.is_ok(), "{}", loaded.status().to_string());
  LocalModel& model = **loaded;
  const int64_t bs = model.block_size();
  const int64_t vocab = model.config().vocab;
  for (int64_t L : lengths)
    TESSERA_CHECK(L % bs == 0 && L > kl_tokens && L <= model.config().max_positions, "length {} (block size {}, context {})",
                  L, bs, model.config().max_positions);
  TESSERA_CHECK(kl_tokens % bs == 0, "--kl-tokens {} is not a multiple of the block size {}", kl_tokens, bs);
  Runner run(model, select);

  nlohmann::json out;
  out["model"] = model_path;
  out["cpu"] = cpu::describe_cpu();
  out["kv_dtype"] = std::string(kv_dtype_name(opts.runtime.kv_dtype));
  out["block_size"] = bs;
  out["top_blocks"] = tops;
  out["sink_blocks"] = select.sink_blocks;
  out["recent_blocks"] = select.recent_blocks;
  out["kl_tokens"] = kl_tokens;
  std::printf("model %s  kv %s  block %lld  selection: %lld sink + %lld recent + top %s blocks\n", model_path.c_str(),
              std::string(kv_dtype_name(opts.runtime.kv_dtype)).c_str(), static_cast<long long>(bs),
              static_cast<long long>(select.sink_blocks), static_cast<long long>(select.recent_blocks), tops_s.c_str());

  // ---------------------------------------------------------------- teacher-forced KL
  std::vector<double> lp_dense, lp_sparse;
  for (const std::string& path : kl_paths) {
    const std::vector<int32_t> ids = encode_doc(path);
    TESSERA_CHECK(static_cast<int64_t>(ids.size()) >= max_len + 1, "{}: {} tokens, fewer than {} + 1", path, ids.size(),
                  max_len);
    std::vector<int32_t> prefix;
    const int64_t pre = max_len - kl_tokens;
    TESSERA_CHECK(model.ensure_blocks(prefix, pre), "KV blocks for {} tokens", pre);
    run.set_sparse(-1);
    run.prefill(ids, 0, pre, prefix);
    for (int64_t L : lengths) {
      const int64_t start = L - kl_tokens;
      std::vector<std::vector<double>> dense_rows;
      std::vector<double> nll_d;
      // Variant 0: dense; then one sparse run per budget in tops.
      for (size_t variant = 0; variant <= tops.size(); ++variant) {
        run.set_sparse(variant == 0 ? -1 : tops[variant - 1]);
        std::vector<double> kl, nll_s;
        int64_t agree = 0;
        std::vector<int32_t> table = run.fork(prefix, start / bs, L);
        for (int64_t p = start; p < L; ++p) {
          const std::vector<float>& lg = run.step(ids[static_cast<size_t>(p)], p, table);
          const size_t k = static_cast<size_t>(p - start);
          const int32_t next = ids[static_cast<size_t>(p + 1)];
          if (variant == 0) {
            log_softmax(lg.data(), vocab, lp_dense);
            dense_rows.push_back(lp_dense);
            nll_d.push_back(-lp_dense[static_cast<size_t>(next)]);
            continue;
          }
          log_softmax(lg.data(), vocab, lp_sparse);
          const std::vector<double>& d = dense_rows[k];
          double s = 0;
          for (int64_t v = 0; v < vocab; ++v)
            s += std::exp(d[static_cast<size_t>(v)]) * (d[static_cast<size_t>(v)] - lp_sparse[static_cast<size_t>(v)]);
          kl.push_back(std::max(0.0, s));
          nll_s.push_back(-lp_sparse[static_cast<size_t>(next)]);
          const auto top = [](const std::vector<double>& r) { return std::max_element(r.begin(), r.end()) - r.begin(); };
          agree += top(d) == top(lp_sparse);
        }
        run.release_fresh(table, start / bs);
        if (variant == 0) continue;
        std::vector<double> sorted = kl;
        std::sort(sorted.begin(), sorted.end());
        nlohmann::json r;
        r["doc"] = path;
        r["length"] = L;
        r["top_blocks"] = tops[variant - 1];
        r["kl_mean"] = mean(kl);
        r["kl_p95"] = sorted[static_cast<size_t>(0.95 * static_cast<double>(sorted.size() - 1))];
        r["kl_max"] = sorted.back();
        r["top1_agree"] = static_cast<double>(agree) / static_cast<double>(kl.size());
        r["nll_dense"] = mean(nll_d);
        r["nll_sparse"] = mean(nll_s);
        out["kl"].push_back(r);
        std::printf("kl %s L=%lld top %lld: mean %.5f p95 %.5f max %.5f top1 %.3f nll dense %.4f sparse %.4f\n",
                    path.c_str(), static_cast<long long>(L), static_cast<long long>(tops[variant - 1]),
                    r["kl_mean"].get<double>(), r["kl_p95"].get<double>(), r["kl_max"].get<double>(),
                    r["top1_agree"].get<double>(), r["nll_dense"].get<double>(), r["nll_sparse"].get<double>());
        std::fflush(stdout);
      }
    }
    model.release_blocks(prefix);
  }

  // ---------------------------------------------------------------- needle in a haystack
  if (!haystack_path.empty()) {
    const std::vector<int32_t> hay = encode_doc(haystack_path);
    const char* colours[] = {"blue", "red", "green", "amber", "violet", "silver", "orange", "white", "black", "golden"};
    const std::string q_prefix = "\n\nQuestion: what is the secret passcode of the ";
    // The longest question (the colour changes its length by a few tokens): budget 32 tokens.
    const int64_t q_budget = 32 + answer_tokens;
    TESSERA_CHECK(static_cast<int64_t>(hay.size()) >= max_len, "{}: {} tokens, fewer than {}", haystack_path, hay.size(),
                  max_len);
    std::vector<int32_t> prefix;
    const int64_t pre = (max_len - q_budget - 64) / bs * bs;
    TESSERA_CHECK(model.ensure_blocks(prefix, pre), "KV blocks for {} tokens", pre);
    run.set_sparse(-1);
    run.prefill(hay, 0, pre, prefix);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int64_t L : lengths) {
      // Modes: 0 dense (strict); per budget t of tops, 2t + 1 sparse engine, 2t + 2 sparse strict.
      const size_t n_modes = 1 + 2 * tops.size();
      std::vector<std::string> names{"dense"};
      for (int64_t t : tops) {
        names.push_back("sparse" + std::to_string(t) + "_engine");
        names.push_back("sparse" + std::to_string(t) + "_strict");
      }
      std::vector<int> pass(n_modes, 0);
      for (int d = 0; d < depths; ++d) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const int code = 10000 + static_cast<int>((rng >> 33) % 90000);
        const std::string colour = colours[d % 10];
        const std::vector<int32_t> needle =
            tk.encode("\nThe secret passcode of the " + colour + " door is " + std::to_string(code) + ". Remember it.\n", false);
        const std::vector<int32_t> question =
            tk.encode(q_prefix + colour + " door?\nAnswer: the secret passcode of the " + colour + " door is", false);
        const int64_t body = L - answer_tokens - static_cast<int64_t>(question.size()) - static_cast<int64_t>(needle.size());
        // Needle at a block boundary at fraction d / (depths - 1) of the haystack part (at least
        // one block in, so BOS's block is shared; at most the shared prefix).
        const double frac = depths > 1 ? static_cast<double>(d) / (depths - 1) : 0.5;
        const int64_t ins = std::clamp<int64_t>(static_cast<int64_t>(frac * static_cast<double>(body)) / bs * bs, bs,
                                                std::min(pre, body / bs * bs));
        std::vector<int32_t> ids(hay.begin(), hay.begin() + ins);
        ids.insert(ids.end(), needle.begin(), needle.end());
        ids.insert(ids.end(), hay.begin() + ins, hay.begin() + body);
        const int64_t q0 = static_cast<int64_t>(ids.size());
        ids.insert(ids.end(), question.begin(), question.end());
        const int64_t n_prompt = static_cast<int64_t>(ids.size());
        // One context: the needle and what follows, prefilled dense up to the question.
        std::vector<int32_t> table = run.fork(prefix, ins / bs, n_prompt + answer_tokens);
        run.set_sparse(-1);
        run.prefill(ids, ins, q0, table);
        const std::string want = std::to_string(code);
        nlohmann::json r;
        r["length"] = L;
        r["depth"] = frac;
        r["needle_at"] = ins;
        r["code"] = want;
        std::printf("needle L=%lld depth %.2f (token %lld) code %s:", static_cast<long long>(L), frac,
                    static_cast<long long>(ins), want.c_str());
        for (size_t mode = 0; mode < n_modes; ++mode) {
          const int64_t top = mode == 0 ? -1 : tops[(mode - 1) / 2];
          const bool engine = mode > 0 && mode % 2 == 1;
          int32_t next = 0;
          if (engine) {  // the question prefilled (dense, as serve does), the answer decoded sparse
            run.set_sparse(-1);
            next = argmax(run.prefill(ids, q0, n_prompt, table));
            run.set_sparse(top);
          } else {  // the question's tokens decoded one by one too
            run.set_sparse(top);
            for (int64_t p = q0; p < n_prompt; ++p) next = argmax(run.step(ids[static_cast<size_t>(p)], p, table));
          }
          std::vector<int32_t> gen{next};
          for (int64_t g = 1; g < answer_tokens; ++g) gen.push_back(argmax(run.step(gen.back(), n_prompt + g - 1, table)));
          const std::string answer = tk.decode(gen, true);
          const bool ok = answer.substr(0, 16).find(want) != std::string::npos;
          pass[mode] += ok;
          r[names[mode]] = {{"answer", answer}, {"pass", ok}};
          std::printf(" %s %s", names[mode].c_str(), ok ? "pass" : "FAIL");
        }
        std::printf("\n");
        std::fflush(stdout);
        run.release_fresh(table, ins / bs);
        out["needle"].push_back(r);
      }
      nlohmann::json sum{{"length", L}, {"depths", depths}};
      std::printf("needle L=%lld of %d:", static_cast<long long>(L), depths);
      for (size_t m = 0; m < n_modes; ++m) {
        sum[names[m]] = pass[m];
        std::printf(" %s %d", names[m].c_str(), pass[m]);
      }
      std::printf("\n");
      out["needle_summary"].push_back(sum);
    }
    model.release_blocks(prefix);
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(1) << "\n";
  }
  return 0;
}
