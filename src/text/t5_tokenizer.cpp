#include "text/t5_tokenizer.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <sentencepiece_processor.h>

#include "runtime/error.h"
#include "runtime/strict_json.h"

namespace tprun::text {
namespace fs = std::filesystem;

T5Tokenizer::T5Tokenizer(const std::string& dir)
    : dir_(dir), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const fs::path root(dir);
  if (!fs::is_directory(root)) throw CheckpointError(fmt::format("{}: T5 tokenizer folder not found", dir));
  const fs::path model_path = root / "spiece.model";
  if (!fs::is_regular_file(model_path))
    throw CheckpointError(fmt::format("{}: missing (T5 SentencePiece model)", model_path.string()));
  const auto status = sp_->Load(model_path.string());
  if (!status.ok())
    throw CheckpointError(
        fmt::format("{}: not a SentencePiece model: {}", model_path.string(), status.ToString()));
  const int64_t pieces = sp_->GetPieceSize();

  const fs::path config_path = root / "tokenizer_config.json", map_path = root / "special_tokens_map.json";
  const nlohmann::json config = read_optional_json(config_path, "tokenizer config");
  const nlohmann::json special_map = read_optional_json(map_path, "special tokens map");
  added_ = parse_added_tokens(config, config_path.string());
  if (!config.contains("added_tokens_decoder")) {
    // transformers' legacy default: <extra_id_i> = pieces - 1 + extra_ids - i, stripping both sides.
    int64_t extra = 100;
    if (config.contains("extra_ids")) {
      if (!config["extra_ids"].is_number_integer() || config["extra_ids"].get<int64_t>() < 0)
        throw CheckpointError(fmt::format("{}: extra_ids {} is not a non-negative integer", config_path.string(),
                                          config["extra_ids"].dump()));
      extra = config["extra_ids"].get<int64_t>();
    }
    for (int64_t i = 0; i < extra; ++i)
      added_.push_back(AddedToken{fmt::format("<extra_id_{}>", i), pieces - 1 + extra - i, true, true});
  }
  auto special = [&](const char* key, const char* fallback) {
    std::string s = special_token_string(special_map, map_path.string(), config, config_path.string(), key);
    if (s.empty()) s = fallback;
    const bool added = std::any_of(added_.begin(), added_.end(), [&](const AddedToken& t) { return t.content == s; });
    if (!added) {
      const int id = sp_->PieceToId(s);
      if (sp_->IdToPiece(id) != s)
        throw CheckpointError(fmt::format("{}: {} '{}' is neither a piece of {} nor an added token",
                                          config_path.string(), key, s, model_path.string()));
      added_.push_back(AddedToken{s, id, false, false});
    }
    return token_id(s);
  };
  eos_id_ = special("eos_token", "</s>");
  unk_id_ = special("unk_token", "<unk>");
  pad_id_ = special("pad_token", "<pad>");
  vocab_size_ = pieces;
  for (const auto& t : added_) vocab_size_ = std::max(vocab_size_, t.id + 1);
  added_trie_ = added_token_trie(added_);
}

T5Tokenizer::~T5Tokenizer() = default;

int64_t T5Tokenizer::token_id(const std::string& token) const {
  for (const auto& t : added_)
    if (t.content == token) return t.id;
  return sp_->PieceToId(token);
}

std::vector<int64_t> T5Tokenizer::content_ids(const std::string& prompt) const {
  return content_ids_with(prompt, added_, added_trie_, [this](const std::string& text, std::vector<int64_t>& ids) {
    // legacy=True: the whole piece through SentencePiece (its normaliser drops
    // leading/trailing whitespace, collapses runs and adds the "▁" prefix).
    std::vector<std::string> sp_pieces;
    const auto status = sp_->Encode(text, &sp_pieces);
    if (!status.ok())
      throw RequestError(fmt::format("T5 tokenizer {}: SentencePiece failed: {}", dir_, status.ToString()));
    for (const auto& p : sp_pieces) ids.push_back(token_id(p));
  });
}

TokenizerOutput T5Tokenizer::encode(const std::string& prompt, int64_t max_length) const {
  if (max_length < 1)
    throw RequestError(fmt::format("T5 tokenizer {}: max_length {} leaves no room for eos", dir_, max_length));
  const int64_t eos = eos_id_;
  return finish_encoding(content_ids(prompt), max_length, 1, pad_id_, [eos](std::vector<int64_t> ids) {
    if (ids.empty() || ids.back() != eos) ids.push_back(eos);  // _add_eos_if_not_present
    return ids;
  });
}

}  // namespace tprun::text
