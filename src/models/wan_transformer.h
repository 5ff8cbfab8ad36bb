#pragma once
// diffusers' WanTransformer3DModel (Wan 2.1 / Wan 2.2 text to video) forward,
// tensor-parallel.
//
// The model (dim D = heads * head_dim): patch_embedding (a Conv3d whose kernel
// and stride are patch_size (pt, ph, pw)) turns the latent video [B, C_in, F,
// H, W] into S = (F / pt)(H / ph)(W / pw) tokens of D, frame-major; the 3-D
// RoPE of wan_rope.h; condition_embedder gives
//   temb            = time_embedder(sinusoidal(timestep))   [B, D]
//                     (freq_dim features, flip_sin_to_cos, shift 0, the raw
//                     timestep 0 .. 1000: no scaling)
//   timestep_proj   = time_proj(silu(temb))                  [B, 6 D]
//   text            = text_embedder(encoder_hidden_states)    [B, S_txt, D]
//                     (linear_1, gelu tanh, linear_2)
// then num_layers blocks (wan_blocks.h: self-attention with RoPE,
// cross-attention to the text without a mask, a GELU FFN, each modulated by
// the block's scale_shift_table + timestep_proj), then the output modulation
// (scale_shift_table [1, 2, D] + temb: read before temb's silu / projection)
// over a LayerNorm without affine, proj_out and the unpatchify to
// [B, out_channels, F, H, W].
//
// TP (a plan of tprun's own; diffusers has only a context-parallel plan for
// this class): each rank of a group of size p holds heads [r H/p, (r+1) H/p) of
//   blocks.*.attn1 / attn2 .to_q, .to_k, .to_v     colwise
//   blocks.*.attn1 / attn2 .norm_q, .norm_k        colwise (the weight's slice
//                                                  of the rank's heads)
//   blocks.*.ffn.net.0.proj                        colwise (ffn_dim / p rows)
//   blocks.*.attn1 / attn2 .to_out.0, ffn.net.2    rowwise (bias added once)
// Everything else is replicated (patch_embedding, condition_embedder, the
// scale_shift_tables, norm2, proj_out), and condition_embedder.time_proj too
// unless ModelOptions::shard_modulation makes it rowwise_split_input (one
// more AllReduce per forward).
// norm_q / norm_k are RMSNorms over ALL heads at once (diffusers builds them
// across heads whatever the config's qk_norm says): a rank holds a slice of
// each token's vector, so the per-token sums of squares of q and k are
// all-reduced (one AllReduce for both) before normalising.
// Communication, per block: 1 AllReduce for the self-attention's q/k norms,
// 1 closing attn1.to_out.0, 1 for the cross-attention's q/k norms, 1 closing
// attn2.to_out.0, 1 closing ffn.net.2: 5 * num_layers per forward (+1 with
// shard_modulation), none when p == 1. tp must divide num_attention_heads and
// ffn_dim (checked before any weight byte).
//
// dtypes as diffusers runs the class in a 16-bit dtype (its
// _keep_in_fp32_modules): condition_embedder.time_embedder, the
// scale_shift_tables and norm2 are kept in fp32 whatever the compute dtype
// (and never stored in fp8 under layerwise casting); the sinusoidal features,
// the time embedder, the norms, the modulations, the RoPE rotation and the
// residual adds of the attention and FFN outputs are fp32, each result
// rounded once to the compute dtype.
//
// Inputs (diffusers' forward argument names):
//   hidden_states          [B, in_channels, F, H, W], F, H, W multiples of the
//                          patch's (pt, ph, pw), each axis at most
//                          rope_max_seq_len patches
//   timestep               [B] (or one value for the batch), any integer or
//                          float dtype: the scheduler's timestep as WanPipeline
//                          passes it (0 .. 1000, not divided by 1000). Wan 2.2
//                          TI2V's per-token [B, S] timesteps are refused.
//   encoder_hidden_states  [B, S_txt, text_dim] (every token attended: the
//                          pipeline zero-pads prompts to 512 tokens itself)
// Output: "sample" [B, out_channels, F, H, W] in the compute dtype.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/denoiser.h"

