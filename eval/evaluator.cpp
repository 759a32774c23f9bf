#include "eval/evaluator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/sha256.h"
#include "common/thread_pool.h"
#include "engine/speculation.h"
#include "eval/corpus.h"
#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/fgemm_bf16.h"
#include "kernels/gemm.h"
#include "local/local_model.h"
#include "model/importance.h"
#include "model/weight_store.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;
constexpr std::string_view kImatrixSuffix = "+imatrix";

struct PrecisionSpec {
  std::string name;
  WeightQuant quant = WeightQuant::kNone;
  bool calibrated = false;
  MatmulPrecision compute = MatmulPrecision::kAuto;  // "@fp32" / "@bf16": how its float matmuls compute
  KvDtype kv_dtype = KvDtype::kF32;                   // ":kv-fp16" / ":kv-int8": what its KV cache stores
};

Result<PrecisionSpec> parse_precision(const std::string& name) {
  PrecisionSpec p{name};
  std::string base = name;
  if (const size_t at = base.rfind(":kv-"); at != std::string::npos) {
    const std::string kv = base.substr(at + 4);
    auto d = parse_kv_dtype(kv);
    if (!d.is_ok() || !kv_dtype_stored(*d, KvBackend::kCpu))
      return Status::invalid_argument(fmt::format("precision '{}': ':kv-{}' is not a KV cache type the CPU stores ({})",
                                                  name, kv, kv_dtypes_stored_text(KvBackend::kCpu, ", ")));
    p.kv_dtype = *d;
    base.resize(at);
  }
  if (const size_t at = base.rfind('@'); at != std::string::npos) {
    const std::string compute = base.substr(at + 1);
    if (!parse_matmul_precision(compute, &p.compute))
      return Status::invalid_argument(
          fmt::format("precision '{}': '@{}' is not a matmul precision (auto, fp32, bf16)", name, compute));
    if (p.compute == MatmulPrecision::kBf16 && !cpu::has_bf16_dot())
      return Status::invalid_argument(fmt::format("precision '{}': bf16 matmuls need AVX512_BF16, which this CPU ({}) "
                                                  "does not have; use '@fp32' or '@auto'",
                                                  name, cpu::cpu_info().brand));
    base.resize(at);
  }
  if (base.size() > kImatrixSuffix.size() && base.ends_with(kImatrixSuffix)) {
    base.resize(base.size() - kImatrixSuffix.size());
    p.calibrated = true;
  }
  if (base == "file") {
    if (p.calibrated) return Status::invalid_argument("precision 'file+imatrix': the file's weights are as stored");
    return p;
  }
  auto q = parse_weight_quant(base);
  if (!q.is_ok() || *q == WeightQuant::kNone)
    return Status::invalid_argument(fmt::format(
        "precision '{}': expected 'file', a --quant name ({}) or one of those with '+imatrix', each optionally with "
        "'@fp32' or '@bf16' (how its float matmuls compute) and then ':kv-fp16' or ':kv-int8' (the KV cache's "
        "elements)",
        name, precision_quant_names()));
  p.quant = *q;
  // Calibrated encoders exist for the GGUF block formats (kernels/quant.h's quantize_row_weighted).
  const QuantTraits& made = quant_traits(weight_quant_type(p.quant));
  if (p.calibrated && (made.is_float || made.ggml_type < 0))
    return Status::invalid_argument(
        fmt::format("precision '{}': only the GGUF formats have calibrated (importance-weighted) encoders", name));
  return p;
}

// One teacher-forced window: BOS (when the tokenizer has one) and up to window - 1 tokens.
using Segment = std::vector<int32_t>;

struct ClassText {
  std::vector<Segment> segments;
  int64_t positions = 0;
  double byte_share = 0;
};

bool is_byte_token(const Tokenizer& tok, int32_t id) {
  const std::string s = tok.id_to_token(id);
  return s.size() == 6 && s.starts_with("<0x") && s.back() == '>';
}

