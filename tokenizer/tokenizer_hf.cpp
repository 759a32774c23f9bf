// Hugging Face tokenizer.json (+ tokenizer_config.json, generation_config.json) -> BpeTokenizer.
// The one file that reads these with nlohmann::json: its exceptions stop here.
#include <algorithm>
#include <filesystem>
#include <functional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "common/mapped_file.h"
#include "tokenizer/tokenizer_impl.h"

namespace tessera {

namespace {

using json = nlohmann::json;
using tok::BpeTokenizer;
using tok::Decoder;
using tok::Normalizer;
using tok::Pattern;
using tok::PrependScheme;
using tok::PreTokenizer;
using tok::SplitBehavior;
using tok::TokenizerSpec;
using Lookup = std::function<std::optional<int32_t>(const std::string&)>;

// Reads the pieces of one JSON document; every error names the file and the field path.
class HfReader {
 public:
  explicit HfReader(std::string source) : source_(std::move(source)) {}

  Status bad(std::string_view field, std::string_view what) const {
    return Status::invalid_argument(fmt::format("{}: {}: {}", source_, field, what));
  }
  Status unsupported(std::string_view field, std::string_view type) const {
    return Status::unimplemented(
        fmt::format("{}: {}: type '{}' is not supported", source_, field, type));
  }

  Result<std::string> type_of(const json& j, std::string_view field) const {
    if (!j.is_object()) return bad(field, "expected an object");
    auto it = j.find("type");
    if (it == j.end() || !it->is_string()) return bad(field, "missing string field 'type'");
    return it->get<std::string>();
  }

  static bool get_bool(const json& j, const char* key, bool fallback) {
    auto it = j.find(key);
    return (it != j.end() && it->is_boolean()) ? it->get<bool>() : fallback;
  }
  static int get_int(const json& j, const char* key, int fallback) {
    auto it = j.find(key);
    return (it != j.end() && it->is_number_integer()) ? it->get<int>() : fallback;
  }
  static std::string get_string(const json& j, const char* key, std::string fallback) {
    auto it = j.find(key);
    return (it != j.end() && it->is_string()) ? it->get<std::string>() : fallback;
  }

  Result<Pattern> pattern(const json& j, std::string_view field) const {
    Pattern p;
    if (j.is_object() && j.contains("String") && j["String"].is_string()) {
      p.literal = j["String"].get<std::string>();
      return p;
    }
    if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
      auto regex = tok::Regex::compile(j["Regex"].get<std::string>());
      if (!regex.is_ok()) return regex.status().with_context(fmt::format("{}: {}", source_, field));
      p.regex = std::move(regex).value();
      return p;
    }
    return bad(field, "expected {\"String\": ...} or {\"Regex\": ...}");
  }

  Status normalizer(const json& j, const std::string& field, std::vector<Normalizer>& out) const {
    if (j.is_null()) return Status::ok();
    TESSERA_ASSIGN_OR_RETURN(std::string type, type_of(j, field));
    Normalizer n;
    if (type == "Sequence") {
      const json& list = j.value("normalizers", json::array());
      if (!list.is_array()) return bad(field + ".normalizers", "expected an array");
      for (size_t i = 0; i < list.size(); ++i) {
        TESSERA_RETURN_IF_ERROR(normalizer(list[i], fmt::format("{}.normalizers[{}]", field, i), out));
      }
      return Status::ok();
    } else if (type == "NFC") {
      n.kind = Normalizer::kNfc;
    } else if (type == "Prepend") {
      n.kind = Normalizer::kPrepend;
      n.text = get_string(j, "prepend", "");
    } else if (type == "Replace") {
      n.kind = Normalizer::kReplace;
      TESSERA_ASSIGN_OR_RETURN(n.pattern, pattern(j.value("pattern", json()), field + ".pattern"));
      n.text = get_string(j, "content", "");
    } else if (type == "Strip") {
      n.kind = Normalizer::kStrip;
      n.strip_left = get_bool(j, "strip_left", true);
      n.strip_right = get_bool(j, "strip_right", true);
    } else {
      return unsupported(field, type);
    }
    out.push_back(std::move(n));
    return Status::ok();
  }