namespace tprun::checkpoint {
class WeightSource;
}

namespace tprun::models {

class TensorCensus;  // models/model_config.h

struct WanTransformerConfig {
  std::array<int64_t, 3> patch_size{1, 2, 2};  // (pt, ph, pw)
  int64_t heads = 40, head_dim = 128, layers = 40;
  int64_t in_channels = 16, out_channels = 16;
  int64_t text_dim = 4096, freq_dim = 256, ffn_dim = 13824;
  bool cross_attn_norm = true;  // norm2 (LayerNorm with affine) before the cross-attention
  // Read and kept for the record: diffusers 0.40 builds the across-heads
  // norm_q / norm_k whatever it says (null included), and so does tprun.
  std::string qk_norm = "rms_norm_across_heads";
  double eps = 1e-6;  // every norm of the model
  int64_t rope_max_seq_len = 1024;
  int64_t inner() const { return heads * head_dim; }
  int64_t patch_volume() const { return patch_size[0] * patch_size[1] * patch_size[2]; }
  // Defaults as diffusers' __init__ (out_channels: absent 16, null or 0 ->
  // in_channels); every value checked and bounded (CheckpointError naming
  // the file and field: attention_head_dim must be even for the RoPE);
  // image_dim, added_kv_proj_dim and pos_embed_seq_len (image to video,
  // VACE) refused by name (ConfigError) when not null.
  static WanTransformerConfig from_json(const nlohmann::json& config, const std::string& config_path,
                                        const TensorCensus* census = nullptr);
};

struct WanWeights;  // wan_blocks.h

class WanTransformer final : public Denoiser {
 public:
  static constexpr const char* kClass = "WanTransformer3DModel";
  // diffusers' enable_layerwise_casting skips for the class: its
  // _skip_layerwise_casting_patterns and its _keep_in_fp32_modules.
  static std::vector<std::string> class_skip_patterns() {
    return {"patch_embedding", "condition_embedder", "norm", "rope", "time_embedder", "scale_shift_table",
            "norm1", "norm2", "norm3"};
  }

  // The table the construction records (no checkpoint is read).
  static ModelTable table_for(const WanTransformerConfig& config, const ModelOptions& options = {});
  // Validates the table against `source` before any weight byte is read
  // (tp divides num_attention_heads and ffn_dim), then loads this rank's slices.
  static std::unique_ptr<WanTransformer> load(checkpoint::WeightSource& source, const nlohmann::json& config,
                                              const std::string& config_path, const parallel::TpContext& tp,
                                              const ModelOptions& options = {});

  // `sample` [B, out_channels, F, H, W] in the compute dtype. RequestError
  // naming the input for a missing or mis-shaped one. Trace (in execution
  // order): "rope.freqs_cos" / "_sin", "patch_embedding",
  // "condition_embedder.temb", "condition_embedder.timestep_proj",
  // "condition_embedder.text_embedder", "blocks.{i}", "norm_out", "proj_out".
  at::Tensor run(const TensorMap& inputs, Trace* trace = nullptr) const override;
  TensorMap forward(const TensorMap& inputs, Trace* trace = nullptr) const override;
  std::string primary_output() const override { return "sample"; }
  // 5 * num_layers (+1 with shard_modulation), 0 at tp 1.
  int64_t all_reduces_per_forward() const override;

  // A batch of 2: 3 latent frames of a 4 x 6 patch grid, 7 text tokens,
  // N(0, 1), timesteps 700 / 300.
  TensorMap example_inputs(uint64_t seed) const override;

  const WanTransformerConfig& config() const { return config_; }

 private:
  WanTransformerConfig config_;
  bool shard_modulation_ = false;
  std::shared_ptr<const WanWeights> w_;
};

}  // namespace tprun::models