// Windows of the documents, round robin (the first window of every document, then the second
// ...), until `positions` next-token predictions are covered.
ClassText segment_docs(const Tokenizer& tok, const std::vector<CorpusDoc>& docs, int64_t window, int64_t positions) {
  ClassText out;
  std::vector<std::vector<int32_t>> ids;
  ids.reserve(docs.size());
  for (const CorpusDoc& d : docs) ids.push_back(tok.encode(d.text, false));
  const int32_t bos = tok.bos_id();
  const int64_t body = window - (bos >= 0 ? 1 : 0);
  int64_t bytes = 0, counted = 0;
  for (int64_t pass = 0; out.positions < positions; ++pass) {
    bool any = false;
    for (const auto& doc : ids) {
      const int64_t begin = pass * body;
      if (begin >= static_cast<int64_t>(doc.size())) continue;
      const int64_t end = std::min<int64_t>(static_cast<int64_t>(doc.size()), begin + body);
      if (end - begin < 16) continue;
      any = true;
      Segment s;
      if (bos >= 0) s.push_back(bos);
      s.insert(s.end(), doc.begin() + begin, doc.begin() + end);
      const int64_t room = positions - out.positions;
      if (static_cast<int64_t>(s.size()) - 1 > room) s.resize(static_cast<size_t>(room + 1));
      for (size_t i = bos >= 0 ? 1 : 0; i < s.size(); ++i) bytes += is_byte_token(tok, s[i]) ? 1 : 0;
      counted += static_cast<int64_t>(s.size()) - (bos >= 0 ? 1 : 0);
      out.positions += static_cast<int64_t>(s.size()) - 1;
      out.segments.push_back(std::move(s));
      if (out.positions >= positions) break;
    }
    if (!any) break;
  }
  out.byte_share = counted > 0 ? static_cast<double>(bytes) / static_cast<double>(counted) : 0;
  return out;
}

std::string hf_linear_name(WeightRef w) {
  const char* suffix = nullptr;
  switch (w.tensor) {
    case Tensor::kWq: suffix = "self_attn.q_proj.weight"; break;
    case Tensor::kWk: suffix = "self_attn.k_proj.weight"; break;
    case Tensor::kWv: suffix = "self_attn.v_proj.weight"; break;
    case Tensor::kWo: suffix = "self_attn.o_proj.weight"; break;
    case Tensor::kWGate: suffix = "mlp.gate_proj.weight"; break;
    case Tensor::kWUp: suffix = "mlp.up_proj.weight"; break;
    case Tensor::kWDown: suffix = "mlp.down_proj.weight"; break;
    default: return {};
  }
  return fmt::format("model.layers.{}.{}", w.layer, suffix);
}

// Runs one window through `m` (no logits: the calibration pass only watches the projections'
// inputs); its KV blocks are free again after.
Status prefill_window(LocalModel& m, const Segment& tokens) {
  std::vector<int32_t> table;
  if (!m.ensure_blocks(table, static_cast<int64_t>(tokens.size())))
    return Status::resource_exhausted(fmt::format("{} tokens do not fit the eval's KV pool", tokens.size()));
  SequenceInput in;
  in.tokens = tokens;
  in.block_table = table;
  in.want_logits = false;
  std::vector<float> logits;
  const Status st = m.forward().run(std::span<const SequenceInput>(&in, 1), logits);
  m.release_blocks(table);
  return st;
}

// log-sum-exp of a row.
double log_sum_exp(const float* x, int64_t v) {
  float mx = x[0];
  for (int64_t i = 1; i < v; ++i) mx = std::max(mx, x[i]);
  double s = 0;
  for (int64_t i = 0; i < v; ++i) s += std::exp(static_cast<double>(x[i] - mx));
  return mx + std::log(s);
}

int64_t argmax(const float* x, int64_t v) { return std::max_element(x, x + v) - x; }

struct ClassAccum {
  double nll = 0;
  double kl = 0;
  int64_t agree = 0;
  int64_t n = 0;
  std::vector<float> kls;
};

struct Loaded {
  PrecisionSpec spec;
  std::unique_ptr<LocalModel> model;
  std::map<std::string, ClassAccum> acc;
  PrecisionResult result;
};

