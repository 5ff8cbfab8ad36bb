// Writing the Qwen2.5-VL tokenizer folder of Qwen-Image (see
// qwen_image_tokenizer_files.h).

#include "presets/qwen_image_tokenizer_files.h"

#include <filesystem>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors_writer.h"
#include "runtime/error.h"

namespace tprun::presets {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Qwen2.5-VL's chat template, as its tokenizer folders carry it.
const char* const kQwen25VlChatTemplate =
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == "
    "'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}"
    "{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}";

void write_text(const fs::path& path, const std::string& text) {
  checkpoint::write_file_atomically(path.string(), text, /*overwrite=*/false);
}

json token_entry(const std::string& content) {
  return {{"content", content}, {"lstrip", false}, {"normalized", false}, {"rstrip", false}, {"single_word", false}};
}

}  // namespace

const std::vector<QwenAddedToken>& qwen25vl_added_tokens() {
  static const std::vector<QwenAddedToken> kTokens = {
      {"<|endoftext|>", true},      {"<|im_start|>", true},     {"<|im_end|>", true},       {"<|object_ref_start|>", true},
      {"<|object_ref_end|>", true}, {"<|box_start|>", true},    {"<|box_end|>", true},      {"<|quad_start|>", true},
      {"<|quad_end|>", true},       {"<|vision_start|>", true}, {"<|vision_end|>", true},   {"<|vision_pad|>", true},
      {"<|image_pad|>", true},      {"<|video_pad|>", true},    {"<tool_call>", false},     {"</tool_call>", false},
      {"<|fim_prefix|>", false},    {"<|fim_middle|>", false},  {"<|fim_suffix|>", false},  {"<|fim_pad|>", false},
      {"<|repo_name|>", false},     {"<|file_sep|>", false}};
  return kTokens;
}

int64_t write_qwen25vl_tokenizer(const std::string& dir, const ByteLevelBpe& bpe, int64_t model_max_length) {
  std::unordered_set<std::string> seen;
  for (const auto& t : bpe.tokens)
    if (!seen.insert(t).second) throw ConfigError(fmt::format("{}: BPE token '{}' would get two ids", dir, t));
  if (bpe.tokens.size() != 256 + bpe.merges.size())
    throw ConfigError(fmt::format("{}: a byte-level BPE has 256 byte tokens and one per merge", dir));
  if (model_max_length < 1) throw ConfigError(fmt::format("{}: model_max_length {} is not positive", dir, model_max_length));
  const fs::path root(dir);
  fs::create_directories(root);

  const auto base = static_cast<int64_t>(bpe.tokens.size());
  json vocab = json::object(), added = json::object(), decoder = json::object(), extra = json::array();
  for (size_t id = 0; id < bpe.tokens.size(); ++id) vocab[bpe.tokens[id]] = static_cast<int64_t>(id);
  const auto& tokens = qwen25vl_added_tokens();
  for (size_t k = 0; k < tokens.size(); ++k) {
    const int64_t id = base + static_cast<int64_t>(k);
    added[tokens[k].content] = id;
    json entry = token_entry(tokens[k].content);
    entry["special"] = tokens[k].special;
    decoder[std::to_string(id)] = entry;
    if (tokens[k].special && k > 0) extra.push_back(tokens[k].content);  // all but <|endoftext|>
  }
  std::string merges = "#version: 0.2\n";
  for (const auto& [a, b] : bpe.merges) merges += a + " " + b + "\n";

  write_text(root / "vocab.json", vocab.dump() + "\n");
  write_text(root / "merges.txt", merges);
  write_text(root / "added_tokens.json", added.dump(2) + "\n");
  json config = {{"add_bos_token", false},
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
  write_text(root / "tokenizer_config.json", config.dump(2) + "\n");
  write_text(root / "special_tokens_map.json",
             json{{"additional_special_tokens", extra},
                  {"eos_token", token_entry("<|im_end|>")},
                  {"pad_token", token_entry("<|endoftext|>")}}
                     .dump(2) + "\n");
  write_text(root / "chat_template.jinja", kQwen25VlChatTemplate);
  return base + static_cast<int64_t>(tokens.size());
}

}  // namespace tprun::presets
