// Fuzz target: the request-to-grammar path of structured outputs and tool calling. The input is
// a request body; its output constraint (response_format, guided_*, structured_outputs) and its
// tools are parsed, the grammar built (the schema checks, the tool-call structural tag) and
// compiled against a small byte vocabulary with a short time budget; a compiled grammar's
// matcher then takes a few steps along its masks. Errors must name something; nothing may crash
// or hang.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "server/structured_request.h"
#include "server/tool_calls.h"

using namespace tessera;

namespace {

// Every byte a token, plus a few multi-byte tokens and an end token (id 300): enough for any
// grammar to be walked byte by byte. Never destroyed (compilations past the budget run on).
GrammarCompiler& compiler() {
  static GrammarCompiler* c = [] {
    std::vector<std::string> vocab;
    for (int b = 0; b < 256; ++b) vocab.emplace_back(1, static_cast<char>(b));
    for (const char* t : {"{\"", "\": ", "\", \"", "\"}", "true", "false", "null", "<tool_call>", "</tool_call>",
                          "\"name\"", "\"arguments\"", "  ", "\n"})
      vocab.emplace_back(t);
    vocab.resize(300);
    vocab.emplace_back();  // 300: the end token (special)
    GrammarCompilerOptions o;
    o.compile_timeout = std::chrono::milliseconds(200);
    o.threads = 1;
    o.cache_bytes = 16 << 20;
    auto made = GrammarCompiler::create(std::move(vocab), 304, {300}, o);
    if (!made.is_ok()) __builtin_trap();
    return made->release();
  }();
  return *c;
}

void expect_named(const Status& s) {
  if (s.is_ok() || s.message().empty()) __builtin_trap();
}

void walk(const CompiledGrammar& g) {
  auto m = g.matcher();
  std::vector<uint32_t> mask(static_cast<size_t>(g.mask_words()));
  for (int step = 0; step < 16 && !m->terminated(); ++step) {
    m->fill_mask(mask);
    int32_t pick = -1;
    for (size_t w = 0; w < mask.size() && pick < 0; ++w)
      if (mask[w]) pick = static_cast<int32_t>(w * 32 + static_cast<size_t>(__builtin_ctz(mask[w])));
    if (pick < 0) return;  // nothing allowed (a complete grammar offers its end token)
    if (pick >= 304) __builtin_trap();  // the padding past the vocabulary is never allowed
    if (!m->accept(pick)) __builtin_trap();  // what the mask allows is accepted
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 1 << 16) return 0;
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return 0;
  std::optional<GrammarSpec> grammar;
  std::string field;
  Status s = parse_structured_output(j, grammar, field);
  if (!s.is_ok()) {
    expect_named(s);
    return 0;
  }
  ToolRequest tools;
  s = parse_tools(j, tools, grammar, field);
  if (!s.is_ok()) {
    expect_named(s);
    return 0;
  }
  if (tools.tool_choice.mode != ToolChoice::Mode::kNone) {
    const ToolFormat format = j.contains("llama")     ? ToolFormat::kLlama3Json
                              : j.contains("mistral") ? ToolFormat::kMistral
                                                      : ToolFormat::kHermes;
    std::optional<std::string> content_schema;
    if (grammar) content_schema = grammar->kind == GrammarKind::kJsonSchema ? grammar->source : R"({"type": "object"})";
    auto tag = tool_call_structural_tag(format, tools.tools, tools.tool_choice, tools.parallel_tool_calls,
                                        content_schema);
    if (!tag.is_ok()) {
      expect_named(tag.status());
      return 0;
    }
    grammar = GrammarSpec{GrammarKind::kStructuralTag, *tag};
  }
  if (!grammar) return 0;
  auto g = compiler().compile(*grammar);
  if (!g.is_ok()) {
    expect_named(g.status());
    return 0;
  }
  walk(**g);
  return 0;
}
