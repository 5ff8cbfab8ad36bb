// FLUX.2's original (BFL) module names and the diffusers modules of
// Flux2Transformer2DModel each reaches (diffusers'
// _convert_non_diffusers_flux2_lora_to_diffusers and
// _convert_kohya_flux2_lora_to_diffusers). The image / text qkv split B's
// rows in thirds of the config's inner width; the single block's linear1 is
// diffusers' fused to_qkv_mlp_proj whole, its linear2 attn.to_out.
#include "models/flux2_transformer.h"
#include "models/lora_names.h"

namespace tprun::models {
namespace {

LoraNameEntry rename(const std::string& original, const std::string& module, int64_t blocks = 0) {
  return {original, blocks, {{module}}};
}

LoraNameEntry qkv(const std::string& original, int64_t blocks, const std::string& q, const std::string& k,
                  const std::string& v, int64_t inner) {
  return {original, blocks, {{q, 0, inner}, {k, inner, inner}, {v, 2 * inner, inner}}};
}

LoraNames flux2_lora_names(const nlohmann::json& config, const std::string& config_path) {
  const Flux2Config c = Flux2Config::from_json(config, config_path);
  const int64_t inner = c.inner();
  const int64_t n = c.layers, s = c.single_layers;
  const std::string d = "double_blocks.{i}.", t = "transformer_blocks.{i}.";
  const std::string sb = "single_blocks.{i}.", st = "single_transformer_blocks.{i}.";
  LoraNames names;
  auto& e = names.entries;
  e.push_back(qkv(d + "img_attn.qkv", n, t + "attn.to_q", t + "attn.to_k", t + "attn.to_v", inner));
  e.push_back(qkv(d + "txt_attn.qkv", n, t + "attn.add_q_proj", t + "attn.add_k_proj", t + "attn.add_v_proj", inner));
  e.push_back(rename(d + "img_attn.proj", t + "attn.to_out.0", n));
  e.push_back(rename(d + "txt_attn.proj", t + "attn.to_add_out", n));
  e.push_back(rename(d + "img_mlp.0", t + "ff.linear_in", n));
  e.push_back(rename(d + "img_mlp.2", t + "ff.linear_out", n));
  e.push_back(rename(d + "txt_mlp.0", t + "ff_context.linear_in", n));
  e.push_back(rename(d + "txt_mlp.2", t + "ff_context.linear_out", n));
  e.push_back(rename(sb + "linear1", st + "attn.to_qkv_mlp_proj", s));
  e.push_back(rename(sb + "linear2", st + "attn.to_out", s));
  e.push_back(rename("img_in", "x_embedder"));
  e.push_back(rename("txt_in", "context_embedder"));
  e.push_back(rename("time_in.in_layer", "time_guidance_embed.timestep_embedder.linear_1"));
  e.push_back(rename("time_in.out_layer", "time_guidance_embed.timestep_embedder.linear_2"));
  e.push_back(rename("guidance_in.in_layer", "time_guidance_embed.guidance_embedder.linear_1"));
  e.push_back(rename("guidance_in.out_layer", "time_guidance_embed.guidance_embedder.linear_2"));
  e.push_back(rename("final_layer.linear", "proj_out"));
  // BFL's LastLayer gives (shift, scale), diffusers' norm_out (scale, shift):
  // the base weights are swapped on conversion, so is B here (diffusers'
  // FLUX.2 LoRA converter does not swap; its FLUX.1 one does).
  e.push_back({"final_layer.adaLN_modulation.1", 0, {{"norm_out.linear", 0, 0, /*halves_swapped=*/true}}});
  e.push_back(rename("single_stream_modulation.lin", "single_stream_modulation.linear"));
  e.push_back(rename("double_stream_modulation_img.lin", "double_stream_modulation_img.linear"));
  e.push_back(rename("double_stream_modulation_txt.lin", "double_stream_modulation_txt.linear"));
  return names;
}

}  // namespace

TPRUN_REGISTER_LORA_NAMES(Flux2Transformer::kClass, flux2_lora_names);

}  // namespace tprun::models
