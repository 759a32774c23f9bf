// BpeTokenizer: added-token matching, the normalize -> pre-tokenize -> BPE pipeline, the
// post-processor, and decoding. The merge loop keeps the word's symbols in a linked list and
// candidate pairs in a binary heap (invalidated lazily), so a word of n characters costs
// O(n log n) however long it is (SentencePiece-style tokenizers see whole lines as one word).
#include <algorithm>

#include "common/check.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace tessera::tok {

// ---- Vocab, MergeTable ----------------------------------------------------------------------

void Vocab::assign(std::vector<std::string> tokens) {
  tokens_ = std::move(tokens);
  size_t cap = 16;
  while (cap < tokens_.size() * 2) cap *= 2;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& t = tokens_[id];
    if (t.empty()) continue;
    const uint64_t h = hash(t);
    const auto tag = static_cast<uint32_t>(h);
    for (size_t i = (h >> 32) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = Slot{tag, static_cast<int32_t>(id)};
        break;
      }
      if (s.tag == tag && tokens_[static_cast<size_t>(s.id)] == t) break;  // duplicate: keep lower id
    }
  }
}

namespace {

inline uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
}

inline size_t hash_key(uint64_t key, size_t mask) {
  return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 17) & mask;
}

}  // namespace

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap *= 2;
  if (cap <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{});
  size_ = 0;
  for (const Slot& s : old) {
    if (s.key != kEmpty) insert(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key), s.merge);
  }
}

void MergeTable::grow() { reserve(std::max<size_t>(16, slots_.size())); }

void MergeTable::insert(int32_t left, int32_t right, Merge merge) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t key = pair_key(left, right);
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash_key(key, mask);; i = (i + 1) & mask) {
    if (slots_[i].key == key) return;  // keep the better (earlier) rank
    if (slots_[i].key == kEmpty) {
      slots_[i] = Slot{key, merge};
      ++size_;
      return;
    }
  }
}

const MergeTable::Merge* MergeTable::find(int32_t left, int32_t right) const {
  if (slots_.empty()) return nullptr;
  const uint64_t key = pair_key(left, right);
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash_key(key, mask);; i = (i + 1) & mask) {
    if (slots_[i].key == key) return &slots_[i].merge;
    if (slots_[i].key == kEmpty) return nullptr;
  }
}

// ---- construction ---------------------------------------------------------------------------

BpeTokenizer::BpeTokenizer(TokenizerSpec spec) : spec_(std::move(spec)) {
  vocab_.assign(std::move(spec_.vocab));
  spec_.vocab.clear();
  vocab_size_ = vocab_.size();
  for (const AddedToken& t : spec_.added_tokens) vocab_size_ = std::max(vocab_size_, t.id + 1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[b] = vocab_.find(name).value_or(-1);
  }
  special_.assign(static_cast<size_t>(vocab_size_), 0);
  for (size_t i = 0; i < spec_.added_tokens.size(); ++i) {
    const AddedToken& t = spec_.added_tokens[i];
    if (t.id < 0) continue;
    added_by_content_.emplace(t.content, t.id);
    added_by_id_.emplace(t.id, i);
    if (t.special && !is_tool_call_marker(t.content)) special_[static_cast<size_t>(t.id)] = 1;
  }
  build_trie(false, raw_trie_);
  build_trie(true, normalized_trie_);
}

void BpeTokenizer::build_trie(bool normalized, Trie& trie) const {
  trie.token_at.assign(1, -1);
  for (size_t i = 0; i < spec_.added_tokens.size(); ++i) {
    const AddedToken& t = spec_.added_tokens[i];
    if (t.normalized != normalized || t.content.empty() || t.id < 0) continue;
    // A normalized token is looked for in normalized text, so it is normalized itself.
    const std::string content = normalized ? normalize(spec_.normalizers, t.content) : t.content;
    if (content.empty()) continue;
    int32_t node = 0;
    for (char c : content) {
      const uint64_t key = (uint64_t{static_cast<uint32_t>(node)} << 8) | static_cast<uint8_t>(c);
      auto it = trie.edges.find(key);
      if (it == trie.edges.end()) {
        const auto child = static_cast<int32_t>(trie.token_at.size());
        trie.token_at.push_back(-1);
        it = trie.edges.emplace(key, child).first;
      }
      node = it->second;
    }
    if (trie.token_at[static_cast<size_t>(node)] < 0) {
      trie.token_at[static_cast<size_t>(node)] = static_cast<int32_t>(i);
    }
    trie.first_byte[static_cast<uint8_t>(content[0])] = true;
  }
}

