#include "presets/tokenizer_files.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "checkpoint/safetensors_writer.h"
#include "runtime/error.h"

namespace tprun::presets {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", as
// transformers writes its tokenizer files (nlohmann sorts keys bytewise,
// which for UTF-8 is Python's code point order).
void write_json(const fs::path& path, const json& j) {
  checkpoint::write_file_atomically(path.string(), j.dump(2) + "\n", /*overwrite=*/false);
}

// An added_tokens_decoder / special_tokens_map entry.
json token_entry(const std::string& content, bool normalized, bool with_special) {
  json e = {{"content", content}, {"lstrip", false}, {"normalized", normalized}, {"rstrip", false},
            {"single_word", false}};
  if (with_special) e["special"] = true;
  return e;
}

class VectorSentences : public sentencepiece::SentenceIterator {
 public:
  explicit VectorSentences(const std::vector<std::string>& v) : v_(v) {}
  bool done() const override { return i_ >= v_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return v_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& v_;
  size_t i_ = 0;
};

// ---- minimal protobuf wire reading (for one bytes field) -------------------------

struct WireReader {
  const std::string& s;
  size_t pos = 0;
  std::string what;

  [[noreturn]] void fail() const {
    throw CheckpointError(fmt::format("{}: malformed SentencePiece model (protobuf) at byte {}", what, pos));
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= s.size()) fail();
      const auto b = static_cast<unsigned char>(s[pos++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    fail();
  }
  // Skips (or returns, for wire type 2) the value of a field.
  std::string value(uint32_t wire_type) {
    switch (wire_type) {
      case 0: varint(); return {};
      case 1: advance(8); return {};
      case 5: advance(4); return {};
      case 2: {
        const uint64_t n = varint();
        if (n > s.size() - pos) fail();
        std::string out = s.substr(pos, static_cast<size_t>(n));
        pos += static_cast<size_t>(n);
        return out;
      }
      default: fail();
    }
  }
  void advance(size_t n) {
    if (n > s.size() - pos) fail();
    pos += n;
  }
};

// The first length-delimited field `number` of `message`, or nullopt-like empty + false.
bool find_bytes_field(const std::string& message, uint32_t number, const std::string& what, std::string& out) {
  WireReader r{message, 0, what};
  bool found = false;
  while (r.pos < message.size()) {
    const uint64_t key = r.varint();
    const auto field = static_cast<uint32_t>(key >> 3), wire = static_cast<uint32_t>(key & 7);
    std::string v = r.value(wire);
    if (field == number && wire == 2 && !found) {
      out = std::move(v);
      found = true;
    }
  }
  return found;
}

// Rounds the score of every piece of a serialized ModelProto (pieces = 1,
// SentencePiece.score = 2, a fixed32 float) in place to a multiple of
// kScoreStep. See train_t5_sentencepiece.
constexpr double kScoreStep = 1.0 / 1024;

void round_piece_scores(std::string& model_proto) {
  WireReader top{model_proto, 0, "trained T5 model"};
  while (top.pos < model_proto.size()) {
    const uint64_t key = top.varint();
    const auto field = static_cast<uint32_t>(key >> 3), wire = static_cast<uint32_t>(key & 7);
    if (field != 1 || wire != 2) {
      top.value(wire);
      continue;
    }
    const uint64_t n = top.varint();
    if (n > model_proto.size() - top.pos) top.fail();
    const size_t begin = top.pos, end = top.pos + static_cast<size_t>(n);
    WireReader piece{model_proto, begin, top.what};
    while (piece.pos < end) {
      const uint64_t k = piece.varint();
      if ((k >> 3) == 2 && (k & 7) == 5) {
        if (piece.pos + 4 > end) piece.fail();
        float score;
        std::memcpy(&score, model_proto.data() + piece.pos, 4);
        score = static_cast<float>(std::round(score / kScoreStep) * kScoreStep);
        std::memcpy(model_proto.data() + piece.pos, &score, 4);
        piece.pos += 4;
      } else {
        piece.value(static_cast<uint32_t>(k & 7));
      }
    }
    if (piece.pos != end) piece.fail();
    top.pos = end;
  }
}

}  // namespace

std::string base64_encode(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                       static_cast<unsigned char>(bytes[i + 2]);
    for (int k = 3; k >= 0; --k) out.push_back(kAlphabet[(v >> (6 * k)) & 63]);
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
    if (rest == 2) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::string spm_precompiled_charsmap(const std::string& model_proto, const std::string& what) {
  // ModelProto.normalizer_spec = 3; NormalizerSpec.precompiled_charsmap = 2.
  std::string normalizer, charsmap;
  if (!find_bytes_field(model_proto, 3, what, normalizer)) return {};
  if (!find_bytes_field(normalizer, 2, what, charsmap)) return {};
  return charsmap;
}

// ---- CLIP ----------------------------------------------------------------------

int64_t write_clip_tokenizer(const std::string& dir, const text::BpeVocabulary& vocab, int64_t model_max_length) {
  const fs::path root(dir);
  fs::create_directories(root);
  json tokens = json::object();
  for (size_t id = 0; id < vocab.tokens.size(); ++id) {
    if (tokens.contains(vocab.tokens[id]))
      throw ConfigError(fmt::format("{}: CLIP token '{}' would get two ids", dir, vocab.tokens[id]));
    tokens[vocab.tokens[id]] = static_cast<int64_t>(id);
  }
  const std::string bos = "<|startoftext|>", eos = "<|endoftext|>";
  if (vocab.tokens.size() < 514 || vocab.tokens[vocab.tokens.size() - 2] != bos || vocab.tokens.back() != eos)
    throw ConfigError(fmt::format("{}: a CLIP vocabulary must end with {} and {}", dir, bos, eos));
  write_json(root / "vocab.json", tokens);

  std::string merges = "#version: 0.2\n";
  for (const auto& [a, b] : vocab.merges) merges += a + " " + b + "\n";
  checkpoint::write_file_atomically((root / "merges.txt").string(), merges, false);

  const auto bos_id = static_cast<int64_t>(vocab.tokens.size() - 2), eos_id = bos_id + 1;
  json config = {{"add_prefix_space", false},
                 {"added_tokens_decoder",
                  {{std::to_string(bos_id), token_entry(bos, true, true)},
                   {std::to_string(eos_id), token_entry(eos, true, true)}}},
                 {"bos_token", bos},
                 {"clean_up_tokenization_spaces", true},
                 {"do_lower_case", true},
                 {"eos_token", eos},
                 {"errors", "replace"},
                 {"model_max_length", model_max_length},
                 {"pad_token", eos},
                 {"tokenizer_class", "CLIPTokenizer"},
                 {"unk_token", eos}};
  write_json(root / "tokenizer_config.json", config);
  json special = {{"bos_token", token_entry(bos, true, false)},
                  {"eos_token", token_entry(eos, true, false)},
                  {"pad_token", eos},
                  {"unk_token", token_entry(eos, true, false)}};
  write_json(root / "special_tokens_map.json", special);
  return static_cast<int64_t>(vocab.tokens.size());
}

// ---- T5 ------------------------------------------------------------------------

T5Vocabulary train_t5_sentencepiece(const std::vector<std::string>& texts, int vocab_size, bool byte_fallback) {
  if (vocab_size < 8) throw ConfigError(fmt::format("T5 tokenizer: vocabulary size {} is below 8", vocab_size));
  std::unordered_map<std::string, std::string> args = {
      {"model_type", "unigram"},
      {"vocab_size", std::to_string(vocab_size)},
      {"hard_vocab_limit", "false"},
      {"character_coverage", "1.0"},
      {"normalization_rule_name", "nmt_nfkc"},
      {"pad_id", "0"},
      {"eos_id", "1"},
      {"unk_id", "2"},
      {"bos_id", "-1"},
      {"num_threads", "1"},
      {"minloglevel", "2"},
  };
  if (byte_fallback) args["byte_fallback"] = "true";
  VectorSentences sentences(texts);
  T5Vocabulary out;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &sentences, &out.model_proto);
  if (!status.ok())
    throw ConfigError(fmt::format("T5 tokenizer: SentencePiece training failed: {}", status.ToString()));
  // SentencePiece sums piece scores in float along the whole text, the
  // tokenizers library (transformers 5's T5TokenizerFast) in double per word:
  // with arbitrary scores a near tie can fall either way on a long prompt.
  // Scores on a 2^-10 grid sum exactly in both (below 2^14 in magnitude), so
  // both pick the same pieces.
  round_piece_scores(out.model_proto);
  sentencepiece::SentencePieceProcessor sp;
  const auto loaded = sp.LoadFromSerializedProto(out.model_proto);
  if (!loaded.ok())
    throw ConfigError(fmt::format("T5 tokenizer: trained model does not load: {}", loaded.ToString()));
  for (int id = 0; id < sp.GetPieceSize(); ++id) out.pieces.emplace_back(sp.IdToPiece(id), sp.GetScore(id));
  if (out.pieces.size() < 3 || out.pieces[0].first != "<pad>" || out.pieces[1].first != "</s>" ||
      out.pieces[2].first != "<unk>")
    throw ConfigError("T5 tokenizer: trained model lacks <pad>=0 </s>=1 <unk>=2");
  out.precompiled_charsmap = spm_precompiled_charsmap(out.model_proto, "trained T5 model");
  return out;
}

int64_t write_t5_tokenizer(const std::string& dir, const T5Vocabulary& vocab, int extra_ids,
                           int64_t model_max_length, bool byte_fallback) {
  const fs::path root(dir);
  fs::create_directories(root);
  checkpoint::write_file_atomically((root / "spiece.model").string(), vocab.model_proto, false);
  const auto pieces = static_cast<int64_t>(vocab.pieces.size());
  auto extra = [&](int i) { return fmt::format("<extra_id_{}>", i); };
  auto extra_id = [&](int i) { return pieces + extra_ids - 1 - i; };  // <extra_id_0> is the last id

  json decoder = json::object(), added = json::array(), model_vocab = json::array();
  const char* specials[] = {"<pad>", "</s>", "<unk>"};
  auto add = [&](int64_t id, const std::string& content) {
    decoder[std::to_string(id)] = token_entry(content, false, true);
    added.push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  };
  for (int64_t id = 0; id < 3; ++id) add(id, specials[id]);
  for (int i = extra_ids - 1; i >= 0; --i) add(extra_id(i), extra(i));
  for (const auto& [piece, score] : vocab.pieces) model_vocab.push_back(json::array({piece, score}));
  for (int i = extra_ids - 1; i >= 0; --i) model_vocab.push_back(json::array({extra(i), 0.0}));
  json extras = json::array();
  for (int i = 0; i < extra_ids; ++i) extras.push_back(extra(i));

  json config = {{"add_prefix_space", true},
                 {"added_tokens_decoder", decoder},
                 {"additional_special_tokens", extras},
                 {"clean_up_tokenization_spaces", true},
                 {"eos_token", "</s>"},
                 {"extra_ids", extra_ids},
                 {"legacy", true},
                 {"model_max_length", model_max_length},
                 {"pad_token", "<pad>"},
                 {"sp_model_kwargs", json::object()},
                 {"tokenizer_class", "T5Tokenizer"},
                 {"unk_token", "<unk>"}};
  write_json(root / "tokenizer_config.json", config);
  json special = {{"additional_special_tokens", extras},
                  {"eos_token", token_entry("</s>", false, false)},
                  {"pad_token", token_entry("<pad>", false, false)},
                  {"unk_token", token_entry("<unk>", false, false)}};
  write_json(root / "special_tokens_map.json", special);

  // tokenizer.json (the `tokenizers` library's format), as transformers 5
  // saves a T5Tokenizer: Unigram over the pieces + extra ids, nmt_nfkc's
  // precompiled map, whitespace split + metaspace, "$A </s>".
  const json metaspace = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"},
                          {"split", true}};
  auto seq = [](const char* id) { return json{{"Sequence", {{"id", id}, {"type_id", 0}}}}; };
  const json eos_tok = {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}};
  json fast = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", vocab.precompiled_charsmap.empty()
                         ? json(nullptr)
                         : json{{"type", "Precompiled"},
                                {"precompiled_charsmap", base64_encode(vocab.precompiled_charsmap)}}},
      {"pre_tokenizer",
       {{"type", "Sequence"}, {"pretokenizers", json::array({json{{"type", "WhitespaceSplit"}}, metaspace})}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({seq("A"), eos_tok})},
        {"pair", json::array({seq("A"), eos_tok, seq("B"), eos_tok})},
        {"special_tokens", {{"</s>", {{"id", "</s>"}, {"ids", json::array({1})}, {"tokens", json::array({"</s>"})}}}}}}},
      {"decoder", metaspace},
      {"model", {{"type", "Unigram"}, {"unk_id", 2}, {"vocab", model_vocab}, {"byte_fallback", byte_fallback}}},
  };
  checkpoint::write_file_atomically((root / "tokenizer.json").string(), fast.dump(2) + "\n", false);
  return pieces + extra_ids;
}

}  // namespace tprun::presets
