// FLUX.1's original (BFL) module names, as adapters trained on BFL's
// checkpoint use them (kohya / sd-scripts underscore them: lora_unet_
// double_blocks_0_img_attn_qkv), and the diffusers modules of
// FluxTransformer2DModel each reaches (diffusers'
// _convert_kohya_flux_lora_to_diffusers). The widths come from the config:
// the fused image / text qkv splits B's rows in thirds of the inner width,
// the single block's linear1 into q, k, v (inner each) and proj_mlp
// (4 x inner, FluxSingleTransformerBlock's mlp_ratio).
#include "models/flux_transformer.h"
#include "models/lora_names.h"

namespace tprun::models {
namespace {

LoraNameEntry rename(const std::string& original, const std::string& module, int64_t blocks = 0) {
  return {original, blocks, {{module}}};
}

LoraNameEntry split(const std::string& original, int64_t blocks, const std::vector<std::string>& modules,
                    const std::vector<int64_t>& rows) {
  LoraNameEntry e{original, blocks, {}};
  int64_t offset = 0;
  for (size_t k = 0; k < modules.size(); ++k) {
    e.targets.push_back({modules[k], offset, rows[k]});
    offset += rows[k];
  }
  return e;
}

LoraNames flux_lora_names(const nlohmann::json& config, const std::string& config_path) {
  const FluxConfig c = FluxConfig::from_json(config, config_path);
  const int64_t inner = c.inner();
  const int64_t n = c.layers, s = c.single_layers;
  const std::string d = "double_blocks.{i}.", t = "transformer_blocks.{i}.";
  const std::string sb = "single_blocks.{i}.", st = "single_transformer_blocks.{i}.";
  LoraNames names;
  auto& e = names.entries;
  e.push_back(split(d + "img_attn.qkv", n, {t + "attn.to_q", t + "attn.to_k", t + "attn.to_v"}, {inner, inner, inner}));
  e.push_back(rename(d + "img_attn.proj", t + "attn.to_out.0", n));
  e.push_back(rename(d + "img_mlp.0", t + "ff.net.0.proj", n));
  e.push_back(rename(d + "img_mlp.2", t + "ff.net.2", n));
  e.push_back(rename(d + "img_mod.lin", t + "norm1.linear", n));
  e.push_back(split(d + "txt_attn.qkv", n, {t + "attn.add_q_proj", t + "attn.add_k_proj", t + "attn.add_v_proj"},
                    {inner, inner, inner}));
  e.push_back(rename(d + "txt_attn.proj", t + "attn.to_add_out", n));
  e.push_back(rename(d + "txt_mlp.0", t + "ff_context.net.0.proj", n));
  e.push_back(rename(d + "txt_mlp.2", t + "ff_context.net.2", n));
  e.push_back(rename(d + "txt_mod.lin", t + "norm1_context.linear", n));
  e.push_back(split(sb + "linear1", s, {st + "attn.to_q", st + "attn.to_k", st + "attn.to_v", st + "proj_mlp"},
                    {inner, inner, inner, 4 * inner}));
  e.push_back(rename(sb + "linear2", st + "proj_out", s));
  e.push_back(rename(sb + "modulation.lin", st + "norm.linear", s));
  e.push_back(rename("img_in", "x_embedder"));
  e.push_back(rename("txt_in", "context_embedder"));
  e.push_back(rename("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1"));
  e.push_back(rename("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2"));
  e.push_back(rename("vector_in.in_layer", "time_text_embed.text_embedder.linear_1"));
  e.push_back(rename("vector_in.out_layer", "time_text_embed.text_embedder.linear_2"));
  e.push_back(rename("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1"));
  e.push_back(rename("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2"));
  e.push_back(rename("final_layer.linear", "proj_out"));
  e.push_back({"final_layer.adaLN_modulation.1", 0, {{"norm_out.linear", 0, 0, /*halves_swapped=*/true}}});
  return names;
}

}  // namespace

TPRUN_REGISTER_LORA_NAMES(FluxTransformer::kClass, flux_lora_names);

}  // namespace tprun::models
