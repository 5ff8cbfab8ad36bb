#include "presets/hf_tokenizer_files.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors_writer.h"
#include "text/bpe_trainer.h"
#include "text/byte_level.h"
#include "text/chat_template.h"
#include "text/hf_regex.h"
#include "text/tokenizer_common.h"
#include "runtime/error.h"

namespace tprun::presets {
namespace fs = std::filesystem;
using nlohmann::json;

const char* const kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kTekkenSplitPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

void write_json(const fs::path& path, const json& j) {
  checkpoint::write_file_atomically(path.string(), j.dump(2) + "\n", /*overwrite=*/false);
}

json added_entry(const std::string& content, int64_t id, bool special) {
  return {{"id", id},           {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},    {"normalized", false}, {"special", special}};
}

json decoder_entry(const std::string& content, bool special) {
  return {{"content", content}, {"lstrip", false}, {"normalized", false},
          {"rstrip", false},    {"single_word", false}, {"special", special}};
}

json bpe_model(const ByteLevelBpe& bpe, int64_t offset, bool ignore_merges) {
  json vocab = json::object();
  for (size_t id = 0; id < bpe.tokens.size(); ++id) vocab[bpe.tokens[id]] = offset + static_cast<int64_t>(id);
  json merges = json::array();
  for (const auto& [a, b] : bpe.merges) merges.push_back(json::array({a, b}));
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", ignore_merges},
          {"vocab", vocab},
          {"merges", merges}};
}

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", use_regex}};
}

json split_then_byte_level(const char* pattern) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           json::array({{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                        byte_level(false)})}};
}

}  // namespace

void check_byte_level_bpe(const std::string& dir, const ByteLevelBpe& bpe) {
  std::unordered_set<std::string> seen;
  for (const auto& t : bpe.tokens)
    if (!seen.insert(t).second) throw ConfigError(fmt::format("{}: BPE token '{}' would get two ids", dir, t));
  if (bpe.tokens.size() != 256 + bpe.merges.size())
    throw ConfigError(fmt::format("{}: a byte-level BPE has 256 byte tokens and one per merge", dir));
}

std::string merges_txt(const ByteLevelBpe& bpe) {
  std::string merges = "#version: 0.2\n";
  for (const auto& [a, b] : bpe.merges) merges += a + " " + b + "\n";
  return merges;
}

const std::vector<QwenAddedToken>& qwen2_added_tokens() {
  static const std::vector<QwenAddedToken> kTokens = {
      {"<|endoftext|>", true},      {"<|im_start|>", true},     {"<|im_end|>", true},      {"<|object_ref_start|>", true},
      {"<|object_ref_end|>", true}, {"<|box_start|>", true},    {"<|box_end|>", true},     {"<|quad_start|>", true},
      {"<|quad_end|>", true},       {"<|vision_start|>", true}, {"<|vision_end|>", true},  {"<|vision_pad|>", true},
      {"<|image_pad|>", true},      {"<|video_pad|>", true},    {"<tool_call>", false},    {"</tool_call>", false},
      {"<|fim_prefix|>", false},    {"<|fim_middle|>", false},  {"<|fim_suffix|>", false}, {"<|fim_pad|>", false},
      {"<|repo_name|>", false},     {"<|file_sep|>", false}};
  return kTokens;
}

json qwen2_tokenizer_config(const std::vector<QwenAddedToken>& added, int64_t first_id, int64_t model_max_length) {
  json decoder = json::object(), extra = json::array();
  for (size_t k = 0; k < added.size(); ++k) {
    decoder[std::to_string(first_id + static_cast<int64_t>(k))] = decoder_entry(added[k].content, added[k].special);
    if (added[k].special && k > 0) extra.push_back(added[k].content);  // all but <|endoftext|>
  }
  return {{"add_bos_token", false},
          {"add_prefix_space", false},
          {"added_tokens_decoder", decoder},
          {"additional_special_tokens", extra},
          {"bos_token", nullptr},
          {"clean_up_tokenization_spaces", false},
          {"eos_token", "<|im_end|>"},
          {"errors", "replace"},
          {"model_max_length", model_max_length},
          {"pad_token", "<|endoftext|>"},
          {"split_special_tokens", false},
          {"tokenizer_class", "Qwen2Tokenizer"},
          {"unk_token", nullptr}};
}

