// CLIPTextModel's adapter names: diffusers' text-encoder keys (and kohya's
// lora_te1_ ones) name the modules as transformers' named_modules gives them,
// always under "text_model." ("text_model.encoder.layers.0.self_attn.q_proj").
// A checkpoint saved by transformers 5 has no such prefix, and tprun's table
// of it names the layers "encoder.layers.0.self_attn.q_proj": these entries
// reach them there. (With the prefix the names are the table's own.)
#include "models/clip_text_model.h"
#include "models/lora_names.h"

namespace tprun::models {
namespace {

LoraNames clip_lora_names(const nlohmann::json& config, const std::string& config_path) {
  const ClipTextConfig c = ClipTextConfig::from_json(config, config_path);
  LoraNames names;
  for (const char* m : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "mlp.fc1",
                        "mlp.fc2"}) {
    const std::string layer = std::string("encoder.layers.{i}.") + m;
    names.entries.push_back({"text_model." + layer, c.layers, {{layer}}});
  }
  return names;
}

}  // namespace

TPRUN_REGISTER_LORA_NAMES(ClipTextModel::kClass, clip_lora_names);

}  // namespace tprun::models
