#include "template/chat_template.h"

#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/mapped_file.h"
#include "model/gguf.h"
#include "template/jinja_interpreter.h"

namespace tessera {

struct ChatTemplate::Impl {
  jinja::Template tmpl;
  std::string source;
};

ChatTemplate::ChatTemplate() = default;
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

namespace {

// The template source from tokenizer_config.json's `chat_template`: a string, or a list of
// {"name", "template"} entries of which "default" is the one used for plain chat.
Result<std::optional<std::string>> template_from_config(const std::string& path, const std::string& text) {
  try {
    const auto config = nlohmann::json::parse(text);
    if (!config.is_object()) return Status::corrupt(fmt::format("{}: not a JSON object", path));
    const auto it = config.find("chat_template");
    if (it == config.end() || it->is_null()) return std::optional<std::string>();
    if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
    if (it->is_array()) {
      for (const auto& entry : *it) {
        if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
            entry["template"].is_string()) {
          return std::optional<std::string>(entry["template"].get<std::string>());
        }
      }
      return Status::not_found(fmt::format("{}: chat_template lists no template named 'default'", path));
    }
    return Status::corrupt(fmt::format("{}: chat_template is neither a string nor a list", path));
  } catch (const nlohmann::json::exception& e) {
    return Status::corrupt(fmt::format("{}: invalid JSON: {}", path, e.what()));
  }
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  auto parsed = jinja::Template::parse(source);
  if (!parsed.is_ok()) return parsed.status().with_context("chat template");
  ChatTemplate t;
  t.impl_ = std::make_unique<Impl>(Impl{std::move(parsed).value(), std::string(source)});
  return t;
}

const std::string& ChatTemplate::source() const { return impl_->source; }

Result<ChatTemplate> ChatTemplate::from_tokenizer_config(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  TESSERA_ASSIGN_OR_RETURN(std::optional<std::string> source, template_from_config(path, text));
  if (!source) {
    const auto sibling = std::filesystem::path(path).parent_path() / "chat_template.jinja";
    std::error_code ec;
    if (!std::filesystem::exists(sibling, ec)) {
      return Status::not_found(fmt::format("{}: no chat_template (and no {} beside it)", path, sibling.string()));
    }
    TESSERA_ASSIGN_OR_RETURN(std::string jinja_text, read_text_file(sibling.string()));
    source = std::move(jinja_text);
  }
  auto t = parse(*source);
  if (!t.is_ok()) return t.status().with_context(path);
  return t;
}

Result<ChatTemplate> ChatTemplate::from_gguf(const GgufFile& gguf) {
  auto source = gguf.get_string("tokenizer.chat_template");
  if (!source.is_ok()) return source.status();
  return parse(*source);
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         const ChatTemplateOptions& options) const {
  using jinja::Value;
  jinja::ValueList message_values;
  message_values.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    jinja::ValueDict d;
    d.append_new(Value::string("role"), Value::string(m.role));
    d.append_new(Value::string("content"), Value::string(m.content));
    if (!m.extra_json.empty()) {
      auto extra = jinja::value_from_json(m.extra_json);
      if (!extra.is_ok()) return extra.status().with_context("chat message");
      if (!extra->is_dict()) return Status::invalid_argument("chat message: extra members are not a JSON object");
      for (const auto& [k, v] : extra->as_dict().entries()) d.set(k, v);
    }
    message_values.push_back(Value::dict(std::move(d)));
  }
  jinja::ValueDict vars;
  vars.set(Value::string("messages"), Value::list(std::move(message_values)));
  vars.set(Value::string("tools"), Value::none());
  vars.set(Value::string("documents"), Value::none());
  vars.set(Value::string("add_generation_prompt"), Value::boolean(options.add_generation_prompt));
  vars.set(Value::string("bos_token"), Value::string(options.bos_token));
  vars.set(Value::string("eos_token"), Value::string(options.eos_token));
  if (!options.extra_context_json.empty()) {
    auto extra = jinja::value_from_json(options.extra_context_json);
    if (!extra.is_ok()) return extra.status().with_context("chat template extra context");
    if (!extra->is_dict()) return Status::invalid_argument("chat template extra context: not a JSON object");
    for (const auto& [k, v] : extra->as_dict().entries()) vars.set(k, v);
  }
  jinja::RenderOptions render_options;
  render_options.max_output_bytes = options.max_output_bytes;
  render_options.max_loop_iterations = options.max_loop_iterations;
  render_options.now_unix_seconds = options.now_unix_seconds;
  return impl_->tmpl.render(vars, render_options);
}

}  // namespace tessera
