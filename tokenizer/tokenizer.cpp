// Tokenizer entry points shared by every format: the streaming decoder and
// load_tokenizer_for_model. The formats live in tokenizer_hf.cpp and tokenizer_gguf.cpp, the
// pipeline in tokenizer_bpe.cpp and tokenizer_text.cpp.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "model/gguf.h"
#include "tokenizer/unicode.h"

namespace tessera {

bool is_tool_call_marker(std::string_view token) {
  return std::find(std::begin(kToolCallMarkers), std::end(kToolCallMarkers), token) != std::end(kToolCallMarkers);
}

std::vector<int32_t> Tokenizer::frequent_ids(int64_t n) const {
  std::vector<int32_t> out;
  for (int32_t id = 0; id < vocab_size() && static_cast<int64_t>(out.size()) < n; ++id)
    if (!is_special(id)) out.push_back(id);
  return out;
}

std::string Tokenizer::decode_raw(std::span<const int32_t> ids, bool skip_special,
                                  bool /*continuation*/) const {
  return decode(ids, skip_special);
}

// ---- IncrementalDecoder ---------------------------------------------------------------------

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDecoder::push(int32_t id) {
  ids_.push_back(id);
  // Once settled ids produced text, the window continues it (no start-of-text rules).
  const bool continuation = prefix_bytes_ > 0;
  const std::string raw = tokenizer_.decode_raw(ids_, skip_special_, continuation);
  if (raw.size() < emitted_bytes_) return {};  // the decoder rewrote its tail: wait for more

  // Return complete characters only; invalid subparts become U+FFFD exactly as decode() does.
  std::string out;
  size_t pos = emitted_bytes_;
  while (pos < raw.size()) {
    const unicode::Utf8Step st = unicode::next_utf8(raw, pos);
    if (st.kind == unicode::Utf8Step::kTruncated) break;
    if (st.kind == unicode::Utf8Step::kValid) {
      out.append(raw, pos, st.len);
    } else {
      unicode::append_utf8(out, unicode::kReplacementChar);
    }
    pos += st.len;
  }
  emitted_bytes_ = pos;

  // Settle the longest prefix of the window whose text is fully returned and that ends on a
  // token boundary, so the next push re-decodes only the last few ids. The prefix must have
  // produced some text (so that what follows is a continuation) and must be a byte prefix of
  // the window's text (decoders whose output is not prefix-stable never settle).
  if (ids_.size() < 2 || emitted_bytes_ + prefix_bytes_ == 0) return out;
  constexpr size_t kMaxTries = 4;
  for (size_t k = ids_.size() - 1, tries = 0; k >= 1 && tries < kMaxTries; --k, ++tries) {
    const std::string pre = tokenizer_.decode_raw(std::span<const int32_t>(ids_.data(), k),
                                                  skip_special_, continuation);
    if (pre.size() > emitted_bytes_ || prefix_bytes_ + pre.size() == 0) continue;
    if (raw.compare(0, pre.size(), pre) != 0) continue;
    prefix_bytes_ += pre.size();
    emitted_bytes_ -= pre.size();
    prefix_start_ += k;
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(k));
    break;
  }
  return out;
}

std::string IncrementalDecoder::flush() {
  const bool continuation = prefix_bytes_ > 0;
  const std::string raw = tokenizer_.decode_raw(ids_, skip_special_, continuation);
  std::string out;
  if (raw.size() > emitted_bytes_) {
    out = unicode::sanitize_utf8(std::string_view(raw).substr(emitted_bytes_), false);
  }
  prefix_bytes_ += raw.size();
  prefix_start_ += ids_.size();
  ids_.clear();
  emitted_bytes_ = 0;
  return out;
}

// ---- load_tokenizer_for_model ---------------------------------------------------------------

namespace {

bool looks_like_gguf(const std::string& path) {
  std::string lower = path;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower.size() >= 5 && lower.compare(lower.size() - 5, 5, ".gguf") == 0) return true;
  char magic[4] = {};
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  const size_t n = std::fread(magic, 1, sizeof(magic), f);
  std::fclose(f);
  return n == 4 && magic[0] == 'G' && magic[1] == 'G' && magic[2] == 'U' && magic[3] == 'F';
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_tokenizer_for_model(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path json = fs::path(path) / "tokenizer.json";
    if (!fs::is_regular_file(json, ec)) {
      return Status::not_found(path + ": model directory has no tokenizer.json");
    }
    return Tokenizer::from_hf_file(json.string());
  }
  if (!fs::exists(path, ec)) return Status::not_found(path + ": no such tokenizer or model file");
  if (looks_like_gguf(path)) {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::open_metadata(path));
    return Tokenizer::from_gguf(*gguf);
  }
  return Tokenizer::from_hf_file(path);
}

}  // namespace tessera
