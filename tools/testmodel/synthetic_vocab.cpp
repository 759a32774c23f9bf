#include "tools/testmodel/synthetic_vocab.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/check.h"

namespace tessera {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // "▁" U+2581, SentencePiece's space mark
constexpr int32_t kFirstPieceId = 259;               // after 3 specials and 256 byte tokens
constexpr size_t kMaxFillPieceBytes = 16;
constexpr int kStoryWeight = 4;                      // a story word counts as this many list words

// A short story written for Tessera; its word frequencies drive the first merges.
constexpr std::string_view kStory =
    "Once upon a time, in a small town near the sea, there lived a girl named Mia and her old dog "
    "Sam. Every morning they walked down to the water to look for shells and little stones. One "
    "day the sky was gray and the wind was cold, but Mia wanted to go out anyway. She put on her "
    "red coat and called her dog. They found a box on the sand. It was wet and heavy, and it had a "
    "big lock. Mia tried to open it, but she could not. Sam started to dig next to the box and "
    "found a small key. Mia laughed and said, You are the best dog in the world! Inside the box "
    "there were old letters, a map and a picture of a ship. The map showed an island with a tree "
    "in the middle. Mia knew that her grandfather had been a sailor. She ran home and showed the "
    "letters to her mother. Her mother read them and smiled. These are from your grandfather, she "
    "said. He wrote them when he was young, before you were born. That night Mia could not sleep. "
    "She looked at the map again and again and thought about the island, the tree and the ship. "
    "The next day she asked her teacher about the island. The teacher said that it was real and "
    "that people could visit it in the summer. When summer came, Mia, her mother and Sam took a "
    "boat to the island. They found the tree, and under the tree they found a stone with a name "
    "on it. It was her grandfather's name. Mia was happy, and she felt that he was with them. "
    "Once upon a time there was a little boy who liked to play in the park with his friends. "
    "One day he saw a bird with a hurt wing. He picked it up and took it home to help it.";

// Common English words, roughly most frequent first; earlier words weigh more.
constexpr std::string_view kWords =
    "the of and to a in is it you that he was for on are with as I his they be at one have this "
    "from or had by not word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number sound no "
    "most people my over know water than call first who may down side been now find any new work "
    "part take get place made live where after back little only round man year came show every "
    "good me give our under name very through just form sentence great think say help low line "
    "differ turn cause much mean before move right boy old too same tell does set three want air "
    "well also play small end put home read hand port large spell add even land here must big "
    "high such follow act why ask men change went light kind off need house picture try us again "
    "animal point mother world near build self earth father head stand own page should country "
    "found answer school grow study still learn plant cover food sun four between state keep eye "
    "never last let thought city tree cross farm hard start might story saw far sea draw left "
    "late run while press close night real life few north open seem together next white children "
    "begin got walk example ease paper group always music those both mark often letter until mile "
    "river car feet care second book carry took science eat room friend began idea fish mountain "
    "stop once base hear horse cut sure watch color face wood main enough plain girl usual young "
    "ready above ever red list though feel talk bird soon body dog family direct pose leave song "
    "measure door product black short numeral class wind question happen complete ship area half "
    "rock order fire south problem piece told knew pass since top whole king space heard best hour "
    "better true during hundred five remember step early hold west ground interest reach fast verb "
    "sing listen six table travel less morning ten simple several vowel toward war lay against "
    "pattern slow center love person money serve appear road map rain rule govern pull cold notice "
    "voice unit power town fine certain fly fall lead cry dark machine note wait plan figure star "
    "box noun field rest correct able pound done beauty drive stood contain front teach week final "
    "gave green quick develop ocean warm free minute strong special mind behind clear tail produce "
    "fact street inch multiply nothing course stay wheel full force blue object decide surface deep "
    "moon island foot system busy test record boat common gold possible plane stead dry wonder "
    "laugh thousand ago ran check game shape equate hot miss brought heat snow tire bring yes "
    "distant fill east paint language among happy lived named small walked looked called tried "
    "started laughed showed smiled asked played jumped opened wanted thinking playing looking "
    "running going coming saying making taking nice hello model token language computer data "
    "Once The One She He They It We You This There When What Why How In On At After Then But And "
    "If So My Our Your His Her Their Mia Sam Lily Tom Hello Today Yesterday Tomorrow";

// Base characters: "▁" and printable ASCII. Every word of the corpus is made of these.
std::vector<std::string> base_chars() {
  std::vector<std::string> chars{std::string(kSpace)};
  for (int c = 33; c <= 126; ++c) chars.emplace_back(1, static_cast<char>(c));
  return chars;
}

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '\'';
}