ByteLevelBpe train_byte_level_bpe(const std::vector<std::string>& texts, const std::string& split_pattern,
                                  int64_t num_merges) {
  if (num_merges < 0) throw ConfigError(fmt::format("BPE training: number of merges {} is negative", num_merges));
  text::SplitRegex regex = [&] {
    try {
      return text::SplitRegex::compile(split_pattern);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(fmt::format("BPE training: split pattern: {}", e.what()));
    }
  }();
  const std::vector<std::string> byte_symbol = text::byte_level_symbols();
  std::vector<std::string> ordered = byte_symbol;
  std::sort(ordered.begin(), ordered.end());  // bytes_to_unicode()'s order (code point order)

  std::vector<text::BpeWord> words;
  std::unordered_map<std::string, size_t> index;
  auto count = [&](const std::u32string& u, size_t b, size_t e) {
    if (e <= b) return;
    const std::string w = text::encode_utf8(u.substr(b, e - b));
    auto [it, added] = index.emplace(w, words.size());
    if (added) {
      text::BpeWord word;
      for (unsigned char c : w) word.symbols.push_back(byte_symbol[c]);
      words.push_back(std::move(word));
    }
    ++words[it->second].count;
  };
  for (const auto& text : texts) {
    const std::u32string u = text::decode_utf8(text, "BPE training text");
    size_t prev = 0;
    for (const auto& [b, e] : regex.find_all(u)) {
      count(u, prev, b);
      count(u, b, e);
      prev = e;
    }
    count(u, prev, u.size());
  }

  ByteLevelBpe bpe;
  bpe.tokens = ordered;
  text::learn_bpe_merges(words, num_merges, bpe.merges, bpe.tokens);
  return bpe;
}

