// Wan's original module names (Wan-Video's checkpoint, as ComfyUI's
// "diffusion_model." files and musubi-tuner's lora_unet_ files use them) and
// the diffusers modules of WanTransformer3DModel each reaches (diffusers'
// _convert_non_diffusers_wan_lora_to_diffusers / _convert_musubi_wan_lora_to_diffusers).
// The image-to-video projections (k_img, v_img) name attn2.add_k_proj /
// add_v_proj, which a text-to-video model does not have: such keys map to
// no module.
#include "models/lora_names.h"
#include "models/wan_transformer.h"

namespace tprun::models {
namespace {

LoraNameEntry rename(const std::string& original, const std::string& module, int64_t blocks = 0) {
  return {original, blocks, {{module}}};
}

LoraNames wan_lora_names(const nlohmann::json& config, const std::string& config_path) {
  const WanTransformerConfig c = WanTransformerConfig::from_json(config, config_path);
  const int64_t n = c.layers;
  const std::string b = "blocks.{i}.";
  LoraNames names;
  auto& e = names.entries;
  const char* ours[] = {"q", "k", "v", "o"};
  const char* theirs[] = {"to_q", "to_k", "to_v", "to_out.0"};
  for (int k = 0; k < 4; ++k) {
    e.push_back(rename(b + "self_attn." + ours[k], b + "attn1." + theirs[k], n));
    e.push_back(rename(b + "cross_attn." + ours[k], b + "attn2." + theirs[k], n));
  }
  e.push_back(rename(b + "cross_attn.k_img", b + "attn2.add_k_proj", n));
  e.push_back(rename(b + "cross_attn.v_img", b + "attn2.add_v_proj", n));
  e.push_back(rename(b + "ffn.0", b + "ffn.net.0.proj", n));
  e.push_back(rename(b + "ffn.2", b + "ffn.net.2", n));
  e.push_back(rename("time_projection.1", "condition_embedder.time_proj"));
  e.push_back(rename("head.head", "proj_out"));
  e.push_back(rename("text_embedding.0", "condition_embedder.text_embedder.linear_1"));
  e.push_back(rename("text_embedding.2", "condition_embedder.text_embedder.linear_2"));
  e.push_back(rename("time_embedding.0", "condition_embedder.time_embedder.linear_1"));
  e.push_back(rename("time_embedding.2", "condition_embedder.time_embedder.linear_2"));
  return names;
}

}  // namespace

TPRUN_REGISTER_LORA_NAMES(WanTransformer::kClass, wan_lora_names);

}  // namespace tprun::models