// Word (with its "▁" prefix) -> weight, from the story and the word list.
std::map<std::string, int64_t> corpus_word_counts() {
  std::map<std::string, int64_t> counts;
  auto add_words = [&](std::string_view text, auto weight_of) {
    size_t i = 0;
    int64_t index = 0;
    while (i < text.size()) {
      while (i < text.size() && !is_word_char(text[i])) ++i;
      size_t j = i;
      while (j < text.size() && is_word_char(text[j])) ++j;
      if (j > i) counts[std::string(kSpace) + std::string(text.substr(i, j - i))] += weight_of(index++);
      i = j;
    }
  };
  add_words(kStory, [](int64_t) { return int64_t{kStoryWeight}; });
  // Zipf-like: the first words of the list weigh most.
  add_words(kWords, [](int64_t rank) { return 1 + 200 / (rank + 4); });
  return counts;
}

// Splits UTF-8 text into code points (the corpus is ASCII plus "▁").
std::vector<std::string> code_points(std::string_view s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// Learns up to `max_pieces` new pieces by BPE over the corpus words. Ties are broken by the
// merged string, then the left part, so the result does not depend on hash order.
std::vector<std::string> learn_bpe_pieces(size_t max_pieces, const std::unordered_set<std::string>& base) {
  std::vector<std::string> symbols;  // symbol id -> text
  std::unordered_map<std::string, int32_t> symbol_id;
  auto intern = [&](const std::string& s) {
    auto [it, inserted] = symbol_id.emplace(s, static_cast<int32_t>(symbols.size()));
    if (inserted) symbols.push_back(s);
    return it->second;
  };
  struct Word {
    std::vector<int32_t> syms;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [text, count] : corpus_word_counts()) {
    Word w{{}, count};
    for (const std::string& cp : code_points(text)) w.syms.push_back(intern(cp));
    words.push_back(std::move(w));
  }

  std::unordered_set<std::string> known = base;
  std::vector<std::string> pieces;
  std::unordered_map<uint64_t, int64_t> pair_counts;
  while (pieces.size() < max_pieces) {
    pair_counts.clear();
    for (const Word& w : words)
      for (size_t i = 0; i + 1 < w.syms.size(); ++i)
        pair_counts[(static_cast<uint64_t>(w.syms[i]) << 32) | static_cast<uint32_t>(w.syms[i + 1])] += w.count;
    if (pair_counts.empty()) break;
    uint64_t best = 0;
    int64_t best_count = -1;
    for (const auto& [key, count] : pair_counts) {
      if (count < best_count) continue;
      if (count == best_count) {
        const std::string& l = symbols[key >> 32];
        const std::string& r = symbols[key & 0xffffffffu];
        const std::string& bl = symbols[best >> 32];
        const std::string& br = symbols[best & 0xffffffffu];
        const std::string merged = l + r;
        const std::string best_merged = bl + br;
        if (merged > best_merged || (merged == best_merged && l >= bl)) continue;
      }
      best = key;
      best_count = count;
    }
    const auto left = static_cast<int32_t>(best >> 32);
    const auto right = static_cast<int32_t>(best & 0xffffffffu);
    const std::string merged = symbols[static_cast<size_t>(left)] + symbols[static_cast<size_t>(right)];
    const int32_t merged_id = intern(merged);
    // A piece reachable by two different splits is added once; later splits just apply.
    if (known.insert(merged).second) pieces.push_back(merged);
    for (Word& w : words) {
      std::vector<int32_t> out;
      out.reserve(w.syms.size());
      for (size_t i = 0; i < w.syms.size(); ++i) {
        if (i + 1 < w.syms.size() && w.syms[i] == left && w.syms[i + 1] == right) {
          out.push_back(merged_id);
          ++i;
        } else {
          out.push_back(w.syms[i]);
        }
      }
      w.syms = std::move(out);
    }
  }
  return pieces;
}

bool is_letter_piece(std::string_view p) {
  if (p.substr(0, kSpace.size()) == kSpace) p.remove_prefix(kSpace.size());
  if (p.empty()) return false;
  return std::all_of(p.begin(), p.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); });
}