void describe_weights(const ModelWeights& w, PrecisionResult* r) {
  int64_t linear_bytes = 0, linear_elems = 0, all_bytes = 0;
  auto bytes_of = [](const TensorView& t) -> int64_t {
    if (t.data == nullptr) return 0;
    return t.ndim == 2 ? static_cast<int64_t>(row_bytes(t.type, t.cols())) * t.rows()
                       : static_cast<int64_t>(row_bytes(t.type, t.shape[0]));
  };
  for (const LayerWeights& l : w.layers) {
    for (const TensorView* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      linear_bytes += bytes_of(*t);
      linear_elems += t->rows() * t->cols();
      r->formats[std::string(quant_name(quant_traits(t->type).r16_base))] += 1;
    }
    for (const TensorView* t : {&l.attn_norm, &l.ffn_norm, &l.post_attn_norm, &l.post_ffn_norm, &l.q_norm, &l.k_norm,
                                &l.bq, &l.bk, &l.bv})
      all_bytes += bytes_of(*t);
  }
  all_bytes += linear_bytes + bytes_of(w.embed) + bytes_of(w.final_norm);
  if (w.lm_head.data != w.embed.data) all_bytes += bytes_of(w.lm_head);
  r->bits_per_weight = linear_elems > 0 ? 8.0 * static_cast<double>(linear_bytes) / linear_elems : 0;
  r->weight_bytes = all_bytes;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

struct Canaries {
  std::optional<CodeCanary> code;
  std::optional<MathCanary> math;
};

Result<std::vector<int32_t>> greedy(LocalModel& m, const std::vector<int32_t>& prompt, int64_t max_tokens) {
  GenerateOptions g;
  g.max_tokens = max_tokens;
  g.sampling.temperature = 0.0f;
  g.speculation.mode = SpecMode::kOff;
  TESSERA_ASSIGN_OR_RETURN(GenerateOutput out, generate(m, prompt, g));
  return out.ids;
}

Result<Canaries> run_canaries(LocalModel& m, const Tokenizer& tok, const EvalCorpus& corpus, const EvalOptions& o) {
  Canaries c;
  const int64_t n_code = std::min<int64_t>(o.code_canaries, static_cast<int64_t>(corpus.code_canaries.size()));
  if (n_code > 0) {
    std::vector<CodeProgram> programs;
    for (int64_t i = 0; i < n_code; ++i) {
      const CodeProblem& p = corpus.code_canaries[static_cast<size_t>(i)];
      TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, greedy(m, tok.encode(p.prompt, true), o.code_tokens));
      const std::string completion = cut_code_completion(tok.decode(ids, true));
      programs.push_back({p.id, p.prompt + completion, p.test + "\ncheck(" + p.entry_point + ")\n"});
    }
    TESSERA_ASSIGN_OR_RETURN(std::vector<CodeVerdict> v, run_code_programs(programs, o.python, o.sandbox));
    CodeCanary cc{n_code};
    for (const CodeVerdict& x : v) {
      cc.parse_rate += x.parses ? 1 : 0;
      cc.pass_at_1 += x.passed ? 1 : 0;
    }
    cc.parse_rate /= static_cast<double>(n_code);
    cc.pass_at_1 /= static_cast<double>(n_code);
    c.code = cc;
  }
  const int64_t n_math = std::min<int64_t>(o.math_canaries, static_cast<int64_t>(corpus.math_canaries.size()));
  if (n_math > 0) {
    MathCanary mc{n_math};
    for (int64_t i = 0; i < n_math; ++i) {
      const MathProblem& p = corpus.math_canaries[static_cast<size_t>(i)];
      TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, greedy(m, tok.encode(p.prompt, true), 8));
      mc.accuracy += math_answer_matches(tok.decode(ids, true), p.answer) ? 1 : 0;
    }
    mc.accuracy /= static_cast<double>(n_math);
    c.math = mc;
  }
  return c;
}

}  // namespace

std::string precision_quant_names() {
  std::string names;
  for (const WeightQuant q : all_weight_quants())
    if (q != WeightQuant::kNone) names += fmt::format("{}{}", names.empty() ? "" : ", ", weight_quant_name(q));
  return names;
}

