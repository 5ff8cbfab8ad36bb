#pragma once
// diffusers' QwenImageTransformer2DModel (Qwen-Image) forward, tensor-parallel.
//
// The model: img_in (patch latents -> D = heads * head_dim), txt_norm
// (diffusers' RMSNorm) then txt_in (text hidden states -> D), a timestep
// embedding temb, num_layers dual-stream blocks (qwen_image_blocks.h) with
// joint attention over [text, image] in which padded text tokens are never
// attended, the 3-axis RoPE of qwen_image_rope.h, then norm_out
// (AdaLayerNormContinuous over silu(temb)) and proj_out on the image stream.
//
// TP (diffusers' _tp_plan for the class): each rank of a group of size p
// holds heads [r H/p, (r+1) H/p) of
//   attn.to_q/to_k/to_v, attn.add_q_proj/add_k_proj/add_v_proj   colwise
//   img_mlp.net.0.proj, txt_mlp.net.0.proj                        colwise (4 D / p rows)
//   attn.to_out.0, attn.to_add_out, img_mlp.net.2, txt_mlp.net.2  rowwise (bias added once)
// Everything else is replicated: embedders, norms, norm_out, proj_out and the
// per-block modulations img_mod.1 / txt_mod.1, unless
// ModelOptions::shard_modulation makes the modulations rowwise_split_input
// (all 2 * num_layers of them are computed up front from the same silu(temb)
// and reduced together).
// Communication, per block: 1 AllReduce closing both streams' attention
// output projections, 1 closing both streams' MLP net.2 (the two MLPs are
// independent). A forward issues 2 * num_layers AllReduces (+1 with
// shard_modulation), none when p == 1. Outputs are bitwise identical on every
// rank of the group.
//
// Inputs (diffusers' forward argument names):
//   hidden_states               [B, S_img, in_channels]
//   encoder_hidden_states       [B, S_txt, joint_attention_dim]
//   encoder_hidden_states_mask  [B, S_txt], optional: nonzero = a real token,
//                               0 = padding (its key is masked); absent = all real
//   timestep                    [B] (or one value), as the pipeline passes it
//                               (t / 1000; the model scales by 1000 inside)
//   img_shapes                  int [B, 3] (frames, height, width in patches)
//                               per sample, or [B, N, 3] for N images per
//                               sample (the Edit pipelines); every sample the
//                               same (diffusers builds RoPE from the first one);
//                               S_img = sum of frames * height * width
//   additional_t_cond           int [B] in {0, 1}, iff use_additional_t_cond
// Not accepted: 'guidance'. diffusers 0.40.0 reads guidance_embeds but builds
// no guidance embedder; its forward fails (TypeError) when guidance is
// passed. A guidance_embeds config loads and runs without it, as diffusers'.
// Output: "sample" [B, S_img, patch^2 * out_channels].
// Variants: use_additional_t_cond adds addition_t_embedding[additional_t_cond]
// to temb. zero_cond_t (Qwen-Image-Edit-2511) embeds the timesteps [t, 0]:
// the image modulations come from both halves (the first image's tokens take
// t's, the tokens of the images after it 0's), the text modulations and
// norm_out from t's; it changes nothing in the plan. Refused by name
// (ConfigError): use_layer3d_rope (Qwen-Image-Layered's QwenEmbedLayer3DRope),
// not implemented, and zero_cond_t together with use_additional_t_cond.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/mmdit_transformer.h"

namespace tprun::checkpoint {
class WeightSource;
}

namespace tprun::models {

class TensorCensus;  // models/model_config.h

struct QwenImageConfig {
  int64_t heads = 24, head_dim = 128, layers = 60;
  int64_t in_channels = 64, out_channels = 16, patch = 2, joint_dim = 3584;
  int64_t timestep_channels = 256;  // Timesteps(num_channels=256), fixed in diffusers
  std::vector<int64_t> axes_dims_rope{16, 56, 56};
  double eps = 1e-6;              // every norm of the model
  bool guidance = false;          // read, but builds nothing (see above)
  bool additional_t_cond = false;  // use_additional_t_cond
  bool zero_cond_t = false;        // a zero-timestep modulation for the conditioning images
  int64_t inner() const { return heads * head_dim; }
  int64_t mlp_hidden() const { return 4 * inner(); }  // FeedForward(mult=4)
  // Defaults as diffusers' __init__ (out_channels: absent 16, null or 0 ->
  // in_channels); every value checked and bounded (CheckpointError naming
  // the file and field); the variant flags refused by name (ConfigError).
  static QwenImageConfig from_json(const nlohmann::json& config, const std::string& config_path,
                                   const TensorCensus* census = nullptr);
};

struct QwenImageWeights;  // qwen_image_blocks.h

class QwenImageTransformer final : public MmditTransformer {
 public:
  static constexpr const char* kClass = "QwenImageTransformer2DModel";
  // diffusers' _skip_layerwise_casting_patterns for the class.
  static std::vector<std::string> class_skip_patterns() { return {"pos_embed", "norm"}; }

  // The table the construction records (no checkpoint is read).
  static ModelTable table_for(const QwenImageConfig& config, const ModelOptions& options = {});
  // Validates the table against `source` before any weight byte is read,
  // then loads this rank's slices.
  static std::unique_ptr<QwenImageTransformer> load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                                    const std::string& config_path, const parallel::TpContext& tp,
                                                    const ModelOptions& options = {});

  // `sample` in the compute dtype. RequestError naming the input for a
  // missing or mis-shaped one. Trace (in execution order):
  // "img_in", "txt_in", "time_text_embed", "pos_embed.freqs_cos" / "_sin",
  // "transformer_blocks.{i}.encoder_hidden_states" / ".hidden_states",
  // "norm_out", "proj_out".
  at::Tensor run(const TensorMap& inputs, Trace* trace = nullptr) const override;

  // A batch of 2: a 4 x 6 patch grid, 7 text tokens of which the second
  // sample's last 3 are padding (mask 0), N(0, 1), timesteps 0.7 / 0.3.
  TensorMap example_inputs(uint64_t seed) const override;

  const QwenImageConfig& config() const { return config_; }

 private:
  QwenImageConfig config_;
  std::shared_ptr<const QwenImageWeights> w_;
};

}  // namespace tprun::models