// Once the corpus has no pairs left, new pieces join a letter piece with a letter piece that does
// not start a word, walking the pairs (i, j) by increasing i + j so short, early pieces come first.
void fill_pieces(std::vector<std::string>& pieces, size_t target, std::unordered_set<std::string>& known,
                 const std::vector<std::string>& chars) {
  std::vector<std::string> lefts, rights;
  auto consider = [&](const std::string& p) {
    if (!is_letter_piece(p)) return;
    lefts.push_back(p);
    if (p.substr(0, kSpace.size()) != kSpace) rights.push_back(p);
  };
  for (const auto& p : pieces) consider(p);
  for (const auto& c : chars) consider(c);
  for (size_t diag = 0; pieces.size() < target; ++diag) {
    TESSERA_CHECK(diag < lefts.size() + rights.size() + 2, "vocabulary fill ran out of candidates");
    for (size_t i = 0; i <= diag && pieces.size() < target; ++i) {
      const size_t j = diag - i;
      if (i >= lefts.size() || j >= rights.size()) continue;
      std::string cand = lefts[i] + rights[j];
      if (cand.size() > kMaxFillPieceBytes || known.count(cand)) continue;
      known.insert(cand);
      pieces.push_back(cand);
      consider(cand);
    }
  }
}

std::string json_string(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

}  // namespace

int64_t synthetic_vocab_min_size() { return kFirstPieceId + static_cast<int64_t>(base_chars().size()); }

Result<SyntheticVocab> build_synthetic_vocab(int64_t vocab_size) {
  if (vocab_size < synthetic_vocab_min_size() || vocab_size > (int64_t{1} << 24))
    return Status::invalid_argument(fmt::format("synthetic vocabulary size {} outside [{}, {}]", vocab_size,
                                                synthetic_vocab_min_size(), int64_t{1} << 24));
  const std::vector<std::string> chars = base_chars();
  SyntheticVocab v;
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(fmt::format("<0x{:02X}>", b));
    v.token_types.push_back(6);
  }
  std::unordered_set<std::string> known(v.tokens.begin(), v.tokens.end());
  known.insert(chars.begin(), chars.end());
  const auto n_pieces = static_cast<size_t>(vocab_size - kFirstPieceId) - chars.size();
  std::vector<std::string> pieces = learn_bpe_pieces(n_pieces, known);
  known.insert(pieces.begin(), pieces.end());
  fill_pieces(pieces, n_pieces, known, chars);
  for (const auto& p : pieces) v.tokens.push_back(p);
  for (const auto& c : chars) v.tokens.push_back(c);
  v.token_types.resize(v.tokens.size(), 1);
  TESSERA_CHECK(static_cast<int64_t>(v.tokens.size()) == vocab_size, "vocab {} != {}", v.tokens.size(), vocab_size);

  v.scores.assign(v.tokens.size(), 0.0f);
  for (size_t id = kFirstPieceId; id < v.tokens.size(); ++id)
    v.scores[id] = -static_cast<float>(id - kFirstPieceId);

  // HF BPE applies only listed merges while SentencePiece merges any adjacent pair whose
  // concatenation is a piece; listing every split keeps the two identical.
  std::unordered_map<std::string_view, int32_t> id_of;
  for (size_t id = kFirstPieceId; id < v.tokens.size(); ++id) id_of.emplace(v.tokens[id], static_cast<int32_t>(id));
  for (size_t id = kFirstPieceId; id < v.tokens.size(); ++id) {
    const std::string& p = v.tokens[id];
    size_t pos = 0;
    for (const std::string& cp : code_points(p)) {
      pos += cp.size();
      if (pos == p.size()) break;
      const std::string_view left(p.data(), pos), right(p.data() + pos, p.size() - pos);
      if (id_of.count(left) && id_of.count(right)) v.merges.push_back(fmt::format("{} {}", left, right));
    }
  }
  return v;
}