  static Result<PrependScheme> prepend_scheme(const json& j) {
    const std::string s = get_string(j, "prepend_scheme", "");
    if (s.empty()) {
      return get_bool(j, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
    }
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    return Status::invalid_argument("prepend_scheme '" + s + "'");
  }

  Status pre_tokenizer(const json& j, const std::string& field,
                       std::vector<PreTokenizer>& out) const {
    if (j.is_null()) return Status::ok();
    TESSERA_ASSIGN_OR_RETURN(std::string type, type_of(j, field));
    PreTokenizer p;
    if (type == "Sequence") {
      const json& list = j.value("pretokenizers", json::array());
      if (!list.is_array()) return bad(field + ".pretokenizers", "expected an array");
      for (size_t i = 0; i < list.size(); ++i) {
        TESSERA_RETURN_IF_ERROR(
            pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", field, i), out));
      }
      return Status::ok();
    } else if (type == "Split") {
      p.kind = PreTokenizer::kSplit;
      TESSERA_ASSIGN_OR_RETURN(p.pattern, pattern(j.value("pattern", json()), field + ".pattern"));
      const std::string behavior = get_string(j, "behavior", "Isolated");
      if (behavior == "Removed") {
        p.behavior = SplitBehavior::kRemoved;
      } else if (behavior == "Isolated") {
        p.behavior = SplitBehavior::kIsolated;
      } else if (behavior == "MergedWithPrevious") {
        p.behavior = SplitBehavior::kMergedWithPrevious;
      } else if (behavior == "MergedWithNext") {
        p.behavior = SplitBehavior::kMergedWithNext;
      } else if (behavior == "Contiguous") {
        p.behavior = SplitBehavior::kContiguous;
      } else {
        return bad(field + ".behavior", "unknown value '" + behavior + "'");
      }
      p.invert = get_bool(j, "invert", false);
    } else if (type == "ByteLevel") {
      p.kind = PreTokenizer::kByteLevel;
      p.add_prefix_space = get_bool(j, "add_prefix_space", true);
      p.use_regex = get_bool(j, "use_regex", true);
    } else if (type == "Metaspace") {
      p.kind = PreTokenizer::kMetaspace;
      p.replacement = get_string(j, "replacement", p.replacement);
      auto scheme = prepend_scheme(j);
      if (!scheme.is_ok()) return bad(field, scheme.status().message());
      p.prepend_scheme = *scheme;
      p.split = get_bool(j, "split", true);
    } else if (type == "Digits") {
      p.kind = PreTokenizer::kDigits;
      p.individual_digits = get_bool(j, "individual_digits", false);
    } else {
      return unsupported(field, type);
    }
    out.push_back(std::move(p));
    return Status::ok();
  }

  Status decoder(const json& j, const std::string& field, std::vector<Decoder>& out) const {
    if (j.is_null()) return Status::ok();
    TESSERA_ASSIGN_OR_RETURN(std::string type, type_of(j, field));
    Decoder d;
    if (type == "Sequence") {
      const json& list = j.value("decoders", json::array());
      if (!list.is_array()) return bad(field + ".decoders", "expected an array");
      for (size_t i = 0; i < list.size(); ++i) {
        TESSERA_RETURN_IF_ERROR(decoder(list[i], fmt::format("{}.decoders[{}]", field, i), out));
      }
      return Status::ok();
    } else if (type == "ByteLevel") {
      d.kind = Decoder::kByteLevel;
    } else if (type == "Replace") {
      d.kind = Decoder::kReplace;
      TESSERA_ASSIGN_OR_RETURN(d.pattern, pattern(j.value("pattern", json()), field + ".pattern"));
      d.content = get_string(j, "content", "");
    } else if (type == "ByteFallback") {
      d.kind = Decoder::kByteFallback;
    } else if (type == "Fuse") {
      d.kind = Decoder::kFuse;
    } else if (type == "Strip") {
      d.kind = Decoder::kStrip;
      d.content = get_string(j, "content", " ");
      d.strip_start = get_int(j, "start", 0);
      d.strip_stop = get_int(j, "stop", 0);
    } else if (type == "Metaspace") {
      d.kind = Decoder::kMetaspace;
      d.replacement = get_string(j, "replacement", d.replacement);
      auto scheme = prepend_scheme(j);
      if (!scheme.is_ok()) return bad(field, scheme.status().message());
      d.prepend_scheme = *scheme;
    } else {
      return unsupported(field, type);
    }
    out.push_back(std::move(d));
    return Status::ok();
  }

  Status post_processor(const json& j, const std::string& field,
                        const Lookup& lookup, TokenizerSpec& spec) const {
    if (j.is_null()) return Status::ok();
    TESSERA_ASSIGN_OR_RETURN(std::string type, type_of(j, field));
    auto id_of = [&](const std::string& token, const std::string& where) -> Result<int32_t> {
      auto id = lookup(token);
      if (!id) return bad(where, "token '" + token + "' is not in the vocabulary");
      return *id;
    };
    if (type == "Sequence") {
      const json& list = j.value("processors", json::array());
      if (!list.is_array()) return bad(field + ".processors", "expected an array");
      for (size_t i = 0; i < list.size(); ++i) {
        TESSERA_RETURN_IF_ERROR(
            post_processor(list[i], fmt::format("{}.processors[{}]", field, i), lookup, spec));
      }
      return Status::ok();
    }
    if (type == "ByteLevel") return Status::ok();  // offsets only
    if (type == "RobertaProcessing" || type == "BertProcessing") {
      for (const char* key : {"cls", "sep"}) {
        const json& pair = j.value(key, json());
        if (!pair.is_array() || pair.size() != 2 || !pair[1].is_number_integer()) {
          return bad(field + "." + key, "expected [token, id]");
        }
        (std::string(key) == "cls" ? spec.post_prefix : spec.post_suffix)
            .push_back(pair[1].get<int32_t>());
      }
      return Status::ok();
    }
    if (type != "TemplateProcessing") return unsupported(field, type);
    const json& single = j.value("single", json());
    if (!single.is_array()) return bad(field + ".single", "expected an array");
    const json& specials = j.value("special_tokens", json::object());
    bool after_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string where = fmt::format("{}.single[{}]", field, i);
      const json& item = single[i];
      if (item.contains("Sequence")) {
        after_sequence = true;
        continue;
      }
      if (!item.contains("SpecialToken") || !item["SpecialToken"].is_object()) {
        return bad(where, "expected SpecialToken or Sequence");
      }
      const std::string name = get_string(item["SpecialToken"], "id", "");
      std::vector<int32_t> ids;
      auto it = specials.find(name);
      if (it != specials.end() && it->is_object() && it->contains("ids") &&
          (*it)["ids"].is_array()) {
        for (const json& id : (*it)["ids"]) {
          if (!id.is_number_integer()) return bad(where, "special token ids must be integers");
          ids.push_back(id.get<int32_t>());
        }
      } else {
        TESSERA_ASSIGN_OR_RETURN(int32_t id, id_of(name, where));
        ids.push_back(id);
      }
      auto& dst = after_sequence ? spec.post_suffix : spec.post_prefix;
      dst.insert(dst.end(), ids.begin(), ids.end());
    }
    return Status::ok();
  }

 private:
  std::string source_;
};

// "bos_token": "<s>" | {"content": "<s>", ...} | null.
std::optional<std::string> special_token_string(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

Result<json> parse_json(std::string_view text, const std::string& source) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    // e.what() names the position: "parse error at line 1, column 5: ..."
    return Status::corrupt(source + ": malformed JSON: " + e.what());
  }
}

// model.vocab and model.merges of a large tokenizer.json (262k tokens, 515k merges) are taken
// out during parsing instead of being built as a JSON DOM (a std::map of 262k nodes and its
// teardown dominated load time).
struct BulkModel {
  bool vocab_seen = false, merges_seen = false;
  std::vector<std::string> vocab;  // by id; "" = hole
  std::string vocab_error;         // first bad entry
  struct MergeRef {
    uint32_t offset, a_len, b_len;  // b_len == kLine: "a b" form, split later
  };
  static constexpr uint32_t kLine = ~uint32_t{0};
  std::string merge_text;
  std::vector<MergeRef> merges;
  std::string merges_error;
};

Result<json> parse_tokenizer_json(std::string_view text, const std::string& source,
                                  BulkModel& bulk) {
  struct Frame {
    std::string name;  // key that introduced the container ("" inside arrays and for the root)
    bool is_object;
  };
  std::vector<Frame> frames;
  std::string pending_key;
  auto under_model = [&](const char* name, bool is_object) {
    return frames.size() >= 3 && frames[1].name == "model" && frames[2].name == name &&
           frames[2].is_object == is_object;
  };
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) -> bool {
    using E = json::parse_event_t;
    switch (event) {
      case E::key:
        if (frames.size() == 3 && under_model("vocab", true)) {
          pending_key = std::move(parsed.get_ref<std::string&>());
          return false;  // not inserted into the DOM
        }
        pending_key = parsed.get<std::string>();
        return true;
      case E::object_start:
      case E::array_start: {
        const bool parent_object = !frames.empty() && frames.back().is_object;
        frames.push_back({parent_object ? pending_key : std::string(), event == E::object_start});
        if (frames.size() == 3 && under_model("vocab", true)) bulk.vocab_seen = true;
        if (frames.size() == 3 && under_model("merges", false)) bulk.merges_seen = true;
        return true;
      }
      case E::object_end:
      case E::array_end: {
        const bool pair = event == E::array_end && frames.size() == 4 && under_model("merges", false);
        frames.pop_back();
        if (!pair) return true;
        if (parsed.is_array() && parsed.size() == 2 && parsed[0].is_string() && parsed[1].is_string()) {
          const auto& a = parsed[0].get_ref<const std::string&>();
          const auto& b = parsed[1].get_ref<const std::string&>();
          bulk.merges.push_back({static_cast<uint32_t>(bulk.merge_text.size()),
                                 static_cast<uint32_t>(a.size()), static_cast<uint32_t>(b.size())});
          bulk.merge_text.append(a).append(b);
        } else if (bulk.merges_error.empty()) {
          bulk.merges_error = fmt::format("model.merges[{}]", bulk.merges.size());
        }
        return false;
      }
      case E::value:
        if (frames.size() == 3 && under_model("vocab", true)) {
          const int64_t id = parsed.is_number_integer() ? parsed.get<int64_t>() : -1;
          if (id < 0 || id > (int64_t{1} << 30)) {
            if (bulk.vocab_error.empty()) bulk.vocab_error = pending_key;
          } else {
            if (static_cast<size_t>(id) >= bulk.vocab.size()) bulk.vocab.resize(static_cast<size_t>(id) + 1);
            std::string& slot = bulk.vocab[static_cast<size_t>(id)];
            if (slot.empty()) slot = std::move(pending_key);
          }
          return false;
        }
        if (frames.size() == 3 && under_model("merges", false)) {
          if (parsed.is_string()) {
            const auto& line = parsed.get_ref<const std::string&>();
            bulk.merges.push_back({static_cast<uint32_t>(bulk.merge_text.size()),
                                   static_cast<uint32_t>(line.size()), BulkModel::kLine});
            bulk.merge_text.append(line);
          } else if (bulk.merges_error.empty()) {
            bulk.merges_error = fmt::format("model.merges[{}]", bulk.merges.size());
          }
          return false;
        }
        return true;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    return Status::corrupt(source + ": malformed JSON: " + e.what());
  }
}

const json& field(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

Status read_model(const HfReader& r, const json& model, BulkModel& bulk, TokenizerSpec& spec) {
  if (!model.is_object()) return r.bad("model", "missing or not an object");
  const std::string type =
      HfReader::get_string(model, "type", (model.contains("merges") || bulk.merges_seen) ? "BPE" : "");
  if (type != "BPE") {
    return Status::unimplemented(fmt::format("{}: model.type '{}' is not supported (only BPE)",
                                             spec.source, type));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!HfReader::get_string(model, key, "").empty()) {
      return Status::unimplemented(fmt::format("{}: model.{} is not supported", spec.source, key));
    }
  }
  if (!bulk.vocab_seen) return r.bad("model.vocab", "expected an object {token: id}");
  if (!bulk.vocab_error.empty()) {
    return r.bad("model.vocab", fmt::format("token '{}' has no valid id", bulk.vocab_error));
  }
  if (!bulk.merges_error.empty()) return r.bad(bulk.merges_error, "expected \"a b\" or [\"a\", \"b\"]");
  if (!bulk.merges_seen && !field(model, "merges").is_null()) {
    return r.bad("model.merges", "expected an array");
  }
  spec.vocab = std::move(bulk.vocab);
  spec.byte_fallback = HfReader::get_bool(model, "byte_fallback", false);
  spec.fuse_unk = HfReader::get_bool(model, "fuse_unk", false);
  spec.ignore_merges = HfReader::get_bool(model, "ignore_merges", false);
  spec.model = tok::ModelKind::kBpeRanks;
  return Status::ok();
}

void add_merges(const BulkModel& bulk, BpeTokenizer& t) {
  t.reserve_merges(bulk.merges.size());
  size_t skipped = 0;
  const std::string_view text = bulk.merge_text;
  for (const BulkModel::MergeRef& m : bulk.merges) {
    bool ok;
    if (m.b_len == BulkModel::kLine) {
      ok = t.add_merge_line(text.substr(m.offset, m.a_len));
    } else {
      ok = t.add_merge(text.substr(m.offset, m.a_len), text.substr(m.offset + m.a_len, m.b_len));
    }
    skipped += ok ? 0 : 1;
  }
  if (skipped > 0) TESSERA_LOG_DEBUG("tokenizer: {} merges name tokens not in the vocabulary", skipped);
}

Result<std::unique_ptr<Tokenizer>> build_from_json(const json& root, BulkModel& bulk,
                                                   const json* config, const json* generation,
                                                   const std::string& source) {
  HfReader r(source);
  if (!root.is_object()) return r.bad("(root)", "expected a JSON object");
  TokenizerSpec spec;
  spec.source = source;
  const json& model = field(root, "model");
  TESSERA_RETURN_IF_ERROR(read_model(r, model, bulk, spec));
  const std::string unk = HfReader::get_string(model, "unk_token", "");

  const json& added = field(root, "added_tokens");
  if (!added.is_null() && !added.is_array()) return r.bad("added_tokens", "expected an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string() || a["id"].get<int64_t>() < 0) {
      return r.bad(fmt::format("added_tokens[{}]", i), "expected {\"id\": int, \"content\": str}");
    }
    tok::AddedToken t;
    t.id = a["id"].get<int32_t>();
    t.content = a["content"].get<std::string>();
    t.special = HfReader::get_bool(a, "special", false);
    t.lstrip = HfReader::get_bool(a, "lstrip", false);
    t.rstrip = HfReader::get_bool(a, "rstrip", false);
    t.single_word = HfReader::get_bool(a, "single_word", false);
    t.normalized = HfReader::get_bool(a, "normalized", !t.special);
    spec.added_tokens.push_back(std::move(t));
  }
  TESSERA_RETURN_IF_ERROR(r.normalizer(field(root, "normalizer"), "normalizer", spec.normalizers));
  TESSERA_RETURN_IF_ERROR(
      r.pre_tokenizer(field(root, "pre_tokenizer"), "pre_tokenizer", spec.pre_tokenizers));
  TESSERA_RETURN_IF_ERROR(r.decoder(field(root, "decoder"), "decoder", spec.decoders));

