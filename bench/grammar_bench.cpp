// tessera-bench-grammar: structured outputs' costs on a real vocabulary (results/
// structured-outputs.md): the per-token mask time (p50 / p99) along outputs of a schema with
// N properties, and the compile time of new schemas of each size. Walks take seeded random
// allowed tokens (a stand-in for a model's choices), so every mask state an output passes
// through is timed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "grammar/grammar.h"
#include "grammar/mask_cost.h"
#include "kernels/cpu/cpu_info.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

std::string read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::string out;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  std::fclose(f);
  return out;
}

// Trace mode: the instance's tokens one by one through the schema's matcher, each mask timed
// (best of 3: the state's own cost, not the machine's noise); prints the total and the slowest
// states with the text before them.
int trace(tessera::GrammarCompiler& compiler, const tessera::Tokenizer& tok, const tessera::GrammarSpec& spec,
          const std::string& instance, int slowest) {
  const auto tc = Clock::now();
  auto g = compiler.compile(spec);
  if (!g.is_ok()) {
    std::fprintf(stderr, "%s\n", g.status().to_string().c_str());
    return 1;
  }
  std::printf("compiled in %.1f ms\n", us_since(tc) / 1000);
  const std::vector<int32_t> ids = tok.encode(instance, false);
  std::vector<uint32_t> mask(static_cast<size_t>((*g)->mask_words()));
  struct State {
    double us;
    size_t pos;
    int64_t allowed;
  };
  std::vector<State> states;
  double total = 0;
  auto m = (*g)->matcher();
  for (size_t i = 0; i <= ids.size(); ++i) {
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      const auto tm = Clock::now();
      m->fill_mask(mask);
      best = std::min(best, us_since(tm));
    }
    int64_t allowed = 0;
    for (uint32_t w : mask) allowed += __builtin_popcount(w);
    states.push_back({best, i, allowed});
    total += best;
    if (i == ids.size()) break;
    if (!m->accept(ids[i])) {
      const bool in_mask = (mask[static_cast<size_t>(ids[i]) / 32] >> (ids[i] % 32)) & 1u;
      std::fprintf(stderr, "token %zu (%d, '%s') is refused by the grammar (its mask %s it) after: %s\n", i, ids[i],
                   tok.id_to_token(ids[i]).c_str(), in_mask ? "allowed" : "left out",
                   tok.decode(std::span(ids.data(), i)).c_str());
      return 1;
    }
  }
  std::printf("%zu tokens, %zu masks: total %.0f us, mean %.1f us\n", ids.size(), states.size(), total,
              total / static_cast<double>(states.size()));
  std::sort(states.begin(), states.end(), [](const State& a, const State& b) { return a.us > b.us; });
  std::printf("| mask us | allowed tokens | text before the state (last 60 bytes) |\n| --- | --- | --- |\n");
  for (size_t i = 0; i < states.size() && i < static_cast<size_t>(slowest); ++i) {
    std::string before = tok.decode(std::span(ids.data(), states[i].pos));
    if (before.size() > 60) before = "..." + before.substr(before.size() - 60);
    std::printf("| %.1f | %lld | `%s` |\n", states[i].us, static_cast<long long>(states[i].allowed), before.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"structured outputs: token-mask and compile times on a real vocabulary"};
  std::string tokenizer_path;
  int64_t model_vocab = 0;
  std::vector<int> sizes = {20, 50};
  int walks = 5;
  int compiles = 5;
  std::string schema_file;
  std::string instance_file;
  int slowest = 12;
  std::string kind = "json_schema";
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json")->required();
  app.add_option("--model-vocab", model_vocab, "the logits' width (default: the tokenizer's vocabulary)");
  app.add_option("--properties", sizes, "schema sizes (properties)")->capture_default_str();
  app.add_option("--walks", walks, "outputs walked per size")->capture_default_str();
  app.add_option("--compiles", compiles, "new schemas compiled per size")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--schema", schema_file,
                 "trace mode: a JSON Schema file; the masks along --instance (its tokenization) are timed and the "
                 "slowest states printed");
  app.add_option("--instance", instance_file, "trace mode: a JSON text that matches --schema");
  app.add_option("--kind", kind,
                 "trace mode: what --schema holds: json_schema, ebnf (root rule \"root\"), regex or structural_tag")
      ->check(CLI::IsMember({"json_schema", "ebnf", "regex", "structural_tag"}))
      ->capture_default_str();
  app.add_option("--slowest", slowest, "trace mode: how many of the slowest states to print")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto tok = tessera::Tokenizer::from_hf_file(tokenizer_path);
  if (!tok.is_ok()) {
    std::fprintf(stderr, "%s\n", tok.status().to_string().c_str());
    return 1;
  }
  if (model_vocab <= 0) model_vocab = (*tok)->vocab_size();
  auto t0 = Clock::now();
  tessera::GrammarCompilerOptions go;
  go.compile_timeout = std::chrono::milliseconds(600000);
  auto compiler = tessera::GrammarCompiler::create(**tok, model_vocab, (*tok)->eos_ids(), go);
  if (!compiler.is_ok()) {
    std::fprintf(stderr, "%s\n", compiler.status().to_string().c_str());
    return 1;
  }
  const double setup_ms = us_since(t0) / 1000;
  std::printf("cpu: %s\n", tessera::cpu::describe_cpu().c_str());
  std::printf("vocabulary: %lld tokens (%s); token tables built in %.0f ms\n\n", static_cast<long long>(model_vocab),
              tokenizer_path.c_str(), setup_ms);
  if (!schema_file.empty()) return trace(**compiler, **tok, {kind == "ebnf"             ? tessera::GrammarKind::kEbnf
                  : kind == "regex"          ? tessera::GrammarKind::kRegex
                  : kind == "structural_tag" ? tessera::GrammarKind::kStructuralTag
                                             : tessera::GrammarKind::kJsonSchema,
                  read_file(schema_file)},
                 read_file(instance_file), slowest);
  std::printf("| properties | compile ms (new schema) p50 / max | mask us p50 | mask us p99 | mask us max | tokens "
              "timed | masks that restrict |\n| --- | --- | --- | --- | --- | --- | --- |\n");
  for (int n : sizes) {
    std::vector<double> compile_ms;
    tessera::MaskCost walked;
    for (int c = 0; c < compiles; ++c) {
      // New schemas each time (cache misses); the last one's outputs are walked.
      auto r = tessera::measure_mask_cost(**compiler, {tessera::GrammarKind::kJsonSchema, tessera::mixed_schema(n, c)},
                                          c == compiles - 1 ? walks : 0, 1234, (*tok)->eos_ids());
      if (!r.is_ok()) {
        std::fprintf(stderr, "%s\n", r.status().to_string().c_str());
        return 1;
      }
      compile_ms.push_back(r->compile_ms);
      if (c == compiles - 1) walked = std::move(*r);
    }
    const std::vector<double>& mask_us = walked.mask_us;
    std::printf("| %d | %.1f / %.1f | %.1f | %.1f | %.1f | %zu | %lld |\n", n, tessera::quantile(compile_ms, 0.5),
                *std::max_element(compile_ms.begin(), compile_ms.end()), tessera::quantile(mask_us, 0.5),
                tessera::quantile(mask_us, 0.99),
                mask_us.empty() ? 0.0 : *std::max_element(mask_us.begin(), mask_us.end()), mask_us.size(),
                static_cast<long long>(walked.restricting));
  }
  return 0;
}