bool BpeTokenizer::add_merge(std::string_view a, std::string_view b) {
  const auto left = vocab_.find(a), right = vocab_.find(b);
  if (!left || !right) return false;
  merge_buffer_.assign(a).append(b);
  const auto merged = vocab_.find(merge_buffer_);
  if (!merged) return false;
  merges_.insert(*left, *right, {static_cast<int32_t>(merges_.size()), *merged});
  return true;
}

bool BpeTokenizer::add_merge_line(std::string_view line) {
  for (size_t p = line.find(' '); p != std::string_view::npos; p = line.find(' ', p + 1)) {
    if (add_merge(line.substr(0, p), line.substr(p + 1))) return true;
  }
  return false;
}

// ---- encoding -------------------------------------------------------------------------------

struct BpeTokenizer::Scratch {
  struct Symbol {
    uint32_t start, len;  // bytes of the word; len 0 marks a symbol merged into its left
    int32_t id;           // token id; -1 for an SPM character not (yet) known as a token
    int32_t prev, next;
  };
  struct Candidate {
    double key;  // lower merges first: the rank, or minus the SPM score
    int32_t left;
    uint32_t left_len, right_len;
    int32_t id;  // the merged token
  };
  // Max-heap order: the best candidate (lowest key, then leftmost) on top.
  static bool worse(const Candidate& a, const Candidate& b) {
    return a.key != b.key ? a.key > b.key : a.left > b.left;
  }
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::vector<Match> matches;
  std::vector<std::string> words;

  // `initial`: only append; heapify() orders them all at once in O(n).
  void push(const Candidate& c, bool initial) {
    heap.push_back(c);
    if (!initial) std::push_heap(heap.begin(), heap.end(), worse);
  }
  void heapify() { std::make_heap(heap.begin(), heap.end(), worse); }
  Candidate pop() {
    std::pop_heap(heap.begin(), heap.end(), worse);
    Candidate c = heap.back();
    heap.pop_back();
    return c;
  }
  void link() {
    for (size_t i = 0; i < symbols.size(); ++i) {
      symbols[i].prev = static_cast<int32_t>(i) - 1;
      symbols[i].next = i + 1 < symbols.size() ? static_cast<int32_t>(i + 1) : -1;
    }
  }
  // Merges candidate `c` (already validated): the right symbol joins the left one.
  void merge(const Candidate& c) {
    Symbol& left = symbols[static_cast<size_t>(c.left)];
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    left.id = c.id;
    left.len += right.len;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = c.left;
    right.len = 0;
  }
};

