// Writing the Qwen2.5-VL tokenizer folder of Qwen-Image (see
// qwen_image_tokenizer_files.h).

#include "presets/qwen_image_tokenizer_files.h"

#include <filesystem>

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

const std::vector<QwenAddedToken>& qwen25vl_added_tokens() { return qwen2_added_tokens(); }

int64_t write_qwen25vl_tokenizer(const std::string& dir, const ByteLevelBpe& bpe, int64_t model_max_length) {
  check_byte_level_bpe(dir, bpe);
  if (model_max_length < 1) throw ConfigError(fmt::format("{}: model_max_length {} is not positive", dir, model_max_length));
  const fs::path root(dir);
  fs::create_directories(root);

  const auto base = static_cast<int64_t>(bpe.tokens.size());
  json vocab = json::object(), added = json::object();
  for (size_t id = 0; id < bpe.tokens.size(); ++id) vocab[bpe.tokens[id]] = static_cast<int64_t>(id);
  const auto& tokens = qwen25vl_added_tokens();
  for (size_t k = 0; k < tokens.size(); ++k) added[tokens[k].content] = base + static_cast<int64_t>(k);
  const json config = qwen2_tokenizer_config(tokens, base, model_max_length);

  write_text(root / "vocab.json", vocab.dump() + "\n");
  write_text(root / "merges.txt", merges_txt(bpe));
  write_text(root / "added_tokens.json", added.dump(2) + "\n");
  write_text(root / "tokenizer_config.json", config.dump(2) + "\n");
  write_text(root / "special_tokens_map.json",
             json{{"additional_special_tokens", config["additional_special_tokens"]},
                  {"eos_token", token_entry("<|im_end|>")},
                  {"pad_token", token_entry("<|endoftext|>")}}
                     .dump(2) + "\n");
  write_text(root / "chat_template.jinja", kQwen25VlChatTemplate);
  return base + static_cast<int64_t>(tokens.size());
}

}  // namespace tprun::presets
