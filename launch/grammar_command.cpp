// `tessera grammar`: what the server would do with one constraint, without a server. Compiles a
// JSON Schema (or any JSON object, a regex, a choice list, an EBNF grammar) against a model's
// vocabulary exactly as a request's would be (the same checks, the same time budget), prints the
// compile time or the refusal that names the keyword and its path, and with --instances checks
// texts against it token by token: each is accepted whole (and may end there), or refused at a
// byte offset. `--list-unsupported` prints the JSON Schema keywords every request is refused for.
//
// tests/integration/test_schema_conformance.py uses it to check that the grammar accepts every
// instance PyPI's hypothesis-jsonschema generates from a schema (the grammar is not narrower than
// the schema), besides checking that the model's constrained outputs validate (it is not wider).
#include <nlohmann/json.hpp>

#include <chrono>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#include "cli/default_model.h"
#include "common/mapped_file.h"
#include "grammar/grammar.h"
#include "grammar/schema_check.h"
#include "launch/commands.h"
#include "tokenizer/tokenizer.h"

namespace tessera::cli {
namespace {

struct GrammarArgs {
  std::string model;
  std::string json_schema;  // a file, or "-" for stdin
  bool json_object = false;
  std::string regex;
  std::string choice;  // a JSON array of strings
  std::string ebnf;    // a file
  bool not_strict = false;
  int64_t compile_timeout_ms = 5000;
  std::string instances;  // a JSONL file of JSON strings, or "-"
  bool list_unsupported = false;
};

// A file's text, or stdin's for "-".
Result<std::string> read_text(const std::string& path) {
  if (path == "-") return std::string((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  return read_text_file(path);
}

Result<GrammarSpec> spec_from(const GrammarArgs& a) {
  GrammarSpec spec;
  spec.strict = !a.not_strict;
  const int given = !a.json_schema.empty() + a.json_object + !a.regex.empty() + !a.choice.empty() + !a.ebnf.empty();
  if (given != 1)
    return Status::invalid_argument("give exactly one of --json-schema, --json-object, --regex, --choice, --ebnf");
  if (!a.json_schema.empty()) {
    spec.kind = GrammarKind::kJsonSchema;
    TESSERA_ASSIGN_OR_RETURN(spec.source, read_text(a.json_schema));
  } else if (a.json_object) {
    spec.kind = GrammarKind::kJsonObject;
  } else if (!a.regex.empty()) {
    spec.kind = GrammarKind::kRegex;
    spec.source = a.regex;
  } else if (!a.choice.empty()) {
    spec.kind = GrammarKind::kChoice;
    spec.source = a.choice;
  } else {
    spec.kind = GrammarKind::kEbnf;
    TESSERA_ASSIGN_OR_RETURN(spec.source, read_text(a.ebnf));
  }
  return spec;
}

// One instance through a fresh matcher: {"accepted": true} when every token is taken and the
// grammar may end after the last, else where and why it stops.
nlohmann::json check_instance(const CompiledGrammar& g, const Tokenizer& tok, const std::string& text) {
  nlohmann::json r;
  // As output continues text (no SentencePiece dummy prefix): the grammar's own spelling, the
  // longest token at each position.
  const std::vector<int32_t> ids = g.spell(text);
  const auto bytes = [&](std::span<const int32_t> part) { return tok.decode_raw(part, false, /*continuation=*/true); };
  if (bytes(ids) != text) {
    r["accepted"] = false;
    r["error"] = "the vocabulary cannot spell the text";
    return r;
  }
  auto m = g.matcher();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!m->accept(ids[i])) {
      r["accepted"] = false;
      r["refused_at_byte"] = bytes(std::span(ids.data(), i)).size();
      r["refused_token"] = bytes(std::span(ids.data() + i, 1));
      r["error"] = "token " + std::to_string(i) + " is refused";
      return r;
    }
  }
  if (!m->completed()) {
    r["accepted"] = false;
    r["refused_at_byte"] = text.size();
    r["error"] = "the text is a prefix: the grammar cannot end after it";
    return r;
  }
  r["accepted"] = true;
  return r;
}

int run_grammar(const GrammarArgs& a) {
  if (a.list_unsupported) {
    for (const UnsupportedKeyword& k : unsupported_schema_keywords())
      std::cout << nlohmann::json{{"keyword", k.keyword}, {"why", k.why}}.dump() << "\n";
    return 0;
  }
  auto spec = spec_from(a);
  if (!spec.is_ok()) return fail(spec.status().to_string());
  auto tok = load_tokenizer_for_model(a.model);
  if (!tok.is_ok()) return fail(tok.status().to_string());
  GrammarCompilerOptions go;
  go.compile_timeout = std::chrono::milliseconds(a.compile_timeout_ms);
  auto compiler = GrammarCompiler::create(**tok, (*tok)->vocab_size(), (*tok)->eos_ids(), go);
  if (!compiler.is_ok()) return fail(compiler.status().to_string());
  const auto t0 = std::chrono::steady_clock::now();
  auto g = (*compiler)->compile(*spec);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!g.is_ok()) {
    std::cout << nlohmann::json{{"compiled", false}, {"error", g.status().to_string()}}.dump() << "\n";
    return 1;
  }
  std::cout << nlohmann::json{{"compiled", true}, {"compile_ms", ms}, {"memory_bytes", (*g)->memory_bytes()}}.dump()
            << "\n";
  if (a.instances.empty()) return 0;
  auto text = read_text(a.instances);
  if (!text.is_ok()) return fail(text.status().to_string());
  std::istringstream lines(*text);
  std::string line;
  int64_t line_no = 0;
  int rc = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    nlohmann::json r;
    if (j.is_discarded() || !j.is_string()) {
      r["accepted"] = false;
      r["error"] = "expected one JSON string per line";
    } else {
      r = check_instance(**g, **tok, j.get<std::string>());
    }
    r["line"] = line_no;
    if (!r["accepted"].get<bool>()) rc = 1;
    std::cout << r.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return rc;
}

}  // namespace

Runner add_grammar_command(CLI::App& app) {
  auto a = std::make_shared<GrammarArgs>();
  add_model_flag(app, a->model, "HF model directory, tokenizer.json, or .gguf file (its vocabulary)");
  app.add_option("--json-schema", a->json_schema, "a JSON Schema file ('-': stdin), as response_format json_schema");
  app.add_flag("--json-object", a->json_object, "any JSON object, as response_format json_object");
  app.add_option("--regex", a->regex, "a regular expression the whole output matches, as guided_regex");
  app.add_option("--choice", a->choice, "a JSON array of strings, the output exactly one, as guided_choice");
  app.add_option("--ebnf", a->ebnf, "an EBNF grammar file (root rule \"root\"), as guided_grammar");
  app.add_flag("--not-strict", a->not_strict,
               "objects take properties the schema does not list unless it says otherwise (strict: false)");
  app.add_option("--grammar-compile-timeout", a->compile_timeout_ms,
                 "milliseconds a compilation may take before it is refused, as the server's flag")
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  app.add_option("--instances", a->instances,
                 "a JSONL file ('-': stdin) of JSON strings: each text is checked against the grammar, one JSON "
                 "result a line; the exit code is 1 when any is refused");
  app.add_flag("--list-unsupported", a->list_unsupported,
               "print the JSON Schema keywords requests are refused for, one JSON object a line, and exit");
  return [a] {
    if (!a->list_unsupported) {
      const Status model = resolve_model_flag(a->model);
      if (!model.is_ok()) return fail(model.to_string());
    }
    return run_grammar(*a);
  };
}

}  // namespace tessera::cli