Result<ModelReport> run_quality_eval(const EvalOptions& o) {
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  if (o.window < 32 || o.chunk < 1 || o.tokens_per_class < 1)
    return Status::invalid_argument(fmt::format("eval: window {} (>= 32), chunk {} (>= 1), tokens per class {} (>= 1)",
                                                o.window, o.chunk, o.tokens_per_class));
  TESSERA_ASSIGN_OR_RETURN(PrecisionSpec ref_spec, parse_precision(o.reference));
  if (ref_spec.calibrated) return Status::invalid_argument("--reference: a calibrated precision is no reference");
  std::vector<PrecisionSpec> specs;
  for (const std::string& name : o.precisions) {
    TESSERA_ASSIGN_OR_RETURN(PrecisionSpec s, parse_precision(name));
    if (s.name == ref_spec.name) continue;  // the reference row is always there
    if (std::any_of(specs.begin(), specs.end(), [&](const PrecisionSpec& x) { return x.name == s.name; })) continue;
    specs.push_back(s);
  }
  TESSERA_ASSIGN_OR_RETURN(EvalCorpus corpus, load_eval_corpus(o.corpus_dir));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, load_tokenizer_for_model(o.model_path));

  ModelReport report;
  report.model = o.model_path;
  report.reference = ref_spec.name;
  report.corpus_sha256 = corpus.sha256;
  report.cpu = cpu::describe_cpu();
  report.date = utc_now();
  say("hashing " + o.model_path);
  TESSERA_ASSIGN_OR_RETURN(report.sha256, model_sha256(o.model_path));
  std::error_code ec;
  report.file_bytes = fs::is_directory(o.model_path) ? 0 : static_cast<int64_t>(fs::file_size(o.model_path, ec));

  // The classes and their windows.
  std::vector<std::string> wanted = o.classes;
  if (wanted.empty())
    for (const auto& [cls, docs] : corpus.classes) wanted.push_back(cls);
  std::map<std::string, ClassText> text;
  std::string best;
  for (const std::string& cls : wanted) {
    auto it = corpus.classes.find(cls);
    if (it == corpus.classes.end()) {
      report.skipped_classes[cls] = "not in the corpus " + o.corpus_dir;
      continue;
    }
    text[cls] = segment_docs(*tok, it->second, o.window, o.tokens_per_class);
    if (best.empty() || text[cls].byte_share < text[best].byte_share) best = cls;
  }
  for (const auto& [cls, t] : text) {
    if (t.byte_share > o.max_byte_share && cls != best) {
      report.skipped_classes[cls] = fmt::format(
          "{:.0f}% of its tokens are byte fallbacks (over {:.0f}%): the model's vocabulary was not made for this text",
          100 * t.byte_share, 100 * o.max_byte_share);
    } else if (t.positions == 0) {
      report.skipped_classes[cls] = "no document long enough";
    } else {
      report.classes.push_back(cls);
    }
  }
  for (const auto& [cls, why] : report.skipped_classes) say(fmt::format("skipping class {}: {}", cls, why));

  // The models: the reference first.
  const int64_t longest_prompt = [&] {
    int64_t n = 0;
    for (int64_t i = 0; i < std::min<int64_t>(o.code_canaries, static_cast<int64_t>(corpus.code_canaries.size())); ++i)
      n = std::max<int64_t>(n, static_cast<int64_t>(tok->encode(corpus.code_canaries[static_cast<size_t>(i)].prompt, true).size()));
    return n;
  }();
  auto load = [&](const PrecisionSpec& s, const ImportanceMatrix* importance) -> Result<std::unique_ptr<LocalModel>> {
    LocalModelOptions lo;
    lo.path = o.model_path;
    lo.runtime.threads = o.threads;
    lo.kv_tokens = std::max<int64_t>(o.window, longest_prompt + o.code_tokens + 16);
    lo.runtime.quant = s.quant;
    lo.runtime.kv_dtype = s.kv_dtype;
    lo.runtime.quant_lm_head = s.quant == WeightQuant::kF32;  // the reference computes its head in fp32 too
    lo.importance = importance;
    auto m = LocalModel::load(lo);
    if (!m.is_ok()) return m.status().with_context(fmt::format("precision '{}'", s.name));
    return std::move(*m);
  };
  say(fmt::format("loading the reference ({})", ref_spec.name));
  std::vector<Loaded> models;
  {
    Loaded r;
    r.spec = ref_spec;
    TESSERA_ASSIGN_OR_RETURN(r.model, load(ref_spec, nullptr));
    r.result.reference = true;
    models.push_back(std::move(r));
  }
  LocalModel& ref = *models[0].model;
  const int64_t vocab = ref.config().vocab;

  // Importance for the calibrated precisions, measured by the reference on the calibration text.
  std::optional<ImportanceMatrix> importance;
  const bool any_calibrated = std::any_of(specs.begin(), specs.end(), [](const PrecisionSpec& s) { return s.calibrated; });
  if (any_calibrated || !o.importance_out.empty()) {
    if (corpus.calibration.empty()) return Status::invalid_argument(o.corpus_dir + ": the corpus has no calibration text");
    ClassText cal = segment_docs(*tok, corpus.calibration, o.window, o.calibration_tokens);
    say(fmt::format("measuring importance on {} calibration tokens", cal.positions));
    ImportanceAccumulator acc;
    ref.forward().set_projection_observer([&](WeightRef w, const float* x, int64_t n, int64_t k) {
      const std::string name = hf_linear_name(w);
      if (!name.empty()) acc.add(name, x, n, k);
    });
    {
      MatmulPrecisionScope compute(models[0].spec.compute);
      for (const Segment& s : cal.segments) TESSERA_RETURN_IF_ERROR(prefill_window(ref, s));
    }
    ref.forward().set_projection_observer({});
    importance = acc.matrix();
    importance->model = o.model_path;
    importance->model_sha256 = report.sha256;
    importance->source = "corpus " + corpus.sha256.substr(0, 12) + " calibration text";
    if (!o.importance_out.empty()) TESSERA_RETURN_IF_ERROR(save_importance(*importance, o.importance_out));
  }
  for (const PrecisionSpec& s : specs) {
    say(fmt::format("loading precision {}", s.name));
    Loaded l;
    l.spec = s;
    TESSERA_ASSIGN_OR_RETURN(l.model, load(s, s.calibrated ? &*importance : nullptr));
    l.result.calibrated = s.calibrated;
    models.push_back(std::move(l));
  }
  for (Loaded& l : models) {
    l.result.precision = l.spec.name;
    describe_weights(l.model->weights(), &l.result);
  }

  // Teacher forcing, in lockstep.
  ThreadPool& pool = ref.pool();
  std::vector<float> ref_lp, ref_p;  // [chunk][vocab] reference log-probabilities, probabilities
  std::vector<double> row_kl, row_nll;
  std::vector<int64_t> row_top, ref_top;
  for (const std::string& cls : report.classes) {
    const ClassText& t = text[cls];
    say(fmt::format("class {}: {} windows, {} positions, {:.1f}% byte-fallback tokens", cls, t.segments.size(),
                    t.positions, 100 * t.byte_share));
    for (const Segment& seg : t.segments) {
      const int64_t last = static_cast<int64_t>(seg.size()) - 1;  // positions predicted: 0 .. last - 1
      // Each model runs the whole window chunk by chunk; the reference's chunk is kept until
      // every other model has run that chunk, so models run chunk-major.
      std::vector<std::vector<int32_t>> tables(models.size());
      for (size_t mi = 0; mi < models.size(); ++mi)
        if (!models[mi].model->ensure_blocks(tables[mi], static_cast<int64_t>(seg.size())))
          return Status::resource_exhausted("eval: a window does not fit the KV pool");
      std::vector<float> logits;
      Status st = Status::ok();
      for (int64_t p = 0; st.is_ok() && p < last; p += o.chunk) {
        const int64_t n = std::min<int64_t>(o.chunk, last - p);
        for (size_t mi = 0; mi < models.size() && st.is_ok(); ++mi) {
          Loaded& l = models[mi];
          SequenceInput in;
          in.tokens = std::span<const int32_t>(seg).subspan(static_cast<size_t>(p), static_cast<size_t>(n));
          in.start_pos = p;
          in.block_table = tables[mi];
          in.want_logits = false;
          in.all_logits = true;
          {
            MatmulPrecisionScope compute(l.spec.compute);
            st = l.model->forward().run(std::span<const SequenceInput>(&in, 1), logits);
          }
          if (!st.is_ok()) break;
          row_kl.assign(static_cast<size_t>(n), 0);
          row_nll.assign(static_cast<size_t>(n), 0);
          row_top.assign(static_cast<size_t>(n), 0);
          if (mi == 0) {
            ref_lp.resize(static_cast<size_t>(n * vocab));
            ref_p.resize(static_cast<size_t>(n * vocab));
            ref_top.assign(static_cast<size_t>(n), 0);
          }
          pool.parallel_for(n, 1, [&](int64_t b, int64_t e, int) {
            for (int64_t r = b; r < e; ++r) {
              const float* x = logits.data() + r * vocab;
              const double lse = log_sum_exp(x, vocab);
              const int32_t target = seg[static_cast<size_t>(p + r + 1)];
              row_nll[static_cast<size_t>(r)] = lse - x[target];
              row_top[static_cast<size_t>(r)] = argmax(x, vocab);
              float* lp = ref_lp.data() + r * vocab;
              float* pr = ref_p.data() + r * vocab;
              if (mi == 0) {
                for (int64_t i = 0; i < vocab; ++i) {
                  lp[i] = static_cast<float>(x[i] - lse);
                  pr[i] = std::exp(lp[i]);
                }
                ref_top[static_cast<size_t>(r)] = row_top[static_cast<size_t>(r)];
              } else {
                // KL = sum p (log p - log q); with log q = x - lse, sum p = 1 (to float precision).
                double kl = 0, mass = 0;
                for (int64_t i = 0; i < vocab; ++i) {
                  kl += static_cast<double>(pr[i]) * (static_cast<double>(lp[i]) - x[i]);
                  mass += pr[i];
                }
                kl += mass * lse;
                row_kl[static_cast<size_t>(r)] = std::isfinite(kl) ? std::max(0.0, kl) : kl;
              }
            }
          });
          for (int64_t r = 0; r < n; ++r)
            if (!std::isfinite(row_nll[static_cast<size_t>(r)]) || !std::isfinite(row_kl[static_cast<size_t>(r)])) {
              st = Status::internal(fmt::format("precision '{}' gives non-finite logits on class {} at position {}",
                                                l.spec.name, cls, p + r));
              break;
            }
          if (!st.is_ok()) break;
          ClassAccum& a = l.acc[cls];
          for (int64_t r = 0; r < n; ++r) {
            a.nll += row_nll[static_cast<size_t>(r)];
            a.kl += row_kl[static_cast<size_t>(r)];
            a.kls.push_back(static_cast<float>(row_kl[static_cast<size_t>(r)]));
            a.agree += row_top[static_cast<size_t>(r)] == ref_top[static_cast<size_t>(r)] ? 1 : 0;
            a.n += 1;
          }
        }
      }
      for (size_t mi = 0; mi < models.size(); ++mi) models[mi].model->release_blocks(tables[mi]);
      TESSERA_RETURN_IF_ERROR(st);
    }
  }
  for (Loaded& l : models)
    for (auto& [cls, a] : l.acc) {
      if (a.n == 0) continue;
      std::sort(a.kls.begin(), a.kls.end());
      const size_t i99 = std::min(a.kls.size() - 1, static_cast<size_t>(std::ceil(0.99 * a.kls.size())) - 1);
      l.result.classes[cls] = ClassQuality{a.n, std::exp(a.nll / a.n), a.kl / a.n, a.kls[i99],
                                           static_cast<double>(a.agree) / a.n};
    }

  // A class the reference predicts barely better than chance (perplexity over max_ppl_share
  // of the vocabulary) is text the model was not trained for: dropped, unless it is the best
  // predicted class.
  {
    const PrecisionResult& rr = models[0].result;
    std::string best_ppl;
    for (const auto& [cls, q] : rr.classes)
      if (best_ppl.empty() || q.ppl < rr.classes.at(best_ppl).ppl) best_ppl = cls;
    std::vector<std::string> kept;
    for (const std::string& cls : report.classes) {
      const double share = rr.classes.at(cls).ppl / static_cast<double>(vocab);
      if (share > o.max_ppl_share && cls != best_ppl) {
        report.skipped_classes[cls] = fmt::format(
            "the reference's perplexity {:.1f} is {:.0f}% of the vocabulary ({}), over {:.0f}%: it was not trained "
            "on this kind of text",
            rr.classes.at(cls).ppl, 100 * share, vocab, 100 * o.max_ppl_share);
        say(fmt::format("skipping class {}: {}", cls, report.skipped_classes[cls]));
        for (Loaded& l : models) l.result.classes.erase(cls);
      } else {
        kept.push_back(cls);
      }
    }
    report.classes = kept;
  }

  // Canaries, model by model.
  const bool code_class = std::find(report.classes.begin(), report.classes.end(), "code") != report.classes.end();
  const bool math_class = std::find(report.classes.begin(), report.classes.end(), "math") != report.classes.end();
  EvalOptions co = o;
  if (!code_class) co.code_canaries = 0;
  if (!math_class) co.math_canaries = 0;
  for (Loaded& l : models) {
    if (co.code_canaries == 0 && co.math_canaries == 0) break;
    say(fmt::format("canaries: {}", l.spec.name));
    MatmulPrecisionScope compute(l.spec.compute);
    TESSERA_ASSIGN_OR_RETURN(Canaries c, run_canaries(*l.model, *tok, corpus, co));
    l.result.code = c.code;
    l.result.math = c.math;
  }
  for (Loaded& l : models) report.precisions.push_back(std::move(l.result));

  nlohmann::json settings = {{"tokens_per_class", o.tokens_per_class}, {"window", o.window},
                             {"code_canaries", co.code_canaries},     {"code_tokens", o.code_tokens},
                             {"math_canaries", co.math_canaries},     {"calibration_tokens", o.calibration_tokens},
                             {"max_byte_share", o.max_byte_share},    {"max_ppl_share", o.max_ppl_share},
                             {"threads", o.threads},
                             {"corpus", o.corpus_dir},                {"sources", corpus.sources}};
  report.settings_json = settings.dump();
  return report;
}

