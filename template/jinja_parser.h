// Parser for chat-template Jinja: source -> TemplateAst (jinja_ast.h).
#pragma once

#include <memory>
#include <string_view>

#include "common/status.h"
#include "template/jinja_ast.h"

namespace tessera::jinja {

// Fails with "syntax error at line L, column C: ..." for malformed templates, unknown tags,
// filters and tests, `break` outside a loop, and nesting deeper than the parser allows.
Result<std::unique_ptr<TemplateAst>> parse_template(std::string_view source);

}  // namespace tessera::jinja