namespace {

bool is_space_byte(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// A "word" character for single_word added tokens: ASCII alphanumerics, '_' and any non-ASCII.
bool is_word_byte(char c) {
  const auto u = static_cast<uint8_t>(c);
  return u >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         c == '_';
}

}  // namespace

void BpeTokenizer::find_added(std::string_view text, bool normalized,
                              std::vector<Match>& out) const {
  const Trie& trie = normalized ? normalized_trie_ : raw_trie_;
  size_t i = 0, prev_end = 0;
  while (i < text.size()) {
    if (!trie.first_byte[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const uint64_t key =
          (uint64_t{static_cast<uint32_t>(node)} << 8) | static_cast<uint8_t>(text[j]);
      auto it = trie.edges.find(key);
      if (it == trie.edges.end()) break;
      node = it->second;
      const int32_t tok = trie.token_at[static_cast<size_t>(node)];
      if (tok < 0) continue;
      const AddedToken& t = spec_.added_tokens[static_cast<size_t>(tok)];
      if (t.single_word && ((i > 0 && is_word_byte(text[i - 1])) ||
                            (j + 1 < text.size() && is_word_byte(text[j + 1])))) {
        continue;
      }
      best = tok;
      best_end = j + 1;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = spec_.added_tokens[static_cast<size_t>(best)];
    size_t begin = i, end = best_end;
    if (t.lstrip) {
      while (begin > prev_end && is_space_byte(text[begin - 1])) --begin;
    }
    if (t.rstrip) {
      while (end < text.size() && is_space_byte(text[end])) ++end;
    }
    out.push_back({begin, end, t.id});
    i = prev_end = end;
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_special) const {
  // Validate once; the regexes then match without PCRE2's per-call UTF check.
  std::string repaired;
  if (!unicode::is_valid_utf8(text)) {
    repaired = unicode::sanitize_utf8(text, false);
    text = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (add_special) out = spec_.post_prefix;
  Scratch scratch;
  if (raw_trie_.empty()) {
    encode_segment(text, true, scratch, out);
  } else {
    std::vector<Match> matches;
    find_added(text, false, matches);
    size_t pos = 0;
    for (const Match& m : matches) {
      encode_segment(text.substr(pos, m.begin - pos), pos == 0, scratch, out);
      out.push_back(m.id);
      pos = m.end;
    }
    encode_segment(text.substr(pos), pos == 0, scratch, out);
  }
  if (add_special) out.insert(out.end(), spec_.post_suffix.begin(), spec_.post_suffix.end());
  return out;
}

void BpeTokenizer::encode_segment(std::string_view raw, bool at_text_start, Scratch& scratch,
                                  std::vector<int32_t>& out) const {
  if (raw.empty()) return;
  std::string text = normalize(spec_.normalizers, std::string(raw));
  if (normalized_trie_.empty()) {
    encode_normalized(std::move(text), at_text_start, scratch, out);
    return;
  }
  std::vector<Match> matches;
  find_added(text, true, matches);
  size_t pos = 0;
  for (const Match& m : matches) {
    encode_normalized(text.substr(pos, m.begin - pos), at_text_start && pos == 0, scratch, out);
    out.push_back(m.id);
    pos = m.end;
  }
  encode_normalized(text.substr(pos), at_text_start && pos == 0, scratch, out);
}

void BpeTokenizer::encode_normalized(std::string text, bool at_text_start, Scratch& scratch,
                                     std::vector<int32_t>& out) const {
  if (text.empty()) return;
  scratch.words.clear();
  pre_tokenize(spec_.pre_tokenizers, std::move(text), at_text_start, scratch.words);
  for (const std::string& w : scratch.words) encode_word(w, scratch, out);
}

void BpeTokenizer::encode_word(std::string_view word, Scratch& scratch,
                               std::vector<int32_t>& out) const {
  if (spec_.model == ModelKind::kBpeRanks) {
    bpe_ranks(word, scratch, out);
  } else {
    bpe_scores(word, scratch, out);
  }
}

void BpeTokenizer::emit_char_fallback(std::string_view ch, Scratch& scratch,
                                      std::vector<int32_t>& out) const {
  if (spec_.byte_fallback) {
    bool all = true;
    for (char c : ch) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
    if (all) {
      for (char c : ch) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
      return;
    }
  }
  if (spec_.unk_id < 0) return;  // no unknown token: the character is dropped
  if (spec_.fuse_unk && !out.empty() && out.back() == spec_.unk_id) return;
  out.push_back(spec_.unk_id);
}

void BpeTokenizer::bpe_ranks(std::string_view word, Scratch& scratch,
                             std::vector<int32_t>& out) const {
  if (spec_.ignore_merges) {
    if (auto id = vocab_.find(word)) {
      out.push_back(*id);
      return;
    }
  }
  auto& symbols = scratch.symbols;
  symbols.clear();
  for (size_t i = 0; i < word.size();) {
    const size_t len = unicode::utf8_len_from_lead(static_cast<uint8_t>(word[i]));
    const std::string_view ch = word.substr(i, len);
    const auto start = static_cast<uint32_t>(i);
    i += len;
    if (auto id = vocab_.find(ch)) {
      symbols.push_back({start, static_cast<uint32_t>(ch.size()), *id, 0, 0});
      continue;
    }
    // Unknown character: byte tokens, else <unk> (fused), else dropped. Byte and <unk>
    // symbols take part in merges like any other (normally none apply).
    std::vector<int32_t> fallback;
    emit_char_fallback(ch, scratch, fallback);
    if (fallback.size() == 1 && fallback[0] == spec_.unk_id) {
      if (spec_.fuse_unk && !symbols.empty() && symbols.back().id == spec_.unk_id) {
        symbols.back().len += static_cast<uint32_t>(ch.size());
      } else {
        symbols.push_back({start, static_cast<uint32_t>(ch.size()), spec_.unk_id, 0, 0});
      }
      continue;
    }
    for (size_t k = 0; k < fallback.size(); ++k) {
      symbols.push_back({start + static_cast<uint32_t>(k), 1, fallback[k], 0, 0});
    }
  }
  if (symbols.size() <= 1) {
    if (!symbols.empty()) out.push_back(symbols[0].id);
    return;
  }
  scratch.link();
  scratch.heap.clear();
  auto try_pair = [&](int32_t left, bool initial) {
    if (left < 0) return;
    const auto& l = symbols[static_cast<size_t>(left)];
    if (l.next < 0) return;
    const auto& r = symbols[static_cast<size_t>(l.next)];
    if (const MergeTable::Merge* m = merges_.find(l.id, r.id)) {
      scratch.push({static_cast<double>(m->rank), left, l.len, r.len, m->id}, initial);
    }
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) try_pair(static_cast<int32_t>(i), true);
  scratch.heapify();
  while (!scratch.heap.empty()) {
    const Scratch::Candidate c = scratch.pop();
    const auto& l = symbols[static_cast<size_t>(c.left)];
    if (l.len != c.left_len || l.next < 0) continue;  // stale: the left symbol changed
    const auto& r = symbols[static_cast<size_t>(l.next)];
    if (r.len != c.right_len) continue;  // stale: the right neighbour changed
    scratch.merge(c);
    try_pair(symbols[static_cast<size_t>(c.left)].prev, false);
    try_pair(c.left, false);
  }
  for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
    out.push_back(symbols[static_cast<size_t>(i)].id);
  }
}

void BpeTokenizer::bpe_scores(std::string_view word, Scratch& scratch,
                              std::vector<int32_t>& out) const {
  auto& symbols = scratch.symbols;
  symbols.clear();
  for (size_t i = 0; i < word.size();) {
    const size_t len = unicode::utf8_len_from_lead(static_cast<uint8_t>(word[i]));
    symbols.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(len), -1, 0, 0});
    i += len;
  }
  if (symbols.empty()) return;
  scratch.link();
  scratch.heap.clear();
  auto try_pair = [&](int32_t left, bool initial) {
    if (left < 0) return;
    const auto& l = symbols[static_cast<size_t>(left)];
    if (l.next < 0) return;
    const auto& r = symbols[static_cast<size_t>(l.next)];
    const auto id = vocab_.find(word.substr(l.start, l.len + r.len));
    if (!id || !spec_.mergeable[static_cast<size_t>(*id)]) return;
    scratch.push({-static_cast<double>(spec_.scores[static_cast<size_t>(*id)]), left, l.len, r.len,
                  *id},
                 initial);
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) try_pair(static_cast<int32_t>(i), true);
  scratch.heapify();
  while (!scratch.heap.empty()) {
    const Scratch::Candidate c = scratch.pop();
    const auto& l = symbols[static_cast<size_t>(c.left)];
    if (l.len != c.left_len || l.next < 0) continue;
    const auto& r = symbols[static_cast<size_t>(l.next)];
    if (r.len != c.right_len) continue;
    scratch.merge(c);
    try_pair(symbols[static_cast<size_t>(c.left)].prev, false);
    try_pair(c.left, false);
  }
  for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
    const auto& s = symbols[static_cast<size_t>(i)];
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    const std::string_view ch = word.substr(s.start, s.len);
    if (auto id = vocab_.find(ch)) {
      out.push_back(*id);
    } else {
      emit_char_fallback(ch, scratch, out);
    }
  }
}

// ---- decoding and lookups -------------------------------------------------------------------

std::string BpeTokenizer::decode_raw(std::span<const int32_t> ids, bool skip_special,
                                     bool continuation) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) continue;
    if (skip_special && special_[static_cast<size_t>(id)]) continue;
    tokens.push_back(id_to_token(id));
  }
  return run_decoders(spec_.decoders, std::move(tokens), continuation);
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  return unicode::sanitize_utf8(decode_raw(ids, skip_special, false), true);
}

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  if (!added_by_content_.empty()) {
    auto it = added_by_content_.find(std::string(token));
    if (it != added_by_content_.end()) return it->second;
  }
  return vocab_.find(token);
}

