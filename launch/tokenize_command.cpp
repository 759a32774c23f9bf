// `tessera tokenize`: text on stdin -> token ids as a JSON array on stdout. With --jsonl, one
// JSON string per input line -> one JSON array per output line (the tokenizer loads once).
#include <nlohmann/json.hpp>

#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include "cli/default_model.h"
#include "launch/commands.h"
#include "tokenizer/tokenizer.h"

namespace tessera::cli {
namespace {

struct TokenizeArgs {
  std::string model;
  bool no_special = false;
  bool jsonl = false;
};

std::string ids_json(const std::vector<int32_t>& ids) { return nlohmann::json(ids).dump(); }

int run_tokenize(const TokenizeArgs& a) {
  auto tok = load_tokenizer_for_model(a.model);
  if (!tok.is_ok()) return fail(tok.status().to_string());
  const Tokenizer& t = **tok;
  if (!a.jsonl) {
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    std::cout << ids_json(t.encode(text, !a.no_special)) << "\n";
    return 0;
  }
  std::string line;
  int64_t line_no = 0;
  int rc = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_string()) {
      std::cerr << "error: stdin line " << line_no << ": expected one JSON string per line\n";
      std::cout << "null\n";
      rc = 1;
      continue;
    }
    std::cout << ids_json(t.encode(j.get<std::string>(), !a.no_special)) << "\n";
  }
  return rc;
}

}  // namespace

Runner add_tokenize_command(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  add_model_flag(app, a->model, "HF model directory, tokenizer.json, or .gguf file");
  app.add_flag("--no-special", a->no_special, "leave out BOS and template tokens");
  app.add_flag("--jsonl", a->jsonl, "one JSON string per input line, one JSON array per output line");
  return [a] {
    const Status model = resolve_model_flag(a->model);
    if (!model.is_ok()) return fail(model.to_string());
    return run_tokenize(*a);
  };
}

}  // namespace tessera::cli