  // Token -> id for the post-processor and the config (added tokens win over the vocabulary).
  // Called for a handful of tokens only, so a linear scan is fine.
  const Lookup lookup = [&](const std::string& token) -> std::optional<int32_t> {
    for (const auto& a : spec.added_tokens) {
      if (a.content == token) return a.id;
    }
    for (size_t id = 0; id < spec.vocab.size(); ++id) {
      if (spec.vocab[id] == token) return static_cast<int32_t>(id);
    }
    return std::nullopt;
  };
  const json& post = field(root, "post_processor");
  TESSERA_RETURN_IF_ERROR(r.post_processor(post, "post_processor", lookup, spec));
  if (!unk.empty()) {
    if (auto id = lookup(unk)) spec.unk_id = *id;
  }

  // Special-token strings and BOS/EOS behaviour from tokenizer_config.json.
  std::optional<std::string> bos, eos;
  if (config != nullptr && config->is_object()) {
    bos = special_token_string(*config, "bos_token");
    eos = special_token_string(*config, "eos_token");
  }
  if (bos) {
    spec.bos_token = *bos;
    if (auto id = lookup(*bos)) spec.bos_id = *id;
  } else if (!spec.post_prefix.empty()) {
    spec.bos_id = spec.post_prefix.front();
  }
  if (eos) {
    spec.eos_token = *eos;
    if (auto id = lookup(*eos)) spec.eos_ids.push_back(*id);
  }
  if (config != nullptr && config->is_object()) {
    // An explicit add_bos_token / add_eos_token decides whether BOS / EOS surround the text
    // (transformers' Llama and Gemma tokenizers rebuild the template from these flags).
    auto flag = [&](const char* key) -> std::optional<bool> {
      auto it = config->find(key);
      if (it == config->end() || !it->is_boolean()) return std::nullopt;
      return it->get<bool>();
    };
    if (auto add_bos = flag("add_bos_token"); add_bos && spec.bos_id >= 0) {
      auto& p = spec.post_prefix;
      p.erase(std::remove(p.begin(), p.end(), spec.bos_id), p.end());
      if (*add_bos) p.insert(p.begin(), spec.bos_id);
    }
    if (auto add_eos = flag("add_eos_token"); add_eos && !spec.eos_ids.empty()) {
      auto& s = spec.post_suffix;
      s.erase(std::remove(s.begin(), s.end(), spec.eos_ids[0]), s.end());
      if (*add_eos) s.push_back(spec.eos_ids[0]);
    }
  }
  if (generation != nullptr && generation->is_object() && generation->contains("eos_token_id")) {
    const json& e = (*generation)["eos_token_id"];
    std::vector<int32_t> ids;
    if (e.is_number_integer()) ids.push_back(e.get<int32_t>());
    if (e.is_array()) {
      for (const json& x : e) {
        if (x.is_number_integer()) ids.push_back(x.get<int32_t>());
      }
    }
    for (int32_t id : ids) {
      if (std::find(spec.eos_ids.begin(), spec.eos_ids.end(), id) == spec.eos_ids.end()) {
        spec.eos_ids.push_back(id);
      }
    }
  }

