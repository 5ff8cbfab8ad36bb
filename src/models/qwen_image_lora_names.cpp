// Qwen-Image's original module names are diffusers' own (the model was
// released in diffusers' layout), so its map holds no renames; kohya's
// lora_unet_transformer_blocks_0_attn_to_q resolves against the table's
// modules. What the family's loader does differently: diffusers'
// _convert_non_diffusers_qwen_lora_to_diffusers pops a lora_A / lora_B
// file's `.alpha` tensors unread, so those modules are scaled by 1 (its
// kohya path, lora_down / lora_up, folds alpha / rank in as FLUX's does).
#include "models/lora_names.h"
#include "models/qwen_image_transformer.h"

namespace tprun::models {
namespace {

LoraNames qwen_image_lora_names(const nlohmann::json& config, const std::string& config_path) {
  QwenImageConfig::from_json(config, config_path);  // refuses what the model refuses
  LoraNames names;
  names.peft_alpha_ignored = true;
  return names;
}

}  // namespace

TPRUN_REGISTER_LORA_NAMES(QwenImageTransformer::kClass, qwen_image_lora_names);

}  // namespace tprun::models