int64_t write_qwen3_tokenizer(const std::string& dir, const ByteLevelBpe& bpe, int64_t model_max_length) {
  check_byte_level_bpe(dir, bpe);
  const fs::path root(dir);
  fs::create_directories(root);
  std::vector<QwenAddedToken> tokens = qwen2_added_tokens();
  tokens.insert(tokens.end(),
                {{"<tool_response>", false}, {"</tool_response>", false}, {"<think>", false}, {"</think>", false}});
  const auto base = static_cast<int64_t>(bpe.tokens.size());
  json added = json::array();
  for (size_t k = 0; k < tokens.size(); ++k)
    added.push_back(added_entry(tokens[k].content, base + static_cast<int64_t>(k), tokens[k].special));
  json tok = {{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", added},
              {"normalizer", {{"type", "NFC"}}},
              {"pre_tokenizer", split_then_byte_level(kQwen2SplitPattern)},
              {"post_processor", byte_level(false)},
              {"decoder", byte_level(false)},
              {"model", bpe_model(bpe, 0, false)}};
  write_json(root / "tokenizer.json", tok);
  write_json(root / "vocab.json", tok["model"]["vocab"]);
  checkpoint::write_file_atomically((root / "merges.txt").string(), merges_txt(bpe), false);
  json config = qwen2_tokenizer_config(tokens, base, model_max_length);
  config["chat_template"] = chat_template_text(text::ChatTemplateKind::kQwen3);
  write_json(root / "tokenizer_config.json", config);
  return base + static_cast<int64_t>(tokens.size());
}

int64_t write_mistral3_tokenizer(const std::string& dir, const ByteLevelBpe& bpe, int64_t num_special,
                                 int64_t model_max_length) {
  check_byte_level_bpe(dir, bpe);
  static const char* kNamed[] = {"<unk>",          "<s>",           "</s>",           "[INST]",          "[/INST]",
                                 "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
                                 "[TOOL_CALLS]",   "[IMG]",         "<pad>",          "[IMG_BREAK]",     "[IMG_END]",
                                 "[PREFIX]",       "[MIDDLE]",      "[SUFFIX]",       "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                                 "[TOOL_CONTENT]"};
  const auto named = static_cast<int64_t>(std::size(kNamed));
  if (num_special < named || num_special > 1000)
    throw ConfigError(fmt::format("{}: a Mistral tokenizer has {} to 1000 special tokens, not {}", dir, named, num_special));
  const fs::path root(dir);
  fs::create_directories(root);
  json added = json::array(), decoder = json::object();
  for (int64_t id = 0; id < num_special; ++id) {
    const std::string content = id < named ? kNamed[id] : fmt::format("<SPECIAL_{}>", id);
    added.push_back(added_entry(content, id, true));
    decoder[std::to_string(id)] = decoder_entry(content, true);
  }
  json bos_piece = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  json post = {{"type", "TemplateProcessing"},
               {"single", json::array({bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
               {"pair", json::array({bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
               {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", json::array({1})}, {"tokens", json::array({"<s>"})}}}}}};
  json tok = {{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", added},
              {"normalizer", nullptr},
              {"pre_tokenizer", split_then_byte_level(kTekkenSplitPattern)},
              {"post_processor", post},
              {"decoder", byte_level(true)},
              {"model", bpe_model(bpe, num_special, true)}};
  // The special tokens are vocabulary entries too, as in Mistral's tokenizer.json.
  for (int64_t id = 0; id < num_special; ++id)
    tok["model"]["vocab"][id < named ? kNamed[id] : fmt::format("<SPECIAL_{}>", id)] = id;
  write_json(root / "tokenizer.json", tok);
  json config = {{"added_tokens_decoder", decoder},
                 {"bos_token", "<s>"},
                 {"clean_up_tokenization_spaces", false},
                 {"eos_token", "</s>"},
                 {"model_max_length", model_max_length},
                 {"pad_token", "<pad>"},
                 {"processor_class", "PixtralProcessor"},
                 {"tokenizer_class", "TokenizersBackend"},
                 {"unk_token", "<unk>"}};
  write_json(root / "tokenizer_config.json", config);
  write_json(root / "special_tokens_map.json",
             {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"pad_token", "<pad>"}, {"unk_token", "<unk>"}});
  write_json(root / "processor_config.json", {{"image_break_token", "[IMG_BREAK]"},
                                              {"image_end_token", "[IMG_END]"},
                                              {"image_token", "[IMG]"},
                                              {"patch_size", 14},
                                              {"processor_class", "PixtralProcessor"},
                                              {"spatial_merge_size", 2}});
  write_json(root / "preprocessor_config.json",
             {{"crop_size", nullptr},
              {"do_center_crop", nullptr},
              {"do_convert_rgb", true},
              {"do_normalize", true},
              {"do_rescale", true},
              {"do_resize", true},
              {"image_mean", {0.48145466, 0.4578275, 0.40821073}},
              {"image_processor_type", "PixtralImageProcessor"},
              {"image_std", {0.26862954, 0.26130258, 0.27577711}},
              {"patch_size", {{"height", 14}, {"width", 14}}},
              {"processor_class", "PixtralProcessor"},
              {"resample", 3},
              {"rescale_factor", 0.00392156862745098},
              {"size", {{"longest_edge", 1540}}}});
  checkpoint::write_file_atomically((root / "chat_template.jinja").string(),
                                    chat_template_text(text::ChatTemplateKind::kMistral3), false);
  return num_special + static_cast<int64_t>(bpe.tokens.size());
}

}  // namespace tprun::presets