std::string BpeTokenizer::id_to_token(int32_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
    return spec_.added_tokens[it->second].content;
  }
  if (id < 0 || id >= vocab_.size()) return {};
  return vocab_.token(id);
}

std::vector<int32_t> BpeTokenizer::frequent_ids(int64_t n) const {
  // First the pieces every text is made of: added tokens that are text (whitespace and newline
  // runs; not special ones) and single printable ASCII characters (a SentencePiece BPE
  // vocabulary keeps its base alphabet last, with the lowest scores: Gemma 3's "(", "a" and ","
  // are ids 236746..236769). Then by score (a vocabulary with SentencePiece scores) or by id
  // (merge order). Control, special, unused-looking and byte-fallback pieces are left out.
  const auto take = static_cast<size_t>(std::max<int64_t>(0, n));
  std::vector<uint8_t> added(static_cast<size_t>(vocab_size_), 0);
  for (const AddedToken& a : spec_.added_tokens)
    if (a.id >= 0 && a.id < vocab_size_) added[static_cast<size_t>(a.id)] = a.special ? 2 : 1;
  std::vector<int32_t> first, rest;
  for (int32_t id = 0; id < vocab_size_; ++id) {
    const auto i = static_cast<size_t>(id);
    if (special_[i] || added[i] == 2) continue;
    const std::string piece = id_to_token(id);
    if (added[i] == 1) {
      // Text added tokens (whitespace runs) yes; placeholders such as <unused12> no.
      const bool placeholder = piece.size() > 2 && piece.front() == '<' && piece.back() == '>';
      if (!placeholder) first.push_back(id);
      continue;
    }
    const bool spm = spec_.model == ModelKind::kSpmScores;
    if (spm && (i >= spec_.scores.size() || (i < spec_.mergeable.size() && !spec_.mergeable[i]))) continue;
    if (piece.size() == 1 && piece[0] >= 0x20 && piece[0] < 0x7f)
      first.push_back(id);
    else
      rest.push_back(id);
  }
  if (spec_.model == ModelKind::kSpmScores) {
    const size_t want = std::min(rest.size(), take > first.size() ? take - first.size() : 0);
    std::partial_sort(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(want), rest.end(), [&](int32_t a, int32_t b) {
      const float sa = spec_.scores[static_cast<size_t>(a)], sb = spec_.scores[static_cast<size_t>(b)];
      return sa != sb ? sa > sb : a < b;
    });
  }
  first.insert(first.end(), rest.begin(), rest.end());
  if (first.size() > take) first.resize(take);
  return first;
}

bool BpeTokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size_ && special_[static_cast<size_t>(id)] != 0;
}

}  // namespace tessera::tok
