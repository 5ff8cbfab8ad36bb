#include "lora/lora_key_format.h"

#include <utility>
#include <vector>

namespace tprun::lora {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

struct Suffix {
  const char* text;
  LoraRole role;
  LoraKeyStyle style;
};

// Longest first where one ends another.
const Suffix kSuffixes[] = {
    {".lora_A.default.weight", LoraRole::Down, LoraKeyStyle::Peft},
    {".lora_B.default.weight", LoraRole::Up, LoraKeyStyle::Peft},
    {".lora_A.weight", LoraRole::Down, LoraKeyStyle::Peft},
    {".lora_B.weight", LoraRole::Up, LoraKeyStyle::Peft},
    {".lora_linear_layer.down.weight", LoraRole::Down, LoraKeyStyle::Peft},
    {".lora_linear_layer.up.weight", LoraRole::Up, LoraKeyStyle::Peft},
    {".lora_down.weight", LoraRole::Down, LoraKeyStyle::Kohya},
    {".lora_up.weight", LoraRole::Up, LoraKeyStyle::Kohya},
    {".alpha", LoraRole::Alpha, LoraKeyStyle::Kohya},
};

struct Prefix {
  const char* text;
  const char* component;
  bool underscored;
};

// Checked in order: the first that starts the key wins.
const Prefix kPrefixes[] = {
    {"lora_unet_", "transformer", true},
    {"lora_transformer_", "transformer", true},
    {"lora_te1_", "text_encoder", true},
    {"lora_te2_", "text_encoder_2", true},
    {"lora_te_", "text_encoder", true},
    {"text_encoders.clip_l.transformer.", "text_encoder", false},
    {"text_encoders.t5xxl.transformer.", "text_encoder_2", false},
    {"base_model.model.", "transformer", false},
    {"model.diffusion_model.", "transformer", false},
    {"diffusion_model.", "transformer", false},
    {"transformer.", "transformer", false},
    {"text_encoder_2.", "text_encoder_2", false},
    {"text_encoder.", "text_encoder", false},
};

}  // namespace

std::string underscored(const std::string& dotted) {
  std::string out = dotted;
  for (char& c : out) {
    if (c == '.') c = '_';
  }
  return out;
}

std::optional<LoraKey> parse_lora_key(const std::string& key) {
  LoraKey k;
  std::string stem;
  bool found = false;
  for (const Suffix& s : kSuffixes) {
    if (ends_with(key, s.text)) {
      stem = key.substr(0, key.size() - std::string(s.text).size());
      k.role = s.role;
      k.style = s.style;
      found = true;
      break;
    }
  }
  if (!found || stem.empty()) return std::nullopt;
  k.component = "transformer";
  k.name = stem;
  for (const Prefix& p : kPrefixes) {
    if (starts_with(stem, p.text)) {
      k.component = p.component;
      k.name = stem.substr(std::string(p.text).size());
      k.underscored = p.underscored;
      break;
    }
  }
  if (k.name.empty()) return std::nullopt;
  return k;
}

}  // namespace tprun::lora