  auto token_of = [&](int32_t id) -> std::string {
    for (const auto& a : spec.added_tokens) {
      if (a.id == id) return a.content;
    }
    return id >= 0 && static_cast<size_t>(id) < spec.vocab.size() ? spec.vocab[static_cast<size_t>(id)]
                                                                  : std::string();
  };
  if (spec.bos_token.empty() && spec.bos_id >= 0) spec.bos_token = token_of(spec.bos_id);
  if (spec.eos_token.empty() && !spec.eos_ids.empty()) spec.eos_token = token_of(spec.eos_ids[0]);

  auto tokenizer = std::make_unique<BpeTokenizer>(std::move(spec));
  add_merges(bulk, *tokenizer);
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

Result<std::unique_ptr<Tokenizer>> from_parts(std::string_view tokenizer_json,
                                              std::string_view config_json,
                                              std::string_view generation_json,
                                              const std::string& source,
                                              const std::string& config_source) {
  try {
    BulkModel bulk;
    TESSERA_ASSIGN_OR_RETURN(json root, parse_tokenizer_json(tokenizer_json, source, bulk));
    json config, generation;
    if (!config_json.empty()) {
      TESSERA_ASSIGN_OR_RETURN(config, parse_json(config_json, config_source));
    }
    if (!generation_json.empty()) {
      // Optional extra stop tokens; a broken file is not worth failing the tokenizer for.
      generation = json::parse(generation_json.begin(), generation_json.end(), nullptr, false);
    }
    return build_from_json(root, bulk, config_json.empty() ? nullptr : &config,
                           generation.is_object() ? &generation : nullptr, source);
  } catch (const json::exception& e) {
    return Status::invalid_argument(source + ": " + e.what());
  }
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_hf_json(std::string_view tokenizer_json,
                                                           std::string_view config_json,
                                                           std::string_view source) {
  const std::string name(source);
  return from_parts(tokenizer_json, config_json, {}, name, name + " (tokenizer_config)");
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_hf_file(const std::string& tokenizer_json_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(tokenizer_json_path, ec)) {
    return Status::not_found(tokenizer_json_path + ": tokenizer file not found");
  }
  TESSERA_ASSIGN_OR_RETURN(std::string text, read_text_file(tokenizer_json_path));
  const fs::path dir = fs::path(tokenizer_json_path).parent_path();
  const std::string config_path = (dir / "tokenizer_config.json").string();
  const std::string generation_path = (dir / "generation_config.json").string();
  std::string config, generation;
  if (fs::is_regular_file(config_path, ec)) {
    TESSERA_ASSIGN_OR_RETURN(config, read_text_file(config_path));
  }
  if (fs::is_regular_file(generation_path, ec)) {
    auto g = read_text_file(generation_path);
    if (g.is_ok()) generation = std::move(g).value();
  }
  return from_parts(text, config, generation, tokenizer_json_path, config_path);
}

}  // namespace tessera