const std::string& synthetic_chat_template() {
  static const std::string kTemplate =
      "{{ bos_token }}"
      "{% for message in messages %}"
      "{% if message['role'] == 'system' %}"
      "{{ '<<SYS>>\\n' + message['content'] + '\\n<</SYS>>\\n\\n' }}"
      "{% elif message['role'] == 'user' %}"
      "{{ '[INST] ' + message['content'] + ' [/INST]' }}"
      "{% elif message['role'] == 'assistant' %}"
      "{{ ' ' + message['content'] + eos_token }}"
      "{% endif %}"
      "{% endfor %}";
  return kTemplate;
}

Result<std::string> synthetic_tokenizer_json(const SyntheticVocab& vocab) {
  using ojson = nlohmann::ordered_json;
  try {
    ojson added = ojson::array();
    for (int32_t id = 0; id < 3; ++id)
      added.push_back({{"id", id}, {"content", vocab.tokens[static_cast<size_t>(id)]}, {"single_word", false},
                       {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
    const ojson normalizer = {
        {"type", "Sequence"},
        {"normalizers", {{{"type", "Prepend"}, {"prepend", kSpace}},
                         {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}}}}};
    const ojson bos = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
    const ojson post = {
        {"type", "TemplateProcessing"},
        {"single", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                  {{"SpecialToken", {{"id", "<s>"}, {"type_id", 1}}}},
                  {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {kSyntheticBosId}}, {"tokens", {"<s>"}}}}}}};
    const ojson decoder = {
        {"type", "Sequence"},
        {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};

    // The vocabulary and merges are written by hand: JSON libraries keep objects in maps, and
    // ordered objects are quadratic to build at 128k entries.
    std::string out;
    out.reserve(vocab.tokens.size() * 24 + vocab.merges.size() * 20 + 4096);
    out += "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
    out += "  \"added_tokens\": " + added.dump() + ",\n";
    out += "  \"normalizer\": " + normalizer.dump() + ",\n";
    out += "  \"pre_tokenizer\": null,\n";
    out += "  \"post_processor\": " + post.dump() + ",\n";
    out += "  \"decoder\": " + decoder.dump() + ",\n";
    out += "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": \"<unk>\",\n"
           "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
           "    \"fuse_unk\": true,\n    \"byte_fallback\": true,\n    \"ignore_merges\": false,\n"
           "    \"vocab\": {";
    for (size_t id = 0; id < vocab.tokens.size(); ++id) {
      out += id == 0 ? "\n      " : ",\n      ";
      out += json_string(vocab.tokens[id]);
      out += ": ";
      out += std::to_string(id);
    }
    out += "\n    },\n    \"merges\": [";
    for (size_t i = 0; i < vocab.merges.size(); ++i) {
      out += i == 0 ? "\n      " : ",\n      ";
      out += json_string(vocab.merges[i]);
    }
    out += "\n    ]\n  }\n}\n";
    return out;
  } catch (const std::exception& e) {
    return Status::internal(fmt::format("tokenizer.json: cannot encode: {}", e.what()));
  }
}

Result<std::string> synthetic_tokenizer_config_json(int64_t model_max_length) {
  using ojson = nlohmann::ordered_json;
  try {
    ojson decoder_tokens = ojson::object();
    const char* names[] = {"<unk>", "<s>", "</s>"};
    for (int id = 0; id < 3; ++id)
      decoder_tokens[std::to_string(id)] = {{"content", names[id]}, {"lstrip", false}, {"normalized", false},
                                            {"rstrip", false}, {"single_word", false}, {"special", true}};
    const ojson config = {{"add_bos_token", true},
                          {"add_eos_token", false},
                          {"added_tokens_decoder", decoder_tokens},
                          {"bos_token", "<s>"},
                          {"eos_token", "</s>"},
                          {"unk_token", "<unk>"},
                          {"pad_token", nullptr},
                          {"chat_template", synthetic_chat_template()},
                          {"clean_up_tokenization_spaces", false},
                          {"model_max_length", model_max_length},
                          {"tokenizer_class", "LlamaTokenizer"}};
    return config.dump(2) + "\n";
  } catch (const std::exception& e) {
    return Status::internal(fmt::format("tokenizer_config.json: cannot encode: {}", e.what()));
  }
}

}  // namespace tessera