std::string format_eval_table(const ModelReport& r) {
  std::string s = fmt::format("model {} (sha256 {}), reference {}, {}\nCPU: {}\n", r.model, r.sha256.substr(0, 16),
                              r.reference, r.date, r.cpu);
  for (const auto& [cls, why] : r.skipped_classes) s += fmt::format("skipped class {}: {}\n", cls, why);
  s += "\n| precision | bits/w | weights MiB |";
  for (const std::string& c : r.classes) s += fmt::format(" {0} KL mean | {0} KL p99 | {0} top-1 | {0} ppl |", c);
  s += " HumanEval parse | pass@1 | arith acc |\n|---|---:|---:|";
  for (size_t i = 0; i < r.classes.size(); ++i) s += "---:|---:|---:|---:|";
  s += "---:|---:|---:|\n";
  for (const PrecisionResult& p : r.precisions) {
    s += fmt::format("| {}{} | {:.2f} | {:.2f} |", p.precision, p.reference ? " (ref)" : "", p.bits_per_weight,
                     p.weight_bytes / 1048576.0);
    for (const std::string& c : r.classes) {
      auto it = p.classes.find(c);
      if (it == p.classes.end()) {
        s += " - | - | - | - |";
        continue;
      }
      s += fmt::format(" {:.4f} | {:.3f} | {:.1f}% | {:.2f} |", it->second.kl_mean, it->second.kl_p99,
                       100 * it->second.top1, it->second.ppl);
    }
    s += p.code ? fmt::format(" {:.0f}% | {:.0f}% |", 100 * p.code->parse_rate, 100 * p.code->pass_at_1) : " - | - |";
    s += p.math ? fmt::format(" {:.0f}% |", 100 * p.math->accuracy) : " - |";
    s += "\n";
  }
  return s;
}

}  // namespace tessera
